"""The memories of bench rows (e), (e2) and (i): ``total`` short sentences about users, generated
in SQL (a Python mirror of the generator checks them), a tenth of them the searched actor's."""

from __future__ import annotations

import math
import time
from typing import Any

import psycopg
from common import ACTOR, INIT, NS, check, connect, say

# (e) memories: short facts about users, sentence k of ``m`` built from a template and vocabulary
# words. k is scrambled (k * 48271 mod m, a bijection: m has no factor but 2 and 5), its last digit
# picks the template and the rest picks each slot's word by its residue modulo the slot's size; the
# sizes of one template are pairwise coprime with a product of at least m / 10, so the m sentences
# are all different (Chinese remainder theorem) and every word of a slot is used evenly. The
# generator in SQL (MEMORY_CONTENT_SQL) and memory_content here give the same sentences.
MEMORY_MULT = 48271
_W = str.split
NAMES = _W(
    "Anna Ben Carla David Emma Felix Greta Hugo Ida Jonas Klara Lukas Mia Noah Olga Paul "
    "Rosa Sami Tara Ugo Vera Wim Xenia Yusuf"
)
CITIES = _W(
    "Berlin Lisbon Madrid Oslo Vienna Prague Dublin Zurich Munich Hamburg Lyon Porto "
    "Seville Krakow Gdansk Bergen Malmo Turin Naples Bologna Ghent Utrecht Leeds Bristol"
)
FOODS = _W(
    "sushi pasta ramen tacos curry falafel risotto paella pizza dumplings pho burritos "
    "lasagne gnocchi hummus pancakes waffles croissants bagels noodles goulash pierogi "
    "kimchi tapas"
)
HOBBIES = _W(
    "hiking cycling climbing swimming rowing chess painting pottery gardening baking "
    "fishing sailing skiing surfing running yoga photography knitting birdwatching "
    "camping kayaking dancing singing woodworking"
)
JOBS = _W(
    "nurse teacher plumber architect lawyer dentist pilot chef journalist engineer "
    "pharmacist librarian electrician accountant designer translator baker carpenter "
    "firefighter veterinarian programmer photographer mechanic gardener"
)
PETS = _W("dog cat parrot rabbit hamster turtle goldfish canary ferret pony")
COLORS = _W("red blue green black white silver yellow orange purple grey brown beige")
CARS = _W("Volvo Skoda Fiat Toyota Honda Renault Peugeot Tesla Kia Mazda Audi Seat")
DAYS = _W("Mondays Tuesdays Wednesdays Thursdays Fridays Saturdays Sundays")
MEALS = _W("breakfast lunch dinner brunch")
RELATIONS = _W("sister brother mother father cousin daughter son friend colleague neighbour")
LANGUAGES = _W(
    "Spanish French German Italian Polish Dutch Swedish Japanese Korean Arabic Greek Turkish"
)
ITEMS = _W(
    "kettle laptop backpack jacket headphones blender lamp chair monitor keyboard camera watch"
)
MONTHS = _W("January February March April May June July August September October November December")
ALLERGENS = _W(
    "peanuts shellfish gluten lactose eggs soy sesame walnuts almonds strawberries kiwi mustard"
)
# (format, [(words, how many of them), ...]): ten templates, four slots each.
MEMORY_TEMPLATES: list[tuple[str, list[tuple[list[str], int]]]] = [
    (
        "The user's %s %s lives in %s and works as a %s",
        [(RELATIONS, 10), (NAMES, 23), (CITIES, 19), (JOBS, 21)],
    ),
    (
        "The user prefers %s for %s when visiting %s on %s",
        [(FOODS, 23), (MEALS, 4), (CITIES, 19), (DAYS, 7)],
    ),
    (
        "The user goes %s with %s on %s near %s",
        [(HOBBIES, 23), (NAMES, 19), (DAYS, 7), (CITIES, 22)],
    ),
    (
        "The user is allergic to %s and avoids %s at %s in %s",
        [(ALLERGENS, 11), (FOODS, 23), (MEALS, 4), (CITIES, 19)],
    ),
    (
        "The user has a %s %s named %s who likes %s",
        [(COLORS, 11), (PETS, 10), (NAMES, 23), (FOODS, 19)],
    ),
    (
        "The user drives a %s %s and commutes to %s as a %s",
        [(COLORS, 12), (CARS, 11), (CITIES, 23), (JOBS, 19)],
    ),
    (
        "The user ordered a %s %s in %s for %s",
        [(COLORS, 7), (ITEMS, 12), (MONTHS, 11), (NAMES, 23)],
    ),
    (
        "The user is learning %s to travel to %s with %s in %s",
        [(LANGUAGES, 12), (CITIES, 23), (NAMES, 19), (MONTHS, 11)],
    ),
    (
        "The user's favourite hobby is %s and %s taught it in %s on %s",
        [(HOBBIES, 24), (NAMES, 23), (CITIES, 19), (DAYS, 7)],
    ),
    (
        "The user celebrates %s birthday in %s with %s and %s",
        [(NAMES, 23), (MONTHS, 12), (FOODS, 19), (HOBBIES, 11)],
    ),
]
# The most sentences the templates can tell apart: 10 x the smallest product of slot sizes.
MEMORY_MAX_PER_ACTOR = 10 * min(math.prod(n for _, n in slots) for _, slots in MEMORY_TEMPLATES)
OTHER_ACTOR_MEMORIES = 100  # memories of each of the other actors


