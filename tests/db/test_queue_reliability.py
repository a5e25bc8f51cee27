"""The queue and the worker under faults (issue 10, items 2-5): every attempt counts, even one
ended by a cancel or a killed backend; backoff runs from the failure; the CLI worker survives
timeouts, terminated backends and a server restart; failed events can be put back in the queue.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from conftest import (
    ADMIN_USER,
    APP_USER,
    WORKER_USER,
    Database,
    chat_namespace,
    queue_extraction,
    run_cli,
)
from fake_openai import FakeOpenAI, Reply, Request, serve

NS = "mem"
FACT = json.dumps({"operations": [{"op": "add", "text": "A fact.", "target": None}]})
UNFINISHED = "ended without a result (cancelled, timed out or the backend crashed)"


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with serve() as server:
        server.default = lambda _r: Reply(content=FACT)
        yield server


@pytest.fixture
def ns(db: Database, fake: FakeOpenAI) -> None:
    chat_namespace(db, fake.base_url, NS)


def _add(db: Database, text: str, actor: str = "alice") -> str:
    return queue_extraction(db, NS, text, actor)


def _event(db: Database, event_id: str) -> dict[str, Any]:
    rows = db.sql(
        "SELECT status, attempts, last_error, next_attempt_at FROM aidb_memory.event "
        "WHERE public_id = %s",
        (event_id,),
    )
    status, attempts, last_error, next_attempt_at = rows[0]
    return {
        "status": status,
        "attempts": attempts,
        "last_error": last_error,
        "next_attempt_at": next_attempt_at,
    }


def _call(db: Database, *, timeout_ms: int | None = None, **params: Any) -> tuple[int, int, int]:
    named = ", ".join(f"{k} => %({k})s" for k in params)
    with db.connect(WORKER_USER) as conn:
        if timeout_ms is not None:
            conn.execute(f"SET statement_timeout = {timeout_ms}")
        row = conn.execute(f"CALL aidb_memory.process_events({named})", params).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def _wait_until(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _slow_for(marker: str, delay: float) -> Callable[[Request], Reply]:
    """A model that takes ``delay`` s for the event whose turn holds ``marker``."""

    def answer(request: Request) -> Reply:
        sent = json.dumps(request.body.get("messages", []))
        return Reply(content=FACT, delay=delay if marker in sent else 0.0)

    return answer


# --- item 2: an event is claimed at most max_attempts times -----------------------------------


def test_a_timed_out_attempt_counts_and_the_event_fails_after_max_attempts(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    event = _add(db, "I collect stamps.")
    fake.default = lambda _r: Reply(content=FACT, delay=8)
    for attempt in (1, 2):
        with pytest.raises(psycopg.errors.QueryCanceled):
            _call(db, timeout_ms=1500, max_attempts=2, backoff_s=0)
        state = _event(db, event)
        assert state["attempts"] == attempt
        assert state["status"] == ("accepted" if attempt == 1 else "failed")
        assert state["last_error"].startswith(f"attempt {attempt} was cancelled: canceling")
        assert "statement timeout" in state["last_error"]
    # Failed: never claimed again, whatever runs next.
    calls = len(fake.calls())
    assert _call(db, max_attempts=2, backoff_s=0) == (0, 0, 0)
    assert len(fake.calls()) == calls
    assert db.value("SELECT count(*) FROM aidb_memory.memory") == 0


def test_a_killed_attempt_counts_and_is_not_claimed_after_max_attempts(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    event = _add(db, "My locker code is 2817.")
    fake.default = lambda _r: Reply(content=FACT, delay=30)
    pid: dict[str, int] = {}

    def doomed() -> None:
        with db.connect(WORKER_USER) as conn:
            pid["pid"] = conn.info.backend_pid
            with contextlib.suppress(psycopg.Error):  # its backend is terminated
                conn.execute("CALL aidb_memory.process_events(lease_s => 30, max_attempts => 2)")

    for attempt in (1, 2):
        calls = len(fake.calls())
        thread = threading.Thread(target=doomed)
        thread.start()
        _wait_until(lambda: len(fake.calls()) > calls)  # noqa: B023 (used at once)
        assert db.value("SELECT pg_terminate_backend(%s)", (pid["pid"],)) is True
        thread.join(10)
        state = _event(db, event)
        assert (state["status"], state["attempts"]) == ("processing", attempt)
        # The lease runs out (moved into the past rather than waited for).
        db.sql("UPDATE aidb_memory.event SET lease_until = now() - interval '1 second'")
    calls = len(fake.calls())
    assert _call(db, max_attempts=2) == (0, 0, 0)
    assert len(fake.calls()) == calls, "no third model call"
    state = _event(db, event)
    assert (state["status"], state["attempts"]) == ("failed", 2)
    assert state["last_error"] == f"attempt 2 {UNFINISHED}"


def test_a_lapsed_attempt_is_taken_over_while_attempts_are_left_and_says_so(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    event = _add(db, "I speak Basque.")
    db.sql(
        "UPDATE aidb_memory.event SET status = 'processing', attempts = 1, "
        "lease_until = now() - interval '1 second'"
    )
    fake.default = lambda _r: Reply(status=500)
    assert _call(db, max_attempts=3, backoff_s=600) == (0, 0, 1)
    state = _event(db, event)
    assert (state["status"], state["attempts"]) == ("accepted", 2)
    assert "HTTP 500" in state["last_error"]
    # Crashed at its third and last attempt: failed, saying so.
    db.sql(
        "UPDATE aidb_memory.event SET status = 'processing', attempts = 3, "
        "lease_until = now() - interval '1 second'"
    )
    assert _call(db, max_attempts=3) == (0, 0, 0)
    state = _event(db, event)
    assert (state["status"], state["attempts"]) == ("failed", 3)
    assert state["last_error"] == f"attempt 3 {UNFINISHED}"


# --- item 3: backoff counts from the failure --------------------------------------------------


def test_backoff_is_counted_from_the_failure_and_doubles(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    event = _add(db, "My cat is called Miso.")
    # A model that fails after 2 s: the failure comes at least 2 s after the call began.
    fake.default = lambda _r: Reply(status=500, delay=2)
    for failure, wait in ((1, 1.0), (2, 2.0)):
        before = db.value("SELECT clock_timestamp()")
        assert _call(db, max_attempts=5, backoff_s=1) == (0, 0, 1)
        state = _event(db, event)
        assert state["attempts"] == failure
        # Due no earlier than the failure (>= before + 2 s) plus backoff * 2^(n-1).
        assert state["next_attempt_at"] >= before + timedelta(seconds=2 + wait)
        db.sql("UPDATE aidb_memory.event SET next_attempt_at = clock_timestamp()")


# --- item 4: the CLI worker stays up ----------------------------------------------------------


def test_a_worker_with_a_statement_timeout_goes_on_past_the_slow_event(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    slow = _add(db, "SLOW: I am writing a novel.")
    behind = [_add(db, f"I have {n} bicycles.") for n in (2, 3)]
    fake.default = _slow_for("SLOW", 8)
    result = run_cli(
        "worker",
        "--once",
        "--backoff",
        "600",
        dsn=db.dsn(WORKER_USER),
        env={"PGOPTIONS": "-c statement_timeout=1500ms"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    cancelled = (
        "worker: call cancelled (aidb_memory.process_events: canceling statement due to "
        "statement timeout)"
    )
    assert cancelled in result.stdout
    assert "Traceback" not in result.stderr
    assert [_event(db, e)["status"] for e in behind] == ["processed", "processed"]
    state = _event(db, slow)
    assert (state["status"], state["attempts"]) == ("accepted", 1)
    assert state["last_error"].startswith("attempt 1 was cancelled")


def _start_worker(db: Database) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    return subprocess.Popen(
        [sys.executable, "-m", "aidb_memory", "worker", "--dsn", db.dsn(WORKER_USER)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _worker_pid(db: Database) -> int | None:
    value = db.value(
        "SELECT pid FROM pg_stat_activity WHERE usename = %s AND datname = %s",
        (WORKER_USER, db.name),
    )
    return int(value) if value is not None else None


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_worker_reconnects_after_its_backend_is_terminated(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    proc = _start_worker(db)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("worker: started;")
        first = _worker_pid(db)
        assert first is not None
        assert db.value("SELECT pg_terminate_backend(%s)", (first,)) is True
        _wait_until(lambda: _worker_pid(db) not in (None, first))
        event = _add(db, "I moved to Lisbon.")
        _wait_until(lambda: _event(db, event)["status"] == "processed")
        out, err = _stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "worker: connection lost (" in out
    assert "worker: reconnected" in out
    assert out.strip().splitlines()[-1].startswith("worker: stopped; processed 1, failed 0")
    assert "Traceback" not in err


def test_a_worker_survives_a_server_restart(
    db: Database, fake: FakeOpenAI, ns: None, pg_server: Any
) -> None:
    proc = _start_worker(db)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("worker: started;")
        pg_server.restart()
        event = _add(db, "I play the cello.")
        _wait_until(lambda: _event(db, event)["status"] == "processed", timeout=60)
        out, err = _stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "worker: connection lost (" in out
    assert "worker: reconnected" in out
    assert "Traceback" not in err


def test_a_worker_without_the_privilege_exits_2(db: Database, ns: None) -> None:
    result = run_cli("worker", "--once", dsn=db.dsn(APP_USER))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("aidb-memory: worker failed: permission denied")


def test_a_worker_that_cannot_connect_at_start_exits_2(db: Database) -> None:
    result = run_cli("worker", "--once", dsn=db.dsn("no_such_role"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("aidb-memory: cannot connect")


# --- item 5: failed events can be retried -----------------------------------------------------


def _fail_all(db: Database, fake: FakeOpenAI) -> None:
    fake.default = lambda _r: Reply(status=500)
    _call(db, max_attempts=1, max_events=100)
    fake.default = lambda _r: Reply(content=FACT)


def test_events_retry_puts_failed_events_back_with_attempts_reset(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    alice = [_add(db, f"Alice fact {n}.") for n in range(2)]
    bob = _add(db, "Bob fact.", actor="bob")
    _fail_all(db, fake)
    assert {_event(db, e)["status"] for e in [*alice, bob]} == {"failed"}
    later = db.value("SELECT clock_timestamp() + interval '1 hour'")
    retry = "SELECT aidb_memory.events_retry(%s, %s, %s)"
    assert db.value(retry, (NS, "alice", later), user=ADMIN_USER) == 0
    assert db.value(retry, (NS, "alice", None), user=ADMIN_USER) == 2
    assert [(_event(db, e)["status"], _event(db, e)["attempts"]) for e in alice] == [
        ("accepted", 0),
        ("accepted", 0),
    ]
    assert _event(db, bob)["status"] == "failed"
    assert _call(db, max_attempts=1) == (2, 0, 0)
    assert db.value("SELECT aidb_memory.events_retry(%s)", (NS,), user=ADMIN_USER) == 1
    assert _event(db, bob)["status"] == "accepted"


@pytest.mark.parametrize(
    ("args", "sqlstate", "message"),
    [
        ((None,), "22004", "aidb_memory.events_retry: namespace must not be NULL"),
        (("nope",), "42704", 'aidb_memory.events_retry: namespace "nope" does not exist'),
    ],
    ids=["null-namespace", "unknown-namespace"],
)
def test_events_retry_errors(
    db: Database, ns: None, args: tuple[Any, ...], sqlstate: str, message: str
) -> None:
    with pytest.raises(psycopg.Error) as caught:
        db.value("SELECT aidb_memory.events_retry(%s)", args, user=ADMIN_USER)
    assert caught.value.sqlstate == sqlstate
    assert caught.value.diag.message_primary == message
    assert caught.value.diag.message_hint


def test_events_retry_is_for_admins(db: Database, ns: None) -> None:
    for user in (APP_USER, WORKER_USER):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            db.value("SELECT aidb_memory.events_retry(%s)", (NS,), user=user)


def test_cli_events_list_and_retry(db: Database, fake: FakeOpenAI, ns: None) -> None:
    for n in range(3):
        _add(db, f"Fact {n}.")
    _fail_all(db, fake)
    _add(db, "Fact 3.")
    listed = run_cli("events", "list", dsn=db.dsn(ADMIN_USER))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [
        "namespace  kind        accepted  processing  processed  failed  skipped",
        "mem        extraction         1           0          0       3        0",
    ]
    as_json = run_cli("events", "list", "--json", "--namespace", NS, dsn=db.dsn(WORKER_USER))
    assert json.loads(as_json.stdout) == {NS: {"extraction": {"accepted": 1, "failed": 3}}}
    retried = run_cli(
        "events", "retry", "--namespace", NS, "--actor", "alice", dsn=db.dsn(ADMIN_USER)
    )
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout == 'put 3 failed events of namespace "mem" back in the queue\n'
    assert db.value("SELECT count(*) FROM aidb_memory.event WHERE status = 'accepted'") == 4
    denied = run_cli("events", "retry", "--namespace", NS, dsn=db.dsn(WORKER_USER))
    assert denied.returncode == 1
    assert "member of aidb_admins" in denied.stderr
    since = run_cli(
        "events", "retry", "--namespace", NS, "--failed-since", "2000-01-01", dsn=db.dsn(ADMIN_USER)
    )
    assert since.stdout.startswith("put 0 failed events")
