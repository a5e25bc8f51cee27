"""``aidb-memory worker --metrics-port`` (issue 36): a real worker process serving Prometheus
metrics and /healthz while it works the queue against the fake model server, its JSON logs,
``aidb-memory status``'s queue, and a worker without the option running as before."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, ClassVar

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from aidb_memory import __version__
from aidb_memory.ops import worker
from conftest import (
    WORKER_USER,
    Database,
    chat_namespace,
    pending_events,
    queue_extraction,
    run_cli,
)
from fake_openai import FakeOpenAI, Reply, Request, serve

NS = "mem"
FACT = json.dumps({"operations": [{"op": "add", "text": "A fact.", "target": None}]})
FAIL = "PLEASE-FAIL"  # a message with this fails at the model, every attempt


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    def answer(request: Request) -> Reply:
        return Reply(status=500) if FAIL in json.dumps(request.body) else Reply(content=FACT)

    with serve() as server:
        server.default = answer
        yield server


@pytest.fixture
def ns(db: Database, fake: FakeOpenAI) -> None:
    chat_namespace(db, fake.base_url, NS)


def _add(db: Database, text: str, actor: str = "alice") -> str:
    """An add that queues an extraction event; its public id."""
    return queue_extraction(db, NS, text, actor)


def _statuses(db: Database) -> list[str]:
    return sorted(r[0] for r in db.sql("SELECT status FROM aidb_memory.event"))


def _wait_until(condition: Callable[[], object], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(families: dict[str, Any], family: str, **labels: str) -> float:
    """The sum of a family's samples (without _bucket/_sum/_count) that have these labels."""
    return float(
        sum(
            s.value
            for s in families[family].samples
            if s.name in (family, family + "_total")
            and all(s.labels.get(k) == v for k, v in labels.items())
        )
    )


