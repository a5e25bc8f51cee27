"""Sessions (SPEC §3, §5 events, §6): the session API as an application calls it.

The seed examples of EDB AIDB's documentation run through psql exactly as written; the rest
checks idempotency (also under concurrency), the events each add records, scope and actor
binding, handoffs, undo, listing, auditing deletion, OpenAI messages and timestamps.
"""

from __future__ import annotations

import csv
import io
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from aidb_memory.throwaway import ThrowawayServer
from conftest import (
    ADMIN_USER,
    APP_USER,
    Database,
    _create_database,
    _drop_database,
    psql,
)

TIMEOUT_S = 30
NS = "helpdesk_namespace"

# --- the seed examples (seeds/003), verbatim ---------------------------------------------------

SEED_START = """SELECT session_id, started_at
FROM aidb_memory.session_start(
  namespace  => 'helpdesk_namespace',
  actor_id   => 'alice',
  agent_id   => 'helpdesk-agent-64849',
  session_id => 'conv-738949'
);"""

SEED_ADD = """SELECT aidb_memory.add(
  namespace       => 'helpdesk_namespace',
  actor_id        => 'alice',
  turns           => '[
    {"role": "user", "content": "my discount was not applied",
     "kind": "user_prompt", "meta": {"sequence_id": "s-01"}},
    {"role": "assistant", "content": "let me check the renewal history",
     "kind": "model_response", "meta": {"sequence_id": "s-01"}}
  ]'::jsonb,
  session_id      => 'conv-738949',
  agent_id        => 'helpdesk-agent-64849',
  idempotency_key => 'conv-738949-turn-001'
);"""

SEED_GET = """SELECT ord, item->>'role' AS role, item->>'content' AS content
FROM aidb_memory.session_get(
       namespace      => 'helpdesk_namespace',
       actor_id       => 'alice',
       session_id     => 'conv-738949',
       limit_chars    => 8000,
       fallback_model => '<fallback-model>'  -- used only if the namespace names no LLM
     ) s,
     jsonb_array_elements(s.items) WITH ORDINALITY AS t(item, ord);"""

SEED_END = """SELECT handoff
FROM aidb_memory.session_end(
  namespace  => 'helpdesk_namespace',
  actor_id   => 'alice',
  session_id => 'conv-738949',
  notes      => 'discount reapplied'
);"""

SEED_NEXT = """SELECT session_id, prev_handoff
FROM aidb_memory.session_start(
  namespace  => 'helpdesk_namespace',
  actor_id   => 'alice',
  agent_id   => 'helpdesk-agent-64849',
  session_id => 'conv-738950'
);"""


# --- helpers -----------------------------------------------------------------------------------


def _init(db: Database, name: str = NS, model_spec: Any = None, config: Any = None) -> int:
    ident = db.value(
        "SELECT aidb_memory.init(%s, %s::jsonb, %s::jsonb)",
        (name, json.dumps(model_spec or {}), json.dumps(config or {})),
        user=ADMIN_USER,
    )
    assert isinstance(ident, int)
    return ident


def _psql_rows(db: Database, query: str, user: str = APP_USER) -> list[dict[str, str]]:
    result = psql(db.dsn(user), "--csv", input=query)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    return list(csv.DictReader(io.StringIO(result.stdout)))


