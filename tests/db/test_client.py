"""The typed Python client (issue 12, item 1): every method against a real server, sync and
async, each exception class from a real error, and the three ways to construct a client."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from aidb_memory.client import (
    AidbMemoryError,
    AsyncMemory,
    EventStatus,
    Handoff,
    IdempotencyConflict,
    InvalidArgument,
    InvalidTurn,
    Memory,
    MemoryRecord,
    NamespaceInactive,
    NamespaceNotFound,
    PermissionDenied,
    ReadResult,
    SearchHit,
    Session,
    SessionClosed,
    SessionRow,
)
from conftest import APP_USER, WORKER_USER, Database

NS = "client_ns"
TURNS = [
    {"role": "user", "content": "Where is my parcel?"},
    {"role": "assistant", "content": "It left the depot this morning."},
]


@pytest.fixture
def ns(db: Database) -> Database:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    for content, session in (
        ("Alice prefers window seats", "s-1"),
        ("Alice lives in Lisbon", "s-1"),
        ("Alice has a red bike", "s-2"),
    ):
        db.sql(
            """INSERT INTO aidb_memory.memory (actor_key, namespace_id, actor_id, agent_id,
                                               session_id, content, content_hash, lexemes)
               SELECT aidb_memory.actor_key(name, 'alice'), id, 'alice', 'agent-1', %s, %s,
                      md5(%s), to_tsvector('english', %s)
               FROM aidb_memory.namespace WHERE name = %s""",
            (session, content, content, content, NS),
        )
    return db


# --- every method, sync ---------------------------------------------------------------------


def test_sync_every_method(ns: Database) -> None:
    with Memory(ns.dsn(APP_USER)) as m:
        session = m.session_start(NS, "alice", agent_id="agent-1", session_id="conv-1")
        assert isinstance(session, Session)
        assert (session.session_id, session.closed, session.prev_handoff) == (
            "conv-1",
            False,
            None,
        )

        event = m.add(NS, "alice", TURNS, session_id="conv-1", idempotency_key="k-1")
        assert isinstance(event, uuid.UUID)
        assert m.add(NS, "alice", Jsonb(TURNS), session_id="conv-1", idempotency_key="k-1") == event

        read = m.session_get(NS, "alice", "conv-1")
        assert isinstance(read, ReadResult)
        assert [i["content"] for i in read.items] == [t["content"] for t in TURNS]
        assert [i["seq"] for i in read.items] == [1, 2]
        assert (read.overflow_chars, read.compacted_entries, read.warnings) == (0, 0, ())
        last = m.session_get(NS, "alice", "conv-1", limit_turns=1)
        assert [i["seq"] for i in last.items] == [2]

        assert m.session_messages(NS, "alice", "conv-1") == TURNS
        responses = m.session_messages(NS, "alice", "conv-1", format="responses")
        assert [r["role"] for r in responses] == ["user", "assistant"]
        assert m.session_messages(NS, "alice", "no-such-session") == []

        status = m.status(NS, "alice", event)
        assert isinstance(status, EventStatus)
        # No model: verbatim extraction (issue 26) queues the event for the worker.
        assert (status.event_id, status.status) == (event, "accepted")
        assert m.status(NS, "alice", str(uuid.uuid4())) is None

        rows = m.session_list(NS, "alice")
        assert isinstance(rows[0], SessionRow)
        assert [(r.session_id, r.agent_id, r.turn_count) for r in rows] == [
            ("conv-1", "agent-1", 2)
        ]
        assert m.session_list(NS, "alice", include_closed=False, limit=1)[0].session_id == "conv-1"

        popped = m.session_pop(NS, "alice", "conv-1")
        assert popped is not None and popped["content"] == TURNS[1]["content"]
        assert m.session_pop(NS, "alice", "empty-session") is None

        handoff = m.session_end(NS, "alice", "conv-1", notes="parcel chased")
        assert isinstance(handoff, Handoff)
        assert (handoff.session_id, handoff.notes, handoff.turn_count) == (
            "conv-1",
            "parcel chased",
            1,
        )
        assert handoff.last_user_prompt == "Where is my parcel?"
        assert handoff.closed_at is not None and handoff.summary is None
        assert m.session_end(NS, "alice", "no-such-session") is None

        nxt = m.session_start(NS, "alice", agent_id="agent-1", session_id="conv-2")
        assert nxt.prev_handoff is not None
        assert nxt.prev_handoff.notes == "parcel chased"
        assert m.session_start(NS, "alice", agent_id="agent-1", session_id="conv-1").closed
        fresh = m.session_start(NS, "bob")
        uuid.UUID(fresh.session_id)

        hits = m.search(NS, "alice", "window seat")
        assert isinstance(hits[0], SearchHit)
        assert hits[0].content == "Alice prefers window seats"
        assert 0 < hits[0].score <= 1
        assert len(m.search(NS, "alice", "Alice", limit=1)) == 1
        assert m.search(NS, "alice", "bike", session_id="s-1") == []

        remembered = m.remember(NS, "alice", "Alice drinks oat milk", session_id="s-3")
        assert isinstance(remembered, uuid.UUID)
        assert [h.id for h in m.search(NS, "alice", "oat milk", limit=1)] == [remembered]
        assert m.remember(NS, "alice", "Alice drinks oat milk") == remembered  # stored once
        assert m.delete(NS, "alice", {"ids": [remembered]}, "test") == 1

        memories = m.list_memories(NS, "alice")
        assert all(isinstance(r, MemoryRecord) and r.current for r in memories)
        assert len(memories) == 3
        assert len(m.list_memories(NS, "alice", session_id="s-2")) == 1
        assert len(m.list_memories(NS, "alice", limit=2, include_superseded=True)) == 2

        # Ids as UUID objects: the client sends them as JSON strings.
        assert m.delete(NS, "alice", {"ids": [memories[0].id]}, "user asked") == 1
        assert m.delete(NS, "alice", {"all": True}, "user asked", agent_id="agent-1") == 2

        assert m.session_delete(NS, "alice", "conv-1", "test") == 1  # turns removed
        assert m.session_delete(NS, "alice", "no-such-session", "test") == 0
        counts = m.forget(NS, "alice", "erasure request")
        assert counts["sessions"] == 1 and counts["turns"] == 0


# --- every method, async ---------------------------------------------------------------------


def test_async_every_method(ns: Database) -> None:
    async def run() -> None:
        async with AsyncMemory(ns.dsn(APP_USER)) as m:
            session = await m.session_start(NS, "alice", agent_id="agent-1", session_id="c-1")
            assert session.session_id == "c-1" and not session.closed
            event = await m.add(NS, "alice", TURNS, session_id="c-1", agent_id="agent-1")
            read = await m.session_get(NS, "alice", "c-1", limit_chars=10_000)
            assert [i["role"] for i in read.items] == ["user", "assistant"]
            assert await m.session_messages(NS, "alice", "c-1") == TURNS
            status = await m.status(NS, "alice", event)
            assert status is not None and status.status == "accepted"
            assert [r.session_id for r in await m.session_list(NS, "alice")] == ["c-1"]
            popped = await m.session_pop(NS, "alice", "c-1")
            assert popped is not None and popped["seq"] == 2
            handoff = await m.session_end(NS, "alice", "c-1")
            assert handoff is not None and handoff.turn_count == 1
            hits = await m.search(NS, "alice", "Lisbon")
            assert [h.content for h in hits][:1] == ["Alice lives in Lisbon"]
            remembered = await m.remember(NS, "alice", "Alice drinks oat milk", agent_id="a-2")
            assert isinstance(remembered, uuid.UUID)
            assert await m.remember(NS, "alice", "Alice drinks oat milk") == remembered
            (hit,) = await m.search(NS, "alice", "oat milk", agent_id="a-2")
            assert (hit.id, hit.agent_id, hit.session_id) == (remembered, "a-2", None)
            assert await m.delete(NS, "alice", {"ids": [remembered]}, "test") == 1
            memories = await m.list_memories(NS, "alice")
            assert len(memories) == 3
            assert await m.delete(NS, "alice", {"ids": [str(memories[0].id)]}, "asked") == 1
            assert await m.session_delete(NS, "alice", "c-1", "test") == 1  # turns removed
            counts = await m.forget(NS, "alice", "erasure request")
            assert counts["memories"] == 2
            with pytest.raises(SessionClosed):
                await m.session_start(NS, "alice", session_id="c-9")
                await m.session_end(NS, "alice", "c-9")
                await m.add(NS, "alice", TURNS, session_id="c-9")

    asyncio.run(run())


# --- exceptions, each from a real error -------------------------------------------------------


@pytest.fixture
def memory(ns: Database) -> Iterator[Memory]:
    with Memory(ns.dsn(APP_USER)) as m:
        yield m


def test_invalid_turn_names_index_and_field(memory: Memory) -> None:
    bad = [TURNS[0], {"role": "user", "content": "hi", "sequnce_id": 1}]
    with pytest.raises(InvalidTurn) as info:
        memory.add(NS, "alice", bad, session_id="conv-1")
    e = info.value
    assert (e.index, e.field, e.path, e.sqlstate) == (1, "sequnce_id", ".sequnce_id", "22023")
    assert e.function == "add"
    assert e.hint is not None and "a turn has" in e.hint
    assert isinstance(e.pgerror, psycopg.errors.InvalidParameterValue)
    assert e.__cause__ is e.pgerror
    assert isinstance(e, InvalidArgument) and isinstance(e, AidbMemoryError)
    with pytest.raises(InvalidTurn) as info:
        memory.add(NS, "alice", [{"role": "assistant", "content": ""}])
    assert (info.value.index, info.value.field) == (0, "content")


def test_invalid_argument(memory: Memory) -> None:
    with pytest.raises(InvalidArgument) as info:
        memory.session_get(NS, "alice", "conv-1", limit_turns=0)
    assert info.value.sqlstate == "22023" and not isinstance(info.value, InvalidTurn)
    with pytest.raises(InvalidArgument) as info:
        memory.add(NS, "alice", None)  # type: ignore[arg-type]
    assert info.value.sqlstate == "22004"
    with pytest.raises(InvalidArgument) as info:
        memory.add(NS, "alice", {"role": "user", "content": "hi"})  # type: ignore[arg-type]
    assert type(info.value) is InvalidArgument
    with pytest.raises(InvalidArgument):
        memory.session_messages(NS, "alice", "conv-1", format="xml")
    with pytest.raises(InvalidArgument):
        memory.search(NS, "alice", "  ")
    with pytest.raises(InvalidArgument):  # 22003: beyond a SQL integer
        memory.session_list(NS, "alice", limit=2**40)


def test_session_closed(memory: Memory) -> None:
    memory.add(NS, "alice", TURNS, session_id="conv-1")
    memory.session_end(NS, "alice", "conv-1")
    with pytest.raises(SessionClosed) as info:
        memory.add(NS, "alice", TURNS, session_id="conv-1")
    assert info.value.sqlstate == "55000" and "session_end" in (info.value.hint or "")
    with pytest.raises(SessionClosed):
        memory.session_pop(NS, "alice", "conv-1")


def test_namespace_inactive(ns: Database, memory: Memory) -> None:
    ns.sql("SELECT * FROM aidb_memory.namespace_update(%s, state => 'INACTIVE')", (NS,))
    with pytest.raises(NamespaceInactive) as info:
        memory.add(NS, "alice", TURNS)
    assert info.value.sqlstate == "55000"
    assert memory.list_memories(NS, "alice")  # reads still work


def test_idempotency_conflict(memory: Memory) -> None:
    memory.add(NS, "alice", TURNS, idempotency_key="k")
    with pytest.raises(IdempotencyConflict) as info:
        memory.add(NS, "alice", TURNS[:1], idempotency_key="k")
    assert info.value.sqlstate == "23505" and info.value.hint


def test_namespace_not_found(memory: Memory) -> None:
    with pytest.raises(NamespaceNotFound) as info:
        memory.session_get("no_such_namespace", "alice", "conv-1")
    assert info.value.sqlstate == "42704"
    assert "aidb_memory.init" in (info.value.hint or "")


def test_permission_denied(ns: Database) -> None:
    with Memory(ns.dsn(WORKER_USER)) as m, pytest.raises(PermissionDenied) as info:
        m.add(NS, "alice", TURNS)
    assert info.value.sqlstate == "42501"
    ns.sql("SELECT aidb_memory.init('bound_ns', config => '{\"actor_binding\": \"session_user\"}')")
    with Memory(ns.dsn(APP_USER)) as m:
        with pytest.raises(PermissionDenied) as info:
            m.session_start("bound_ns", "alice")
        assert info.value.function == "session_start"
        assert m.session_start("bound_ns", APP_USER, session_id="mine").session_id == "mine"


def test_async_errors_are_mapped_too(ns: Database) -> None:
    async def run() -> None:
        async with AsyncMemory(ns.dsn(APP_USER)) as m:
            with pytest.raises(InvalidTurn) as info:
                await m.add(NS, "alice", [{"role": "user"}])
            assert (info.value.index, info.value.field) == (0, "content")
            with pytest.raises(NamespaceNotFound):
                await m.search("nope", "alice", "x")

    asyncio.run(run())


# --- warnings -------------------------------------------------------------------------------


def test_read_warnings_on_the_result_and_logged(
    ns: Database, caplog: pytest.LogCaptureFixture
) -> None:
    long_turns = [{"role": "user", "content": "x" * 300}, {"role": "assistant", "content": "y"}]
    with Memory(ns.dsn(APP_USER)) as quiet:
        quiet.add(NS, "alice", long_turns, session_id="conv-1")
        quiet.add(NS, "alice", long_turns, session_id="conv-1")
        with caplog.at_level(logging.WARNING, logger="aidb_memory.client"):
            result = quiet.session_get(NS, "alice", "conv-1", limit_chars=400)
        assert result.warnings == ("compaction_budget_too_small",)
        assert caplog.records == []
    with (
        Memory(ns.dsn(APP_USER), log_warnings=True) as loud,
        caplog.at_level(logging.WARNING, logger="aidb_memory.client"),
    ):
        loud.session_get(NS, "alice", "conv-1", limit_chars=400)
    [record] = caplog.records
    assert record.name == "aidb_memory.client" and record.levelno == logging.WARNING
    assert "compaction_budget_too_small" in record.getMessage()
    assert "conv-1" in record.getMessage()


# --- construction: DSN, connection, pool -------------------------------------------------------


def test_dsn_owns_an_autocommit_connection(ns: Database) -> None:
    m = Memory(ns.dsn(APP_USER))
    m.add(NS, "alice", TURNS, session_id="conv-1")
    # Visible at once from another connection: autocommit.
    assert ns.value("SELECT count(*) FROM aidb_memory.turn") == 2
    conn = m._conn
    assert conn is not None and conn.autocommit
    m.close()
    assert conn.closed


def test_a_given_connection_is_the_callers_transaction(ns: Database) -> None:
    with psycopg.connect(ns.dsn(APP_USER), row_factory=dict_row) as conn:
        m = Memory(conn)
        m.add(NS, "alice", TURNS, session_id="conv-1")
        # Same transaction: readable through the client, not yet committed.
        assert len(m.session_get(NS, "alice", "conv-1").items) == 2
        assert ns.value("SELECT count(*) FROM aidb_memory.turn") == 0
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.rollback()
        assert m.session_get(NS, "alice", "conv-1").items == []
        m.add(NS, "alice", TURNS, session_id="conv-1")
        conn.commit()
        assert ns.value("SELECT count(*) FROM aidb_memory.turn") == 2
        m.close()
        assert not conn.closed
        # An error aborts the caller's transaction, which the caller rolls back.
        with pytest.raises(InvalidArgument):
            m.session_get(NS, "alice", "conv-1", limit_chars=0)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        conn.rollback()
        assert len(m.session_get(NS, "alice", "conv-1").items) == 2


def test_remember_is_in_the_callers_transaction_and_refuses_bad_input(ns: Database) -> None:
    with psycopg.connect(ns.dsn(APP_USER)) as conn:
        m = Memory(conn)
        first = m.remember(NS, "bob", "Bob likes jazz")
        # In the caller's transaction: searchable at once, through it, before the commit.
        assert [h.id for h in m.search(NS, "bob", "jazz")] == [first]
        assert ns.value("SELECT count(*) FROM aidb_memory.memory WHERE actor_id = 'bob'") == 0
        conn.rollback()
        assert m.search(NS, "bob", "jazz") == []
        kept = m.remember(NS, "bob", "Bob likes jazz", session_id="s-9", agent_id="agent-2")
        conn.commit()
        (record,) = m.list_memories(NS, "bob")
        assert (record.id, record.content, record.session_id, record.agent_id) == (
            kept,
            "Bob likes jazz",
            "s-9",
            "agent-2",
        )
        conn.commit()
        with pytest.raises(InvalidArgument) as info:
            m.remember(NS, "bob", "x" * 1001)  # over memory_max_chars (1000)
        assert (info.value.sqlstate, info.value.function) == ("22023", "remember")
        assert "content" in info.value.message
        conn.rollback()
        with pytest.raises(InvalidArgument) as info:
            m.remember(NS, "bob", None)  # type: ignore[arg-type]
        assert info.value.sqlstate == "22004"
        conn.rollback()
        with pytest.raises(NamespaceNotFound):
            m.remember("no_such_namespace", "bob", "Bob likes jazz")
        conn.rollback()
        # A read-only transaction (as on a replica) refuses the write.
        conn.read_only = True
        with pytest.raises(AidbMemoryError) as info:
            m.remember(NS, "bob", "Bob likes blues")
        assert info.value.sqlstate == "25006"
        conn.rollback()
    assert ns.value("SELECT count(*) FROM aidb_memory.memory WHERE actor_id = 'bob'") == 1


def test_statements_are_prepared(ns: Database) -> None:
    with psycopg.connect(ns.dsn(APP_USER), autocommit=True) as conn:
        m = Memory(conn)
        m.session_get(NS, "alice", "conv-1")
        m.session_get(NS, "alice", "conv-2", limit_chars=100)
        prepared = [
            r[0] for r in conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()
        ]
    reads = [s for s in prepared if "aidb_memory.session_get" in s]
    assert len(reads) == 2, prepared
    assert all('"namespace" => $1::text' in s for s in reads)
    assert any('"limit_chars" => $4::integer' in s for s in reads)
    assert not any("limit_items" in s for s in reads)
    with psycopg.connect(ns.dsn(APP_USER), autocommit=True) as conn:
        Memory(conn, prepare=False).session_get(NS, "alice", "conv-1")
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)


def test_sync_pool(ns: Database) -> None:
    with ConnectionPool(ns.dsn(APP_USER), min_size=1, max_size=2, open=True) as pool:
        m = Memory(pool)
        m.add(NS, "alice", TURNS, session_id="conv-1")
        # Committed when the call returned the connection.
        assert ns.value("SELECT count(*) FROM aidb_memory.turn") == 2
        assert len(m.session_get(NS, "alice", "conv-1").items) == 2
        with pytest.raises(SessionClosed):
            m.session_end(NS, "alice", "conv-1")
            m.add(NS, "alice", TURNS, session_id="conv-1")
        # The failed call's connection went back rolled back: the pool still serves.
        assert m.session_list(NS, "alice")[0].closed
        m.close()
        assert not pool.closed


def test_async_connection_and_pool(ns: Database) -> None:
    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(ns.dsn(APP_USER)) as conn:
            m = AsyncMemory(conn)
            await m.add(NS, "alice", TURNS, session_id="conv-1")
            assert ns.value("SELECT count(*) FROM aidb_memory.turn") == 0
            await conn.commit()
            await m.close()
            assert not conn.closed
        async with AsyncConnectionPool(ns.dsn(APP_USER), min_size=1, open=False) as pool:
            pm = AsyncMemory(pool)
            read = await pm.session_get(NS, "alice", "conv-1")
            assert len(read.items) == 2
            # Concurrent calls each borrow a connection.
            results = await asyncio.gather(
                *(pm.session_messages(NS, "alice", "conv-1") for _ in range(4))
            )
            assert all(r == TURNS for r in results)
        lazy = AsyncMemory(ns.dsn(APP_USER))  # connects on first use
        assert (await lazy.session_list(NS, "alice"))[0].session_id == "conv-1"
        await lazy.close()

    asyncio.run(run())


def test_wrong_source_types() -> None:
    with pytest.raises(TypeError, match="AsyncMemory takes"):
        Memory(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Memory takes the sync ones"):
        AsyncMemory(object())  # type: ignore[arg-type]


def test_a_connection_failure_is_an_aidb_memory_error(ns: Database) -> None:
    dsn: Any = ns.dsn(APP_USER).replace(f"dbname={ns.name}", "dbname=no_such_db")
    with pytest.raises(AidbMemoryError) as info:
        Memory(dsn)
    assert isinstance(info.value.pgerror, psycopg.OperationalError)
