"""Bench row (i) (issue 14): search quality on misspelled queries.

30 queries of a few words about (e)'s generated memories, each with one word misspelled: 10 with
two neighbouring letters swapped ("Volov"), 10 with a letter replaced ("Skoba"), 10 with a letter
missing or one too many ("almods", "Teslla"). Each is also given spelled right. The intended
memory of a query is the best hit of ``search`` for the query spelled right (one memory; the
query spelled right matches from about 20 to 900 of the actor's 100,000 memories); the query is
a hit when that memory is among search's first 3 results for the misspelled query. The row is
the share of hits, target >= 0.9.

Checked before anything is counted (a failed check stops the run): the misspelled word is not a
word of the actor's memories and the right one is (memory_word), plain full text finds nothing
for the misspelled query, and the query spelled right finds the intended memory by plain full
text too. A second, looser share is printed for information: the queries where any of the first
3 results matches the query spelled right by plain full text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

TARGET = 0.9
TOP = 3

# (kind, misspelled query, the misspelled word, the word spelled right). The words are slot
# words of bench/memories.py's MEMORY_TEMPLATES, each within the part of its slot's list the
# template uses, so every query spelled right finds memories for any --memories.
QUERIES: list[tuple[str, str, str, str]] = [
    ("transposition", "parrot named Hguo", "hguo", "hugo"),
    ("transposition", "allergic to sesmae", "sesmae", "sesame"),
    ("transposition", "sister lives in Lsibon", "lsibon", "lisbon"),
    ("transposition", "goes hiknig with Mia", "hiknig", "hiking"),
    ("transposition", "drives a red Volov", "volov", "volvo"),
    ("transposition", "learning Gerek", "gerek", "greek"),
    ("transposition", "prefers sushi for lucnh", "lucnh", "lunch"),
    ("transposition", "ordered a blue lpatop", "lpatop", "laptop"),
    ("transposition", "has a black dgo", "dgo", "dog"),
    ("transposition", "cousin works as a nruse", "nruse", "nurse"),
    ("substitution", "allergic to peamuts", "peamuts", "peanuts"),
    ("substitution", "goes swimning with Noah", "swimning", "swimming"),
    ("substitution", "drives a green Skoba", "skoba", "skoda"),
    ("substitution", "parrot named Hogo", "hogo", "hugo"),
    ("substitution", "visiting Oslo on Fridsys", "fridsys", "fridays"),
    ("substitution", "brother lives in Berlun", "berlun", "berlin"),
    ("substitution", "ordered a silver kittle", "kittle", "kettle"),
    ("substitution", "learning Polisg", "polisg", "polish"),
    ("substitution", "has a grey cay", "cay", "cat"),
    ("substitution", "works as a pilor", "pilor", "pilot"),
    ("deletion", "ordered a black hedphones", "hedphones", "headphones"),
    ("deletion", "allergic to almods", "almods", "almonds"),
    ("deletion", "goes runing with Ida", "runing", "running"),
    ("deletion", "prefers pizza for diner", "diner", "dinner"),
    ("deletion", "has a white tutle", "tutle", "turtle"),
    ("insertion", "sister lives in Madrrid", "madrrid", "madrid"),
    ("insertion", "goes cycling with Emmma", "emmma", "emma"),
    ("insertion", "learning Frenche", "frenche", "french"),
    ("insertion", "ordered a camerra in March", "camerra", "camera"),
    ("insertion", "drives a Teslla", "teslla", "tesla"),
]

SEARCH = 'SELECT id::text, content FROM aidb_memory.search(%s, %s, %s, "limit" => 10)'
_VOCABULARY = """
SELECT v.word FROM aidb_memory.memory_word v JOIN aidb_memory.namespace n ON n.id = v.namespace_id
WHERE n.name = %s AND v.actor_id = %s AND v.word = ANY (%s)
"""
_FULL_TEXT = """
SELECT count(*) FROM aidb_memory.memory m JOIN aidb_memory.namespace n ON n.id = m.namespace_id
WHERE n.name = %s AND m.actor_id = %s AND m.valid_to IS NULL
  AND m.tsv @@ websearch_to_tsquery('simple', %s)
