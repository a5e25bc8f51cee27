"""``aidb-memory worker`` (SPEC §7; issue 5 acceptance 7): progress output, --once, woken by
NOTIFY, and a clean stop on SIGTERM after the event in hand."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import APP_USER, WORKER_USER, Database, run_cli
from fake_openai import FakeOpenAI, Reply, serve

NS = "mem"


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with serve() as server:
        server.default = lambda _r: Reply(
            content=json.dumps({"operations": [{"op": "add", "text": "A fact.", "target": None}]})
        )
        yield server


@pytest.fixture
def ns(db: Database, fake: FakeOpenAI) -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\')', (NS,))


def _add(db: Database, text: str) -> None:
    db.sql(
        "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's')",
        (NS, json.dumps([{"role": "user", "content": text}])),
        user=APP_USER,
    )


def _statuses(db: Database) -> list[str]:
    return [r[0] for r in db.sql("SELECT status FROM aidb_memory.event ORDER BY id")]


def test_once_drains_the_queue_and_reports_progress(db: Database, ns: None) -> None:
    for i in range(3):
        _add(db, f"I like number {i}.")
    result = run_cli("worker", "--once", dsn=db.dsn(WORKER_USER))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("worker: started (--once")
    assert any(line.startswith("worker: processed 3, failed 0, retried 0 (") for line in lines)
    assert lines[-1].startswith("worker: stopped; processed 3, failed 0, retried 0 (")
    assert "events/s" in lines[-1]
    assert _statuses(db) == ["processed"] * 3


def test_once_on_an_empty_queue_exits_at_once(db: Database, ns: None) -> None:
    started = time.monotonic()
    result = run_cli("worker", "--once", dsn=db.dsn(WORKER_USER))
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 10
    assert "stopped; processed 0" in result.stdout


def _start_worker(db: Database) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    return subprocess.Popen(
        [sys.executable, "-m", "aidb_memory", "worker", "--dsn", db.dsn(WORKER_USER)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _wait_until(condition: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_running_worker_is_woken_by_add_and_stops_cleanly_on_sigterm(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    proc = _start_worker(db)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("worker: started;")
        _add(db, "I am learning Portuguese.")
        # Woken by the NOTIFY of add, well before its idle timeout would have it look again.
        _wait_until(lambda: _statuses(db) == ["processed"], timeout=4)
        # SIGTERM while an event is in hand: it finishes the event, then stops.
        fake.default = lambda _r: Reply(
            content=json.dumps({"operations": [{"op": "add", "text": "B fact.", "target": None}]}),
            delay=2,
        )
        _add(db, "My sister lives in Porto.")
        _wait_until(lambda: len(fake.calls()) == 2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert _statuses(db) == ["processed", "processed"], "the event in hand was finished"
    assert out.strip().splitlines()[-1].startswith("worker: stopped; processed 2, failed 0")
    assert "Traceback" not in err


def test_sigint_on_an_idle_worker_stops_it_promptly(db: Database, ns: None) -> None:
    proc = _start_worker(db)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert time.monotonic() - started < 3
    assert "worker: stopped; processed 0" in out
