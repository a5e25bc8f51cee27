"""Bench row (e): ``search`` over one actor's memories against plain full text on the same rows,
the same 10 queries in turn (3 of them misspelled); and ``--only e``, (e) then (i) on the same
memories."""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

import psycopg
import search_quality  # row (i), bench/search_quality.py
from common import ACTOR, INIT, KEY, NS, check, connect, say, version
from measuring import Comparison, Measured, QueryCycle, measure, median, ratio, stats
from memories import build_memories, load_memories, memory_content, memory_shape

# The queries of (e), a few words each as a user would type them; the misspelled ones name the
# word the data spells right, which search's best hit must contain (the near-words signal finds it;
# plain full text finds nothing).
SEARCH_QUERIES: list[tuple[str, str | None]] = [
    ("sister lives in Lisbon", None),
    ("allergic to peanuts", None),
    ("sushi for dinner", None),
    ("red Volvo", None),
    ("learning Japanese", None),
    ("parrot named Hugo", None),
    ("goes climbing with Mia", None),
    ("allergic to penauts", "peanuts"),
    ("favorite hobby pottery", "favourite"),
    ("ordered a blue ketle", "kettle"),
]

SEARCH = 'SELECT id, content FROM aidb_memory.search(%s, %s, %s, "limit" => 10)'
# (e) reference: plain full text on the same rows, best ts_rank_cd first.
SEARCH_REF = """
SELECT public_id, content FROM aidb_memory.memory
WHERE actor_key = %(key)s AND valid_to IS NULL AND tsv @@ websearch_to_tsquery('simple', %(q)s)
ORDER BY ts_rank_cd(tsv, websearch_to_tsquery('simple', %(q)s)) DESC
LIMIT 10
"""


def verify_memories(conn: psycopg.Connection[Any], total: int) -> list[dict[str, Any]]:
    """(e): the rows are what the generator says, and both paths answer every query."""
    per_actor, others = memory_shape(total)
    counts = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE actor_id = %s), count(DISTINCT actor_id), "
        "bool_and(valid_to IS NULL AND embedding IS NULL) FROM aidb_memory.memory",
        (ACTOR,),
    ).fetchone()
    check(
        counts == (total, per_actor, others + 1, True),
        f"(e) {total:,} current memories without embeddings, {per_actor:,} of them '{ACTOR}''s, "
        f"{others:,} other actors",
    )
    stored = [
        r[0]
        for r in conn.execute(
            "SELECT content FROM aidb_memory.memory WHERE actor_id = %s ORDER BY created_at",
            (ACTOR,),
        )
    ]
    check(
        stored == [memory_content(k, per_actor) for k in range(per_actor)],
        f"(e) '{ACTOR}''s {per_actor:,} memories are the generator's sentences, all different",
    )
    found = conn.execute("SELECT id FROM aidb_memory.namespace WHERE name = %s", (NS,)).fetchone()
    assert found is not None
    queries = []
    for q, right in SEARCH_QUERIES:
        ours = conn.execute(SEARCH, (NS, ACTOR, q), prepare=True).fetchall()
        ref = conn.execute(
            SEARCH_REF, {"ns": found[0], "actor": ACTOR, "key": KEY, "q": q}, prepare=True
        ).fetchall()
        mine = conn.execute(
            "SELECT count(*) FROM aidb_memory.memory WHERE public_id = ANY (%s::uuid[]) "
            "AND actor_id = %s AND valid_to IS NULL",
            ([str(r[0]) for r in ours], ACTOR),
        ).fetchone()
        check(
            len(ours) == 10 and mine == (10,),
            f"(e) {q!r}: search returns 10 of '{ACTOR}''s current memories",
        )
        if right is None:
            # Every word of the query, as search reads it (english stems, stop words out).
            top_matches = conn.execute(
                "SELECT lexemes @@ websearch_to_tsquery('english', %s) FROM aidb_memory.memory "
                "WHERE public_id = %s::uuid",
                (q, str(ours[0][0])),
            ).fetchone()
            check(
                len(ref) > 0 and top_matches == (True,),
                f"    the reference finds {len(ref)}, and search's best hit holds every word of "
                "the query",
            )
        else:
            check(
                len(ref) == 0 and right in ours[0][1],
                f"    misspelled: the reference finds nothing, search's best hit has {right!r}",
            )
        queries.append(
            {
                "query": q,
                "misspelled": right is not None,
                "ours_rows": len(ours),
                "reference_rows": len(ref),
                "in_both": len({r[0] for r in ours} & {r[0] for r in ref}),
                "ours_best": ours[0][1],
            }
        )
    return queries


