"""Bench row (e2): the slowest single ``search`` an application role can make with a
100,000-char query, on (e)'s memories."""

from __future__ import annotations

import argparse
import itertools
import json
import string
import sys
import time
from typing import Any

import psycopg
from common import ACTOR, NS, REPO, connect, say
from memories import load_memories
from search import SEARCH

WORST_QUERY_CHARS = 100_000
WORST_RUNS = 3  # runs of each shape; a shape's cost is the slowest of them


def _fill(words: list[str], sep: str, chars: int) -> str:
    """``words`` joined by ``sep``, cycled, as many as fit in ``chars`` characters."""
    out: list[str] = []
    n = 0
    for i in range(chars):
        w = words[i % len(words)]
        if n + len(w) + len(sep) > chars:
            break
        out.append(w)
        n += len(w) + len(sep)
    return sep.join(out)


def _distinct_words(chars: int) -> str:
    """Distinct short words (aaa, aab, ..., then aaaa, ...) up to ``chars`` characters."""
    out: list[str] = []
    n = 0
    for size in (3, 4):
        for letters in itertools.product(string.ascii_lowercase, repeat=size):
            if n + size + 1 > chars:
                return " ".join(out)
            out.append("".join(letters))
            n += size + 1
    return " ".join(out)


def default_caps() -> dict[str, int]:
    """The search caps' defaults, from the server code's own table of config keys (pure Python)."""
    sys.path.insert(0, str(REPO / "plpython"))
    try:
        from aidb_memory_server.validation import CONFIG_DEFAULTS
    finally:
        sys.path.pop(0)
    return {k: int(v) for k, v in CONFIG_DEFAULTS.items() if k.startswith("search_max_")}


def worst_queries(vocabulary: list[str], caps: dict[str, int]) -> list[tuple[str, str]]:
    """(e2): adversarial shapes, (name, query). Four of WORST_QUERY_CHARS characters (what issue 9
    measured at 29.7 s and > 30 s before the caps), and the costliest query the default caps still
    accept: the most common words of the data, or-joined, up to every cap."""
    under: list[str] = []
    for w in vocabulary[: caps["search_max_words"] - 1]:  # "or" is a word too
        tokens = 2 * len(under) + 1
        if tokens + 2 > caps["search_max_query_nodes"]:
            break
        under.append(w)
    at_caps = _fill(under, " or ", caps["search_max_query_chars"])
    while 2 * len(at_caps.split(" or ")) - 1 > caps["search_max_query_nodes"]:
        at_caps = at_caps.rsplit(" or ", 1)[0]
    # Misspelled common words: full text finds nothing, so the any-word signal runs, with the
    # words nearest each one (up to 3 a word) or-joined.
    misspelled = [w[:-1] + "x" for w in vocabulary if len(w) >= 5][: caps["search_max_words"]]
    return [
        ("or-joined words", _fill(vocabulary, " or ", WORST_QUERY_CHARS)),
        ("distinct short words", _distinct_words(WORST_QUERY_CHARS)),
        ("one long word", "x" * WORST_QUERY_CHARS),
        ("one quoted phrase", '"' + _fill(vocabulary, " ", WORST_QUERY_CHARS - 2) + '"'),
        ("at the default caps", at_caps),
        ("misspelled, at the caps", " ".join(misspelled)),
    ]


def worst_search(dsn: str) -> dict[str, Any]:
    """(e2): the slowest single search an application role can make with a 100,000-char query,
    against (e)'s memories: each shape WORST_RUNS times on one warmed-up connection, under the
    default caps, then with search_max_query_chars raised to 100,000 (so that the other caps do
    the bounding). Refused queries count: their cost is what refusing them costs."""
    with connect(dsn) as conn:
        caps = default_caps()
        vocabulary = [
            r[0]
            for r in conn.execute(
                "SELECT word FROM aidb_memory.memory_word v JOIN aidb_memory.namespace n "
                "ON n.id = v.namespace_id WHERE n.name = %s AND v.actor_id = %s "
                "ORDER BY word",
                (NS, ACTOR),
            ).fetchall()
        ]
        common = [
            r[0]
            for r in conn.execute(
                "SELECT word FROM ts_stat($$SELECT tsv FROM aidb_memory.memory "
                "WHERE actor_id = 'alice'$$) ORDER BY ndoc DESC, word LIMIT 200"
            ).fetchall()
        ]
        shapes = worst_queries(common or vocabulary, caps)
        for _ in range(3):  # warm up: the backend's first PL/Python call, the plans
            conn.execute(SEARCH, (NS, ACTOR, "allergic to peanuts"), prepare=True).fetchall()
        out: list[dict[str, Any]] = []
        settings = [("default caps", None), ("search_max_query_chars 100000", 100_000)]
        for label, chars in settings:
            conn.execute(
                "SELECT aidb_memory.namespace_update(%s, config => %s::jsonb)",
                (NS, json.dumps({"search_max_query_chars": chars})),
            )
            for name, query in shapes:
                times, outcome = [], ""
                for _ in range(WORST_RUNS):
                    t0 = time.perf_counter_ns()
                    try:
                        rows = conn.execute(SEARCH, (NS, ACTOR, query), prepare=True).fetchall()
                        outcome = f"{len(rows)} rows"
                    except psycopg.Error as e:
                        outcome = f"refused {e.sqlstate}: {(e.diag.message_primary or '')[20:70]}"
                    times.append(time.perf_counter_ns() - t0)
                out.append(
                    {
                        "config": label,
                        "shape": name,
                        "query_chars": len(query),
                        "worst_ms": round(max(times) / 1e6, 2),
                        "outcome": outcome,
                    }
                )
        conn.execute(
            "SELECT aidb_memory.namespace_update(%s, config => %s::jsonb)",
            (NS, json.dumps({"search_max_query_chars": None})),
        )
    worst = max(out, key=lambda r: r["worst_ms"])
    return {"worst_ms": worst["worst_ms"], "worst": worst, "shapes": out}


def report_worst(worst: dict[str, Any]) -> None:
    print(
        f"(e2) the worst single search of a {WORST_QUERY_CHARS:,}-char query: "
        f"{worst['worst_ms']:.1f} ms ({worst['worst']['shape']}, {worst['worst']['config']})"
    )
    header = "{:<32} {:<22} {:>7} {:>9}  {}".format(
        "config", "shape", "chars", "worst ms", "outcome"
    )
    print(header)
    print("-" * len(header))
    for r in worst["shapes"]:
        print(
            f"{r['config']:<32} {r['shape']:<22} {r['query_chars']:>7} {r['worst_ms']:>9.1f}  "
            f"{r['outcome']}"
        )


def only(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--only worst-search``: (e2) alone, on (e)'s memories; the run's JSON entries."""
    generated = load_memories(dsn, args.memories)
    say("bench: (e2) the worst single search of a 100,000-char query")
    return {"memories": generated, "worst_search": worst_search(dsn)}
