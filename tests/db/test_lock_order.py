"""One lock order between the session API and compaction (issue 10, item 1).

A compacting read holds the session's compaction lock row for its model call and then needs the
session row (FOR KEY SHARE: its summary's foreign key). Every other interleaving is tried here:
each of add, session_end, session_delete and session_pop in an open transaction, started before
the read or while the read is in its model call, and that transaction then popping (the call
that waits for the compaction lock). No client may get 40P01 and the server log may not say
"deadlock detected": the pop waits, or the read reports ``compaction_busy``.

Every connection has a ``statement_timeout``: a guard, so that a regression fails fast instead
of hanging the suite, not a measurement.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import APP_USER, Database
from fake_openai import FakeOpenAI, Reply, serve

NS = "order"
GUARD = "SET statement_timeout = '20s'"
MODEL_DELAY = 2.0  # the model call the other transaction meets (or that meets it)


def _exchange(i: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"question {i:04d} ".ljust(100, "q")},
        {"role": "assistant", "content": f"answer {i:04d} ".ljust(100, "a")},
    ]


OPS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "add": (
        "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's')",
        (NS, json.dumps(_exchange(99))),
    ),
    "session_end": ("SELECT * FROM aidb_memory.session_end(%s, 'alice', 's', 'bye')", (NS,)),
    "session_delete": (
        "SELECT aidb_memory.session_delete(%s, 'alice', 's', 'lock order test')",
        (NS,),
    ),
    "session_pop": ("SELECT aidb_memory.session_pop(%s, 'alice', 's')", (NS,)),
}
POP = OPS["session_pop"]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with serve() as server:
        server.default = lambda req: Reply(content="S" * 200, delay=MODEL_DELAY)
        yield server


def _server_log(db: Database) -> Path:
    # testing.postgresql sends the server's stderr to <base_dir>/<class name>.log
    # (ThrowawayServer runs it with logging_collector=off).
    (log,) = (Path(db.server.workdir) / "server").glob("*.log")
    return log


class _Read(threading.Thread):
    """A compacting read (20 turns of 100 chars, budget 1000) in a connection of its own."""

    def __init__(self, db: Database) -> None:
        super().__init__()
        self.conn = db.connect(APP_USER)
        self.conn.execute(GUARD)
        self.pid = self.conn.info.backend_pid
        self.result: tuple[int, list[str]] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            row = self.conn.execute(
                "SELECT compacted_entries, warnings FROM aidb_memory.session_get("
                "%s, 'alice', 's', 1000)",
                (NS,),
            ).fetchone()
            assert row is not None
            self.result = (int(row[0]), list(row[1]))
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            self.conn.close()


def _waiting_or_calling(db: Database, fake: FakeOpenAI, read: _Read) -> None:
    """Until the read is in its model call, waits for a lock, or is done (a guard of 15 s)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if fake.calls() or not read.is_alive():
            return
        waiting = db.value(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
            (read.pid,),
        )
        if waiting:
            return
        time.sleep(0.02)
    raise AssertionError("the read neither called the model nor waited nor finished")


def _run(conn: psycopg.Connection[Any], statement: tuple[str, tuple[Any, ...]]) -> Any:
    """A statement of the open transaction; an error is returned (the transaction goes on from
    a savepoint), so that a 40P01 anywhere is seen."""
    assert conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
    try:
        with conn.transaction():  # a savepoint: the transaction is open
            return conn.execute(*statement).fetchall()
    except psycopg.Error as e:
        return e


@pytest.mark.parametrize("first", ["op", "read"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_no_interleaving_of_the_session_api_and_a_compacting_read_deadlocks(
    db: Database, fake: FakeOpenAI, op: str, first: str
) -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\', \'{"llm_timeout_s": 10}\')', (NS,))
    with db.connect(APP_USER) as app:
        for i in range(1, 11):
            app.execute(
                "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's')",
                (NS, json.dumps(_exchange(i))),
            )
    log = _server_log(db)
    log_start = log.stat().st_size

    read = _Read(db)
    outcomes: list[Any] = []
    with db.connect(APP_USER, autocommit=False) as tx:
        tx.execute(GUARD)
        if first == "op":
            outcomes.append(_run(tx, OPS[op]))  # in flight, not committed
            read.start()
            _waiting_or_calling(db, fake, read)
        else:
            read.start()
            _waiting_or_calling(db, fake, read)
            assert fake.calls(), "the read is in its model call"
            outcomes.append(_run(tx, OPS[op]))
        outcomes.append(_run(tx, POP))  # what waits for the compaction lock
        tx.commit()
    read.join(40)
    assert not read.is_alive()

    errors = [o for o in outcomes if isinstance(o, psycopg.Error)]
    assert not [e for e in errors if isinstance(e, psycopg.errors.DeadlockDetected)], errors
    # A pop after session_end is refused (the session is closed); nothing else fails.
    assert all(isinstance(e, psycopg.errors.ObjectNotInPrerequisiteState) for e in errors), errors
    assert read.error is None, read.error
    assert read.result is not None
    compacted, warnings = read.result
    assert (compacted > 0 and warnings == []) or warnings in (
        ["compaction_busy"],
        ["compaction_call_failed"],  # its session was deleted under it: no summary to store
    ), read.result
    with log.open(errors="replace") as f:
        f.seek(log_start)
        assert "deadlock detected" not in f.read()
    # No lock row is left without its session.
    assert (
        db.sql(
            "SELECT session_ref FROM aidb_memory.compaction_lock l WHERE NOT EXISTS "
            "(SELECT 1 FROM aidb_memory.session s WHERE s.id = l.session_ref)"
        )
        == []
    )
