"""The worker's Prometheus exporter (issue 36): ``aidb-memory worker --metrics-port PORT``.

One small HTTP server (a thread of the worker, a thread per request) answers ``/metrics`` in
Prometheus' text format and ``/healthz`` with a JSON object. On each scrape the :class:`Exporter`
runs ``aidb_memory.metrics(N)`` on a connection of its own (never the one running
``process_events``): opened on the first scrape, opened again when lost, one query at a time
(a lock: scrapes may come from several threads), under a ``statement_timeout`` so that a stuck
database cannot hang a scrape. It exports those rows as the families they are (:func:`families`),
and the worker's own figures (:func:`worker_families`, from :class:`WorkerStats`); a scrape whose
query fails still answers, with ``aidb_memory_worker_database_up 0``.

``/healthz`` answers 200 when the database answers, the installed aidb_memory version is this
package's, and the queue is being claimed (its oldest ready event is younger than
``--health-max-latency``); 503 otherwise, with the failing checks named (:func:`health_report`).

This is the only module that imports prometheus-client (the ``metrics`` extra): the worker
imports it only when ``--metrics-port`` is given.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from wsgiref.simple_server import WSGIRequestHandler, make_server
from wsgiref.types import StartResponse, WSGIEnvironment

import psycopg
from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)

from aidb_memory import __version__
from aidb_memory.connection import (
    connection_reason,
    first_line,
    pinned_options,
    redact,
    resolve_dsn,
)
from aidb_memory.ops.worker import (
    QUEUE_LATENCY,
    StatsSnapshot,
    WorkerStats,
    queue_states,
)

Connection = psycopg.Connection[tuple[object, ...]]
Row = tuple[object, object, object]  # metric, labels, value: a row of aidb_memory.metrics()

_METRICS = "SELECT metric, labels, value FROM aidb_memory.metrics(%s::int)"
_VERSION = "SELECT aidb_memory.version()"
# A scrape (or a health check) waits at most this long for its query: Prometheus' default scrape
# timeout is 10 s, and a scrape that times out tells nothing, while one that answers
# aidb_memory_worker_database_up 0 says what is wrong.
QUERY_TIMEOUT_S = 5
# libpq's connect_timeout for the exporter's connection (a host that drops packets).
CONNECT_TIMEOUT_S = 5
DEFAULT_MAX_NAMESPACES = 20
DEFAULT_MAX_LATENCY_S = 600.0

# The families of aidb_memory.metrics() (the issue 36 contract): name as its samples are named
# (a counter's with _total, a histogram's without _bucket/_sum/_count) -> (type, help).
FAMILIES: dict[str, tuple[str, str]] = {
    "aidb_memory_queue_events": (
        "gauge",
        "Events in the queue by kind and status: ready (due now), waiting (next attempt after a "
        "backoff), processing, failed (gave up after max attempts).",
    ),
    "aidb_memory_queue_events_estimated": (
        "gauge",
        "1 when more than 5,000 events are pending and aidb_memory_queue_events is an estimate "
        "past the oldest 5,000 (which are counted); 0 when it counts every event.",
    ),
    QUEUE_LATENCY: (
        "gauge",
        "Age of the oldest ready event of the kind in seconds (now - created_at); 0 when none.",
    ),
    "aidb_memory_events_processed_total": (
        "counter",
        "Events finished: extraction processed or skipped, compaction summarized or dropped.",
    ),
    "aidb_memory_events_failed_total": ("counter", "Events that failed for good (max attempts)."),
    "aidb_memory_events_retried_total": ("counter", "Failed attempts that will be retried."),
    "aidb_memory_model_calls_total": (
        "counter",
        "Model calls by model, purpose, outcome and namespace (every row of model_usage).",
    ),
    "aidb_memory_model_call_duration_seconds": (
        "histogram",
        "Duration of model calls in seconds, by model and purpose.",
    ),
    "aidb_memory_model_tokens_total": (
        "counter",
        "Model tokens by model and direction (in, out); a call that reports none counts 0.",
    ),
    "aidb_memory_compactions_total": (
        "counter",
        "Session summaries written: ahead of reads by the worker, or inline by a read.",
    ),
    "aidb_memory_worker_last_batch_timestamp_seconds": (
        "gauge",
        "Unix time a process_events call last finished (any worker, pg_cron too); 0 if never.",
    ),
}

# The worker's own families (worker_families), as prometheus-client names them (a counter
# without _total): rows of the database under these names are left out rather than exported
# twice.
WORKER_FAMILIES = frozenset(
    {
        "aidb_memory_worker_up",
        "aidb_memory_worker_database_up",
        "aidb_memory_worker_batches",
        "aidb_memory_worker_last_success_timestamp_seconds",
        "aidb_memory_worker_events",
    }
)
# Prometheus' data model: what a metric and a label may be called.
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def _family_of(name: str, labels: Mapping[str, str], histograms: set[str]) -> tuple[str, str]:
    """The family a sample belongs to and its type: the contract's table first, then by
    Prometheus' naming rules (``_total``: a counter; ``_bucket`` with ``le``, and the ``_sum``
    and ``_count`` beside it: a histogram); any other sample is a family of unknown type."""
    if name in FAMILIES:
        return name, FAMILIES[name][0]
    for suffix in _HISTOGRAM_SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and (
            FAMILIES.get(base, ("",))[0] == "histogram"
            or base in histograms
            or (suffix == "_bucket" and "le" in labels)
        ):
            return base, "histogram"
    if name.endswith("_total"):
        return name, "counter"
    return name, "unknown"


def _labels(value: object) -> dict[str, str] | None:
    """A row's labels as Prometheus labels (string values); None when they cannot be."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        return None
    out = {}
    for key, v in value.items():
        if not isinstance(key, str) or not _LABEL_NAME.match(key) or key.startswith("__"):
            return None
        out[key] = v if isinstance(v, str) else json.dumps(v)
    return out


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _le(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("inf")


@dataclass
class _Histogram:
    buckets: dict[str, float]
    sum: float | None = None
    count: float | None = None


def families(rows: Iterable[Row]) -> list[Metric]:
    """``aidb_memory.metrics()`` rows (metric, labels, value) as Prometheus metric families, in
    the order they first appear: a histogram's ``_bucket``, ``_sum`` and ``_count`` rows make one
    family, a counter's samples keep their ``_total``. Rows that Prometheus could not take (a
    name outside ``aidb_memory_``, an invalid name or label, a value that is not a number, a
    sample already seen, a family the worker exports itself) are left out, so that one odd row
    never costs the whole scrape."""
    samples: list[tuple[str, dict[str, str], float]] = []
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for metric, raw_labels, raw_value in rows:
        labels, value = _labels(raw_labels), _float(raw_value)
        if (
            not isinstance(metric, str)
            or not metric.startswith("aidb_memory_")
            or not _METRIC_NAME.match(metric)
            or labels is None
            or value is None
        ):
            continue
        key = (metric, tuple(sorted(labels.items())))
        if key in seen:
            continue
        seen.add(key)
        samples.append((metric, labels, value))
    # A histogram of a name outside the table is known by its _bucket samples, which may come
    # after its _count (rows are ordered by name): look at them first.
    histograms = {
        m.removesuffix("_bucket") for m, lb, _ in samples if m.endswith("_bucket") and "le" in lb
    }
    grouped: dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]] = {}
    for metric, labels, value in samples:
        family, typ = _family_of(metric, labels, histograms)
        if family.removesuffix("_total") in WORKER_FAMILIES:
            continue
        grouped.setdefault(family, (typ, []))[1].append((metric, labels, value))
    out: list[Metric] = []
    for family, (typ, members) in grouped.items():
        built = _build(family, typ, members)
        if built is not None:
            out.append(built)
    return out


