"""The worker's exporter, logs and progress without a database (issue 36): aidb_memory.metrics()
rows as Prometheus families, the health decision, the JSON log objects, the backlog's progress,
and prometheus-client imported only with --metrics-port."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from aidb_memory import __version__, cli
from aidb_memory.ops import metrics
from aidb_memory.ops.worker import (
    Log,
    Progress,
    ProgressObjects,
    QueueState,
    Totals,
    WorkerStats,
    json_line,
    logged_events,
    queue_states,
)
from aidb_memory.progress import Reporter
from conftest import REPO

DURATION = "aidb_memory_model_call_duration_seconds"


def _rows() -> list[tuple[object, object, object]]:
    """Rows shaped as the contract's aidb_memory.metrics() returns them (ordered by metric)."""
    rows: list[tuple[object, object, object]] = [
        ("aidb_memory_events_processed_total", {"kind": "extraction", "namespace": "a"}, 7),
        ("aidb_memory_events_processed_total", {"kind": "extraction", "namespace": "_other"}, 2),
    ]
    for le, n in [("0.1", 1), ("0.25", 1), ("0.5", 2), ("1", 3), ("+Inf", 4)]:
        rows.append((f"{DURATION}_bucket", {"model": "m", "purpose": "extraction", "le": le}, n))
    rows += [
        (f"{DURATION}_count", {"model": "m", "purpose": "extraction"}, 4),
        (f"{DURATION}_sum", {"model": "m", "purpose": "extraction"}, 2.5),
        ("aidb_memory_model_tokens_total", {"model": "m", "direction": "in"}, 100),
        ("aidb_memory_queue_events", {"kind": "extraction", "status": "ready"}, 3),
        ("aidb_memory_queue_events", {"kind": "extraction", "status": "failed"}, 1),
        ("aidb_memory_queue_latency_seconds", {"kind": "extraction"}, 12.5),
        ("aidb_memory_queue_latency_seconds", {"kind": "compaction"}, 0),
        ("aidb_memory_worker_last_batch_timestamp_seconds", {}, 1700000000.5),
    ]
    return rows


def _exposition(families: list[Metric]) -> str:
    """The families as prometheus-client serves them, through a registry."""

    class Fixed:
        def collect(self) -> Iterator[Metric]:
            yield from families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    return generate_latest(registry).decode()