class Worker:
    """``aidb-memory worker`` in a process of its own, its output read as it comes."""

    def __init__(self, db: Database, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aidb_memory", "worker", "--dsn", db.dsn(WORKER_USER), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: Any, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    def objects(self) -> list[dict[str, Any]]:
        """The JSON log objects so far (every stderr line must be one)."""
        return [json.loads(line) for line in list(self.err)]

    def url(self) -> str:
        """The metrics server's base URL, from the worker's line saying where it listens."""
        found: list[str] = []

        def listening() -> bool:
            for line in list(self.out) + list(self.err):
                match = re.search(r"metrics on (http://[^/\s]+)/metrics", line) or re.search(
                    r'"url":"(http://[^"]+)"', line
                )
                if match:
                    found.append(match.group(1))
                    return True
            assert self.proc.poll() is None, f"the worker exited: {self.err}"
            return False

        _wait_until(listening)
        return found[0]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        for reader in self._readers:
            reader.join(timeout=10)
        return code

    def __enter__(self) -> Worker:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def test_a_running_worker_serves_its_metrics_health_and_json_logs(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    with Worker(
        db, "--metrics-port", "0", "--log-format", "json", "--max-attempts", "2", "--backoff", "0"
    ) as w:
        url = w.url()
        good = [_add(db, "I like tea."), _add(db, "I live in Lyon.", actor="bob")]
        bad = _add(db, f"{FAIL} I collect stamps.")
        _wait_until(lambda: _statuses(db) == ["failed", "processed", "processed"])
        # The worker counts after its CALL returns: wait for the failed event's batch.
        _wait_until(lambda: any(o.get("outcome") == "failed" for o in w.objects()))

        status, text = _get(f"{url}/metrics")
        assert status == 200
        families = _families(text)
        # The worker's own.
        assert _value(families, "aidb_memory_worker_up") == 1
        assert _value(families, "aidb_memory_worker_database_up") == 1
        assert families["aidb_memory_worker_batches"].type == "counter"
        assert _value(families, "aidb_memory_worker_batches", outcome="ok") >= 4
        assert _value(families, "aidb_memory_worker_batches", outcome="failed") == 0
        assert _value(families, "aidb_memory_worker_last_success_timestamp_seconds") > (
            time.time() - 60
        )
        events = families["aidb_memory_worker_events"]
        assert events.type == "counter"
        assert _value(families, "aidb_memory_worker_events", outcome="processed") == 2
        assert _value(families, "aidb_memory_worker_events", outcome="retried") == 1
        assert _value(families, "aidb_memory_worker_events", outcome="failed") == 1
        # aidb_memory.metrics()'s, as they are.
        assert families["aidb_memory_queue_events"].type == "gauge"
        queue = {
            (s.labels["kind"], s.labels["status"]): s.value
            for s in families["aidb_memory_queue_events"].samples
        }
        for kind in ("extraction", "compaction"):
            for state in ("ready", "waiting", "processing", "failed"):
                assert (kind, state) in queue
        assert queue[("extraction", "failed")] == 1
        assert queue[("extraction", "ready")] == 0
        assert families["aidb_memory_queue_latency_seconds"].type == "gauge"
        assert families["aidb_memory_events_processed"].type == "counter"
        assert _value(families, "aidb_memory_events_processed", kind="extraction") == 2
        assert _value(families, "aidb_memory_events_failed", kind="extraction") == 1
        assert _value(families, "aidb_memory_events_retried", kind="extraction") == 1
        assert _value(families, "aidb_memory_events_processed", namespace=NS) == 2
        assert families["aidb_memory_model_calls"].type == "counter"
        assert _value(families, "aidb_memory_model_calls", outcome="ok") == 2
        assert _value(families, "aidb_memory_model_calls") == 4
        duration = families["aidb_memory_model_call_duration_seconds"]
        assert duration.type == "histogram"
        counts = [s.value for s in duration.samples if s.name.endswith("_count")]
        infinite = [s.value for s in duration.samples if s.labels.get("le") == "+Inf"]
        assert sum(counts) == sum(infinite) == 4
        assert _value(families, "aidb_memory_model_tokens", direction="in") > 0
        assert _value(families, "aidb_memory_worker_last_batch_timestamp_seconds") > 0

        status, text = _get(f"{url}/healthz")
        assert status == 200, text
        health = json.loads(text)
        assert health["status"] == "ok" and health["failing"] == []
        assert health["checks"]["version"]["installed"] == __version__
        assert w.stop() == 0

    objects = w.objects()  # every stderr line is a JSON object
    assert w.out == [], "with --log-format json stdout stays empty"
    assert {"ts", "level", "msg"} <= set(objects[0])
    assert [o["msg"] for o in objects][:2] == ["metrics", "started"]
    assert objects[-1]["msg"] == "stopped"
    batches = [o for o in objects if o["msg"] == "batch"]
    assert sum(o["processed"] for o in batches) == 2
    assert sum(o["retried"] for o in batches) == 1
    assert sum(o["failed"] for o in batches) == 1
    assert all(isinstance(o["duration_ms"], int) for o in batches)
    failures = [o for o in objects if o["msg"] == "event"]
    assert [(o["outcome"], o["level"]) for o in failures] == [
        ("retry", "warning"),
        ("failed", "error"),
    ]
    for o in failures:
        assert o["event"] == bad
        assert (o["kind"], o["namespace"]) == ("extraction", NS)
        assert isinstance(o["duration_ms"], int)
        assert set(o) == {
            "ts",
            "level",
            "msg",
            "event",
            "kind",
            "namespace",
            "outcome",
            "duration_ms",
        }
    assert not set(good) & {o.get("event") for o in objects}, "only failures get an object"


def _key(db: Database, actor: str) -> int:
    return int(db.value("SELECT aidb_memory.actor_key(%s, %s)", (NS, actor)))


def test_healthz_fails_when_the_oldest_ready_event_is_older_than_the_limit(
    db: Database, ns: None
) -> None:
    # A worker whose key range leaves alice out: her event stays ready, unclaimed.
    key = _key(db, "alice")
    low, high = (key + 1, worker.KEY_MAX) if key < worker.KEY_MAX else (worker.KEY_MIN, key - 1)
    with Worker(
        db, "--metrics-port", "0", "--health-max-latency", "1", f"--key-range={low}:{high}"
    ) as w:
        url = w.url()
        assert _get(f"{url}/healthz")[0] == 200  # nothing waits yet
        _add(db, "I like tea.")
        time.sleep(1.5)
        status, text = _get(f"{url}/healthz")
        assert status == 503, text
        health = json.loads(text)
        assert health["failing"] == ["queue"]
        assert health["checks"]["queue"]["late"] == ["extraction"]
        assert health["checks"]["queue"]["latency_seconds"]["extraction"] >= 1
        assert health["checks"]["database"]["ok"] is True
        assert health["checks"]["version"]["ok"] is True
        # /metrics says the same.
        families = _families(_get(f"{url}/metrics")[1])
        assert _value(families, "aidb_memory_queue_latency_seconds", kind="extraction") >= 1
        assert _value(families, "aidb_memory_queue_events", kind="extraction", status="ready") == 1
        assert w.stop() == 0
    assert _statuses(db) == ["accepted"]


def test_a_database_that_goes_away_is_database_up_0_and_503_then_comes_back(
    db: Database, ns: None
) -> None:
    with Worker(db, "--metrics-port", "0") as w:
        url = w.url()
        assert _value(_families(_get(f"{url}/metrics")[1]), "aidb_memory_worker_database_up") == 1
        # The exporter's connection is cut and no new one is let in (the worker's own stays).
        admin = psycopg.connect(db.server.dsn(), autocommit=True)
        admin.execute(f"ALTER DATABASE {db.name} ALLOW_CONNECTIONS false")
        try:
            cut = admin.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                "WHERE application_name = 'aidb-memory worker metrics' AND datname = %s",
                (db.name,),
            ).fetchall()
            assert cut == [(True,)]
            started = time.monotonic()
            status, text = _get(f"{url}/metrics")
            assert time.monotonic() - started < 15, "the scrape did not hang"
            assert status == 200
            families = _families(text)
            assert _value(families, "aidb_memory_worker_database_up") == 0
            assert _value(families, "aidb_memory_worker_up") == 1
            assert "aidb_memory_queue_events" not in families
            status, text = _get(f"{url}/healthz")
            assert status == 503
            assert json.loads(text)["failing"] == ["database"]
        finally:
            admin.execute(f"ALTER DATABASE {db.name} ALLOW_CONNECTIONS true")
            admin.close()
        families = _families(_get(f"{url}/metrics")[1])
        assert _value(families, "aidb_memory_worker_database_up") == 1, "opened again"
        assert "aidb_memory_queue_events" in families
        assert _get(f"{url}/healthz")[0] == 200
        assert w.stop() == 0
    said = [line for line in w.out if line.startswith("worker: metrics: ")]
    assert len(said) == 2, "once when it went, once when it came back: not once per scrape"
    assert said[0].startswith("worker: metrics: cannot read aidb_memory.metrics() (")
    assert said[1] == "worker: metrics: the database answers again"


def test_a_port_in_use_is_one_line_and_exit_2(db: Database, ns: None) -> None:
    with Worker(db, "--metrics-port", "0") as first:
        port = first.url().rsplit(":", 1)[1]
        result = run_cli("worker", "--once", "--metrics-port", port, dsn=db.dsn(WORKER_USER))
        assert result.returncode == 2
        assert result.stderr.startswith(
            f"aidb-memory: worker: cannot serve metrics on 127.0.0.1:{port}"
        )
        assert len(result.stderr.strip().splitlines()) == 1
        assert first.stop() == 0


# --- status -------------------------------------------------------------------------------------


def test_status_prints_the_queue_per_kind(db: Database, ns: None) -> None:
    _add(db, "I like tea.")
    result = run_cli("status", dsn=db.dsn())
    assert result.returncode == 0, result.stderr
    assert re.search(
        r"^queue extraction: ready 1, waiting 0, processing 0, failed 0; oldest ready event "
        r"\d+\.\d s old$",
        result.stdout,
        re.MULTILINE,
    ), result.stdout
    assert "queue compaction: ready 0, waiting 0, processing 0, failed 0" in result.stdout
    data = json.loads(run_cli("status", "--json", dsn=db.dsn()).stdout)
    assert data["queue"]["extraction"]["ready"] == 1
    assert data["queue"]["compaction"] == {
        "ready": 0,
        "waiting": 0,
        "processing": 0,
        "failed": 0,
        "latency_seconds": 0.0,
        "estimated": False,
    }


def test_status_marks_the_depths_of_a_backlog_as_estimates(db: Database) -> None:
    """Past the oldest 5,000 pending events metrics() estimates the depth: status says so."""
    pending_events(db, "backlog", 6000)
    result = run_cli("status", dsn=db.dsn())
    assert result.returncode == 0, result.stderr
    assert re.search(
        r"^queue extraction: ready ~6000, waiting ~0, processing ~0, failed 0; ",
        result.stdout,
        re.MULTILINE,
    ), result.stdout
    data = json.loads(run_cli("status", "--json", dsn=db.dsn()).stdout)
    assert data["queue"]["extraction"]["estimated"] is True
    assert data["queue"]["extraction"]["ready"] == 6000


def test_status_on_a_database_without_metrics_says_so_in_one_line(db: Database) -> None:
    # As a version from before issue 36 (the function removed, not replaced).
    db.sql("DROP FUNCTION aidb_memory.metrics(integer)")
    result = run_cli("status", dsn=db.dsn())
    assert result.returncode == 0, result.stderr
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("queue")]
    assert lines == [
        "queue: this database's aidb_memory has no aidb_memory.metrics() (it is older than this "
        "package): run `aidb-memory install` to upgrade it; `aidb-memory events list` counts its "
        "events"
    ]
    assert json.loads(run_cli("status", "--json", dsn=db.dsn()).stdout)["queue"] is None