E_TARGET = 2.0

# The full run's comparison (e), after sessions.py's (report.py).
COMPARISON = Comparison(
    "e",
    "(e) search(limit => 10) over one actor's memories vs a plain full-text query on the same rows",
    "mean latency aidb_memory.search (full text + near words, fused) / the reference (tsv @@ "
    "websearch_to_tsquery, ORDER BY ts_rank_cd LIMIT 10), the same 10 queries in turn",
    "e_search",
    "e_ref",
    "latency",
    "<=",
    E_TARGET,
)
# For information: (e) against the reference planned for each query's values.
INFO = [
    (
        "e_search",
        "e_ref_custom",
        "latency",
        "search / the reference with custom plans (plan_cache_mode = force_custom_plan)",
    ),
]


def measure_e(
    runner: asyncio.Runner,
    dsn: str,
    args: argparse.Namespace,
    paths: dict[str, Measured],
) -> tuple[dict[str, Any], list[psycopg.Connection[Any]]]:
    """(e): generate and verify the memories, then measure its paths (added to ``paths``) side by
    side. Returns the per-query results and the connections it opened (the caller closes them)."""
    per_actor = args.memories // 10
    psy = f"psycopg {version('psycopg')} sync"
    say(f"bench: generating {args.memories:,} memories for (e)")
    with connect(dsn) as setup:
        generated = build_memories(setup, args.memories)
        say("bench: verifying the memories and that both paths of (e) answer every query")
        answers = verify_memories(setup, args.memories)
        ns_row = setup.execute(
            "SELECT id FROM aidb_memory.namespace WHERE name = %s", (NS,)
        ).fetchone()
        assert ns_row is not None
        ns_id = ns_row[0]
    e_ours, e_ref, e_custom = connect(dsn), connect(dsn), connect(dsn)
    # The reference again, planned for each query's values (the generic plan a prepared
    # statement gets after 5 runs estimates an average actor's ~100 rows, not 100,000).
    e_custom.execute("SET plan_cache_mode = force_custom_plan")
    e_search = QueryCycle(e_ours, SEARCH, [(NS, ACTOR, q) for q, _ in SEARCH_QUERIES])
    e_plain = QueryCycle(
        e_ref,
        SEARCH_REF,
        [{"ns": ns_id, "actor": ACTOR, "key": KEY, "q": q} for q, _ in SEARCH_QUERIES],
    )
    e_plain_custom = QueryCycle(e_custom, SEARCH_REF, e_plain.params)
    e_paths = [
        Measured(
            "e_search",
            f"search, {per_actor // 1000}k of {args.memories // 1000}k memories",
            psy,
            op=e_search,
        ),
        Measured("e_ref", f"plain full text, {per_actor // 1000}k memories", psy, op=e_plain),
        Measured(
            "e_ref_custom",
            f"the same, custom plans, {per_actor // 1000}k",
            psy,
            op=e_plain_custom,
        ),
    ]
    paths.update((p.name, p) for p in e_paths)
    on = (e_search, e_plain, e_plain_custom)
    measure(runner, paths, [[p.name for p in e_paths]], args, start_recording=on)
    search = {
        "data": generated,
        "queries": [
            {
                **answer,
                "ours_mean_ms": round(sum(a) / len(a) / 1e6, 2),
                "reference_mean_ms": round(sum(b) / len(b) / 1e6, 2),
                "reference_custom_plan_mean_ms": round(sum(c) / len(c) / 1e6, 2),
                "ops": [len(a), len(b), len(c)],
            }
            for answer, a, b, c in zip(
                answers, e_search.by_query, e_plain.by_query, e_plain_custom.by_query, strict=True
            )
        ],
    }
    return search, [e_ours, e_ref, e_custom]


