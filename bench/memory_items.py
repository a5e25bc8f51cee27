"""Bench rows (l), (m) and (n) (issue 34): memories an application shapes, on (e)'s memories
(the 100,000 memories of one actor among 1,000,000).

(l) ``search`` whose filter selects 1% of the actor's memories (``{"pinned": true}``, set on
    every hundredth of them) against the same search unfiltered, (e)'s 10 queries in turn: p95
    latency ratio, target <= 1.5.
(m) ``get_memory`` by id against a plain-SQL select of the same row by the actor's key and the
    memory's public id (the unique index a get probes), 1,000 memories in turn: mean latency
    ratio, target <= 1.5.
(n) ``remember`` with metadata and a key against ``remember`` without either, a new text each
    call, each path its own actor: mean latency ratio, target <= 1.1.

The paths of each row run side by side (measuring.measure), after (e) and (i) in a full run;
``--only items`` builds (e)'s memories first.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from typing import Any

import psycopg
from common import ACTOR, INIT, KEY, NS, check, connect, say, version
from measuring import Measured, QueryCycle, measure, median, ratio, stats
from memories import build_memories
from search import SEARCH_QUERIES

TAG = {"pinned": True}
SHARE = 100  # one memory in SHARE is tagged: 1%
FILTER = json.dumps(TAG)
SEARCH = 'SELECT id FROM aidb_memory.search(%s, %s, %s, "limit" => 10)'
SEARCH_FILTERED = 'SELECT id FROM aidb_memory.search(%s, %s, %s, "limit" => 10, filter => %s)'
GET = "SELECT * FROM aidb_memory.get_memory(%s, %s, id => %s)"
GET_REF = """
SELECT public_id, content, agent_id, session_id, valid_from, valid_to, created_at, updated_at,
       metadata, key
FROM aidb_memory.memory WHERE actor_key = %s AND public_id = %s
"""
REMEMBER = "SELECT aidb_memory.remember(%s, %s, %s)"
REMEMBER_KEYED = "SELECT aidb_memory.remember(%s, %s, %s, metadata => %s, key => %s)"
TARGETS = {"l": 1.5, "m": 1.5, "n": 1.1}


class Writes:
    """A remember path: a new text (and key) every call."""

    def __init__(self, conn: psycopg.Connection[Any], actor: str, keyed: bool) -> None:
        self.conn, self.actor, self.keyed = conn, actor, keyed
        self.n = itertools.count()

    def __call__(self) -> Any:
        i = next(self.n)
        text = f"{self.actor} noted fact number {i} about the project"
        if self.keyed:
            meta = json.dumps({"source": "bench", "n": i})
            args: tuple[Any, ...] = (NS, self.actor, text, meta, f"fact-{i}")
            return self.conn.execute(REMEMBER_KEYED, args, prepare=True).fetchone()
        return self.conn.execute(REMEMBER, (NS, self.actor, text), prepare=True).fetchone()


def tag(conn: psycopg.Connection[Any]) -> int:
    """Tag every SHAREth of the actor's memories (in id order); how many."""
    tagged = conn.execute(
        "UPDATE aidb_memory.memory SET metadata = %(tag)s::jsonb "
        "WHERE actor_key = %(key)s AND id IN ("
        "  SELECT x.id FROM (SELECT m.id, row_number() OVER (ORDER BY m.id) AS r"
        "                    FROM aidb_memory.memory m WHERE m.actor_key = %(key)s) x"
        "  WHERE x.r %% %(share)s = 0)",
        {"tag": FILTER, "key": KEY, "share": SHARE},
    ).rowcount
    conn.execute("ANALYZE aidb_memory.memory")
    return tagged