# --- without the option, as before -------------------------------------------------------------


class Recording(psycopg.Connection[tuple[Any, ...]]):
    """A connection that notes every statement it is given."""

    statements: ClassVar[list[str]] = []

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        Recording.statements.append(str(query))
        return super().execute(query, *args, **kwargs)


def test_without_the_options_the_worker_sends_what_it_always_sent(db: Database, ns: None) -> None:
    for i in range(3):
        _add(db, f"I like number {i}.")
    Recording.statements = []
    lines: list[str] = []
    totals = worker.run(
        lambda: Recording.connect(db.dsn(WORKER_USER), autocommit=True),
        worker.Options(once=True),
        say=lines.append,
    )
    assert totals.processed == 3
    # LISTEN, then the CALL of one event until one finds none: no metrics query, no count of
    # the waiting, nothing else on the connection that runs the queue.
    call, _ = worker.Options().call()
    assert Recording.statements == [f"LISTEN {worker.CHANNEL}"] + [call] * 4
    assert lines[0] == "worker: started (--once: until the queue is empty)"
    assert [ln.split(" (")[0] for ln in lines[1:]] == [
        "worker: processed 1, failed 0, retried 0",
        "worker: processed 2, failed 0, retried 0",
        "worker: processed 3, failed 0, retried 0",
        "worker: stopped; processed 3, failed 0, retried 0",
    ]