def _parsed(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_rows_become_families_of_the_contract_s_types() -> None:
    families = {f.name: f for f in metrics.families(_rows())}
    # prometheus-client names a counter family without _total, and its samples with it.
    assert families["aidb_memory_events_processed"].type == "counter"
    assert families["aidb_memory_model_tokens"].type == "counter"
    assert families["aidb_memory_queue_events"].type == "gauge"
    assert families["aidb_memory_queue_latency_seconds"].type == "gauge"
    assert families["aidb_memory_worker_last_batch_timestamp_seconds"].type == "gauge"
    assert families[DURATION].type == "histogram"
    assert {s.name for s in families["aidb_memory_events_processed"].samples} == {
        "aidb_memory_events_processed_total"
    }
    text = _exposition(list(families.values()))
    # The sample names Prometheus stores are the SQL function's, exactly.
    assert 'aidb_memory_events_processed_total{kind="extraction",namespace="a"} 7.0' in text
    assert "aidb_memory_events_processed_total_total" not in text
    assert "# TYPE aidb_memory_events_processed_total counter" in text
    assert "# TYPE aidb_memory_model_call_duration_seconds histogram" in text
    assert "# HELP aidb_memory_queue_latency_seconds Age of the oldest ready event" in text
    parsed = _parsed(text)
    assert parsed["aidb_memory_queue_events"].type == "gauge"
    assert parsed["aidb_memory_events_processed"].type == "counter"


def test_a_histogram_s_rows_make_one_family() -> None:
    [histogram] = [f for f in metrics.families(_rows()) if f.name == DURATION]
    samples = {(s.name, s.labels.get("le")): s.value for s in histogram.samples}
    assert samples == {
        (f"{DURATION}_bucket", "0.1"): 1,
        (f"{DURATION}_bucket", "0.25"): 1,
        (f"{DURATION}_bucket", "0.5"): 2,
        (f"{DURATION}_bucket", "1"): 3,
        (f"{DURATION}_bucket", "+Inf"): 4,
        (f"{DURATION}_count", None): 4,
        (f"{DURATION}_sum", None): 2.5,
    }
    assert all(s.labels["model"] == "m" for s in histogram.samples)
    parsed = _parsed(_exposition([histogram]))
    assert parsed[DURATION].type == "histogram"
    assert len(parsed[DURATION].samples) == 7


def test_histogram_buckets_are_sorted_and_get_their_inf_bucket_from_the_count() -> None:
    rows: list[tuple[object, object, object]] = [
        (f"{DURATION}_bucket", {"model": "m", "purpose": "p", "le": "10"}, 5),
        (f"{DURATION}_bucket", {"model": "m", "purpose": "p", "le": "2.5"}, 2),
        (f"{DURATION}_count", {"model": "m", "purpose": "p"}, 6),
        (f"{DURATION}_sum", {"model": "m", "purpose": "p"}, 30.0),
    ]
    [histogram] = metrics.families(rows)
    buckets = [(s.labels["le"], s.value) for s in histogram.samples if s.name.endswith("_bucket")]
    assert buckets == [("2.5", 2), ("10", 5), ("+Inf", 6)]


def test_odd_rows_are_left_out_not_the_scrape() -> None:
    rows: list[tuple[object, object, object]] = [
        ("pg_stat_whatever", {}, 1),  # not ours
        ("aidb_memory_bad name", {}, 1),  # not a metric name
        ("aidb_memory_queue_events", {"bad-label": "x"}, 1),  # not a label name
        ("aidb_memory_queue_events", {"kind": "extraction", "status": "ready"}, None),
        ("aidb_memory_queue_events", {"kind": "extraction", "status": "ready"}, "3"),
        ("aidb_memory_queue_events", {"kind": "extraction", "status": "ready"}, 3),
        ("aidb_memory_queue_events", {"kind": "extraction", "status": "ready"}, 4),  # again
        ("aidb_memory_worker_up", {}, 0),  # the worker's own: exported once, by the worker
        ("aidb_memory_worker_batches_total", {"outcome": "ok"}, 99),
        ("aidb_memory_queue_events", "not an object", 1),
    ]
    families = metrics.families(rows)
    assert [(f.name, [(s.labels, s.value) for s in f.samples]) for f in families] == [
        ("aidb_memory_queue_events", [({"kind": "extraction", "status": "ready"}, 3)])
    ]
    _exposition(families)  # and prometheus-client takes it


def test_labels_of_a_family_are_their_union_and_values_are_strings() -> None:
    rows: list[tuple[object, object, object]] = [
        ("aidb_memory_model_calls_total", {"model": "m", "outcome": "ok", "namespace": ""}, 2),
        ("aidb_memory_model_calls_total", {"model": "m", "outcome": "error", "purpose": "x"}, 1),
        ("aidb_memory_something_new", {"n": 3}, 1.5),
    ]
    calls, new = metrics.families(rows)
    assert [s.labels for s in calls.samples] == [
        {"model": "m", "namespace": "", "outcome": "ok", "purpose": ""},
        {"model": "m", "namespace": "", "outcome": "error", "purpose": "x"},
    ]
    # A family outside the contract's table: its type by Prometheus' naming rules.
    assert (new.name, new.type, new.samples[0].labels) == (
        "aidb_memory_something_new",
        "unknown",
        {"n": "3"},
    )
    _exposition([calls, new])


def test_the_worker_s_own_families() -> None:
    stats = WorkerStats()
    totals = Totals()
    totals.add_kinds({"extraction": {"processed": 3, "failed": 1, "retried": 2}})
    stats.batch_ok(totals, 1700000000.0)
    stats.batch_failed()
    text = _exposition(metrics.worker_families(stats.snapshot(), database_up=False))
    parsed = _parsed(text)
    assert parsed["aidb_memory_worker_up"].samples[0].value == 1
    assert parsed["aidb_memory_worker_database_up"].samples[0].value == 0
    assert {s.labels["outcome"]: s.value for s in parsed["aidb_memory_worker_batches"].samples} == {
        "ok": 1,
        "failed": 1,
    }
    assert "aidb_memory_worker_batches_total" in text
    assert parsed["aidb_memory_worker_last_success_timestamp_seconds"].samples[0].value == (
        1700000000.0
    )
    events = {
        (s.labels["kind"], s.labels["outcome"]): s.value
        for s in parsed["aidb_memory_worker_events"].samples
    }
    assert events[("extraction", "processed")] == 3
    assert events[("extraction", "retried")] == 2
    assert events[("compaction", "summarized")] == 0  # present from the start: rate() works
    assert "expiry" not in {kind for kind, _ in events}


@pytest.mark.parametrize(
    ("kwargs", "status", "failing"),
    [
        ({}, 200, []),
        ({"installed": "0.1.0"}, 503, ["version"]),
        ({"installed": None}, 503, ["version"]),
        ({"latencies": {"extraction": 600.0, "compaction": 0.0}}, 503, ["queue"]),
        ({"latencies": {"extraction": 599.9, "compaction": 0.0}}, 200, []),
        ({"queue_error": "function aidb_memory.metrics(integer) does not exist"}, 503, ["queue"]),
        ({"database_error": "connection refused"}, 503, ["database"]),
    ],
)
def test_health_decision(kwargs: dict[str, Any], status: int, failing: list[str]) -> None:
    given: dict[str, Any] = {
        "database_error": None,
        "installed": "1.0",
        "package": "1.0",
        "queue_error": None,
        "latencies": {"extraction": 0.0, "compaction": 3.0},
        "max_latency_s": 600.0,
        **kwargs,
    }
    code, body = metrics.health_report(**given)
    assert code == status
    assert body["failing"] == failing
    assert body["status"] == ("ok" if status == 200 else "failing")
    checks = body["checks"]
    assert isinstance(checks, dict)
    assert set(checks) == {"database", "version", "queue"}
    for name in failing:
        assert checks[name]["ok"] is False
    json.dumps(body)  # what /healthz sends


def test_health_when_the_database_is_gone_leaves_the_other_checks_unrun() -> None:
    _code, body = metrics.health_report(
        database_error="connection refused",
        installed=None,
        package="1.0",
        queue_error=None,
        latencies={},
        max_latency_s=600,
    )
    checks = body["checks"]
    assert isinstance(checks, dict)
    assert checks["version"]["ok"] is None and checks["queue"]["ok"] is None


def test_queue_states_from_rows() -> None:
    states = queue_states(_rows())
    assert states == [
        QueueState("extraction", {"ready": 3, "failed": 1}, 12.5),
        QueueState("compaction", {}, 0.0),
    ]
    assert states[0].line() == (
        "queue extraction: ready 3, waiting 0, processing 0, failed 1; oldest ready event "
        "12.5 s old"
    )
    assert states[1].as_json() == {
        "ready": 0,
        "waiting": 0,
        "processing": 0,
        "failed": 0,
        "latency_seconds": 0.0,
        "estimated": False,
    }
    estimated = queue_states([*_rows(), ("aidb_memory_queue_events_estimated", {}, 1)])
    assert all(state.estimated for state in estimated)
    assert estimated[0].line() == (
        "queue extraction: ready ~3, waiting ~0, processing ~0, failed 1; oldest ready event "
        "12.5 s old"
    )


# --- logs -------------------------------------------------------------------------------------


def test_json_line_is_one_object_with_ts_level_msg() -> None:
    line = json_line("batch", "info", {"processed": 2}, 1700000000.25)
    assert "\n" not in line
    assert json.loads(line) == {
        "ts": "2023-11-14T22:13:20.250Z",
        "level": "info",
        "msg": "batch",
        "processed": 2,
    }


def test_logged_events_keep_failures_and_retries_and_only_their_fields() -> None:
    by_kind = {
        "extraction": {"processed": 1},
        "events": [
            {"event": "e1", "kind": "extraction", "namespace": "n", "outcome": "processed"},
            {
                "event": "e2",
                "kind": "extraction",
                "namespace": "n",
                "outcome": "failed",
                "duration_ms": 12,
                "actor_id": "alice",  # a server that says more than the contract: left out
                "error": "the model said: alice's secret",
            },
            {"event": "e3", "kind": "compaction", "namespace": "n", "outcome": "retry"},
            "not an object",
        ],
    }
    assert logged_events(by_kind) == [
        {
            "event": "e2",
            "kind": "extraction",
            "namespace": "n",
            "outcome": "failed",
            "duration_ms": 12,
        },
        {"event": "e3", "kind": "compaction", "namespace": "n", "outcome": "retry"},
    ]
    assert logged_events({"extraction": {}}) == []  # a server from before issue 36
    assert logged_events(None) == []


def test_log_text_json_and_quiet() -> None:
    out: list[str] = []
    err: list[str] = []
    text = Log(out.append, err.append)
    text("started", "worker: started", once=False)
    text.batch("worker: processed 1", processed=1)
    text.events({"events": [{"event": "e", "outcome": "failed"}]})
    assert out == ["worker: started", "worker: processed 1"] and err == []

    out.clear()
    as_json = Log(out.append, err.append, json_format=True, clock=lambda: 0.0)
    as_json("started", "worker: started", once=False)
    as_json.batch("worker: processed 1", processed=1, duration_ms=5)
    as_json.events({"events": [{"event": "e", "kind": "extraction", "outcome": "retry"}]})
    assert out == []
    objects = [json.loads(line) for line in err]
    assert [(o["msg"], o["level"]) for o in objects] == [
        ("started", "info"),
        ("batch", "info"),
        ("event", "warning"),
    ]
    assert objects[1]["processed"] == 1 and objects[1]["duration_ms"] == 5

    out.clear()
    quiet = Log(out.append, err.append, quiet=True)
    quiet.batch("worker: processed 1")
    quiet("stopped", "worker: stopped")
    assert out == ["worker: stopped"]


# --- progress ---------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_progress_reports_done_of_waiting_rate_and_time_left_every_few_seconds() -> None:
    clock, out = Clock(), io.StringIO()
    looks: list[int] = []

    def remaining() -> int:
        looks.append(1)
        return 90

    progress = Progress(remaining, Reporter(out, mode="always", interval_s=5, clock=clock))
    progress.handled(1, more=True)  # busy from here
    clock.now += 1
    progress.handled(10, more=True)  # 1 s busy: no line yet, and no query
    assert out.getvalue() == "" and looks == []
    clock.now += 4
    progress.handled(39, more=True)  # 5 s busy: a line, after one look at the queue
    assert out.getvalue().splitlines() == [
        "worker: backlog: 50 of 140 events (35%), 10 events/s, about 9 s left"
    ]
    assert len(looks) == 1
    clock.now += 2
    progress.handled(10, more=True)  # 2 s after the line: nothing
    assert len(out.getvalue().splitlines()) == 1
    clock.now += 1
    progress.handled(0, more=False)  # the queue is empty: a last line
    assert out.getvalue().splitlines()[-1] == (
        "worker: backlog: done, 60 events in 8 s (7.5 events/s)"
    )
    assert len(looks) == 1
    assert progress.task is None


def test_progress_looks_again_once_it_has_done_what_it_saw() -> None:
    clock, out = Clock(), io.StringIO()
    waiting = [10, 100]
    progress = Progress(
        lambda: waiting.pop(0), Reporter(out, mode="always", interval_s=5, clock=clock)
    )
    progress.handled(1, more=True)
    clock.now += 5
    progress.handled(4, more=True)  # 5 done, 10 waiting: of 15
    clock.now += 5
    progress.handled(10, more=True)  # 15 done of 15: more came meanwhile, look again
    assert [line.split(" (")[0] for line in out.getvalue().splitlines()] == [
        "worker: backlog: 5 of 15 events",
        "worker: backlog: 15 of 115 events",
    ]


def test_progress_is_silent_for_short_bursts_and_without_a_count() -> None:
    clock, out = Clock(), io.StringIO()
    progress = Progress(lambda: None, Reporter(out, mode="always", interval_s=5, clock=clock))
    progress.handled(1, more=True)
    clock.now += 1
    progress.handled(0, more=False)
    assert out.getvalue() == ""
    progress.handled(1, more=True)
    clock.now += 6
    progress.handled(1, more=True)  # an older server: no count of the waiting
    assert out.getvalue().splitlines() == ["worker: backlog: 2 events, 0.3 events/s"]


def test_progress_as_json_objects() -> None:
    clock, err = Clock(), []
    log = Log(print, err.append, json_format=True, clock=lambda: 0.0)
    reporter = Reporter(ProgressObjects(log), mode="always", interval_s=5, clock=clock)
    progress = Progress(lambda: 5, reporter)
    progress.handled(1, more=True)
    clock.now += 5
    progress.handled(4, more=True)
    [line] = err
    assert json.loads(line) == {
        "ts": "1970-01-01T00:00:00.000Z",
        "level": "info",
        "msg": "progress",
        "text": "worker: backlog: 5 of 10 events (50%), 1.0 events/s, about 5 s left",
        "done": 5,
        "total": 10,
    }


# --- the server, with a database that is not there ----------------------------------------------


def _refused() -> psycopg.Connection[tuple[object, ...]]:
    raise psycopg.OperationalError("connection refused")


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_server_answers_when_the_database_does_not() -> None:
    reported: list[str | None] = []
    exporter = metrics.Exporter(_refused, WorkerStats(), on_database=reported.append)
    server = metrics.serve(exporter, "127.0.0.1", 0)
    try:
        status, text = _get(f"{server.url}/metrics")
        assert status == 200
        parsed = _parsed(text)
        assert parsed["aidb_memory_worker_up"].samples[0].value == 1
        assert parsed["aidb_memory_worker_database_up"].samples[0].value == 0
        assert "process_start_time_seconds" in text or sys.platform != "linux"
        _get(f"{server.url}/metrics")
        assert reported == ["connection refused"], "reported once, not per scrape"
        status, text = _get(f"{server.url}/healthz")
        assert status == 503
        body = json.loads(text)
        assert body["failing"] == ["database"]
        assert body["checks"]["version"]["package"] == __version__
        assert _get(f"{server.url}/nothing")[0] == 404
    finally:
        server.close()


# --- prometheus-client only with --metrics-port -----------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": str(REPO / "src")},
    )


