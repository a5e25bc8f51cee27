"""Issue 15, item 3, at run time: every hot API call reads the per-actor tables by index access on
the distribution key.

Each hot call runs as the application role under auto_explain (every nested statement's plan,
as JSON, sent to the client as a NOTICE), with sequential scans disabled: the tables are tiny,
and what is tested is that an index by actor_key can serve every scan, not which plan the planner
prefers. Every scan node on a per-actor table must be an Index Scan or Index Only Scan whose
Index Cond names actor_key, or a Bitmap Heap Scan over Bitmap Index Scans whose Index Cond names
it (a GIN index's too). Statements are named by where they are in the server code
(tests/actor_key_rule.py finds them), else by their first line; the test prints, per hot call,
every statement it saw.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

import actor_key_rule as rule
from conftest import APP_USER, Database

NS = "keyed"
AUTO_EXPLAIN = Path("/usr/lib/postgresql/15/lib/auto_explain.so")
REPO = Path(__file__).resolve().parents[2]
KEY = re.compile(r"\bactor_key\b")
BITMAP_CHILDREN = ("Bitmap Index Scan", "BitmapAnd", "BitmapOr")


@dataclass
class Seen:
    """One statement's plan: where it comes from, and what it scans."""

    where: str
    scans: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _walk(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _walk(child)


def _keyed_bitmap(node: dict[str, Any]) -> bool:
    """Whether a bitmap (index scan, AND, OR) can only return rows of the key it names."""
    kind = node["Node Type"]
    children = node.get("Plans", ())
    if kind == "Bitmap Index Scan":
        return bool(KEY.search(node.get("Index Cond", "")))
    if kind == "BitmapAnd":
        return any(_keyed_bitmap(c) for c in children)
    if kind == "BitmapOr":
        return bool(children) and all(_keyed_bitmap(c) for c in children)
    return False


def _check(plan: dict[str, Any], tables_of: dict[str, str], seen: Seen) -> None:
    """Record each scan of a per-actor table in ``plan`` and what is wrong with it."""
    for node in _walk(plan):
        kind = node["Node Type"]
        if kind in BITMAP_CHILDREN or kind == "ModifyTable":
            continue  # a bitmap is judged by its heap scan; a write's rows come from below it
        table = node.get("Relation Name") or tables_of.get(node.get("Index Name", ""))
        if table not in rule.PER_ACTOR_TABLES:
            continue
        index = node.get("Index Name")
        if kind in ("Index Scan", "Index Only Scan"):
            cond = node.get("Index Cond", "")
            seen.scans.append(f"{table}: {kind} using {index} on {cond}")
            if not KEY.search(cond):
                seen.problems.append(f"{table}: {kind} using {index} without actor_key: {cond!r}")
        elif kind == "Bitmap Heap Scan":
            bitmaps = node.get("Plans", ())
            conds = [c.get("Index Cond", c["Node Type"]) for b in bitmaps for c in _walk(b)]
            names = [c.get("Index Name") for b in bitmaps for c in _walk(b) if "Index Name" in c]
            seen.scans.append(f"{table}: Bitmap Heap Scan using {', '.join(names)} on {conds}")
            if not bitmaps or not all(_keyed_bitmap(b) for b in bitmaps):
                seen.problems.append(
                    f"{table}: Bitmap Heap Scan using {', '.join(names)} without actor_key: "
                    f"{conds!r}"
                )
        else:
            seen.scans.append(f"{table}: {kind}")
            seen.problems.append(f"{table}: {kind} (not an index access by actor_key)")


def _normal(text: str) -> str:
    return " ".join(text.split())


class Places:
    """Where the server's statements are, by their text as the server runs it: a value the
    collector could not resolve, and pg_trgm's schema (extensions.trgm_sql), match anything."""

    def __init__(self) -> None:
        server = rule.collect(REPO)
        self.exact: dict[str, str] = {}
        self.patterns: list[tuple[re.Pattern[str], str]] = []
        for statement in server.statements:
            text, where = _normal(statement.text), f"{statement.where} `{statement.first_line}`"
            self.exact[text] = where
            pattern = re.escape(text)
            for wildcard, matches in ((rule.UNRESOLVED, ".*?"), ('"@trgm@"', r"[^\s.]+")):
                pattern = pattern.replace(re.escape(wildcard), matches)
            if pattern != re.escape(text):
                self.patterns.append((re.compile(pattern, re.S), where))

    def get(self, text: str) -> str | None:
        text = _normal(text)
        if text in self.exact:
            return self.exact[text]
        return next((where for pattern, where in self.patterns if pattern.fullmatch(text)), None)


@pytest.fixture(scope="module")
def places() -> Places:
    return Places()


class Tracer:
    """A connection as the application role whose nested statements' plans are reported."""

    def __init__(self, db: Database, places: Places) -> None:
        self.conn = db.connect()
        self.notices: list[str] = []
        self.places = places
        self.tables_of = {
            name: table
            for name, table in self.conn.execute(
                "SELECT indexrelid::regclass::text, indrelid::regclass::text "
                "FROM pg_index WHERE indrelid::regclass::text LIKE 'aidb_memory.%'"
            ).fetchall()
        }
        self.tables_of = {k.split(".")[-1]: v.split(".")[-1] for k, v in self.tables_of.items()}
        self.conn.add_notice_handler(lambda d: self.notices.append(d.message_primary or ""))
        for setting in (
            "LOAD 'auto_explain'",
            "SET auto_explain.log_min_duration = 0",
            "SET auto_explain.log_nested_statements = on",
            "SET auto_explain.log_format = 'json'",
            "SET auto_explain.log_level = 'notice'",  # to this client only, as a NOTICE
            "SET enable_seqscan = off",
            f"SET ROLE {APP_USER}",
        ):
            self.conn.execute(setting)
        self.calls: dict[str, list[Seen]] = {}
        self.plans: list[tuple[str, str, dict[str, Any]]] = []  # (call, where, plan): all of them

    def call(self, name: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one hot call; its statements' plans are checked under ``name``. A call that
        fails is a problem of its own (the others still run: the report is complete)."""
        self.notices.clear()
        seen = self.calls.setdefault(name, [])
        try:
            cur = self.conn.execute(query, params)
            rows = cur.fetchall() if cur.description else []
        except psycopg.Error as e:
            failed = Seen(f"`{' '.join(query.split())}`")
            failed.problems.append(f"the call failed: {e.sqlstate} {e.diag.message_primary}")
            seen.append(failed)
            rows = []
        for text in self.notices:
            _, sep, body = text.partition("plan:")
            if not sep:
                continue
            explained = json.loads(body)
            query_text = explained.get("Query Text", "")
            if _normal(query_text) == _normal(query):
                continue  # the call itself
            where = self.places.get(_normal(query_text))
            if where is None:
                lines = [line.strip() for line in query_text.splitlines() if line.strip()]
                where = f"`{lines[0] if lines else query_text}`"
            self.plans.append((name, where, explained["Plan"]))
            one = Seen(where)
            _check(explained["Plan"], self.tables_of, one)
            if one.scans:
                seen.append(one)
        return rows

    def close(self) -> None:
        self.conn.close()


def _setup(db: Database) -> dict[str, Any]:
    """A namespace whose compaction needs no network (the builtin summarizer), memories of two
    actors with history, as the extraction worker leaves them."""
    db.sql("SELECT aidb_memory.create_model('quotes', 'builtin', '{\"kind\": \"extractive\"}')")
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "quotes"}\'::jsonb)', (NS,))
    ids = {}
    for actor in ("alice", "bob"):
        for fact in ("prefers green tea", "lives in Lisbon", "has a cat called Miso"):
            content = f"{actor.title()} {fact}"
            ids[content] = db.value(
                """INSERT INTO aidb_memory.memory
                       (actor_key, namespace_id, actor_id, content, content_hash, lexemes)
                   SELECT aidb_memory.actor_key(n.name, %s), n.id, %s, %s, md5(%s),
                          to_tsvector('english', %s)
                   FROM aidb_memory.namespace n WHERE n.name = %s
                   RETURNING public_id::text""",
                (actor, actor, content, content, content, NS),
            )
    db.sql(
        """INSERT INTO aidb_memory.memory_history
               (actor_key, memory_id, namespace_id, actor_id, operation, new_content)
           SELECT m.actor_key, m.id, m.namespace_id, m.actor_id, 'add', m.content
           FROM aidb_memory.memory m"""
    )
    db.sql("ANALYZE")
    return ids


TOOL_ROUND = [
    {"role": "user", "content": "What is the weather in Lisbon?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Lisbon"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24 C"},
    {"role": "assistant", "content": "It is sunny and 24 C in Lisbon."},
]


def _exchange(i: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"question {i:04d} ".ljust(100, "q")},
        {"role": "assistant", "content": f"answer {i:04d} ".ljust(100, "a")},
    ]


def _run_hot_calls(t: Tracer, ids: dict[str, Any]) -> None:
    """Every hot API function, on its common paths."""
    start = "SELECT * FROM aidb_memory.session_start(%s, 'alice', NULL, %s)"
    t.call("session_start", start, (NS, "s1"))
    t.call("session_start", start, (NS, "s1"))  # resumed
    t.call("session_start", start, (NS, "s2"))
    add = "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, %s)"
    t.call("add", add, (NS, json.dumps(TOOL_ROUND), "s1"))  # the general path
    t.call("add", add, (NS, json.dumps(_exchange(0)), "s1"))  # the one-statement path
    t.call("add", add, (NS, json.dumps(_exchange(1)), "s-new"))  # a session created on use
    t.call("add", "SELECT aidb_memory.add(%s, 'alice', %s::jsonb)", (NS, json.dumps(_exchange(2))))
    keyed = "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, %s, idempotency_key => 'k1')"
    event = next(iter(t.call("add", keyed, (NS, json.dumps(_exchange(3)), "s1"))), (None,))[0]
    t.call("add", keyed, (NS, json.dumps(_exchange(3)), "s1"))  # replayed
    for i in range(4, 24):
        t.call("add", add, (NS, json.dumps(_exchange(i)), "s2"))
    get = "SELECT * FROM aidb_memory.session_get(%s, 'alice', %s, %s)"
    t.call("session_get", get, (NS, "s1", None))
    t.call("session_get", get, (NS, "s1", 100_000))
    t.call("session_get", get, (NS, "s2", 1000))  # compacts (the builtin summarizer)
    t.call("session_get", get, (NS, "s2", 1000))  # reads the summary
    t.call(
        "session_get",
        "SELECT * FROM aidb_memory.session_get(%s, 'alice', 's1', limit_items => 3)",
        (NS,),
    )
    messages = "SELECT aidb_memory.session_messages(%s, 'alice', %s, %s, format => %s)"
    t.call("session_messages", messages, (NS, "s1", None, "chat"))
    t.call("session_messages", messages, (NS, "s1", 100_000, "responses"))
    t.call("session_messages", messages, (NS, "s2", 1000, "chat"))
    t.call("session_list", "SELECT * FROM aidb_memory.session_list(%s, 'alice')", (NS,))
    t.call(
        "session_list",
        "SELECT * FROM aidb_memory.session_list(%s, 'alice', NULL, false, 10)",
        (NS,),
    )
    t.call("status", "SELECT aidb_memory.status(%s, 'alice', %s)", (NS, event))
    pop = "SELECT aidb_memory.session_pop(%s, 'alice', %s)"
    t.call("session_pop", pop, (NS, "s1"))
    t.call("session_pop", pop, (NS, "s2"))  # under a summary: the summary goes too
    search = "SELECT * FROM aidb_memory.search(%s, 'alice', %s)"
    t.call("search", search, (NS, "green tea"))
    t.call("search", search, (NS, "Lisbn"))  # one edit away: the trigram word index
    remember = "SELECT aidb_memory.remember(%s, 'alice', %s)"
    t.call("remember", remember, (NS, "Alice rides a red bicycle"))
    t.call("remember", remember, (NS, "alice rides a RED bicycle"))  # the exact duplicate
    t.call("list_memories", "SELECT * FROM aidb_memory.list_memories(%s, 'alice')", (NS,))
    t.call(
        "list_memories",
        "SELECT * FROM aidb_memory.list_memories(%s, 'alice', include_superseded => true)",
        (NS,),
    )
    delete = "SELECT aidb_memory.delete(%s, 'alice', %s::jsonb, 'test')"
    t.call("delete", delete, (NS, json.dumps({"ids": [ids["Alice prefers green tea"]]})))
    t.call("delete", delete, (NS, json.dumps({"before": "2000-01-01T00:00:00Z"})))
    end = "SELECT * FROM aidb_memory.session_end(%s, 'alice', %s, 'notes')"
    t.call("session_end", end, (NS, "s1"))
    t.call("session_end", end, (NS, "s1"))  # the stored handoff
    t.call("session_start", start, (NS, "s3"))  # the previous handoff
    t.call(
        "session_delete",
        "SELECT aidb_memory.session_delete(%s, 'alice', 's-new', 'test')",
        (NS,),
    )
    t.call("forget", "SELECT aidb_memory.forget(%s, 'alice', 'test')", (NS,))


@pytest.mark.skipif(not AUTO_EXPLAIN.exists(), reason="auto_explain (postgresql-contrib) missing")
def test_every_hot_call_reads_per_actor_tables_by_index_on_the_key(
    db: Database, places: Places
) -> None:
    ids = _setup(db)
    tracer = Tracer(db, places)
    try:
        _run_hot_calls(tracer, ids)
    finally:
        tracer.close()
    report = []
    problems = []
    for call, seen in tracer.calls.items():
        report.append(f"{call}:")
        for one in seen:
            report.append(f"  {one.where}")
            report.extend(f"      {scan}" for scan in one.scans)
            problems.extend((call, one.where, p) for p in one.problems)
    print("\n".join(report))
    assert set(tracer.calls) == set(rule.HOT_FUNCTIONS)
    for call, seen in tracer.calls.items():
        if not any(one.scans for one in seen):
            problems.append((call, "", "no plan of a per-actor table seen"))
    # each once, in the order met (the plans of one statement differ in their constants only)
    unique: dict[tuple[str, str, str], str] = {}
    for call, where, problem in problems:
        unique.setdefault(
            (call, where, problem.partition(" without")[0]), f"{call}: {where}: {problem}"
        )
    assert not unique, (
        f"{len(unique)} problems (scans of per-actor tables without index access by actor_key, "
        "failed calls):\n" + "\n".join(unique.values())
    )


PARALLEL_NODES = ("Gather", "Gather Merge")


def _parallel(plan: dict[str, Any]) -> list[str]:
    """The nodes of ``plan`` that start or feed parallel workers."""
    return [
        node.get("Relation Name") or node["Node Type"]
        for node in _walk(plan)
        if node["Node Type"] in PARALLEL_NODES or node.get("Parallel Aware")
    ]


@pytest.mark.skipif(not AUTO_EXPLAIN.exists(), reason="auto_explain (postgresql-contrib) missing")
def test_no_hot_call_starts_parallel_workers(db: Database, places: Places) -> None:
    """Issue 33: a parallel plan of one actor's rows starts workers (~7 ms) for a read of well
    under a millisecond. session_get's generic plan went parallel whenever the statistics of
    `turn` promised a few thousand rows (make bench (b): ten times slower until the next
    ANALYZE). Here parallelism costs the planner nothing, so any statement that could run in
    parallel would: none that reads a per-actor table may, under any statistics (migration
    0020: parallel_workers = 0). The catalog's own small tables (the runtime's code, read once
    per connection) never reach min_parallel_table_scan_size and are not judged here."""
    ids = _setup(db)
    tracer = Tracer(db, places)
    try:
        for setting in (
            "parallel_setup_cost = 0",
            "parallel_tuple_cost = 0",
            "min_parallel_table_scan_size = 0",
            "min_parallel_index_scan_size = 0",
            "enable_seqscan = on",
        ):
            tracer.conn.execute(f"SET {setting}")
        _run_hot_calls(tracer, ids)
    finally:
        tracer.close()
    assert {call for call, _, _ in tracer.plans} == set(rule.HOT_FUNCTIONS)
    parallel = {
        f"{call}: {where}: {', '.join(nodes)}"
        for call, where, plan in tracer.plans
        if (nodes := _parallel(plan))
        and any(n.get("Relation Name") in rule.PER_ACTOR_TABLES for n in _walk(plan))
    }
    assert not parallel, "parallel plans:\n" + "\n".join(sorted(parallel))


def test_the_parallel_check_sees_workers() -> None:
    gather = {
        "Node Type": "Gather Merge",
        "Plans": [
            {"Node Type": "Bitmap Heap Scan", "Relation Name": "turn", "Parallel Aware": True}
        ],
    }
    assert _parallel({"Node Type": "Result", "Plans": [gather]}) == ["Gather Merge", "turn"]
    assert _parallel({"Node Type": "Index Scan", "Relation Name": "turn"}) == []


def test_the_plan_checker_refuses_what_is_not_keyed() -> None:
    tables = {"turn_pkey": "turn", "memory_tsv_idx": "memory"}
    seq = {"Node Type": "Seq Scan", "Relation Name": "turn"}
    by_ref = {
        "Node Type": "Index Scan",
        "Relation Name": "turn",
        "Index Name": "turn_offset_idx",
        "Index Cond": "((session_ref = $1) AND (char_offset >= $2))",
    }
    keyed = dict(by_ref, **{"Index Cond": "((actor_key = $1) AND (session_ref = $2))"})
    bitmap = {
        "Node Type": "Bitmap Heap Scan",
        "Relation Name": "memory",
        "Plans": [
            {
                "Node Type": "BitmapAnd",
                "Plans": [
                    {
                        "Node Type": "Bitmap Index Scan",
                        "Index Name": "memory_tsv_idx",
                        "Index Cond": "((actor_key = '5'::bigint) AND (tsv @@ $3))",
                    },
                    {
                        "Node Type": "Bitmap Index Scan",
                        "Index Name": "memory_actor_idx",
                        "Index Cond": "(created_at < $1)",
                    },
                ],
            }
        ],
    }
    either = {
        "Node Type": "Bitmap Heap Scan",
        "Relation Name": "memory",
        "Plans": [dict(bitmap["Plans"][0], **{"Node Type": "BitmapOr"})],  # type: ignore[index]
    }
    other = {"Node Type": "Seq Scan", "Relation Name": "namespace"}
    for plan, bad in ((seq, True), (by_ref, True), (keyed, False), (bitmap, False)):
        seen = Seen("x")
        _check({"Node Type": "Nested Loop", "Plans": [other, plan]}, tables, seen)
        assert bool(seen.problems) == bad, (plan, seen.problems)
        assert len(seen.scans) == 1
    seen = Seen("x")
    _check(either, tables, seen)
    assert seen.problems, "an OR with an unkeyed side reads other actors' rows"


def test_auto_explain_is_installed() -> None:
    """The run-time test needs auto_explain (postgresql-contrib) next to the server."""
    if not AUTO_EXPLAIN.parent.exists():
        pytest.skip("not PostgreSQL 15's layout")
    assert AUTO_EXPLAIN.exists()
