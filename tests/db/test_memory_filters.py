"""Issue 34, item 4: filters on search and list_memories.

What a filter selects is held against a reference written here from the documented semantics
(filtering.py's docstring), on generated filters over memories with generated metadata: the
database and the reference must select the same memories, every time."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import APP_USER, Database
from plans import memory_scans

NS = "filtered"
MISSING = object()
# Small domains, so that generated filters select some memories and not others.
NAMES = ["a", "b", "c.d"]
SCALARS = [None, True, False, 0, 1, 1.0, 2.5, -3, "x", "y", "ab", "Z", ""]
TEXTS = [None, "x", "y"]


# --- the reference ------------------------------------------------------------------------------


def _json_equal(x: Any, y: Any) -> bool:
    """jsonb equality: numbers by value (1 = 1.0), booleans only with booleans."""
    if isinstance(x, bool) or isinstance(y, bool):
        return type(x) is type(y) and x == y
    if isinstance(x, int | float) and isinstance(y, int | float):
        return x == y
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_json_equal(a, b) for a, b in zip(x, y, strict=True))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_json_equal(x[k], y[k]) for k in x)
    return type(x) is type(y) and x == y


def _value(memory: dict[str, Any], field: str) -> tuple[str, Any]:
    if field in ("created_at", "updated_at"):
        return "time", memory[field]
    if field in ("agent_id", "session_id", "key"):
        return "text", memory[field]
    node: Any = memory["metadata"]
    for part in field.removeprefix("metadata.").split("."):
        if not isinstance(node, dict) or part not in node:
            return "json", MISSING
        node = node[part]
    return "json", node


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _leaf(kind: str, x: Any, op: str, v: Any) -> bool:
    absent = x is MISSING if kind == "json" else x is None
    if op == "$exists":
        return (not absent) is v
    if op in ("$in", "$nin"):
        found = any(_leaf(kind, x, "$eq", item) for item in v)
        return found if op == "$in" else not found
    if kind == "time":
        v = datetime.fromisoformat(v)
        v = v if v.tzinfo else v.replace(tzinfo=UTC)
    if op in ("$eq", "$ne"):
        if kind == "json":
            same = not absent and _json_equal(x, v)
        else:
            same = x is None if v is None else (x is not None and x == v)
        return same if op == "$eq" else not same
    if absent:
        return False
    if kind == "json":
        ok = _is_number(x) if _is_number(v) else isinstance(x, str)
        if not ok:
            return False
    compare = {"$gt": x > v, "$gte": x >= v, "$lt": x < v, "$lte": x <= v}
    return compare[op]


def _matches(memory: dict[str, Any], f: dict[str, Any]) -> bool:
    for name, cond in f.items():
        if name == "$and":
            ok = all(_matches(memory, c) for c in cond)
        elif name == "$or":
            ok = any(_matches(memory, c) for c in cond)
        elif name == "$not":
            ok = not _matches(memory, cond)
        else:
            kind, x = _value(memory, name)
            ops = cond.items() if isinstance(cond, dict) and cond and all(
                k.startswith("$") for k in cond) else [("$eq", cond)]  # fmt: skip
            ok = all(_leaf(kind, x, op, v) for op, v in ops)
        if not ok:
            return False
    return True


# --- generated filters --------------------------------------------------------------------------

_ORDERABLE = st.sampled_from([0, 1, 2.5, -3, "x", "ab", "Z", ""])


def _condition(field: str) -> st.SearchStrategy[Any]:
    value: st.SearchStrategy[Any]
    if field in ("created_at", "updated_at"):
        value = ordered = st.sampled_from(
            ["2025-01-01T00:00:05Z", "2025-01-01T00:00:10", "2025-01-02"]
        )
    elif field in ("agent_id", "session_id", "key"):
        value, ordered = st.sampled_from(TEXTS), st.sampled_from(["x", "y", "a"])
    else:
        value, ordered = st.sampled_from([*SCALARS, [1, 2], {"e": 1}]), _ORDERABLE
    return st.one_of(
        value,
        st.dictionaries(st.sampled_from(["$eq", "$ne"]), value, min_size=1),
        st.dictionaries(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), ordered, min_size=1),
        st.dictionaries(st.sampled_from(["$in", "$nin"]), st.lists(value, max_size=3), min_size=1),
        st.fixed_dictionaries({"$exists": st.booleans()}),
    )


_FIELDS = st.sampled_from(
    [*NAMES, "metadata.a", "created_at", "updated_at", "agent_id", "session_id", "key"]
)
_LEAF = _FIELDS.flatmap(lambda f: st.fixed_dictionaries({f: _condition(f)}))
_FILTERS = st.recursive(
    _LEAF,
    lambda inner: st.one_of(
        st.fixed_dictionaries({"$and": st.lists(inner, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"$or": st.lists(inner, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"$not": inner}),
        st.lists(inner, min_size=2, max_size=3).map(
            lambda fs: {k: v for f in fs for k, v in f.items()}
        ),
    ),
    max_leaves=6,
)


@pytest.fixture
def memories(db: Database) -> tuple[Database, list[dict[str, Any]]]:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    rng = random.Random(34)
    for i in range(40):
        metadata: dict[str, Any] = {}
        for name in NAMES:
            if rng.random() < 0.6:
                value = rng.choice([*SCALARS, [1, 2], {"e": 1}])
                if "." in name:
                    head, tail = name.split(".")
                    metadata.setdefault(head, {})[tail] = value
                else:
                    metadata[name] = value
        key = rng.choice([None, None, f"k{i}"])
        db.sql(
            "SELECT aidb_memory.remember(%s, 'alice', %s, session_id => %s, agent_id => %s, "
            "metadata => %s, key => %s)",
            (NS, f"fact number {i} tea", rng.choice(TEXTS), rng.choice(TEXTS),
             json.dumps(metadata), key),
            user=APP_USER,
        )  # fmt: skip
    # Times the filters can split: one memory every second from 2025-01-01 00:00:00 UTC.
    db.sql(
        "UPDATE aidb_memory.memory m SET created_at = t.at, updated_at = t.at + interval '1 day' "
        "FROM (SELECT id, timestamptz '2025-01-01 00:00:00+00' + (row_number() OVER (ORDER BY id)"
        " - 1) * interval '1 second' AS at FROM aidb_memory.memory) t WHERE t.id = m.id"
    )
    out = []
    for r in db.sql(
        "SELECT public_id::text, metadata, created_at, updated_at, agent_id, session_id, key "
        "FROM aidb_memory.memory ORDER BY id"
    ):
        out.append(dict(zip(["id", "metadata", "created_at", "updated_at", "agent_id",
                             "session_id", "key"], r, strict=True)))  # fmt: skip
    return db, out


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(f=_FILTERS)
def test_list_memories_selects_what_the_reference_does(
    memories: tuple[Database, list[dict[str, Any]]], f: dict[str, Any]
) -> None:
    db, rows = memories
    want = {r["id"] for r in rows if _matches(r, f)}
    try:
        got = db.sql(
            "SELECT id::text FROM aidb_memory.list_memories(%s, 'alice', \"limit\" => 1000, "
            "filter => %s)",
            (NS, json.dumps(f)),
            user=APP_USER,
        )
    except psycopg.errors.InvalidParameterValue as e:
        # Over the node cap (64) is the only refusal a generated filter may meet.
        assert "conditions, the namespace limit" in str(e), (f, e)
        return
    assert {r[0] for r in got} == want, f
    # search ranks among the same memories (every memory holds "tea").
    found = db.sql(
        "SELECT id::text FROM aidb_memory.search(%s, 'alice', 'tea', \"limit\" => 100, "
        "filter => %s)",
        (NS, json.dumps(f)),
        user=APP_USER,
    )
    assert {r[0] for r in found} == want, f


# --- paging (item 6) ----------------------------------------------------------------------------


def test_list_memories_pages_through_every_memory_by_a_cursor(db: Database) -> None:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    for i in range(25):
        db.sql(
            "SELECT aidb_memory.remember(%s, 'alice', %s, metadata => %s)",
            (NS, f"fact {i}", json.dumps({"even": i % 2 == 0})),
            user=APP_USER,
        )
    # Two memories of one instant: the id orders them.
    db.sql(
        "UPDATE aidb_memory.memory SET created_at = '2025-01-01' "
        "WHERE content IN ('fact 3', 'fact 4')"
    )

    def page(after: str | None, f: dict[str, Any] | None = None) -> list[str]:
        rows = db.sql(
            "SELECT id::text FROM aidb_memory.list_memories(%s, 'alice', \"limit\" => 4, "
            "filter => %s, after => %s)",
            (NS, None if f is None else json.dumps(f), after),
            user=APP_USER,
        )
        return [r[0] for r in rows]

    for f in (None, {"even": True}):
        text = None if f is None else json.dumps(f)
        everything = [r[0] for r in db.sql(
            "SELECT id::text FROM aidb_memory.list_memories(%s, 'alice', \"limit\" => 1000, "
            "filter => %s)", (NS, text), user=APP_USER)]  # fmt: skip
        paged: list[str] = []
        after = None
        while batch := page(after, f):
            paged += batch
            after = batch[-1]
        assert paged == everything, f
        assert len(paged) == (25 if f is None else 13)
    with db.connect(APP_USER) as conn, pytest.raises(psycopg.errors.InvalidParameterValue) as info:
        conn.execute(
            "SELECT * FROM aidb_memory.list_memories(%s, 'bob', after => %s)", (NS, paged[0])
        )
    assert str(info.value).startswith(
        "aidb_memory.list_memories: after is not a memory of the actor"
    )


def test_search_offset_skips_the_best(db: Database) -> None:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    for i in range(12):
        db.sql(
            "SELECT aidb_memory.remember(%s, 'alice', %s)",
            (NS, "tea " * (i + 1) + f"number {i}"),
            user=APP_USER,
        )

    def ids(**kwargs: Any) -> list[str]:
        names = "".join(f', "{k}" => %({k})s' for k in kwargs)
        return [r[0] for r in db.sql(
            f"SELECT id::text FROM aidb_memory.search(%(ns)s, 'alice', 'tea'{names})",
            {"ns": NS, **kwargs}, user=APP_USER)]  # fmt: skip

    best = ids(limit=12)
    assert len(best) == 12
    assert ids(limit=5, offset=0) == best[:5]
    assert ids(limit=5, offset=5) == best[5:10]
    assert ids(limit=5, offset=10) == best[10:]
    assert ids(limit=5, offset=12) == []
    for bad in (-1, 1001):
        with db.connect(APP_USER) as conn, pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute(
                "SELECT * FROM aidb_memory.search(%s, 'alice', 'tea', \"offset\" => %s)", (NS, bad)
            )


# --- the index answers a filter's equalities (bench (l)) -----------------------------------------


def _search_ids(db: Database, f: dict[str, Any]) -> set[str]:
    rows = db.sql(
        "SELECT id::text FROM aidb_memory.search(%s, 'alice', 'tea', \"limit\" => 100, "
        "filter => %s)",
        (NS, json.dumps(f)),
        user=APP_USER,
    )
    return {r[0] for r in rows}


def test_a_filtered_search_reads_only_the_memories_its_filter_selects(db: Database) -> None:
    """A filter that keeps 1% of the memories holding the words: memory_lexemes_idx is asked for
    the words and the filter's equality together, so the search reads the 20 memories it keeps,
    not the 2,000 holding "tea" (where each was read and the filter tested on it)."""
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    db.sql(
        "INSERT INTO aidb_memory.memory (actor_key, namespace_id, actor_id, content, "
        "content_hash, lexemes, metadata) "
        "SELECT aidb_memory.actor_key(%s, 'alice'), n.id, 'alice', 'tea fact ' || g, "
        "md5('f' || g), to_tsvector('english', 'tea fact ' || g), "
        'CASE WHEN g %% 100 = 0 THEN \'{"pinned": true, "n": 2}\'::jsonb '
        '     ELSE \'{"pinned": false, "n": 2.0}\'::jsonb END '
        "FROM aidb_memory.namespace n, generate_series(1, 2000) g WHERE n.name = %s",
        (NS, NS),
    )
    db.sql("ANALYZE aidb_memory.memory")
    query = "SELECT id FROM aidb_memory.search(%s, 'alice', 'tea', \"limit\" => 100, filter => %s)"
    with db.connect() as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        scans = memory_scans(conn, query, (NS, json.dumps({"pinned": True, "n": 2})))
    conditions = [
        c.get("Index Cond", "") for s in scans for c in [s, *s.get("Plans", ())]
    ]  # fmt: skip
    assert any("metadata_entries" in c for c in conditions), conditions
    # Each source of candidates (those holding every word; then each word's) reads the 20.
    read = [s["Actual Rows"] for s in scans if s["Node Type"] == "Bitmap Heap Scan"]
    removed = sum(s.get("Rows Removed by Filter", 0) for s in scans)
    assert read and max(read) == 20 and removed == 0, (read, removed)
    assert len(_search_ids(db, {"pinned": True, "n": 2})) == 20
    assert len(_search_ids(db, {"pinned": False})) == 100, "the best 100 of 1,980"


def test_what_the_index_holds_follows_the_metadata(db: Database) -> None:
    """Numbers by value, nested objects by dotted path, arrays by index (not in the index: the
    filter alone selects), a long string, and metadata changed by update_memory, by a keyed put
    and by an UPDATE of the column: the filtered search finds what the filter selects, always."""
    db.sql("SELECT aidb_memory.init(%s)", (NS,))

    def remember(text: str, metadata: dict[str, Any], key: str | None = None) -> str:
        rows = db.sql(
            "SELECT aidb_memory.remember(%s, 'alice', %s, metadata => %s, key => %s)::text",
            (NS, text, json.dumps(metadata), key),
            user=APP_USER,
        )
        return str(rows[0][0])

    long = "x" * 3900
    a = remember("tea one", {"n": 100, "f": 1.50, "a": {"b": {"c": "deep"}}, "s": long})
    b = remember("tea two", {"tags": ["red", "blue"], "a": {"b": None}})
    c = remember("tea three", {"who": "ann"}, key="k")
    assert _search_ids(db, {"n": 1e2}) == _search_ids(db, {"n": 100.0}) == {a}
    assert _search_ids(db, {"f": 1.5, "a.b.c": "deep", "s": long}) == {a}
    assert _search_ids(db, {"a.b": None}) == {b}
    assert _search_ids(db, {"tags.0": "red"}) == _search_ids(db, {"tags.-1": "blue"}) == {b}
    assert _search_ids(db, {"who": "ann"}) == {c}
    db.sql(
        "SELECT * FROM aidb_memory.update_memory(%s, 'alice', %s, metadata => %s)",
        (NS, a, json.dumps({"n": 7})),
        user=APP_USER,
    )
    assert _search_ids(db, {"n": 100}) == set()
    assert _search_ids(db, {"n": 7}) == {a}
    assert remember("tea three again", {"who": "bo"}, key="k") == c
    assert _search_ids(db, {"who": "ann"}) == set()
    assert _search_ids(db, {"who": "bo"}) == {c}
    db.sql('UPDATE aidb_memory.memory SET metadata = \'{"who": "cy"}\' WHERE public_id = %s', (b,))
    assert _search_ids(db, {"who": "cy"}) == {b}


def test_filters_of_one_text_with_and_without_index_entries_share_a_connection(
    db: Database,
) -> None:
    """{"a": "x"} and {"a": ["x"]} compile to the same condition, and only the first has an
    index entry (a scalar): a plan kept by its statement's text must not take the parameters of
    the other (the entries' parameters are the search's alone, never the listing's)."""
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    for metadata in ({"a": "x"}, {"a": ["x"]}):
        db.sql(
            "SELECT aidb_memory.remember(%s, 'alice', %s, metadata => %s)",
            (NS, f"tea with {json.dumps(metadata)}", json.dumps(metadata)),
            user=APP_USER,
        )
    with db.connect(APP_USER) as conn:
        for f, want in (({"a": "x"}, {"x"}), ({"a": ["x"]}, {"['x']"}), ({"a": "x"}, {"x"})):
            for call in (
                "SELECT metadata FROM aidb_memory.list_memories(%s, 'alice', filter => %s)",
                "SELECT metadata FROM aidb_memory.search(%s, 'alice', 'tea', filter => %s)",
            ):
                rows = conn.execute(call, (NS, json.dumps(f))).fetchall()
                assert {str(r[0]["a"]) for r in rows} == want, (call, f)