def memory_content(k: int, m: int) -> str:
    """Sentence k (0 <= k < m) of m different ones."""
    j = k * MEMORY_MULT % m
    fmt, slots = MEMORY_TEMPLATES[j % 10]
    q = j // 10
    return fmt % tuple(words[q % n] for words, n in slots)


def _memory_content_sql() -> str:
    def lit(s: str) -> str:
        return "'" + s.replace("'", "''") + "'"

    whens = []
    for i, (fmt, slots) in enumerate(MEMORY_TEMPLATES):
        words = ", ".join(
            f"(ARRAY[{', '.join(lit(w) for w in ws[:n])}])[1 + mod(q, {n})]" for ws, n in slots
        )
        whens.append(f"WHEN {i} THEN format({lit(fmt)}, {words})")
    return "CASE mod(j, 10) " + " ".join(whens) + " END"


MEMORY_CONTENT_SQL = _memory_content_sql()


MEMORY_INDEXES = (
    "memory_current_hash_idx",
    "memory_actor_idx",
    "memory_tsv_idx",
    "memory_lexemes_idx",
)


def memory_shape(total: int) -> tuple[int, int]:
    """(memories of ACTOR, number of other actors) for ``total`` memories."""
    per_actor = total // 10
    return per_actor, 9 * per_actor // OTHER_ACTOR_MEMORIES


def _index_definitions(conn: psycopg.Connection[Any]) -> dict[str, str]:
    return dict(
        conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'aidb_memory' "
            "AND tablename = 'memory' AND indexname = ANY (%s)",
            (list(MEMORY_INDEXES),),
        ).fetchall()
    )


def bulk_insert(
    conn: psycopg.Connection[Any], insert: str, params: dict[str, Any], ns_id: int, row: str
) -> tuple[float, float]:
    """Run ``insert`` (memories of namespace ``ns_id``, one statement) as a bulk load: the
    secondary indexes of MEMORY_INDEXES dropped and created again from their own definitions
    (checked), search's statistics (memory_lexeme) counted once after the load, as migration
    0018 counts them, instead of by the trigger row by row (an update of the same few rows per
    memory: the word every memory of an actor shares was updated once a row). The tables end as
    the row-by-row load would leave them. Returns the seconds of the load and of the indexes."""
    defs = _index_definitions(conn)
    assert sorted(defs) == sorted(MEMORY_INDEXES), defs
    t0 = time.perf_counter()
    for name in MEMORY_INDEXES:
        conn.execute(f"DROP INDEX aidb_memory.{name}")
    conn.execute("ALTER TABLE aidb_memory.memory DISABLE TRIGGER memory_lexemes_counted")
    conn.execute(insert, params)
    conn.execute(
        """
        INSERT INTO aidb_memory.memory_lexeme (actor_key, namespace_id, actor_id, lexeme, memories)
        SELECT m.actor_key, m.namespace_id, m.actor_id, l.lexeme, count(*)
        FROM aidb_memory.memory m
        CROSS JOIN LATERAL unnest(array_append(tsvector_to_array(m.lexemes), '')) AS l(lexeme)
        WHERE m.valid_to IS NULL AND m.namespace_id = %s
        GROUP BY 1, 2, 3, 4
        """,
        (ns_id,),
    )
    conn.execute("ALTER TABLE aidb_memory.memory ENABLE TRIGGER memory_lexemes_counted")
    inserted = time.perf_counter() - t0
    t1 = time.perf_counter()
    conn.execute("SET maintenance_work_mem = '256MB'")
    for name in MEMORY_INDEXES:
        conn.execute(defs[name])
    conn.execute("RESET maintenance_work_mem")
    indexed = time.perf_counter() - t1
    check(
        _index_definitions(conn) == defs,
        f"{row} the memory indexes were created again exactly as defined",
    )
    # The tables the load filled besides memory (which the caller vacuums): otherwise autovacuum
    # finds a million new rows in each and works through them while the row is being measured.
    conn.execute("VACUUM ANALYZE aidb_memory.memory_lexeme")
    conn.execute("VACUUM ANALYZE aidb_memory.memory_word")
    return inserted, indexed