def _build(
    family: str, typ: str, members: list[tuple[str, dict[str, str], float]]
) -> Metric | None:
    """One family from its samples. Samples whose label names differ get the union of them,
    an absent label empty (which Prometheus reads as the same series)."""
    doc = FAMILIES.get(family, (typ, f"{family} (from aidb_memory.metrics())."))[1]
    names = sorted({k for _, labels, _ in members for k in labels if k != "le"})

    def values(labels: Mapping[str, str]) -> list[str]:
        return [labels.get(n, "") for n in names]

    if typ == "histogram":
        return _histogram(family, doc, names, members, values)
    metric: GaugeMetricFamily | CounterMetricFamily | UnknownMetricFamily
    if typ == "counter":
        # CounterMetricFamily names the family without _total and its samples with it.
        metric = CounterMetricFamily(family, doc, labels=names)
    elif typ == "gauge":
        metric = GaugeMetricFamily(family, doc, labels=names)
    else:
        metric = UnknownMetricFamily(family, doc, labels=names)
    for _, labels, value in members:
        metric.add_metric(values(labels), value)
    return metric


def _histogram(
    family: str,
    doc: str,
    names: list[str],
    members: list[tuple[str, dict[str, str], float]],
    values: Callable[[Mapping[str, str]], list[str]],
) -> Metric | None:
    series: dict[tuple[str, ...], _Histogram] = {}
    for metric, labels, value in members:
        h = series.setdefault(tuple(values(labels)), _Histogram({}))
        if metric == family + "_bucket" and "le" in labels:
            h.buckets[labels["le"]] = value
        elif metric == family + "_sum":
            h.sum = value
        elif metric == family + "_count":
            h.count = value
    out = HistogramMetricFamily(family, doc, labels=names)
    for key, h in series.items():
        buckets = sorted(h.buckets.items(), key=lambda b: _le(b[0]))
        if not buckets or _le(buckets[-1][0]) != float("inf"):
            if h.count is None:
                continue  # no +Inf bucket and no count: not a histogram Prometheus can read
            buckets.append(("+Inf", h.count))
        # The +Inf bucket gives the family its _count (as Prometheus' own histograms do).
        out.add_metric(list(key), buckets, h.sum)
    return out if out.samples else None


