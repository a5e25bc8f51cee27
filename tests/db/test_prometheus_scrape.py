"""A real scraper (issue 36 item 5): Debian's Prometheus server on loopback scrapes a running
``aidb-memory worker --metrics-port`` every second and evaluates docs/monitoring/
aidb_memory_rules.yml; events go through the worker with the fake model server failing some
calls, and the series are read back through Prometheus' HTTP query API.

Nothing is faked but the model: the worker is the CLI in a process of its own, the figures come
from aidb_memory.metrics() in the suite's PostgreSQL, Prometheus is the packaged binary (as root,
run as the server user, which owns its TSDB directory: tests/scrapers.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO, WORKER_USER, Database, chat_namespace, queue_extraction
from deployments import free_port
from fake_openai import FakeOpenAI, Reply, Request, serve
from scrapers import Prometheus, http_get, prometheus

RULES = REPO / "docs" / "monitoring" / "aidb_memory_rules.yml"
NS = "mem"
JOB = "aidb_memory_worker"
FACT = json.dumps({"operations": [{"op": "add", "text": "A fact.", "target": None}]})
SLOW_S = 4.0  # the model's answer to a turn holding SLOW: the events behind it wait that long
WAIT_S = 60.0


def _answer(request: Request) -> Reply:
    """The model: HTTP 500 for a turn that says FAIL, a slow answer for one that says SLOW."""
    sent = json.dumps(request.body.get("messages", []))
    if "FAIL" in sent:
        return Reply(status=500)
    return Reply(content=FACT, delay=SLOW_S if "SLOW" in sent else 0.0)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with serve() as server:
        server.default = _answer
        yield server


@pytest.fixture
def ns(db: Database, fake: FakeOpenAI) -> None:
    chat_namespace(db, fake.base_url, NS)


def _add(db: Database, text: str) -> None:
    queue_extraction(db, NS, text)


@contextmanager
def _worker(db: Database, logs: Path) -> Iterator[int]:
    """``aidb-memory worker --metrics-port`` on a free loopback port (yielded), as a user runs it;
    every failed attempt is retried at once (--backoff 0) and an event fails for good at its
    second (--max-attempts 2). Stopped with SIGTERM, killed if it does not stop, whatever
    happens."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "DATABASE_URL"}
    command = [sys.executable, "-m", "aidb_memory", "worker", "--dsn", db.dsn(WORKER_USER)]
    command += ["--metrics-port", str(port), "--max-attempts", "2", "--backoff", "0"]
    with (logs / "worker.out").open("wb") as out, (logs / "worker.err").open("wb") as err:
        proc = subprocess.Popen(command, stdout=out, stderr=err, env=env)
        try:
            deadline = time.monotonic() + WAIT_S
            while True:
                assert proc.poll() is None, (logs / "worker.err").read_text()
                try:
                    if http_get(f"http://127.0.0.1:{port}/metrics")[0] == 200:
                        break
                except OSError:
                    pass  # not listening yet
                assert time.monotonic() < deadline, "the worker's exporter did not answer"
                time.sleep(0.1)
            yield port
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=30)
    assert proc.returncode == 0, (logs / "worker.err").read_text()


Samples = list[tuple[dict[str, str], float]]