"""
_MATCHES = """
SELECT public_id::text FROM aidb_memory.memory
WHERE public_id = ANY (%s::uuid[]) AND tsv @@ websearch_to_tsquery('simple', %s)
"""


class QualityError(RuntimeError):
    pass


def right_query(query: str, wrong: str, right: str) -> str:
    """``query`` with its misspelled word spelled right."""
    words = query.split()
    fixed = [right if w.lower() == wrong else w for w in words]
    if fixed == words:
        raise QualityError(f"(i) {query!r} has no word {wrong!r}")
    return " ".join(fixed)


def run(dsn: str, ns: str, actor: str, say: Callable[[str], None]) -> dict[str, Any]:
    """Row (i) on the memories of ``actor`` in namespace ``ns``."""
    out: list[dict[str, Any]] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        words = [w for _, _, wrong, right in QUERIES for w in (wrong, right)]
        known = {r[0] for r in conn.execute(_VOCABULARY, (ns, actor, words))}
        for kind, query, wrong, right in QUERIES:
            fixed = right_query(query, wrong, right)
            if wrong in known or right not in known:
                raise QualityError(
                    f"(i) {query!r}: {wrong!r} must not be a word of the memories, {right!r} must"
                )
            if conn.execute(_FULL_TEXT, (ns, actor, query)).fetchone() != (0,):
                raise QualityError(f"(i) {query!r}: plain full text finds it")
            row = conn.execute(_FULL_TEXT, (ns, actor, fixed)).fetchone()
            matching = int(row[0]) if row else 0
            intended = conn.execute(SEARCH, (ns, actor, fixed)).fetchall()
            if not intended or not conn.execute(_MATCHES, ([intended[0][0]], fixed)).fetchall():
                raise QualityError(f"(i) {fixed!r}: search's best hit does not match it")
            got = conn.execute(SEARCH, (ns, actor, query)).fetchall()
            top = [r[0] for r in got[:TOP]]
            loose = conn.execute(_MATCHES, (top, fixed)).fetchall() if top else []
            out.append(
                {
                    "kind": kind,
                    "query": query,
                    "spelled_right": fixed,
                    "matching_memories": matching,
                    "intended": intended[0][1],
                    "rank": top.index(intended[0][0]) + 1 if intended[0][0] in top else None,
                    "hit": intended[0][0] in top,
                    "top_matches_right_query": len(loose),
                    "best": got[0][1] if got else None,
                }
            )
    hits = sum(q["hit"] for q in out)
    share = hits / len(out)
    kinds = {
        kind: f"{sum(q['hit'] for q in out if q['kind'] in group)} of "
        f"{sum(q['kind'] in group for q in out)}"
        for kind, group in (
            ("transposition", ("transposition",)),
            ("substitution", ("substitution",)),
            ("deletion or insertion", ("deletion", "insertion")),
        )
    }
    result = {
        "queries": out,
        "hits": hits,
        "total": len(out),
        "share": round(share, 3),
        "by_kind": kinds,
        "loose_share": round(sum(q["top_matches_right_query"] > 0 for q in out) / len(out), 3),
        "target": f">= {TARGET}",
        "result": "PASS" if share >= TARGET else "MISS",
    }
    say(f"  (i) {hits} of {len(out)} misspelled queries find their memory in the top {TOP}")
    return result


def report(result: dict[str, Any]) -> None:
    print(
        f"(i) search quality: of {result['total']} queries with one misspelled word, "
        f"{result['hits']} have their intended memory (the best hit of the query spelled right) "
        f"in the top {TOP}: {result['share']:.2f}, target {result['target']}  {result['result']}"
    )
    print(
        "  by kind: "
        + ", ".join(f"{k} {v}" for k, v in result["by_kind"].items())
        + f"; info: any of the top {TOP} matches the query spelled right: "
        f"{result['loose_share']:.2f}"
    )
    header = "{:<14} {:<28} {:>8} {:>5}  {}".format("kind", "query", "matching", "rank", "best hit")
    print(header)
    print("-" * len(header))
    for q in result["queries"]:
        rank = "-" if q["rank"] is None else str(q["rank"])
        print(
            f"{q['kind']:<14} {q['query']:<28} {q['matching_memories']:>8} {rank:>5}  {q['best']}"
        )