def _user(t: str, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": t, **extra}


def _assistant(t: str | None, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": t, **extra}


def _call(call_id: str, name: str = "lookup", arguments: str = '{"q": 1}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool(call_id: str, t: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": t}


Conn = psycopg.Connection[Any]


def _add(
    conn: Conn,
    turns: list[dict[str, Any]],
    session_id: str | None = "s1",
    actor: str = "alice",
    agent: str | None = None,
    key: str | None = None,
    ns: str = NS,
) -> str:
    row = conn.execute(
        """SELECT aidb_memory.add(namespace => %s, actor_id => %s, turns => %s::jsonb,
                                  session_id => %s, agent_id => %s, idempotency_key => %s)::text""",
        (ns, actor, json.dumps(turns), session_id, agent, key),
    ).fetchone()
    assert row is not None
    return str(row[0])


def _start(
    conn: Conn,
    session_id: str | None,
    actor: str = "alice",
    agent: str | None = None,
    ns: str = NS,
) -> dict[str, Any]:
    rows = conn.execute(
        """SELECT to_jsonb(s) FROM aidb_memory.session_start(
               namespace => %s, actor_id => %s, agent_id => %s, session_id => %s) s""",
        (ns, actor, agent, session_id),
    ).fetchall()
    assert len(rows) == 1
    return dict(rows[0][0])


def _end(
    conn: Conn, session_id: str, notes: str | None = None, actor: str = "alice", ns: str = NS
) -> list[tuple[Any, ...]]:
    return conn.execute(
        """SELECT handoff, closed_at FROM aidb_memory.session_end(
               namespace => %s, actor_id => %s, session_id => %s, notes => %s)""",
        (ns, actor, session_id, notes),
    ).fetchall()


def _get(
    conn: Conn,
    session_id: str = "s1",
    actor: str = "alice",
    limit_chars: int | None = None,
    limit_turns: int | None = None,
    ns: str = NS,
) -> dict[str, Any]:
    rows = conn.execute(
        """SELECT items, overflow_chars, compacted_entries, warnings
           FROM aidb_memory.session_get(namespace => %s, actor_id => %s, session_id => %s,
                                        limit_chars => %s, limit_turns => %s)""",
        (ns, actor, session_id, limit_chars, limit_turns),
    ).fetchall()
    assert len(rows) == 1
    items, overflow, compacted, warnings = rows[0]
    return {"items": items, "overflow": overflow, "compacted": compacted, "warnings": warnings}


def _pop(conn: Conn, session_id: str = "s1", actor: str = "alice") -> Any:
    row = conn.execute(
        "SELECT aidb_memory.session_pop(namespace => %s, actor_id => %s, session_id => %s)",
        (NS, actor, session_id),
    ).fetchone()
    assert row is not None
    return row[0]


def _messages(
    conn: Conn,
    session_id: str = "s1",
    limit_chars: int | None = None,
    limit_turns: int | None = None,
) -> list[dict[str, Any]]:
    row = conn.execute(
        """SELECT aidb_memory.session_messages(namespace => %s, actor_id => 'alice',
               session_id => %s, limit_chars => %s, limit_turns => %s)""",
        (NS, session_id, limit_chars, limit_turns),
    ).fetchone()
    assert row is not None
    return list(row[0])


def _error(conn_factory: Callable[[], Conn], query: str, params: Any = None) -> psycopg.Error:
    with conn_factory() as conn, pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    return info.value


def _app_error(db: Database, query: str, params: Any = None) -> psycopg.Error:
    return _error(lambda: db.connect(APP_USER), query, params)


def _stored(db: Database) -> dict[str, Any]:
    """Everything the session tables hold, in a comparable form."""
    out = {}
    for table in ("session", "turn", "event", "summary", "audit_log"):
        out[table] = db.sql(
            pgsql.SQL("SELECT to_jsonb(x)::text FROM aidb_memory.{} x ORDER BY 1").format(
                pgsql.Identifier(table)
            )
        )
    return out


def _turns(db: Database, session_id: str = "s1", actor: str = "alice") -> list[tuple[Any, ...]]:
    return db.sql(
        """SELECT t.seq, t.role, t.content, t.round_start, t.char_offset, t.chars
           FROM aidb_memory.turn t JOIN aidb_memory.session s ON s.id = t.session_ref
           WHERE s.actor_id = %s AND s.session_id = %s ORDER BY t.seq""",
        (actor, session_id),
    )


def _check_protocol(items: list[dict[str, Any]]) -> None:
    """No tool result without its call, and no call without all its results, in order."""
    open_calls: list[str] = []
    for item in items:
        if item["role"] == "tool":
            assert item["tool_call_id"] in open_calls, items
            open_calls.remove(item["tool_call_id"])
        else:
            assert open_calls == [], items
        if "tool_calls" in item:
            open_calls = [c["id"] for c in item["tool_calls"]]
    assert open_calls == [], items


# --- 1. the seed examples, and session_start ----------------------------------------------------


def test_seed_examples_run_in_psql_exactly_as_written(db: Database) -> None:
    _init(db)
    before = datetime.now(UTC)

    started = _psql_rows(db, SEED_START)
    assert len(started) == 1 and started[0]["session_id"] == "conv-738949"
    assert set(started[0]) == {"session_id", "started_at"}
    assert db.value(
        "SELECT started_at = %s::timestamptz FROM aidb_memory.sessions WHERE session_id = %s",
        (started[0]["started_at"], "conv-738949"),
    )
    started_at = db.value("SELECT started_at FROM aidb_memory.sessions")
    assert before - timedelta(seconds=5) <= started_at <= datetime.now(UTC)

    added = _psql_rows(db, SEED_ADD)
    assert len(added) == 1 and list(added[0]) == ["add"]
    event_id = uuid.UUID(added[0]["add"])
    assert db.sql(
        "SELECT session_id, agent_id, idempotency_key, actor_id FROM aidb_memory.events "
        "WHERE public_id = %s",
        (event_id,),
    ) == [("conv-738949", "helpdesk-agent-64849", "conv-738949-turn-001", "alice")]
    assert db.sql("SELECT kind, meta FROM aidb_memory.turn ORDER BY seq") == [
        ("user_prompt", {"sequence_id": "s-01"}),
        ("model_response", {"sequence_id": "s-01"}),
    ]

    assert _psql_rows(db, SEED_GET) == [
        {"ord": "1", "role": "user", "content": "my discount was not applied"},
        {"ord": "2", "role": "assistant", "content": "let me check the renewal history"},
    ]

    ended = _psql_rows(db, SEED_END)
    assert len(ended) == 1
    handoff = json.loads(ended[0]["handoff"])
    assert handoff["notes"] == "discount reapplied"
    assert handoff["session_id"] == "conv-738949"
    assert handoff["last_user_prompt"] == "my discount was not applied"
    assert handoff["turn_count"] == 2

    nxt = _psql_rows(db, SEED_NEXT)
    assert len(nxt) == 1 and nxt[0]["session_id"] == "conv-738950"
    assert json.loads(nxt[0]["prev_handoff"]) == handoff
    # The retry of the add (same key) returns the same event and stores nothing more.
    assert _psql_rows(db, SEED_ADD) == added
    assert db.value("SELECT count(*) FROM aidb_memory.turn") == 2
    assert db.value("SELECT count(*) FROM aidb_memory.events") == 1


def test_session_start_with_a_null_session_id_creates_a_uuid(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        first = _start(conn, None)
        second = _start(conn, None)
    assert str(uuid.UUID(first["session_id"])) == first["session_id"]
    assert first["session_id"] != second["session_id"]
    assert first["closed_at"] is None and first["prev_handoff"] is None
    assert db.value("SELECT count(*) FROM aidb_memory.sessions") == 2


def test_session_start_resumes_the_stored_row(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        first = _start(conn, "s1", agent="a")
        _add(conn, [_user("hello")])
        time.sleep(0.01)
        again = _start(conn, "s1", agent="a")
        other_agent = _start(conn, "s1", agent="b")
    assert again == first == other_agent
    assert db.sql("SELECT agent_id, turn_count FROM aidb_memory.sessions") == [("a", 1)]


def test_a_closed_session_stays_closed_and_reports_closed_at(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _add(conn, [_user("hello")])
        [(_, closed_at)] = _end(conn, "s1")
        resumed = _start(conn, "s1")
    assert resumed["closed_at"] is not None
    assert db.value(
        "SELECT closed_at = %s::timestamptz AND closed_at = %s FROM aidb_memory.sessions",
        (resumed["closed_at"], closed_at),
    )
    with db.connect(APP_USER) as conn, pytest.raises(psycopg.Error) as info:
        _add(conn, [_user("still there?")])
    assert info.value.sqlstate == "55000"
    with db.connect(APP_USER) as conn:
        assert [i["content"] for i in _get(conn)["items"]] == ["hello"]
        assert [i["content"] for i in _messages(conn)] == ["hello"]


def test_concurrent_starts_of_one_new_session_return_one_row(db: Database) -> None:
    _init(db)
    workers = 8
    barrier = threading.Barrier(workers)
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            with db.connect(APP_USER) as conn:
                conn.execute("SELECT * FROM aidb_memory.session_list(%s, 'warmup')", (NS,))
                barrier.wait(TIMEOUT_S)
                results.append(_start(conn, "together", agent="a"))
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert errors == []
    assert len(results) == workers and all(r == results[0] for r in results)
    assert db.value("SELECT count(*) FROM aidb_memory.sessions") == 1


def test_session_start_has_no_default_agent_id(db: Database) -> None:
    _init(db)
    e = _app_error(
        db,
        "SELECT * FROM aidb_memory.session_start(namespace => %s, actor_id => 'alice', "
        "session_id => 's1')",
        (NS,),
    )
    assert e.sqlstate == "42883"
    assert db.value("SELECT count(*) FROM aidb_memory.sessions") == 0


# --- 2. idempotency ----------------------------------------------------------------------------


@pytest.mark.parametrize("session_id", ["s1", None])
def test_a_retry_with_the_same_key_returns_the_original_event_and_writes_nothing(
    db: Database, session_id: str | None
) -> None:
    _init(db)
    batch = [_user("hi", meta={"sequence_id": 1}), _assistant("hello", meta={"sequence_id": 1})]
    with db.connect(APP_USER) as conn:
        first = _add(conn, batch, session_id=session_id, key="k1")
        before = _stored(db)
        # The same turns, written differently (key order, spacing), are the same batch.
        reordered = [{k: t[k] for k in reversed(list(t))} for t in batch]
        again = _add(conn, reordered, session_id=session_id, key="k1")
        also = _add(conn, batch, session_id=session_id, key="k1")
    assert uuid.UUID(first) and first == again == also
    assert _stored(db) == before
    assert db.value("SELECT count(*) FROM aidb_memory.events") == 1
    expected_turns = 2 if session_id else 0
    assert db.value("SELECT count(*) FROM aidb_memory.turn") == expected_turns


@pytest.mark.parametrize("session_id", ["s1", None])
def test_the_same_key_with_different_turns_is_23505_and_stores_nothing(
    db: Database, session_id: str | None
) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _add(conn, [_user("hi")], session_id=session_id, key="k1")
    before = _stored(db)
    e = _app_error(
        db,
        "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, %s, NULL, 'k1')",
        (NS, json.dumps([_user("something else")]), session_id),
    )
    assert e.sqlstate == "23505"
    assert (e.diag.message_primary or "").startswith("aidb_memory.add: idempotency_key")
    assert _stored(db) == before
    # Another actor may use the same key for its own batch.
    with db.connect(APP_USER) as conn:
        other = _add(conn, [_user("something else")], session_id=session_id, actor="bob", key="k1")
    assert db.value("SELECT actor_id FROM aidb_memory.events WHERE public_id = %s", (other,)) == (
        "bob"
    )


@pytest.mark.parametrize("session_id", ["s1", None])
def test_concurrent_adds_with_one_key_store_once(db: Database, session_id: str | None) -> None:
    _init(db)
    workers = 8
    batch = [_user("once"), _assistant("only once")]
    barrier = threading.Barrier(workers)
    results: list[str] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            with db.connect(APP_USER) as conn:
                conn.execute("SELECT * FROM aidb_memory.session_list(%s, 'warmup')", (NS,))
                barrier.wait(TIMEOUT_S)
                results.append(_add(conn, batch, session_id=session_id, key="same-key"))
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert errors == []
    assert len(results) == workers and len(set(results)) == 1
    assert db.sql("SELECT public_id::text FROM aidb_memory.events") == [(results[0],)]
    if session_id:
        assert _turns(db) == [
            (1, "user", "once", 1, 0, 4),
            (2, "assistant", "only once", 2, 4, 9),
        ]
        assert db.sql("SELECT turn_count, total_chars FROM aidb_memory.sessions") == [(2, 13)]
    else:
        assert db.value("SELECT count(*) FROM aidb_memory.turn") == 0
        assert db.value("SELECT count(*) FROM aidb_memory.sessions") == 0


def test_concurrent_writers_get_gap_free_positions_in_order(db: Database) -> None:
    _init(db)
    workers, rounds = 8, 5
    barrier = threading.Barrier(workers)
    errors: list[BaseException] = []

    def call(w: int) -> None:
        try:
            with db.connect(APP_USER) as conn:
                conn.execute("SELECT * FROM aidb_memory.session_list(%s, 'warmup')", (NS,))
                barrier.wait(TIMEOUT_S)
                for r in range(rounds):
                    _add(conn, [_user(f"w{w} r{r} a"), _assistant(f"w{w} r{r} b")])
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=call, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert errors == []
    rows = _turns(db)
    assert [r[0] for r in rows] == list(range(1, 2 * workers * rounds + 1))
    # Each batch stays together, in order, and the offsets add up.
    offset = 0
    for i in range(0, len(rows), 2):
        a, b = rows[i], rows[i + 1]
        assert a[2].endswith(" a") and b[2] == a[2][:-1] + "b"
        assert (a[4], b[4]) == (offset, offset + a[5])
        offset += a[5] + b[5]
    assert db.value("SELECT total_chars FROM aidb_memory.sessions") == offset


# --- 3. events ---------------------------------------------------------------------------------


def test_events_view_has_exactly_these_columns(db: Database) -> None:
    columns = db.sql(
        """SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
           WHERE attrelid = 'aidb_memory.events'::regclass AND attnum > 0 AND NOT attisdropped
           ORDER BY attnum"""
    )
    assert columns == [
        ("event_id", "bigint"),
        ("public_id", "uuid"),
        ("correlation_id", "uuid"),
        ("namespace_id", "bigint"),
        ("actor_id", "text"),
        ("agent_id", "text"),
        ("session_id", "text"),
        ("idempotency_key", "text"),
        ("status", "text"),
        ("attempts", "integer"),
        ("last_error", "text"),
        ("created_at", "timestamp with time zone"),
        ("processed_at", "timestamp with time zone"),
        # Issue 13: the queue also holds compaction tasks; SPEC §5's columns come first.
        ("kind", "text"),
    ]


@pytest.mark.parametrize(
    ("model_spec", "config", "status"),
    [
        # Without a model, extraction is verbatim by default (issue 26): accepted.
        ({}, {}, "accepted"),
        ({"llm": "extractor"}, {"extraction": False}, "skipped"),
        ({}, {"extraction": True}, "accepted"),
        ({}, {"extraction_mode": "model"}, "skipped"),
        ({}, {"extraction": False, "extraction_mode": "verbatim"}, "skipped"),
        ({"llm": "extractor"}, {}, "accepted"),
    ],
)
def test_every_add_records_one_event_with_its_status(
    db: Database, model_spec: dict[str, Any], config: dict[str, Any], status: str
) -> None:
    db.sql("SELECT aidb_memory.create_model('extractor', 'builtin', '{\"kind\": \"extractive\"}')")
    ns_id = _init(db, model_spec=model_spec, config=config)
    with db.connect(APP_USER) as conn:
        a = _add(conn, [_user("one"), _assistant("two")], agent="ag", key="k")
        b = _add(conn, [_user("three")], session_id=None)
        c = _add(conn, [_user("four")], actor="bob", session_id="s2")
    rows = db.sql(
        """SELECT public_id::text, namespace_id, actor_id, agent_id, session_id, idempotency_key,
                  status, attempts, last_error, processed_at, correlation_id
           FROM aidb_memory.events ORDER BY event_id"""
    )
    assert rows == [
        (a, ns_id, "alice", "ag", "s1", "k", status, 0, None, None, None),
        (b, ns_id, "alice", None, None, None, status, 0, None, None, None),
        (c, ns_id, "bob", None, "s2", None, status, 0, None, None, None),
    ]


# --- 4. scope and privileges -------------------------------------------------------------------


def test_another_actors_session_reads_as_empty_and_cannot_be_touched(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _add(conn, [_user("secret question"), _assistant("secret answer")])
        before = _stored(db)
        assert _get(conn, actor="mallory") == {
            "items": [],
            "overflow": 0,
            "compacted": 0,
            "warnings": [],
        }
        assert _get(conn, actor="mallory", limit_chars=5) == {
            "items": [],
            "overflow": 0,
            "compacted": 0,
            "warnings": [],
        }
        assert _messages(conn) != []
        assert conn.execute(
            "SELECT aidb_memory.session_messages(%s, 'mallory', 's1')", (NS,)
        ).fetchone() == ([],)
        assert _end(conn, "s1", "closing yours", actor="mallory") == []
        assert _pop(conn, actor="mallory") is None
        assert conn.execute(
            "SELECT aidb_memory.session_delete(%s, 'mallory', 's1', 'try')", (NS,)
        ).fetchone() == (0,)
        assert (
            conn.execute("SELECT * FROM aidb_memory.session_list(%s, 'mallory')", (NS,)).fetchall()
            == []
        )
    assert _stored(db) == before
    with db.connect(APP_USER) as conn:
        assert [i["content"] for i in _get(conn)["items"]] == ["secret question", "secret answer"]


def test_app_user_cannot_read_the_views_or_any_table_or_the_internal_plan(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _add(conn, [_user("x")])
    relations = db.sql(
        """SELECT c.relname FROM pg_class c
           WHERE c.relnamespace = 'aidb_memory'::regnamespace AND c.relkind IN ('r', 'v', 'p')
             AND c.relname <> 'namespaces' ORDER BY 1"""
    )
    names = {r[0] for r in relations}
    assert {"sessions", "events", "session", "turn", "event", "summary", "audit_log"} <= names
    for (name,) in relations:
        query = pgsql.SQL("SELECT * FROM {} LIMIT 1").format(pgsql.Identifier("aidb_memory", name))
        with db.connect(APP_USER) as conn, pytest.raises(psycopg.Error) as info:
            conn.execute(query)
        assert info.value.sqlstate == "42501", name
    internal = db.sql(
        """SELECT p.oid::regprocedure::text FROM pg_proc p
           WHERE p.pronamespace = 'aidb_memory'::regnamespace
             AND p.proname IN ('session_read_plan', 'session_compact')"""
    )
    assert len(internal) == 2
    for (signature,) in internal:
        assert not db.value(
            "SELECT has_function_privilege(%s, %s, 'EXECUTE')", (APP_USER, signature)
        )
    e = _app_error(
        db,
        "SELECT * FROM aidb_memory.session_read_plan("
        "%s, 'alice', 's1', NULL, NULL, NULL, NULL, NULL)",
        (NS,),
    )
    assert e.sqlstate == "42501"
    # Admins read both views.
    assert db.value("SELECT count(*) FROM aidb_memory.sessions", user=ADMIN_USER) == 1
    assert db.value("SELECT count(*) FROM aidb_memory.events", user=ADMIN_USER) == 1


_BOUND_CALLS = {
    "add": 'SELECT aidb_memory.add(%(ns)s, %(actor)s, \'[{"role": "user", "content": "x"}]\', '
    "'s1')",
    "session_get": "SELECT * FROM aidb_memory.session_get(%(ns)s, %(actor)s, 's1')",
    "session_start": "SELECT * FROM aidb_memory.session_start(%(ns)s, %(actor)s, NULL, 's1')",
    "session_end": "SELECT * FROM aidb_memory.session_end(%(ns)s, %(actor)s, 's1')",
    "session_pop": "SELECT aidb_memory.session_pop(%(ns)s, %(actor)s, 's1')",
    "session_list": "SELECT * FROM aidb_memory.session_list(%(ns)s, %(actor)s)",
    "session_delete": "SELECT aidb_memory.session_delete(%(ns)s, %(actor)s, 's1', 'gdpr')",
    "session_messages": "SELECT aidb_memory.session_messages(%(ns)s, %(actor)s, 's1')",
}


@pytest.mark.parametrize("function", sorted(_BOUND_CALLS))
def test_actor_binding_refuses_any_other_actor(db: Database, function: str) -> None:
    _init(db, config={"actor_binding": "session_user"})
    with db.connect("postgres") as conn:
        # The superuser writes as itself (its own actor) and as app_user cannot be faked.
        _add(conn, [_user("the superuser's own")], actor="postgres")
    with db.connect(APP_USER) as conn:
        _add(conn, [_user("mine"), _assistant("yours")], actor=APP_USER)
    before = _stored(db)
    for actor in ("alice", "postgres", APP_USER.upper(), APP_USER + " "):
        e = _app_error(db, _BOUND_CALLS[function], {"ns": NS, "actor": actor})
        assert e.sqlstate == "42501", (actor, e)
        assert (e.diag.message_primary or "").startswith(f"aidb_memory.{function}: actor_id")
    assert _stored(db) == before
    # The caller's own actor works.
    with db.connect(APP_USER) as conn:
        conn.execute(_BOUND_CALLS[function], {"ns": NS, "actor": APP_USER}).fetchall()


def test_actor_binding_lets_app_user_read_and_write_its_own_actor(db: Database) -> None:
    _init(db, config={"actor_binding": "session_user"})
    with db.connect(APP_USER) as conn:
        _start(conn, "s1", actor=APP_USER)
        _add(conn, [_user("q"), _assistant("a")], actor=APP_USER)
        assert [i["content"] for i in _get(conn, actor=APP_USER)["items"]] == ["q", "a"]
        assert _pop(conn, actor=APP_USER)["content"] == "a"
        listed = conn.execute(
            "SELECT session_id, turn_count FROM aidb_memory.session_list(%s, %s)", (NS, APP_USER)
        ).fetchall()
        assert listed == [("s1", 1)]
        assert _end(conn, "s1", actor=APP_USER)[0][0]["turn_count"] == 1


def test_actor_binding_follows_a_change_of_session_authorization(db: Database) -> None:
    """The calling role is read per call, not remembered from the first call of a connection."""
    _init(db, config={"actor_binding": "session_user"})
    with db.connect("postgres") as conn:
        _add(conn, [_user("as the superuser")], actor="postgres")
        conn.execute(f"SET SESSION AUTHORIZATION {APP_USER}")
        with pytest.raises(psycopg.Error) as info:
            _add(conn, [_user("as postgres again")], actor="postgres")
        assert info.value.sqlstate == "42501"
        _add(conn, [_user("as app_user")], actor=APP_USER)
    assert db.sql("SELECT actor_id, turn_count FROM aidb_memory.sessions ORDER BY 1") == [
        (APP_USER, 1),
        ("postgres", 1),
    ]


# --- 5. session_end and handoffs ---------------------------------------------------------------


def test_session_end_is_idempotent_and_deterministic(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        start = _start(conn, "s1", agent="agent-1")
        _add(conn, [_user("first question"), _assistant("first answer")])
        _add(conn, [_user("second question"), _assistant("second answer")])
        [(handoff, closed_at)] = _end(conn, "s1", "all done")
        time.sleep(0.01)
        again = _end(conn, "s1", "different notes are ignored")
        third = _end(conn, "s1")
    assert again == third == [(handoff, closed_at)]
    assert set(handoff) == {
        "notes",
        "session_id",
        "agent_id",
        "started_at",
        "closed_at",
        "turn_count",
        "last_user_prompt",
        "summary",
    }
    assert handoff["notes"] == "all done"
    assert handoff["session_id"] == "s1"
    assert handoff["agent_id"] == "agent-1"
    assert handoff["turn_count"] == 4
    assert handoff["last_user_prompt"] == "second question"
    assert handoff["summary"] is None
    assert datetime.fromisoformat(handoff["closed_at"]) == closed_at
    assert handoff["started_at"] == start["started_at"]
    assert db.sql("SELECT handoff, closed_at FROM aidb_memory.sessions") == [(handoff, closed_at)]


def test_session_end_of_an_unknown_session_returns_no_row(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        assert _end(conn, "never-started", "notes") == []
    assert db.value("SELECT count(*) FROM aidb_memory.sessions") == 0


def test_session_end_of_a_session_without_turns_has_an_empty_handoff(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _start(conn, "s1")
        [(handoff, _)] = _end(conn, "s1")
    assert handoff["turn_count"] == 0
    assert handoff["last_user_prompt"] is None and handoff["notes"] is None


def _close(conn: Conn, session_id: str, notes: str, **who: Any) -> dict[str, Any]:
    actor = who.get("actor", "alice")
    ns = who.get("ns", NS)
    _start(conn, session_id, actor=actor, agent=who.get("agent"), ns=ns)
    _add(conn, [_user(notes)], session_id=session_id, actor=actor, ns=ns)
    [(handoff, _)] = _end(conn, session_id, notes, actor=actor, ns=ns)
    return dict(handoff)


def test_prev_handoff_follows_namespace_actor_and_agent(db: Database) -> None:
    _init(db)
    _init(db, "other_namespace")
    with db.connect(APP_USER) as conn:
        older_null = _close(conn, "n1", "null agent, older")
        newest_null = _close(conn, "n2", "null agent, newest")
        a_old = _close(conn, "a1", "agent a, older", agent="a")
        a_new = _close(conn, "a2", "agent a, newest", agent="a")
        # Closed later, but not alice's, or not in this namespace, or another agent.
        _close(conn, "x1", "bob's", actor="bob", agent="a")
        _close(conn, "x2", "bob's, null agent", actor="bob")
        _close(conn, "x3", "elsewhere", agent="a", ns="other_namespace")
        _close(conn, "x4", "elsewhere, null agent", ns="other_namespace")
        _close(conn, "x5", "agent b", agent="b")
        assert _start(conn, "next-null")["prev_handoff"] == newest_null
        assert _start(conn, "next-a", agent="a")["prev_handoff"] == a_new
        assert _start(conn, "next-c", agent="c")["prev_handoff"] is None
        assert _start(conn, "next-carol", actor="carol")["prev_handoff"] is None
        # Re-closing an older session changes nothing: closed_at is its first close.
        _end(conn, "n1", "again")
        assert _start(conn, "next-null-2")["prev_handoff"] == newest_null
        # A session created by add gets its prev_handoff too.
        _add(conn, [_user("hi")], session_id="by-add", agent="a")
        assert _start(conn, "by-add", agent="a")["prev_handoff"] == a_new
    assert older_null != newest_null and a_old != a_new


def test_prev_handoff_is_fixed_when_the_session_is_first_started(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        first = _close(conn, "c1", "first")
        opened = _start(conn, "c2")
        assert opened["prev_handoff"] == first
        second = _close(conn, "c3", "second")
        assert _start(conn, "c2") == opened
        assert _start(conn, "c4")["prev_handoff"] == second
        # Closing c2 itself does not change what it started with.
        _end(conn, "c2")
        assert _start(conn, "c2")["prev_handoff"] == first


def test_adding_to_a_closed_session_is_55000_and_stores_nothing(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        first = _add(conn, [_user("hi")], key="k0")
        _end(conn, "s1")
    before = _stored(db)
    with db.connect(APP_USER) as conn:
        # A retry of an add that made it before the close is still answered as a retry.
        assert _add(conn, [_user("hi")], key="k0") == first
    for key in (None, "fresh-key"):
        e = _app_error(
            db,
            "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's1', NULL, %s)",
            (NS, json.dumps([_user("too late")]), key),
        )
        assert e.sqlstate == "55000"
        assert e.diag.message_primary == 'aidb_memory.add: session "s1" is closed'
    e = _app_error(db, "SELECT aidb_memory.session_pop(%s, 'alice', 's1')", (NS,))
    assert e.sqlstate == "55000"
    assert _stored(db) == before


def test_an_inactive_namespace_refuses_writes_with_55000(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _add(conn, [_user("before")])
    db.sql(
        "SELECT * FROM aidb_memory.namespace_update(%s, NULL, NULL, 'INACTIVE')",
        (NS,),
        user=ADMIN_USER,
    )
    before = _stored(db)
    for query in (
        'SELECT aidb_memory.add(%s, \'alice\', \'[{"role": "user", "content": "x"}]\', \'s1\')',
        'SELECT aidb_memory.add(%s, \'alice\', \'[{"role": "user", "content": "x"}]\')',
        "SELECT * FROM aidb_memory.session_start(%s, 'alice', NULL, 's2')",
    ):
        e = _app_error(db, query, (NS,))
        assert e.sqlstate == "55000", query
        assert "INACTIVE" in (e.diag.message_primary or "")
    assert _stored(db) == before
    with db.connect(APP_USER) as conn:
        assert [i["content"] for i in _get(conn)["items"]] == ["before"]


# --- 6. session_pop, session_list, session_delete ----------------------------------------------


def _exchange_with_tools(conn: Conn) -> None:
    _add(conn, [_user("earlier"), _assistant("earlier answer")])
    _add(
        conn,
        [
            _user("what is the weather in Paris and Rome?"),
            _assistant(None, tool_calls=[_call("c1", "weather"), _call("c2", "weather")]),
            _tool("c1", "Paris: sun"),
            _tool("c2", "Rome: rain"),
            _assistant("sun in Paris, rain in Rome"),
        ],
    )


def test_pop_walks_back_an_exchange_with_tool_calls(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _exchange_with_tools(conn)
        popped = []
        while True:
            item = _pop(conn)
            popped.append(item)
            if item["role"] == "user":
                break
        assert [(p["seq"], p["role"]) for p in popped] == [
            (7, "assistant"),
            (6, "tool"),
            (5, "tool"),
            (4, "assistant"),
            (3, "user"),
        ]
        assert popped[1]["tool_call_id"] == "c2" and popped[1]["content"] == "Rome: rain"
        assert popped[3]["tool_calls"] == [_call("c1", "weather"), _call("c2", "weather")]
        assert popped[3]["content"] is None and popped[3]["kind"] == "tool_call"
        assert popped[4]["content"] == "what is the weather in Paris and Rome?"
        assert set(popped[4]) == {"seq", "role", "content", "kind", "meta", "created_at"}
        after = _get(conn)
        assert [i["content"] for i in after["items"]] == ["earlier", "earlier answer"]
        assert after["warnings"] == []
        assert db.sql("SELECT turn_count, total_chars FROM aidb_memory.sessions") == [(2, 21)]
        # Then on to empty: NULL, and NULL again.
        assert _pop(conn)["content"] == "earlier answer"
        assert _pop(conn)["content"] == "earlier"
        assert _pop(conn) is None
        assert _pop(conn) is None
        assert _pop(conn, session_id="never-existed") is None
        assert _get(conn) == {"items": [], "overflow": 0, "compacted": 0, "warnings": []}
        # add starts again at position 1.
        _add(conn, [_user("fresh start")])
    assert _turns(db) == [(1, "user", "fresh start", 1, 0, 11)]


def test_the_handoff_after_pops_names_the_user_prompt_that_remains(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _exchange_with_tools(conn)
        while _pop(conn)["role"] != "user":
            pass
        [(handoff, _)] = _end(conn, "s1")
    assert (handoff["turn_count"], handoff["last_user_prompt"]) == (2, "earlier")


def test_summaries_reach_the_handoff_and_go_with_the_turns_they_cover(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _add(conn, [_user(f"turn {i}") for i in range(1, 7)])
    ref, key = db.sql("SELECT id, actor_key FROM aidb_memory.session")[0]
    db.sql(
        """INSERT INTO aidb_memory.summary
               (actor_key, session_ref, from_seq, to_seq, turn_count, content, chars, model,
                from_offset, to_offset)
           VALUES (%(k)s, %(r)s, 1, 2, 2, 'old summary', 11, 'm', 0, 12),
                  (%(k)s, %(r)s, 3, 4, 2, 'new summary', 11, 'm', 12, 24)""",
        {"r": ref, "k": key},
    )
    with db.connect(APP_USER) as conn:
        assert _pop(conn)["content"] == "turn 6"
        assert db.sql("SELECT content FROM aidb_memory.summary ORDER BY to_seq") == [
            ("old summary",),
            ("new summary",),
        ]
        # Turn 4 is now the newest round, which a summary never covers (the next add could
        # extend it): the summary of 3-4 goes.
        assert _pop(conn)["content"] == "turn 5"
        assert db.sql("SELECT content FROM aidb_memory.summary") == [("old summary",)]
        _start(conn, "s2")
        _add(conn, [_user("other session")], session_id="s2")
        [(handoff, _)] = _end(conn, "s1")
    assert handoff["summary"] == {
        "content": "old summary",
        "from_seq": 1,
        "to_seq": 2,
        "model": "m",
    }
    assert handoff["turn_count"] == 4 and handoff["last_user_prompt"] == "turn 4"
    with db.connect(APP_USER) as conn:
        conn.execute("SELECT aidb_memory.session_delete(%s, 'alice', 's1', 'done')", (NS,))
    assert db.value("SELECT count(*) FROM aidb_memory.summary") == 0


_ROUND_TURNS = [
    _user("question", meta={"sequence_id": "s1"}),
    _assistant(None, tool_calls=[_call("c1")], meta={"sequence_id": "s1"}),
    _tool("c1", "result"),  # no sequence_id of its own: it carries its round's
    _assistant("done", meta={"sequence_id": "s1"}),
    _user("next"),
    _assistant(None, tool_calls=[_call("c2")]),
    _tool("c2", "result 2"),
    _assistant("ok"),
]
_ROUND_STARTS = [1, 1, 1, 1, 5, 6, 6, 8]


@pytest.mark.parametrize(
    ("batches", "pops"),
    [
        ([8], 0),
        ([1] * 8, 0),
        ([3, 1, 4], 0),
        ([8], 5),  # pop back to the tool result, then add the rest
        ([8], 6),  # pop back to the open call
        ([2, 1, 5], 1),
    ],
)
def test_rounds_do_not_depend_on_how_turns_are_batched_or_popped(
    db: Database, batches: list[int], pops: int
) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        at = 0
        for n in batches:
            _add(conn, _ROUND_TURNS[at : at + n])
            at += n
        for _ in range(pops):
            _pop(conn)
        for turn in _ROUND_TURNS[len(_ROUND_TURNS) - pops :] if pops else []:
            _add(conn, [turn])
        items = _get(conn)["items"]
    assert [r[3] for r in _turns(db)] == _ROUND_STARTS
    assert [i["seq"] for i in items] == list(range(1, 9))
    # Budgets cut only where a round starts: before seq 5, 6 or 8.
    with db.connect(APP_USER) as conn:
        kept = [[i["seq"] for i in _get(conn, limit_chars=n)["items"]][:1] for n in range(1, 40, 3)]
    assert {k[0] for k in kept if k} <= {1, 5, 6, 8}


def test_add_after_pop_continues_at_gap_free_positions(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _exchange_with_tools(conn)
        _pop(conn)
        _pop(conn)
        _add(conn, [_tool("c2", "Rome: clouds"), _assistant("sun, clouds")])
        rows = _turns(db)
        assert [r[0] for r in rows] == list(range(1, 8))
        assert [r[2] for r in rows[-2:]] == ["Rome: clouds", "sun, clouds"]
        # The re-added result joins its call's round; offsets are contiguous.
        assert [r[3] for r in rows] == [1, 2, 3, 4, 4, 4, 7]
        offsets = [r[4] for r in rows]
        assert offsets == [sum(r[5] for r in rows[:i]) for i in range(len(rows))]
        assert db.value("SELECT total_chars FROM aidb_memory.sessions") == sum(r[5] for r in rows)
        items = _get(conn)["items"]
        _check_protocol(items)
        assert [i["seq"] for i in items] == list(range(1, 8))


def test_popping_a_tool_result_reopens_its_call(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _exchange_with_tools(conn)
        assert _pop(conn)["role"] == "assistant"
        assert _pop(conn)["tool_call_id"] == "c2"
        # c2 is open again: the read withholds the round, a non-result is refused ...
        got = _get(conn)
        assert [i["seq"] for i in got["items"]] == [1, 2, 3]
        assert got["warnings"] == ["tool_results_pending"]
        with pytest.raises(psycopg.Error) as info:
            _add(conn, [_user("moving on")])
        assert info.value.sqlstate == "22023"
        # ... c1 cannot be answered twice ...
        with pytest.raises(psycopg.Error) as info:
            _add(conn, [_tool("c1", "again")])
        assert info.value.sqlstate == "22023"
        # ... and the result can be added again.
        _add(conn, [_tool("c2", "Rome: rain")])
        got = _get(conn)
        assert got["warnings"] == []
        assert [i["seq"] for i in got["items"]] == [1, 2, 3, 4, 5, 6]
        _check_protocol(got["items"])


def test_popping_the_tool_call_turn_clears_its_calls(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _add(conn, [_user("q"), _assistant(None, tool_calls=[_call("c1"), _call("c2")])])
        assert _get(conn)["warnings"] == ["tool_results_pending"]
        assert _pop(conn)["tool_calls"] == [_call("c1"), _call("c2")]
        got = _get(conn)
        assert got["warnings"] == [] and [i["content"] for i in got["items"]] == ["q"]
        # No call is open: a result for c1 is refused, a plain answer accepted.
        with pytest.raises(psycopg.Error) as info:
            _add(conn, [_tool("c1", "late")])
        assert info.value.sqlstate == "22023"
        _add(conn, [_assistant("answer without tools")])
    assert [r[:3] for r in _turns(db)] == [
        (1, "user", "q"),
        (2, "assistant", "answer without tools"),
    ]


def test_pending_tool_results_are_withheld_until_they_arrive(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _add(conn, [_user("q", meta={"sequence_id": "r1"})])
        _add(
            conn,
            [_assistant("checking", meta={"sequence_id": "r1"}, tool_calls=[_call("c1")])],
        )
        got = _get(conn)
        # The whole round (user turn included: same sequence_id) waits for the result.
        assert got["items"] == [] and got["warnings"] == ["tool_results_pending"]
        assert got["overflow"] == 0
        assert _messages(conn) == []
        _add(conn, [_tool("c1", "found it")])
        got = _get(conn)
        assert [i["seq"] for i in got["items"]] == [1, 2, 3] and got["warnings"] == []


def _list(conn: Conn, *args: Any, **kwargs: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
    names = ["namespace", "actor_id", *kwargs]
    call = pgsql.SQL("SELECT * FROM aidb_memory.session_list({})").format(
        pgsql.SQL(", ").join(
            pgsql.SQL("{} => {}").format(pgsql.Identifier(n), pgsql.Placeholder()) for n in names
        )
    )
    cur = conn.execute(call, (NS, *args, *kwargs.values()))
    assert cur.description is not None
    return [c.name for c in cur.description], cur.fetchall()


def test_session_list_returns_index_rows_only(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _add(conn, [_user("private words"), _assistant("more private words")], agent="a")
        columns, rows = _list(conn, "alice")
    assert columns == [
        "session_id",
        "agent_id",
        "started_at",
        "closed_at",
        "turn_count",
        "total_chars",
        "updated_at",
    ]
    assert len(rows) == 1
    session_id, agent_id, started_at, closed_at, turn_count, total_chars, updated_at = rows[0]
    assert (session_id, agent_id, closed_at, turn_count, total_chars) == ("s1", "a", None, 2, 31)
    assert started_at <= updated_at
    assert "private" not in repr(rows)


def test_session_list_filters_orders_and_limits(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        for sid, agent in (("s1", "a"), ("s2", "b"), ("s3", "a"), ("s4", None)):
            _add(conn, [_user(sid)], session_id=sid, agent=agent)
        _end(conn, "s3")
        _add(conn, [_user("touch")], session_id="s2")
        _add(conn, [_user("someone else")], session_id="s5", actor="bob", agent="a")

        def ids(**kwargs: Any) -> list[str]:
            return [r[0] for r in _list(conn, "alice", **kwargs)[1]]

        assert ids() == ["s2", "s3", "s4", "s1"]
        assert ids(agent_id="a") == ["s3", "s1"]
        assert ids(agent_id="a", include_closed=False) == ["s1"]
        assert ids(include_closed=False) == ["s2", "s4", "s1"]
        assert ids(limit=2) == ["s2", "s3"]
        assert ids(agent_id="nobody") == []
    for bad in (0, -1, 1001):
        with db.connect(APP_USER) as conn, pytest.raises(psycopg.Error) as info:
            _list(conn, "alice", limit=bad)
        assert info.value.sqlstate == "22023"
        assert (info.value.diag.message_primary or "").startswith("aidb_memory.session_list: limit")


def test_session_delete_removes_the_session_and_audits_without_content(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _add(conn, [_user("delete me please"), _assistant("secret reply")], agent="ag")
        _add(conn, [_user("keep me")], session_id="s2")
        _add(conn, [_user("bob keeps his")], actor="bob")
        removed = conn.execute(
            "SELECT aidb_memory.session_delete(%s, 'alice', 's1', 'user asked to erase it')",
            (NS,),
        ).fetchone()
        assert removed == (2,)
        assert _get(conn) == {"items": [], "overflow": 0, "compacted": 0, "warnings": []}
        assert [r[0] for r in _list(conn, "alice")[1]] == ["s2"]
        assert _get(conn, actor="bob")["items"][0]["content"] == "bob keeps his"
        # Deleting it again removes nothing and audits nothing.
        again = conn.execute(
            "SELECT aidb_memory.session_delete(%s, 'alice', 's1', 'again')", (NS,)
        ).fetchone()
        assert again == (0,)
    assert (
        db.value(
            "SELECT count(*) FROM aidb_memory.turn t JOIN aidb_memory.session s "
            "ON s.id = t.session_ref WHERE s.session_id = 's1' AND s.actor_id = 'alice'"
        )
        == 0
    )
    audit = db.sql("SELECT to_jsonb(a) FROM aidb_memory.audit_log a")
    assert len(audit) == 1
    row = audit[0][0]
    assert row["action"] == "session_delete"
    assert row["reason"] == "user asked to erase it"
    assert row["counts"] == {"sessions": 1, "turns": 2}
    assert row["by_role"] == APP_USER
    assert row["namespace"] == NS
    text = json.dumps(row)
    for secret in ("delete me", "secret reply", "alice", '"s1"', 'ag"'):
        assert secret not in text, secret


@pytest.mark.parametrize(("reason", "sqlstate"), [(None, "22004"), ("", "22023"), ("  ", "22023")])
def test_session_delete_needs_a_reason(db: Database, reason: str | None, sqlstate: str) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _add(conn, [_user("keep")])
    before = _stored(db)
    e = _app_error(db, "SELECT aidb_memory.session_delete(%s, 'alice', 's1', %s)", (NS, reason))
    assert e.sqlstate == sqlstate
    assert (e.diag.message_primary or "").startswith("aidb_memory.session_delete: reason")
    assert _stored(db) == before


# --- 7. session_messages ----------------------------------------------------------------------

_MESSAGE_KEYS = {
    "system": ({"role", "content"}, {"name"}),
    "user": ({"role", "content"}, {"name"}),
    "assistant": ({"role", "content"}, {"name", "tool_calls"}),
    "tool": ({"role", "content", "tool_call_id"}, set()),
}


def _check_openai_messages(messages: list[dict[str, Any]]) -> None:
    """The shape of OpenAI's ChatCompletionMessageParam, strictly, and the tool protocol."""
    for m in messages:
        required, optional = _MESSAGE_KEYS[m["role"]]
        assert required <= set(m) <= required | optional, m
        if m["role"] == "assistant" and "tool_calls" in m:
            assert m["content"] is None or isinstance(m["content"], str)
            for call in m["tool_calls"]:
                assert set(call) == {"id", "type", "function"} and call["type"] == "function"
                assert set(call["function"]) == {"name", "arguments"}
                assert isinstance(call["function"]["arguments"], str)
        else:
            assert isinstance(m["content"], str), m
    _check_protocol(messages)


def test_session_messages_is_an_openai_messages_array(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _add(conn, [{"role": "system", "content": "be brief"}, _user("hi", name="alice")])
        _add(
            conn,
            [
                _assistant(None, tool_calls=[_call("c1", "search", '{"q": "x"}')]),
                _tool("c1", "result one"),
                _assistant("", name="helper", tool_calls=[_call("c2")]),
                _tool("c2", "result two"),
                _assistant("done", name="helper", meta={"sequence_id": 9}, kind="final"),
            ],
        )
        messages = _messages(conn)
    _check_openai_messages(messages)
    assert messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi", "name": "alice"},
        {"role": "assistant", "content": None, "tool_calls": [_call("c1", "search", '{"q": "x"}')]},
        {"role": "tool", "tool_call_id": "c1", "content": "result one"},
        {"role": "assistant", "content": "", "name": "helper", "tool_calls": [_call("c2")]},
        {"role": "tool", "tool_call_id": "c2", "content": "result two"},
        {"role": "assistant", "content": "done", "name": "helper"},
    ]


@pytest.mark.parametrize(
    ("limit_chars", "limit_turns"),
    [(None, None), (40, None), (25, None), (5, None), (None, 1), (None, 3), (60, 4), (1, 1)],
)
def test_session_messages_budget_behaves_like_session_get(
    db: Database, limit_chars: int | None, limit_turns: int | None
) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        _exchange_with_tools(conn)
        _add(conn, [_user("last question"), _assistant("last answer")])
        got = _get(conn, limit_chars=limit_chars, limit_turns=limit_turns)
        messages = _messages(conn, limit_chars=limit_chars, limit_turns=limit_turns)
    _check_openai_messages(messages)
    _check_protocol(got["items"])
    assert [(m["role"], m["content"]) for m in messages] == [
        (i["role"], i["content"]) for i in got["items"]
    ]
    total = db.value("SELECT total_chars FROM aidb_memory.sessions")
    assert got["overflow"] == total - sum(
        len(i["content"] or "")
        + sum(len(c["function"]["arguments"]) for c in i.get("tool_calls", []))
        for i in got["items"]
    )
    if limit_chars is not None:
        assert total - got["overflow"] <= limit_chars
    if limit_turns is not None:
        assert len(got["items"]) <= limit_turns


# --- 8. timestamps -----------------------------------------------------------------------------


def test_timestamps_are_exact_whatever_the_datestyle_and_timezone(db: Database) -> None:
    _init(db)
    with db.connect(APP_USER) as conn:
        conn.execute("SET datestyle = 'postgres, dmy'")
        conn.execute("SET timezone = 'Asia/Kolkata'")
        # Kept in temp tables and compared by the server: a client cannot parse every DateStyle.
        for table, query in (
            ("started", "SELECT * FROM aidb_memory.session_start(%(ns)s, 'alice', 'ag', 's1')"),
            ("added", "SELECT aidb_memory.add(%(ns)s, 'alice', %(turns)s::jsonb, 's1')"),
            ("got", "SELECT * FROM aidb_memory.session_get(%(ns)s, 'alice', 's1')"),
            ("ended", "SELECT * FROM aidb_memory.session_end(%(ns)s, 'alice', 's1', 'n')"),
            ("listed", "SELECT * FROM aidb_memory.session_list(%(ns)s, 'alice')"),
            ("resumed", "SELECT * FROM aidb_memory.session_start(%(ns)s, 'alice', 'ag', 's1')"),
            ("nxt", "SELECT * FROM aidb_memory.session_start(%(ns)s, 'alice', 'ag', 's2')"),
        ):
            conn.execute(
                f"CREATE TEMP TABLE {table} AS {query}",
                {"ns": NS, "turns": json.dumps([_user("q")])},
            )
        [(started_at, closed_at, updated_at)] = db.sql(
            "SELECT started_at, closed_at, updated_at FROM aidb_memory.session "
            "WHERE session_id = 's1'"
        )
        created_at = db.value("SELECT created_at FROM aidb_memory.turn")
        checks = conn.execute(
            """SELECT started.started_at = %(s)s, started.closed_at IS NULL,
                      (got.items->0->>'created_at')::timestamptz = %(t)s,
                      ended.closed_at = %(c)s,
                      (ended.handoff->>'closed_at')::timestamptz = %(c)s,
                      (ended.handoff->>'started_at')::timestamptz = %(s)s,
                      listed.started_at = %(s)s, listed.closed_at = %(c)s,
                      listed.updated_at = %(u)s,
                      resumed.started_at = %(s)s, resumed.closed_at = %(c)s,
                      (nxt.prev_handoff->>'closed_at')::timestamptz = %(c)s,
                      (nxt.prev_handoff->>'started_at')::timestamptz = %(s)s
               FROM started, got, ended, listed, resumed, nxt""",
            {"s": started_at, "c": closed_at, "u": updated_at, "t": created_at},
        ).fetchall()
    assert checks == [(True,) * 13]


# --- a read racing a writer ---------------------------------------------------------------------


def _wait_for_lock_waiters(db: Database, count: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        waiting = db.value(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        if waiting == count:
            return
        time.sleep(0.02)
    raise AssertionError(f"expected {count} sessions waiting on a lock")


def test_a_read_racing_a_writer_is_one_consistent_snapshot(db: Database) -> None:
    """The plan and the window of a read see the same history.

    The reader's statement starts while the tool result is not yet stored, and is held (on its
    first PL/Python call, loading the code) until the writer has committed the result.
    """
    _init(db)
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            with db.connect(APP_USER) as conn:
                results.append(_get(conn))
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    with db.connect(APP_USER) as writer:
        _add(writer, [_user("q"), _assistant(None, tool_calls=[_call("c1")])])
        with db.connect("postgres", autocommit=False) as locker:
            locker.execute("LOCK TABLE aidb_memory.runtime_modules IN ACCESS EXCLUSIVE MODE")
            reader = threading.Thread(target=read)
            reader.start()
            _wait_for_lock_waiters(db, 1)
            _add(writer, [_tool("c1", "the result")])
            locker.commit()
        reader.join(TIMEOUT_S)
    assert errors == []
    [got] = results
    _check_protocol(got["items"])
    assert (
        [i["seq"] for i in got["items"]],
        got["warnings"],
        got["overflow"],
    ) in (([1], ["tool_results_pending"], 0), ([1, 2, 3], [], 0))


# --- errors name the function that was called --------------------------------------------------

_CALLS = {
    "session_start": "SELECT * FROM aidb_memory.session_start(%(ns)s, %(actor)s, NULL, %(sid)s)",
    "add": "SELECT aidb_memory.add(%(ns)s, %(actor)s, "
    '\'[{"role": "user", "content": "x"}]\', %(sid)s)',
    "session_get": "SELECT * FROM aidb_memory.session_get(%(ns)s, %(actor)s, %(sid)s)",
    "session_messages": "SELECT aidb_memory.session_messages(%(ns)s, %(actor)s, %(sid)s)",
    "session_end": "SELECT * FROM aidb_memory.session_end(%(ns)s, %(actor)s, %(sid)s)",
    "session_pop": "SELECT aidb_memory.session_pop(%(ns)s, %(actor)s, %(sid)s)",
    "session_list": "SELECT * FROM aidb_memory.session_list(%(ns)s, %(actor)s, %(sid)s)",
    "session_delete": "SELECT aidb_memory.session_delete(%(ns)s, %(actor)s, %(sid)s, 'r')",
}


@pytest.fixture(scope="module")
def unchanged_db(pg_server: ThrowawayServer, template_db: Database) -> Iterator[Database]:
    """One database for the error cases: each checks that it leaves the database unchanged."""
    database = _create_database(pg_server, template_db.name)
    try:
        _init(database)
        with database.connect(APP_USER) as conn:
            _add(conn, [_user("keep")])
        yield database
    finally:
        _drop_database(database)


@pytest.mark.parametrize("function", sorted(_CALLS))
@pytest.mark.parametrize(
    ("ns", "actor", "sid", "sqlstate", "field"),
    [
        ("no_such_namespace", "alice", "s1", "42704", 'namespace "no_such_namespace"'),
        (None, "alice", "s1", "22004", "namespace must not be NULL"),
        (NS, None, "s1", "22004", "actor_id must not be NULL"),
        (NS, "", "s1", "22023", "actor_id must not be empty"),
        (NS, "alice", "", "22023", "_id must not be empty"),
        (NS, "alice", "s" * 256, "22023", "_id is longer than 255 characters"),
    ],
)
def test_bad_arguments_are_clean_errors_naming_the_function(
    unchanged_db: Database, function: str, ns: Any, actor: Any, sid: str, sqlstate: str, field: str
) -> None:
    db = unchanged_db
    before = _stored(db)
    assert before["turn"], "the fixture's turn at least"
    e = _app_error(db, _CALLS[function], {"ns": ns, "actor": actor, "sid": sid})
    assert e.sqlstate == sqlstate, e
    message = e.diag.message_primary or ""
    assert message.startswith(f"aidb_memory.{function}: "), message
    assert field in message, message
    assert _stored(db) == before


@pytest.mark.parametrize("function", ["session_get", "session_messages"])
@pytest.mark.parametrize(
    ("limit_chars", "limit_turns", "field"),
    [(0, None, "limit_chars"), (-5, None, "limit_chars"), (None, 0, "limit_turns")],
)
def test_bad_budgets_are_22023_naming_the_function(
    unchanged_db: Database,
    function: str,
    limit_chars: int | None,
    limit_turns: int | None,
    field: str,
) -> None:
    db = unchanged_db
    query = pgsql.SQL(
        "SELECT * FROM aidb_memory.{}(%s, 'alice', 's1', limit_chars => %s, limit_turns => %s)"
    ).format(pgsql.Identifier(function))
    with db.connect(APP_USER) as conn, pytest.raises(psycopg.Error) as info:
        conn.execute(query, (NS, limit_chars, limit_turns))
    assert info.value.sqlstate == "22023"
    assert (info.value.diag.message_primary or "").startswith(f"aidb_memory.{function}: {field} ")


@pytest.mark.parametrize("bad", ["a\nb", "a\x7fb", "a\x85b", "a\u2028b", "a\u2029b"])
@pytest.mark.parametrize("field", ["actor_id", "session_id", "agent_id", "idempotency_key"])
def test_ids_with_control_characters_are_refused_on_one_line(
    unchanged_db: Database, field: str, bad: str
) -> None:
    db = unchanged_db
    before = _stored(db)
    args = {"namespace": NS, "actor_id": "alice", "session_id": "s1", field: bad}
    e = _app_error(
        db,
        """SELECT aidb_memory.add(namespace => %(namespace)s, actor_id => %(actor_id)s,
               turns => '[{"role": "user", "content": "x"}]', session_id => %(session_id)s,
               agent_id => %(agent_id)s, idempotency_key => %(idempotency_key)s)""",
        {"agent_id": None, "idempotency_key": None, **args},
    )
    assert e.sqlstate == "22023"
    message = e.diag.message_primary or ""
    assert message == f"aidb_memory.add: {field} must not contain control characters"
    assert _stored(db) == before


@pytest.mark.parametrize("name", ["no\u2028such", "no\x85such", 'no"such\\', "naïve"])
def test_an_unknown_namespace_is_quoted_on_one_line(unchanged_db: Database, name: str) -> None:
    e = _app_error(unchanged_db, "SELECT * FROM aidb_memory.session_list(%s, 'alice')", (name,))
    message = e.diag.message_primary or ""
    assert e.sqlstate == "42704"
    assert len(message.splitlines()) == 1 and "\u2028" not in message, repr(message)
    prefix, suffix = "aidb_memory.session_list: namespace ", " does not exist"
    assert message.startswith(prefix) and message.endswith(suffix), message
    assert json.loads(message.removeprefix(prefix).removesuffix(suffix)) == name


def test_a_huge_unknown_namespace_name_is_cut_in_the_message(unchanged_db: Database) -> None:
    e = _app_error(
        unchanged_db, "SELECT * FROM aidb_memory.session_list(%s, 'alice')", ("n" * 100_000,)
    )
    assert e.sqlstate == "42704"
    message = e.diag.message_primary or ""
    assert len(message) < 300 and message.endswith('…" does not exist'), message


def test_the_same_key_and_turns_for_another_session_or_agent_is_23505(db: Database) -> None:
    """A key names one request: the same turns sent to another session are not a retry."""
    _init(db)
    batch = [_user("hi")]
    with db.connect(APP_USER) as conn:
        _add(conn, batch, session_id="s1", key="k1")
    before = _stored(db)
    for session_id, agent in (("s2", None), ("s1", "other-agent")):
        e = _app_error(
            db,
            "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, %s, %s, 'k1')",
            (NS, json.dumps(batch), session_id, agent),
        )
        assert e.sqlstate == "23505"
    assert _stored(db) == before


def test_the_audit_row_holds_a_keyed_hash_that_a_guess_cannot_confirm(db: Database) -> None:
    import hashlib
    import hmac

    _init(db)
    with db.connect(APP_USER) as conn:
        _add(conn, [_user("hi")], session_id="conv-1")
        conn.execute("SELECT aidb_memory.session_delete(%s, 'alice', 'conv-1', 'asked to')", (NS,))
    stored = db.value("SELECT subject_hash FROM aidb_memory.audit_log")
    subject = "\0".join((NS, "alice", "conv-1")).encode()
    assert stored != hashlib.sha256(subject).hexdigest()
    key = db.value("SELECT key FROM aidb_memory.audit_key")
    assert len(key) == 64
    assert stored == hmac.new(key.encode(), subject, hashlib.sha256).hexdigest()