def _until(
    prom: Prometheus, promql: str, done: Callable[[Samples], bool] = bool, timeout: float = WAIT_S
) -> Samples:
    """The samples of ``promql`` once ``done`` holds for them (Prometheus scrapes every second)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = prom.query(promql)
        if done(samples):
            return samples
        assert time.monotonic() < deadline, f"{promql}: still {samples}"
        time.sleep(0.2)


def _value(prom: Prometheus, promql: str, expected: float) -> None:
    """Wait until ``promql`` is one sample of value ``expected``."""
    _until(prom, promql, lambda s: [v for _, v in s] == [expected])


def _statuses(db: Database) -> list[str]:
    return [r[0] for r in db.sql("SELECT status FROM aidb_memory.event ORDER BY id")]


def _wait_for_db(db: Database, statuses: list[str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while _statuses(db) != statuses:
        assert time.monotonic() < deadline, f"events still {_statuses(db)}"
        time.sleep(0.1)


def _alerts() -> dict[str, str]:
    """Each alert of the rules file: its expression."""
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"] if "alert" in r}


def test_prometheus_scrapes_the_worker_and_evaluates_the_rules(
    db: Database, fake: FakeOpenAI, ns: None, tmp_path: Path
) -> None:
    started = time.time()
    with (
        _worker(db, tmp_path) as port,
        prometheus({JOB: [f"127.0.0.1:{port}"]}, [RULES]) as prom,
    ):
        _value(prom, f'up{{job="{JOB}"}}', 1)
        # The families with fixed labels are there before any event: every kind (extraction
        # and compaction at least), every status, all 0.
        queue = _until(prom, "aidb_memory_queue_events", lambda s: len(s) >= 8)
        assert {(m["kind"], m["status"]) for m, _ in queue} >= {
            (kind, status)
            for kind in ("extraction", "compaction")
            for status in ("ready", "waiting", "processing", "failed")
        }
        assert {m["job"] for m, _ in queue} == {JOB}
        assert all(v == 0 for _, v in queue)
        kinds = {m["kind"] for m, _ in queue}
        latency = _until(prom, "aidb_memory_queue_latency_seconds", lambda s: len(s) == len(kinds))
        assert {m["kind"] for m, _ in latency} == kinds
        _value(prom, "aidb_memory_worker_up", 1)
        _value(prom, "aidb_memory_worker_database_up", 1)
        # The idle worker calls process_events every few seconds: the last batch is recent.
        _until(
            prom,
            "aidb_memory_worker_last_batch_timestamp_seconds",
            lambda s: len(s) == 1 and s[0][1] >= started,
        )

        # Phase 1: a slow event, then two that wait behind it (one of which fails twice).
        _add(db, "SLOW: I am learning Portuguese.")
        _add(db, "My sister lives in Porto.")
        _add(db, "FAIL: I collect stamps.")
        _wait_for_db(db, ["processed", "processed", "failed"])
        ext = 'kind="extraction",namespace="mem"'
        _value(prom, f"aidb_memory_events_processed_total{{{ext}}}", 2)
        _value(prom, f"aidb_memory_events_failed_total{{{ext}}}", 1)
        _value(prom, f"aidb_memory_events_retried_total{{{ext}}}", 1)

        # Scraped while the slow call ran: an event in hand, others ready and growing older.
        def highest(series: str) -> float:
            return prom.query(f"max_over_time({series}[5m])")[0][1]

        assert highest('aidb_memory_queue_events{kind="extraction",status="processing"}') >= 1
        assert highest('aidb_memory_queue_events{kind="extraction",status="ready"}') >= 1
        oldest = highest('aidb_memory_queue_latency_seconds{kind="extraction"}')
        assert 1.5 <= oldest <= SLOW_S + 10

        # Phase 2: two more that work, three more that fail.
        phase2 = [
            ("I like green tea.", "processed"),
            ("FAIL: I play chess on Sundays.", "failed"),
            ("I run every morning.", "processed"),
            ("FAIL: I sing in a choir.", "failed"),
            ("FAIL: I have two cats.", "failed"),
        ]
        for text, _ in phase2:
            _add(db, text)
        _wait_for_db(db, ["processed", "processed", "failed"] + [status for _, status in phase2])
        _value(prom, f"aidb_memory_events_processed_total{{{ext}}}", 4)
        _value(prom, f"aidb_memory_events_failed_total{{{ext}}}", 4)
        _value(prom, f"aidb_memory_events_retried_total{{{ext}}}", 4)
        # Model calls by outcome: 4 that worked, 2 attempts of each of the 4 failing events.
        calls = 'aidb_memory_model_calls_total{model="chat",purpose="extraction",namespace="mem"'
        _value(prom, calls + ',outcome="ok"}', 4)
        _value(prom, calls + ',outcome="error"}', 8)
        assert len(fake.calls()) == 12
        # Their durations: the slow one in the 5 s bucket, the 11 others in the 2.5 s one.
        duration = 'aidb_memory_model_call_duration_seconds{model="chat",purpose="extraction"}'
        _value(prom, duration.replace("seconds{", "seconds_count{"), 12)
        buckets = {
            float(m["le"]): v
            for m, v in prom.query(duration.replace("seconds{", "seconds_bucket{"))
        }
        assert buckets[2.5] == 11 and buckets[5.0] == 12 and buckets[float("inf")] == 12
        sum_s = prom.query(duration.replace("seconds{", "seconds_sum{"))[0][1]
        assert SLOW_S <= sum_s < SLOW_S + 11 * 2.5
        tokens = prom.query('aidb_memory_model_tokens_total{model="chat"}')
        assert {m["direction"] for m, v in tokens if v > 0} == {"in", "out"}
        # The queue after: the 4 failed events, nothing waiting.
        _value(prom, 'aidb_memory_queue_events{kind="extraction",status="failed"}', 4)
        _value(prom, 'aidb_memory_queue_events{kind="extraction",status="ready"}', 0)
        _value(prom, 'aidb_memory_queue_latency_seconds{kind="extraction"}', 0)
        # The worker's own figures.
        for outcome, count in (("processed", 4), ("failed", 4), ("retried", 4)):
            own = f'aidb_memory_worker_events_total{{kind="extraction",outcome="{outcome}"}}'
            _value(prom, own, count)
        assert prom.query('aidb_memory_worker_batches_total{outcome="ok"}')[0][1] >= 8
        last_success = prom.query("aidb_memory_worker_last_success_timestamp_seconds")
        assert last_success[0][1] >= started

        # The rules: loaded, and evaluated on these series without an error.
        def evaluated(groups: list[dict[str, Any]]) -> bool:
            rules = [r for g in groups for r in g["rules"]]
            return bool(rules) and all(r["health"] != "unknown" for r in rules)

        deadline = time.monotonic() + WAIT_S
        while not evaluated(groups := prom.api("rules")["groups"]):
            assert time.monotonic() < deadline, groups
            time.sleep(0.2)
        assert {g["name"] for g in groups} == {"aidb_memory", "aidb_memory_worker"}
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        assert set(rules) == set(_alerts())
        for name, rule in rules.items():
            assert rule["health"] == "ok", (name, rule.get("lastError"))

        # On these series the two ratios are above their thresholds (33% of the extraction
        # events that finished since phase 1 failed, 75% of the model calls), and everything
        # else is healthy: each alert's expression, as Prometheus evaluates it.
        expected = {
            "AidbMemoryEventFailureRatioHigh": [{"kind": "extraction"}],
            "AidbMemoryModelErrorRatioHigh": [{"model": "chat"}],
        }
        for name, expr in _alerts().items():
            found = [labels for labels, _ in prom.query(expr)]
            assert found == expected.get(name, []), (name, found)
        # And the two alerts are pending (their for: has not passed), none other is.
        active = _until(
            prom,
            'ALERTS{alertstate="pending"}',
            lambda s: {m["alertname"] for m, _ in s} == set(expected),
        )
        assert {m["alertname"] for m, _ in prom.query("ALERTS")} == set(expected), active