def test_the_worker_does_not_import_prometheus_client_without_the_option() -> None:
    result = _python(
        "import sys\n"
        "from aidb_memory import cli\n"
        "from aidb_memory.ops import worker\n"
        "cli.build_parser().parse_args(['worker', '--log-format', 'json'])\n"
        "assert 'prometheus_client' not in sys.modules, 'imported'\n"
        "assert 'aidb_memory.ops.metrics' not in sys.modules, 'imported'\n"
    )
    assert result.returncode == 0, result.stderr


def test_without_the_metrics_extra_it_says_which_extra() -> None:
    # prometheus_client missing: a None entry in sys.modules makes its import fail.
    result = _python(
        "import sys; sys.modules['prometheus_client'] = None; from aidb_memory.cli import main; "
        "sys.exit(main(['worker', '--metrics-port', '0', '--dsn', 'host=/nonexistent']))"
    )
    assert result.returncode == 2
    assert result.stderr == cli.METRICS_EXTRA_MISSING + "\n"
    assert "pip install 'aidb-memory[metrics]'" in cli.METRICS_EXTRA_MISSING


@pytest.mark.parametrize(
    "args",
    [
        ["--metrics-port", "70000"],
        ["--metrics-port", "x"],
        ["--metrics-namespaces", "-1"],
        ["--health-max-latency", "0"],
        ["--log-format", "xml"],
    ],
)
def test_bad_worker_options_are_usage_errors(args: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(["worker", *args])
    assert exit_info.value.code == 2


def test_the_server_listens_on_an_ipv6_address_too() -> None:
    exporter = metrics.Exporter(_refused, WorkerStats())
    try:
        server = metrics.serve(exporter, "::1", 0)
    except OSError as e:  # a host without IPv6 on loopback
        pytest.skip(f"no ::1 here: {e}")
    try:
        assert server.url == f"http://[::1]:{server.port}"
        assert _get(f"{server.url}/metrics")[0] == 200
    finally:
        server.close()
