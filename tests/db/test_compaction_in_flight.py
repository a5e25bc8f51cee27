"""What an inline compaction in flight does to the session's other callers (issue 13, item 5).

A budgeted read that compacts holds the session's compaction lock row during its model call.
``add`` never waits for it; other readers get the history as it was with ``compaction_busy`` at
once; ``session_pop`` waits for it at most ``POP_WAIT_S`` (5 s, or the caller's
``lock_timeout`` when shorter), then fails with 55P03 and pops nothing.

The model is the fake server answering slowly (``MODEL_DELAY``); every bound asserted here is far
below that delay, so a loaded machine cannot make them flake.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from conftest import APP_USER, Database
from fake_openai import FakeOpenAI, Reply

NS = "inflight"
MODEL_DELAY = 12.0
POP_WAIT_S = 5.0  # sessions.POP_WAIT_S


def _exchange(i: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"question {i:04d} ".ljust(100, "q")},
        {"role": "assistant", "content": f"answer {i:04d} ".ljust(100, "a")},
    ]


def _add(conn: psycopg.Connection[Any], i: int) -> None:
    conn.execute(
        "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's')", (NS, json.dumps(_exchange(i)))
    )


def _read(conn: psycopg.Connection[Any]) -> tuple[list[int], int, list[str]]:
    row = conn.execute(
        "SELECT items, compacted_entries, warnings FROM aidb_memory.session_get("
        "%s, 'alice', 's', limit_chars => 1000)",
        (NS,),
    ).fetchone()
    assert row is not None
    return [i["seq"] for i in row[0]], int(row[1]), list(row[2])


class _CompactingRead(threading.Thread):
    """A read of the session that compacts (its model answers after MODEL_DELAY)."""

    def __init__(self, db: Database) -> None:
        super().__init__()
        self.db = db
        self.result: tuple[list[int], int, list[str]] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.db.connect(APP_USER) as conn:
                self.result = _read(conn)
        except BaseException as e:  # reported by the test
            self.error = e


@pytest.fixture
def in_flight(db: Database, fake: FakeOpenAI) -> Iterator[_CompactingRead]:
    """A session of 20 turns of 100 chars whose budgeted read is in its model call."""
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\', \'{"llm_timeout_s": 60}\')', (NS,))
    with db.connect(APP_USER) as app:
        for i in range(1, 11):
            _add(app, i)
    fake.queue(Reply(content="S" * 200, delay=MODEL_DELAY))
    read = _CompactingRead(db)
    read.start()
    deadline = time.monotonic() + 30
    while not fake.calls() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.calls(), "the read is in its model call"
    yield read
    read.join(MODEL_DELAY + 30)
    assert not read.is_alive()
    assert read.error is None, read.error


def test_an_add_does_not_wait_for_a_compaction_in_flight(
    db: Database, in_flight: _CompactingRead
) -> None:
    with db.connect(APP_USER) as app:
        started = time.monotonic()
        _add(app, 11)
        assert time.monotonic() - started < MODEL_DELAY / 2
        # Other readers get the history as it was, at once.
        started = time.monotonic()
        seqs, compacted, warnings = _read(app)
        assert time.monotonic() - started < MODEL_DELAY / 2
        assert (seqs, compacted, warnings) == (list(range(13, 23)), 0, ["compaction_busy"])
        assert in_flight.is_alive(), "all of it while the model call was in flight"
    in_flight.join(MODEL_DELAY + 30)
    assert in_flight.result is not None
    assert in_flight.result[1:] == (15, []), "the summary of turns 1-15 is stored"
    assert db.sql("SELECT from_seq, to_seq FROM aidb_memory.summary") == [(1, 15)]


def test_a_pop_waits_for_a_compaction_in_flight_boundedly_then_pops_nothing(
    db: Database, in_flight: _CompactingRead
) -> None:
    pop = "SELECT aidb_memory.session_pop(%s, 'alice', 's')"
    with db.connect(APP_USER) as app:
        # The caller's lock_timeout, when shorter, bounds the wait.
        app.execute("SET lock_timeout = '1s'")
        started = time.monotonic()
        with pytest.raises(psycopg.errors.LockNotAvailable) as caught:
            app.execute(pop, (NS,))
        assert time.monotonic() - started < MODEL_DELAY / 3
        assert caught.value.diag.message_primary == (
            'aidb_memory.session_pop: session "s" is being compacted'
        )
        assert caught.value.diag.message_hint is not None
        # Else POP_WAIT_S: it waits that long, not for the model.
        app.execute("SET lock_timeout = 0")
        started = time.monotonic()
        with pytest.raises(psycopg.errors.LockNotAvailable):
            app.execute(pop, (NS,))
        waited = time.monotonic() - started
        assert POP_WAIT_S <= waited < MODEL_DELAY - 2, waited
        assert in_flight.is_alive(), "both while the model call was in flight"
        in_flight.join(MODEL_DELAY + 30)
        assert in_flight.result is not None
        assert in_flight.result[1:] == (15, [])
        assert db.value("SELECT max(seq) FROM aidb_memory.turn") == 20, "nothing popped"
        # The compaction done, a pop proceeds; popping down to turn 15 drops the summary of 1-15,
        # which would now cover the newest round.
        popped = [app.execute(pop, (NS,)).fetchone() for _ in range(6)]
        assert [p[0]["seq"] for p in popped if p] == [20, 19, 18, 17, 16, 15]
        assert db.sql("SELECT from_seq, to_seq FROM aidb_memory.summary") == []