def run(runner: asyncio.Runner, dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    """(l), (m), (n) on (e)'s memories (already in the database)."""
    psy = f"psycopg {version('psycopg')} sync"
    with connect(dsn) as setup:
        tagged = tag(setup)
        total = setup.execute(
            "SELECT count(*) FROM aidb_memory.memory WHERE actor_key = %s", (KEY,)
        ).fetchone()
        ids = [
            str(r[0])
            for r in setup.execute(
                "SELECT public_id FROM aidb_memory.memory WHERE actor_key = %s "
                "ORDER BY md5(public_id::text) LIMIT 1000",
                (KEY,),
            )
        ]
    assert total is not None
    check(
        tagged == total[0] // SHARE,
        f"(l) {tagged:,} of '{ACTOR}''s {total[0]:,} memories tagged {FILTER}",
    )
    conns = [connect(dsn) for _ in range(6)]
    try:
        # (l) answers only with tagged memories, and as many as it finds.
        for q, _ in SEARCH_QUERIES:
            found = [
                str(r[0])
                for r in conns[0].execute(SEARCH_FILTERED, (NS, ACTOR, q, FILTER)).fetchall()
            ]
            if found:
                hits = (
                    conns[0]
                    .execute(
                        "SELECT count(*) FROM aidb_memory.memory WHERE actor_key = %s "
                        "AND public_id = ANY (%s::uuid[]) AND metadata = %s::jsonb",
                        (KEY, found, FILTER),
                    )
                    .fetchone()
                )
                check(hits == (len(found),), f"(l) {q!r}: the filtered search's hits are tagged")
        got = conns[0].execute(GET, (NS, ACTOR, ids[0])).fetchall()
        check(len(got) == 1 and str(got[0][0]) == ids[0], "(m) get_memory finds the memory")
        paths = {
            "l_filtered": Measured(
                "l_filtered",
                "search, filter selecting 1%",
                psy,
                op=QueryCycle(
                    conns[0], SEARCH_FILTERED, [(NS, ACTOR, q, FILTER) for q, _ in SEARCH_QUERIES]
                ),
            ),
            "l_plain": Measured(
                "l_plain",
                "search, no filter",
                psy,
                op=QueryCycle(conns[1], SEARCH, [(NS, ACTOR, q) for q, _ in SEARCH_QUERIES]),
            ),
            "m_get": Measured(
                "m_get",
                "get_memory by id",
                psy,
                op=QueryCycle(conns[2], GET, [(NS, ACTOR, i) for i in ids]),
            ),
            "m_ref": Measured(
                "m_ref",
                "plain select by key and id",
                psy,
                op=QueryCycle(conns[3], GET_REF, [(KEY, i) for i in ids]),
            ),
            "n_keyed": Measured(
                "n_keyed", "remember, metadata and key", psy, op=Writes(conns[4], "writer-a", True)
            ),
            "n_plain": Measured(
                "n_plain", "remember, neither", psy, op=Writes(conns[5], "writer-b", False)
            ),
        }
        groups = [["l_filtered", "l_plain"], ["m_get", "m_ref"], ["n_keyed", "n_plain"]]
        measure(runner, paths, groups, args)
    finally:
        for c in conns:
            c.close()
    st = {name: stats(p) for name, p in paths.items()}
    l_ratio = st["l_filtered"]["p95_us"] / st["l_plain"]["p95_us"]
    m_ratio, m_rounds = ratio(paths, "m_get", "m_ref", "latency")
    n_ratio, n_rounds = ratio(paths, "n_keyed", "n_plain", "latency")
    rows = {
        "l": {
            "what": "p95 of search with a filter selecting 1% / p95 of the same search unfiltered",
            "measured": round(l_ratio, 3),
            "tagged": tagged,
            "of_actor": total[0],
        },
        "m": {
            "what": "mean latency of get_memory by id / a plain select of the row",
            "measured": round(m_ratio, 3),
            "median_of_rounds": round(median(m_rounds), 3),
            "by_round": [round(x, 3) for x in m_rounds],
        },
        "n": {
            "what": "mean latency of remember with metadata and a key / remember without",
            "measured": round(n_ratio, 3),
            "median_of_rounds": round(median(n_rounds), 3),
            "by_round": [round(x, 3) for x in n_rounds],
        },
    }
    for row, target in TARGETS.items():
        rows[row]["target"] = f"<= {target}"
        rows[row]["result"] = "PASS" if rows[row]["measured"] <= target else "MISS"
    return {"rows": rows, "paths": st}


def only(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--only items``: (e)'s memories, then (l), (m), (n) on them."""
    with connect(dsn) as setup:
        setup.execute(INIT, (NS,))
        say(f"bench: generating {args.memories:,} memories for (l), (m), (n)")
        generated = build_memories(setup, args.memories)
    with asyncio.Runner() as runner:
        found = run(runner, dsn, args)
    return {
        "settings": {"rounds": args.rounds, "slice_s": args.slice, "burst": args.burst},
        "memories": generated,
        "memory_items": found,
    }


def report(found: dict[str, Any]) -> None:
    """Print rows (l), (m), (n) and their paths."""
    for name, st in found["paths"].items():
        print(
            f"{name:<11} {st['label']:<30} {st['ops']:>7} ops  mean {st['mean_us']:>8.0f} µs  "
            f"p95 {st['p95_us']:>8.0f} µs"
        )
    for row, r in found["rows"].items():
        print(f"({row}) {r['what']}: {r['measured']:.2f}, target {r['target']}  {r['result']}")