def only_e(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--only e``: (e) alone, then (i) on the same memories; the run's JSON entries."""
    with connect(dsn) as setup:
        setup.execute(INIT, (NS,))
    paths: dict[str, Measured] = {}
    with asyncio.Runner() as runner:
        search, conns = measure_e(runner, dsn, args, paths)
    for c in conns:
        c.close()
    e = COMPARISON
    overall, rounds = ratio(paths, e.num, e.den, e.metric)
    custom, _ = ratio(paths, "e_search", "e_ref_custom", "latency")
    say("bench: (i) search quality, 30 misspelled queries")
    quality = search_quality.run(dsn, NS, ACTOR, say)
    return {
        "settings": {"rounds": args.rounds, "slice_s": args.slice, "burst": args.burst},
        "machine": {"cpus": os.cpu_count(), "loadavg": list(os.getloadavg())},
        "e": {
            "ratio": "e_search/e_ref",
            "measured": round(overall, 3),
            "median_of_rounds": round(median(rounds), 3),
            "by_round": [round(x, 3) for x in rounds],
            "target": f"{e.op} {e.target}",
            "result": "PASS" if e.passes(overall) else "MISS",
            "vs_custom_plans": round(custom, 3),
        },
        "paths": {name: stats(p) for name, p in paths.items()},
        "search": search,
        "search_quality": quality,
    }


def show_only_e(r: dict[str, Any]) -> None:
    """Print what ``only_e`` found."""
    e = r["e"]
    for name, st in r["paths"].items():
        print(f"{name:<12} {st['label']:<36} {st['ops']:>6} ops, mean {st['mean_us']:>8.0f} µs")
    print(
        f"(e) search / plain full text (mean latency): {e['measured']:.2f}, target "
        f"{e['target']}  {e['result']} (rounds {min(e['by_round']):.2f}.."
        f"{max(e['by_round']):.2f}; info: / the reference with custom plans "
        f"{e['vs_custom_plans']:.2f})"
    )
    report_search(r["search"])
    print()
    search_quality.report(r["search_quality"])


def only_i(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--only i``: (i) alone, on (e)'s memories; the run's JSON entries."""
    generated = load_memories(dsn, args.memories)
    say("bench: (i) search quality, 30 misspelled queries")
    return {"memories": generated, "search_quality": search_quality.run(dsn, NS, ACTOR, say)}


def report_search(search: dict[str, Any]) -> None:
    """(e)'s table per query."""
    data = search["data"]
    print(
        f"(e) per query: {data['of_actor']:,} memories of one actor among {data['total']:,} "
        f"(generated in {data['seconds']:.0f} s); mean ms over all rounds"
    )
    header = "{:<26} {:>10} {:>8} {:>6} {:>11}  {:>7}  {}".format(
        "query", "search ms", "ref ms", "ratio", "ref* ms", "ref hits", "search's best hit"
    )
    print(header)
    print("-" * len(header))
    for q in search["queries"]:
        print(
            f"{q['query']:<26} {q['ours_mean_ms']:>10.1f} {q['reference_mean_ms']:>8.1f} "
            f"{q['ours_mean_ms'] / q['reference_mean_ms']:>6.0f} "
            f"{q['reference_custom_plan_mean_ms']:>11.1f}  {q['reference_rows']:>7}  "
            f"{q['ours_best']}"
        )
    print("ref*: the reference with custom plans (plan_cache_mode = force_custom_plan)")