def worker_families(stats: StatsSnapshot, database_up: bool) -> list[Metric]:
    """The worker's own families: up, whether this scrape's query worked, its CALLs by outcome,
    the time of its last successful CALL, and the events it handled by kind and outcome."""
    up = GaugeMetricFamily("aidb_memory_worker_up", "1: this worker process is running.", value=1)
    database = GaugeMetricFamily(
        "aidb_memory_worker_database_up",
        "1 when this scrape's query of aidb_memory.metrics() worked, 0 when it did not.",
        value=1 if database_up else 0,
    )
    batches = CounterMetricFamily(
        "aidb_memory_worker_batches_total",
        "This worker's process_events calls by outcome (ok, failed).",
        labels=["outcome"],
    )
    for outcome in ("ok", "failed"):
        batches.add_metric([outcome], stats.batches.get(outcome, 0))
    last = GaugeMetricFamily(
        "aidb_memory_worker_last_success_timestamp_seconds",
        "Unix time of this worker's last successful process_events call; 0 if none yet.",
        value=stats.last_success,
    )
    events = CounterMetricFamily(
        "aidb_memory_worker_events_total",
        "Events this worker handled, by kind and outcome (as process_events' by_kind counts them).",
        labels=["kind", "outcome"],
    )
    for kind, counts in stats.events.items():
        for outcome, n in counts.items():
            events.add_metric([kind, outcome], n)
    return [up, database, batches, last, events]


