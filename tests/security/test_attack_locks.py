"""Locks that only our code can take (issue 9, class 5; issue 10, item 1).

Until 0.x the per-actor lock was an advisory lock on ``hashtext(namespace id || NUL || actor)``,
which PL/Python cut at the NUL (so it was per namespace), and compaction used
``pg_try_advisory_xact_lock`` on ``hashint8(session ref)``: any role that can connect could take
those keys and stall the worker, ``forget``, ``delete`` and ``session_pop``, or keep every
compaction ``compaction_busy``. The locks are now rows of tables no role but ours can touch.

Every API connection here has a ``statement_timeout``: a guard, so that a regression fails fast
with 57014 instead of hanging the suite, not a measurement.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from conftest import APP_USER, NO_GRANT_USER, WORKER_USER, Database
from fake_openai import FakeOpenAI, Reply, Request, serve

NS = "locks"
GUARD = "SET statement_timeout = '15s'"
# The keys the advisory locks of the old code used (compaction.py and reconciliation.py).
OLD_COMPACTION_CLASS = 0x41_44_43_50  # "ADCP", with hashint8(session.id)
OLD_ACTOR_CLASS = 0x41_44_52_43  # "ADRC", with hashtext(f"{namespace.id}\0{actor}")


def _extraction(request: Request) -> Reply:
    """A compaction gets a summary, an extraction one new fact."""
    if "response_format" not in request.body:
        return Reply(content="S" * 200)
    text = f"fact {len(request.body['messages'][-1]['content'])}"
    return Reply(content=json.dumps({"operations": [{"op": "add", "text": text, "target": None}]}))


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with serve() as server:
        server.default = _extraction
        yield server


@pytest.fixture
def ns(db: Database, fake: FakeOpenAI) -> int:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\', \'{"llm_timeout_s": 10}\')', (NS,))
    return int(db.value("SELECT id FROM aidb_memory.namespace WHERE name = %s", (NS,)))


def _guarded(db: Database, user: str, autocommit: bool = True) -> psycopg.Connection[Any]:
    conn = db.connect(user, autocommit=autocommit)
    conn.execute(GUARD)
    if not autocommit:
        conn.commit()
    return conn


def _exchange(i: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"question {i:04d} ".ljust(100, "q")},
        {"role": "assistant", "content": f"answer {i:04d} ".ljust(100, "a")},
    ]


def _add(conn: psycopg.Connection[Any], actor: str, turns: list[dict[str, Any]]) -> None:
    conn.execute("SELECT aidb_memory.add(%s, %s, %s::jsonb, 's')", (NS, actor, json.dumps(turns)))


def _get(conn: psycopg.Connection[Any], actor: str, limit_chars: int) -> tuple[int, list[str]]:
    row = conn.execute(
        "SELECT compacted_entries, warnings FROM aidb_memory.session_get(%s, %s, 's', %s)",
        (NS, actor, limit_chars),
    ).fetchone()
    assert row is not None
    return int(row[0]), list(row[1])


def _statuses(db: Database, actor: str) -> list[str]:
    rows = db.sql("SELECT status FROM aidb_memory.event WHERE actor_id = %s ORDER BY id", (actor,))
    return [r[0] for r in rows]


def _work(db: Database) -> None:
    with _guarded(db, WORKER_USER) as worker:
        worker.execute("CALL aidb_memory.process_events(lease_s => 60, backoff_s => 0)")


def _memories(db: Database, actor: str) -> int:
    return int(db.value("SELECT count(*) FROM aidb_memory.memory WHERE actor_id = %s", (actor,)))


def test_the_old_advisory_keys_held_by_a_role_without_grants_stall_nothing(
    db: Database, fake: FakeOpenAI, ns: int, attack_roles: dict[str, str]
) -> None:
    with _guarded(db, APP_USER) as app:
        for i in range(1, 11):  # 2,000 chars: a read with a budget of 1,000 compacts
            _add(app, "alice", _exchange(i))
        refs = [r[0] for r in db.sql("SELECT id FROM aidb_memory.session")]
        # The attacker computes every key the old code took and holds them, for as long as it
        # likes (session locks, not transaction locks). No privilege is needed for that.
        with db.connect(NO_GRANT_USER) as attacker:
            for ref in refs:
                attacker.execute(
                    "SELECT pg_advisory_lock(%s, pg_catalog.hashint8(%s))",
                    (OLD_COMPACTION_CLASS, ref),
                )
            for key in (f"{ns}", f"{ns}alice", f"{ns}bob"):  # as cut at the NUL, and whole
                attacker.execute(
                    "SELECT pg_advisory_lock(%s, pg_catalog.hashtext(%s))", (OLD_ACTOR_CLASS, key)
                )
            held = attacker.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = "
                "pg_backend_pid() AND granted"
            ).fetchone()
            assert held == (len(refs) + 3,)

            _add(app, "alice", _exchange(11))
            compacted, warnings = _get(app, "alice", 1000)
            assert warnings == [] and compacted > 0, "the read compacted, it was not kept busy"
            popped = app.execute(
                "SELECT aidb_memory.session_pop(%s, 'alice', 's')", (NS,)
            ).fetchone()
            assert popped is not None and popped[0]["seq"] == 22
            _work(db)
            assert set(_statuses(db, "alice")) == {"processed"}
            assert _memories(db, "alice") > 0
            deleted = app.execute(
                "SELECT aidb_memory.delete(%s, 'alice', '{\"all\": true}', 'attack test')", (NS,)
            ).fetchone()
            assert deleted is not None and deleted[0] > 0
            forgotten = app.execute(
                "SELECT aidb_memory.forget(%s, 'alice', 'attack test')", (NS,)
            ).fetchone()
            assert forgotten is not None and forgotten[0]["sessions"] == 1
    # forget leaves no lock row behind either.
    assert db.sql("SELECT * FROM aidb_memory.actor_lock") == []
    assert db.sql("SELECT * FROM aidb_memory.compaction_lock") == []


def test_a_long_hold_of_one_actors_lock_blocks_no_other_actor(
    db: Database, fake: FakeOpenAI, ns: int
) -> None:
    with _guarded(db, APP_USER) as app:
        _add(app, "alice", _exchange(1))
        _add(app, "bob", _exchange(1))
        _work(db)
        assert _memories(db, "alice") == 1 and _memories(db, "bob") == 1
        _add(app, "bob", _exchange(2))
        # Ours, held as long as the transaction stays open: a delete of alice's memories.
        with _guarded(db, APP_USER, autocommit=False) as holder:
            holder.execute(
                "SELECT aidb_memory.delete(%s, 'alice', '{\"all\": true}', 'held')", (NS,)
            )
            _work(db)  # bob's extraction reconciles under bob's lock
            assert _statuses(db, "bob") == ["processed", "processed"]
            assert _memories(db, "bob") == 2
            deleted = app.execute(
                "SELECT aidb_memory.delete(%s, 'bob', '{\"all\": true}', 'test')", (NS,)
            ).fetchone()
            assert deleted == (2,)
            forgotten = app.execute(
                "SELECT aidb_memory.forget(%s, 'bob', 'test')", (NS,)
            ).fetchone()
            assert forgotten is not None and forgotten[0]["sessions"] == 1
            # The lock is still one per actor: alice's own forget has to wait for it.
            with db.connect(APP_USER) as other:
                other.execute("SET lock_timeout = '100ms'")
                with pytest.raises(psycopg.errors.LockNotAvailable):
                    other.execute("SELECT aidb_memory.forget(%s, 'alice', 'test')", (NS,))
            holder.rollback()
    assert _memories(db, "alice") == 1, "the held delete was rolled back"


def test_a_pop_during_a_compaction_waits_for_it_and_nothing_deadlocks(
    db: Database, fake: FakeOpenAI, ns: int
) -> None:
    """Issue 10, item 1: pop used to lock the session row, then wait for the compaction, whose
    summary insert needed that row (40P01). Now pop takes the compaction lock first."""
    with _guarded(db, APP_USER) as app:
        for i in range(1, 11):
            _add(app, "alice", _exchange(i))
        fake.queue(Reply(content="S" * 200, delay=3))
        read: dict[str, tuple[int, list[str]]] = {}

        def compacting_read() -> None:
            with _guarded(db, APP_USER) as conn:
                read["result"] = _get(conn, "alice", 1000)

        thread = threading.Thread(target=compacting_read)
        thread.start()
        deadline = time.monotonic() + 10
        while not fake.calls() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert fake.calls(), "the compaction is calling the model"
        popped = app.execute("SELECT aidb_memory.session_pop(%s, 'alice', 's')", (NS,)).fetchone()
        thread.join(30)
        assert not thread.is_alive()
    assert popped is not None and popped[0]["seq"] == 20
    assert read["result"] == (15, []), "the compaction was not a deadlock victim"
    assert db.sql("SELECT from_seq, to_seq FROM aidb_memory.summary") == [(1, 15)]


def test_a_session_deleted_during_its_compaction_leaves_no_lock_row(
    db: Database, fake: FakeOpenAI, ns: int
) -> None:
    """session_delete does not wait for the compaction (whose lock row it skips); the
    compaction, finding its session gone, removes the row itself."""
    with _guarded(db, APP_USER) as app:
        for i in range(1, 11):
            _add(app, "alice", _exchange(i))
        fake.queue(Reply(content="S" * 200, delay=2))
        read: dict[str, tuple[int, list[str]]] = {}

        def compacting_read() -> None:
            with _guarded(db, APP_USER) as conn:
                read["result"] = _get(conn, "alice", 1000)

        thread = threading.Thread(target=compacting_read)
        thread.start()
        deadline = time.monotonic() + 10
        while not fake.calls() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert fake.calls(), "the compaction is calling the model"
        deleted = app.execute(
            "SELECT aidb_memory.session_delete(%s, 'alice', 's', 'test')", (NS,)
        ).fetchone()
        thread.join(30)
        assert not thread.is_alive()
    assert deleted == (20,)
    # Its summary had no session left to go to (or, had the deletion not committed yet, met the
    # foreign key): nothing was stored either way.
    assert read["result"] in ((0, ["compaction_busy"]), (0, ["compaction_call_failed"]))
    assert db.sql("SELECT * FROM aidb_memory.compaction_lock") == []
    assert db.sql("SELECT * FROM aidb_memory.summary") == []


def test_namespace_drop_takes_its_lock_rows_with_it(
    db: Database, fake: FakeOpenAI, ns: int
) -> None:
    with _guarded(db, APP_USER) as app:
        _add(app, "alice", _exchange(1))
        _add(app, "bob", _exchange(1))
    _work(db)
    assert db.sql("SELECT actor_id FROM aidb_memory.actor_lock ORDER BY 1") == [
        ("alice",),
        ("bob",),
    ]
    assert len(db.sql("SELECT * FROM aidb_memory.compaction_lock")) == 2
    db.sql("SELECT aidb_memory.namespace_drop(%s, 'test')", (NS,))
    assert db.sql("SELECT * FROM aidb_memory.actor_lock") == []
    assert db.sql("SELECT * FROM aidb_memory.compaction_lock") == []


def test_a_session_without_a_lock_row_gets_one_when_it_needs_it(
    db: Database, fake: FakeOpenAI, ns: int
) -> None:
    """A session that an older release created while 0007_locks was being installed has no
    lock row: compaction and pop create it rather than never compacting or not excluding."""
    with _guarded(db, APP_USER) as app:
        for i in range(1, 11):
            _add(app, "alice", _exchange(i))
        db.sql("DELETE FROM aidb_memory.compaction_lock")
        assert _get(app, "alice", 1000) == (15, [])
        assert len(db.sql("SELECT * FROM aidb_memory.compaction_lock")) == 1
        db.sql("DELETE FROM aidb_memory.compaction_lock")
        popped = app.execute("SELECT aidb_memory.session_pop(%s, 'alice', 's')", (NS,)).fetchone()
        assert popped is not None and popped[0]["seq"] == 20
        assert len(db.sql("SELECT * FROM aidb_memory.compaction_lock")) == 1