def test_the_cli_worker_without_the_option_opens_no_port_and_no_second_connection(
    db: Database, ns: None
) -> None:
    with Worker(db) as w:
        _wait_until(lambda: w.out and w.out[0].startswith("worker: started;"))
        _add(db, "I like tea.")
        _wait_until(lambda: _statuses(db) == ["processed"])
        backends = db.value(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND usename = %s",
            (db.name, WORKER_USER),
        )
        assert backends == 1
        assert w.stop() == 0
    assert not any("metrics" in line for line in w.out + w.err)
    assert w.err == []


# --- progress and --quiet ------------------------------------------------------------------------


def test_draining_a_backlog_reports_progress_with_progress_and_nothing_with_quiet(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    for i in range(12):
        _add(db, f"I like number {i}.", actor=f"actor{i}")
    fake.default = lambda _r: Reply(content=FACT, delay=0.25)
    # A line every 0.5 s instead of 5 (aidb_memory.progress' interval variable).
    env = {"AIDB_MEMORY_PROGRESS_INTERVAL": "0.5"}
    result = run_cli("worker", "--once", "--progress", dsn=db.dsn(WORKER_USER), env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines, "no progress"
    for line in lines[:-1]:
        assert re.fullmatch(
            r"worker: backlog: \d+ of \d+ events \(\d+%\), [\d.,]+ events/s, "
            r"(about .* left|nearly done)",
            line,
        ), line
    assert any(re.match(r"worker: backlog: \d+ of 1[12] events", line) for line in lines)
    done = r"worker: backlog: done, 12 events in \d+ s \([\d.]+ events/s\)"
    assert re.fullmatch(done, lines[-1]), lines[-1]
    # The per-batch lines as before, on stdout.
    assert result.stdout.splitlines()[-1].startswith("worker: stopped; processed 12,")

    for i in range(3):
        _add(db, f"I like colour {i}.")
    result = run_cli("worker", "--once", "--progress", "--quiet", dsn=db.dsn(WORKER_USER), env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert [line.split(";")[0] for line in result.stdout.splitlines()] == [
        "worker: started (--once: until the queue is empty)",
        "worker: stopped",
    ]
    assert _statuses(db) == ["processed"] * 15