def build_memories(conn: psycopg.Connection[Any], total: int) -> dict[str, Any]:
    """(e): ``total`` memories in namespace NS, every tenth one ACTOR's (so ACTOR's are spread over
    the whole table, as a long-lived actor's would be), the others spread over many actors with
    OTHER_ACTOR_MEMORIES each; generated in SQL as the superuser, without embeddings (the
    namespace has no embedding model: search fuses full text and near words), by
    :func:`bulk_insert`."""
    per_actor, _ = memory_shape(total)
    groups = per_actor // OTHER_ACTOR_MEMORIES
    found = conn.execute("SELECT id FROM aidb_memory.namespace WHERE name = %s", (NS,)).fetchone()
    assert found is not None
    ns_id = found[0]
    # Row g (0-based): ACTOR's sentence g / 10 when g is a multiple of 10; otherwise actor
    # 'user-<g mod 10>-<(g / 10) mod groups>', whose 100 rows get sentences that are all different.
    # created_at: 10 s apart, in row order.
    t0 = time.perf_counter()
    inserted, indexed = bulk_insert(
        conn,
        f"""
        INSERT INTO aidb_memory.memory
            (actor_key, namespace_id, actor_id, content, content_hash, valid_from, created_at,
             updated_at, lexemes)
        SELECT aidb_memory.actor_key(%(name)s, s.actor), %(ns)s, s.actor, x.c, md5(x.c), s.at,
               s.at, s.at, to_tsvector('pg_catalog.english', x.c)
        FROM (SELECT CASE WHEN mod(g, 10) = 0 THEN %(actor)s
                          ELSE 'user-' || mod(g, 10) || '-' || mod(g / 10, %(groups)s) END AS actor,
                     mod(mod(g / 10, %(m)s) * {MEMORY_MULT}, %(m)s) AS j,
                     mod(mod(g / 10, %(m)s) * {MEMORY_MULT}, %(m)s) / 10 AS q,
                     timestamptz '2025-01-01 00:00:00+00' + g * interval '10 seconds' AS at
              FROM generate_series(0::bigint, %(total)s - 1) AS g) AS s,
             LATERAL (SELECT {MEMORY_CONTENT_SQL.replace("%", "%%")} AS c) AS x
        """,
        {
            "ns": ns_id,
            "name": NS,
            "actor": ACTOR,
            "groups": groups,
            "m": per_actor,
            "total": total,
        },
        ns_id,
        "(e)",
    )
    t2 = time.perf_counter()
    conn.execute("VACUUM ANALYZE aidb_memory.memory")
    analyzed = time.perf_counter() - t2
    size = conn.execute(
        "SELECT pg_relation_size('aidb_memory.memory'), "
        "pg_total_relation_size('aidb_memory.memory')"
    ).fetchone()
    assert size is not None
    gen = {
        "total": total,
        "of_actor": per_actor,
        "other_actors": 9 * groups,
        "insert_s": round(inserted, 1),
        "indexes_s": round(indexed, 1),
        "vacuum_analyze_s": round(analyzed, 1),
        "seconds": round(time.perf_counter() - t0, 1),
        "table_mb": round(size[0] / 2**20),
        "table_and_indexes_mb": round(size[1] / 2**20),
    }
    say(
        f"  {total:,} memories ({per_actor:,} of '{ACTOR}', {9 * groups:,} other actors with "
        f"{OTHER_ACTOR_MEMORIES} each): inserted in {inserted:.1f} s, indexes {indexed:.1f} s, "
        f"VACUUM ANALYZE {analyzed:.1f} s; {gen['table_and_indexes_mb']} MB with indexes"
    )
    return gen


def load_memories(dsn: str, total: int) -> dict[str, Any]:
    """For a row run alone on (e)'s memories: the namespace, then ``build_memories``."""
    with connect(dsn) as setup:
        setup.execute(INIT, (NS,))
        say(f"bench: generating {total:,} memories for (e)")
        return build_memories(setup, total)