def health_report(
    *,
    database_error: str | None,
    installed: str | None,
    package: str,
    queue_error: str | None,
    latencies: Mapping[str, float],
    max_latency_s: float,
) -> tuple[int, dict[str, object]]:
    """The health decision: (HTTP status, JSON object). 200 when the database answered, the
    installed version is ``package`` and every kind's oldest ready event is younger than
    ``max_latency_s`` (or there is none); 503 otherwise, with ``failing`` naming the checks that
    failed. Checks the database's failure left unrun have ``ok`` null."""
    checks: dict[str, dict[str, object]] = {}
    if database_error is not None:
        checks["database"] = {"ok": False, "error": database_error}
        checks["version"] = {"ok": None, "package": package}
        checks["queue"] = {"ok": None, "max_latency_seconds": max_latency_s}
    else:
        checks["database"] = {"ok": True}
        checks["version"] = {"ok": installed == package, "installed": installed, "package": package}
        if queue_error is not None:
            checks["queue"] = {
                "ok": False,
                "error": queue_error,
                "max_latency_seconds": max_latency_s,
            }
        else:
            late = sorted(k for k, s in latencies.items() if not s < max_latency_s)
            checks["queue"] = {
                "ok": not late,
                "latency_seconds": dict(latencies),
                "max_latency_seconds": max_latency_s,
                **({"late": late} if late else {}),
            }
    failing = [name for name, check in checks.items() if check["ok"] is False]
    body: dict[str, object] = {
        "status": "failing" if failing else "ok",
        "failing": failing,
        "checks": checks,
    }
    return (503 if failing else 200), body


def connector(dsn: str | None) -> Callable[[], Connection]:
    """Opens the exporter's connections: autocommit, the search_path pinned (as the CLI's), a
    short connect timeout, and a statement_timeout of QUERY_TIMEOUT_S."""
    resolved = resolve_dsn(dsn)

    def open_connection() -> Connection:
        conn = psycopg.connect(
            resolved,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            options=pinned_options(resolved),
            application_name="aidb-memory worker metrics",
        )
        conn.execute(
            "SELECT pg_catalog.set_config('statement_timeout', %s, false)",
            (str(QUERY_TIMEOUT_S * 1000),),
        )
        return conn

    return open_connection


def _reason(error: psycopg.Error, dsn_for_redaction: str) -> str:
    """One line for what went wrong with a query or a connection, never with a password."""
    if isinstance(error, psycopg.OperationalError) and error.sqlstate is None:
        return redact(connection_reason(str(error)), dsn_for_redaction)
    return redact(first_line(error), dsn_for_redaction)


_UNKNOWN = object()


class Exporter:
    """prometheus-client's collector for the worker (``collect``), and its health check
    (``health``), on one connection of its own."""

    def __init__(
        self,
        connect: Callable[[], Connection],
        stats: WorkerStats,
        *,
        max_namespaces: int = DEFAULT_MAX_NAMESPACES,
        max_latency_s: float = DEFAULT_MAX_LATENCY_S,
        dsn: str = "",
        on_database: Callable[[str | None], None] | None = None,
    ) -> None:
        self._connect = connect
        self.stats = stats
        self.max_namespaces = max_namespaces
        self.max_latency_s = max_latency_s
        self._dsn = dsn  # to redact its password from error lines
        # Told when the database stops answering the exporter (the reason) and when it answers
        # again (None): once per change, not once per scrape.
        self._on_database = on_database
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._last_error: object = _UNKNOWN  # str | None once a scrape ran

    def _run(self, work: Callable[[Connection], object]) -> tuple[object, str | None]:
        """``work`` on the exporter's connection, opened if need be: (its result, None), or
        (None, what went wrong). A connection lost since the last scrape (a server restart) is
        opened again and ``work`` tried once more, so that the scrape after a restart answers.
        The caller holds the lock."""
        for _ in range(2):
            fresh = self._conn is None
            try:
                if self._conn is None:
                    self._conn = self._connect()
                return work(self._conn), None
            except psycopg.Error as e:
                lost = self._conn is None or self._conn.closed or self._conn.broken
                if lost:
                    self._close()
                if lost and not fresh:
                    continue
                return None, _reason(e, self._dsn)
        raise AssertionError("unreachable: the second try returns")

    def _note(self, error: str | None) -> None:
        """Tell on_database when the scrapes' query starts failing (and the first scrape when it
        fails) and when it works again: once per change, not once per scrape."""
        last, self._last_error = self._last_error, error
        changed = (error is not None) if last is _UNKNOWN else ((error is None) != (last is None))
        if changed and self._on_database is not None:
            self._on_database(error)

    def rows(self) -> tuple[list[Row], str | None]:
        """``aidb_memory.metrics(max_namespaces)``'s rows, or what went wrong."""

        def query(conn: Connection) -> list[Row]:
            cur = conn.execute(_METRICS, (self.max_namespaces,))
            return [(r[0], r[1], r[2]) for r in cur.fetchall()]

        with self._lock:
            result, error = self._run(query)
            self._note(error)
        return (result if isinstance(result, list) else []), error

    def collect(self) -> Iterator[Metric]:
        """A scrape (prometheus-client's Collector protocol)."""
        rows, error = self.rows()
        yield from families(rows)
        yield from worker_families(self.stats.snapshot(), database_up=error is None)

    def health(self) -> tuple[int, dict[str, object]]:
        """``/healthz``: (HTTP status, JSON object), as :func:`health_report` decides."""

        def installed(conn: Connection) -> str | None:
            try:
                row = conn.execute(_VERSION).fetchone()
            except psycopg.ProgrammingError:
                # No aidb_memory.version() (not installed) or no right to it: the database
                # answered, and the version check fails.
                return None
            return row[0] if row and isinstance(row[0], str) else None

        with self._lock:
            version, database_error = self._run(installed)
        rows: list[Row] = []
        queue_error = None
        if database_error is None:
            rows, queue_error = self.rows()
        return health_report(
            database_error=database_error,
            installed=version if isinstance(version, str) else None,
            package=__version__,
            queue_error=queue_error,
            latencies={state.kind: state.latency_s for state in queue_states(rows)},
            max_latency_s=self.max_latency_s,
        )

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            # A connection already gone has nothing to say.
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def close(self) -> None:
        with self._lock:
            self._close()


class _QuietHandler(WSGIRequestHandler):
    """No line per request on standard error (the worker's log is its own), and an idle client
    dropped after 30 s rather than holding a thread."""

    timeout = 30

    def log_message(self, format: str, *args: object) -> None:
        pass


def app(exporter: Exporter, registry: CollectorRegistry) -> Callable[..., Iterable[bytes]]:
    """The WSGI application: ``/metrics`` (prometheus-client's exposition of ``registry``),
    ``/healthz`` (``exporter.health()`` as JSON), 404 for any other path."""
    metrics = make_wsgi_app(registry)

    def application(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        if path == "/healthz":
            if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
                start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
                return [b""]
            status, body = exporter.health()
            payload = (json.dumps(body, sort_keys=True) + "\n").encode()
            reason = "OK" if status == 200 else "Service Unavailable"
            start_response(
                f"{status} {reason}",
                [
                    ("Content-Type", "application/json"),
                    ("Content-Length", str(len(payload))),
                    ("Cache-Control", "no-store"),
                ],
            )
            return [payload if environ.get("REQUEST_METHOD") == "GET" else b""]
        payload = b"not found: the worker serves /metrics and /healthz\n"
        start_response(
            "404 Not Found",
            [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(payload)))],
        )
        return [payload]

    return application


@dataclass
class MetricsServer:
    """The running server: its address, and how to stop it."""

    server: ThreadingWSGIServer
    thread: threading.Thread
    exporter: Exporter

    @property
    def address(self) -> str:
        return str(self.server.server_address[0])

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
        self.exporter.close()


def serve(exporter: Exporter, address: str, port: int) -> MetricsServer:
    """Serve ``exporter`` on ``address``:``port`` (0: a free port) in a thread; OSError when the
    address cannot be bound (in use, not this host's)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    # The worker process' CPU, memory, open files and start time (process_*), as any
    # prometheus-client exporter has them.
    ProcessCollector(registry=registry)
    # IPv4 or IPv6, as the address is.
    family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][
        0
    ]

    class Server(ThreadingWSGIServer):
        address_family = family

    httpd = make_server(address, port, app(exporter, registry), Server, _QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, name="aidb-memory metrics", daemon=True)
    thread.start()
    return MetricsServer(httpd, thread, exporter)
