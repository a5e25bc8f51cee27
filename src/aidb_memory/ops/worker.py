"""``aidb-memory worker``: runs the queue (SPEC §5; issue 13) until stopped: extraction events
and compaction tasks (a session's next summary, written before its reads need it).

It calls ``aidb_memory.process_events`` in batches; when the queue is empty it waits on
``LISTEN aidb_memory_events`` (every ``add`` that queues an event notifies at commit), with a
timeout so that events due after a backoff are picked up too. SIGINT or SIGTERM stops it after
the event in hand (by default one event per CALL; each event commits on its own). Several
workers at once are safe: the procedure claims events with ``FOR UPDATE SKIP LOCKED``. With
``--key-range MIN:MAX`` a worker claims only the events of actors whose ``actor_key`` is in that
range (issue 15): N workers given N disjoint ranges that cover the key space
(:func:`key_ranges`, ``aidb-memory worker --split-key-space N``) share the queue, each never
scanning the others' events.

It stays up: a CALL that fails (a ``statement_timeout`` or cancel during an event, which the
procedure records as that event's failed attempt, or any other error) is reported and the next
CALL goes on after a short pause; a lost connection (server restart, terminated backend) is
re-opened with a capped backoff, a line per try. It stops only on SIGINT/SIGTERM or on a
configuration error (:class:`ConfigError`: no privilege, aidb_memory not installed, an option
the server refuses), which retrying cannot mend.

What it reports (issue 36) goes through :class:`Log`: a line per batch and per change of state, as
text on standard output or, with ``--log-format json``, one JSON object per line on standard
error (and one per failed or retried event, from by_kind's ``events``), never content, keys or
actor ids; ``--quiet`` drops the per-batch lines. Draining a backlog, it reports the events done
of those waiting, their rate and the time left (:class:`Progress`) on standard error, at most
every few seconds, when standard error is a terminal or with ``--progress``. With
``--metrics-port`` it keeps its own figures in a :class:`WorkerStats`, which the exporter
(``aidb_memory.ops.metrics``, the only module that imports prometheus-client) reads on each
scrape.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import FrameType

import psycopg

from aidb_memory.connection import CliError, first_line
from aidb_memory.progress import Reporter, Task

CHANNEL = "aidb_memory_events"
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
# Errors no retry mends: no privilege, no such function or schema (not installed, or an older
# version), an option the server refuses.
CONFIG_SQLSTATES = frozenset({"42501", "42883", "3F000", "42P01", "42704", "22023", "22004"})
_PROCESS = (
    "CALL aidb_memory.process_events(max_events => %s::int, lease_s => %s::int, "
    "max_attempts => %s::int, backoff_s => %s::real)"
)
# With a key range. Without one the CALL stays as it was, so that a worker without a range also
# runs against a server from before key ranges.
_PROCESS_IN_RANGE = (
    "CALL aidb_memory.process_events(max_events => %s::int, lease_s => %s::int, "
    "max_attempts => %s::int, backoff_s => %s::real, key_min => %s::bigint, key_max => %s::bigint)"
)
# actor_key is a signed 64-bit integer (aidb_memory.actor_key).
KEY_MIN = -(2**63)
KEY_MAX = 2**63 - 1


def parse_key_range(text: str) -> tuple[int, int]:
    """``MIN:MAX`` (two integers, inclusive, MIN <= MAX, both within the signed 64-bit range)
    as (MIN, MAX); ValueError saying what is wrong otherwise."""
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        low, high = int(parts[0]), int(parts[1])
    except ValueError:
        raise ValueError(
            f"{text!r} is not MIN:MAX, two integers (e.g. --key-range=-9223372036854775808:-1)"
        ) from None
    for bound in (low, high):
        if not KEY_MIN <= bound <= KEY_MAX:
            raise ValueError(f"{bound} is outside the keys ({KEY_MIN} to {KEY_MAX})")
    if low > high:
        raise ValueError(f"MIN {low} is greater than MAX {high}")
    return low, high


def key_ranges(n: int) -> list[tuple[int, int]]:
    """``n`` ranges of (about) equal size, in order, that together cover every key once."""
    if n < 1:
        raise ValueError("the number of ranges must be at least 1")
    span = KEY_MAX - KEY_MIN + 1
    starts = [KEY_MIN + span * i // n for i in range(n)]
    return [(lo, hi - 1) for lo, hi in zip(starts, [*starts[1:], KEY_MAX + 1], strict=True)]


@dataclass
class Options:
    """How the worker runs."""

    once: bool = False
    batch: int = 1  # events per CALL: a stop request is seen after each batch
    lease_s: int = 300
    max_attempts: int = 5
    backoff_s: float = 10.0
    idle_s: float = 5.0  # longest wait for a notification before looking again
    key_range: tuple[int, int] | None = None  # only events with actor_key in MIN..MAX

    def call(self) -> tuple[str, tuple[object, ...]]:
        """The CALL of one batch, and its parameters."""
        args = (self.batch, self.lease_s, self.max_attempts, self.backoff_s)
        if self.key_range is None:
            return _PROCESS, args
        return _PROCESS_IN_RANGE, (*args, *self.key_range)


# What process_events reports per kind (its by_kind), in the order printed.
KIND_COUNTS = {
    "extraction": ("processed", "failed", "retried"),
    "compaction": ("summarized", "dropped", "failed", "retried"),
    "expiry": ("expired",),
}
# The most expired memories one call of process_events deletes (sql/70_worker.sql): after a full
# batch the worker calls again at once, as after a full batch of events.
EXPIRE_BATCH = 1000


@dataclass
class Totals:
    """What the worker did so far: all kinds together, and per kind."""

    processed: int = 0
    failed: int = 0
    retried: int = 0
    started: float = field(default_factory=time.monotonic)
    by_kind: dict[str, dict[str, int]] = field(
        default_factory=lambda: {k: dict.fromkeys(names, 0) for k, names in KIND_COUNTS.items()}
    )

    def add_kinds(self, reported: object) -> None:
        """Add a CALL's by_kind (NULL from an older server: nothing to add)."""
        if not isinstance(reported, dict):
            return
        for kind, names in KIND_COUNTS.items():
            counts = reported.get(kind)
            if isinstance(counts, dict):
                for name in names:
                    self.by_kind[kind][name] += _count(counts.get(name))

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.processed / elapsed
        kinds = "; ".join(
            f"{kind}: " + ", ".join(f"{name} {self.by_kind[kind][name]}" for name in names)
            for kind, names in KIND_COUNTS.items()
        )
        return (
            f"processed {self.processed}, failed {self.failed}, retried {self.retried} "
            f"({rate:.1f} events/s); {kinds}"
        )


# The fields of a by_kind event a log line may carry (issue 36: no actor id, no content, no error
# text); whatever else a server puts there stays out of the log.
EVENT_FIELDS = ("event", "kind", "namespace", "outcome", "duration_ms")
# The outcomes of an event that get a log object of their own, and its level.
LOGGED_OUTCOMES = {"failed": "error", "retry": "warning"}


def json_line(msg: str, level: str, fields: Mapping[str, object], now: float) -> str:
    """One log object on one line: ts (UTC, ISO 8601, milliseconds), level, msg, then fields."""
    ts = datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat(timespec="milliseconds")
    record = {"ts": ts.replace("+00:00", "Z"), "level": level, "msg": msg, **fields}
    return json.dumps(record, separators=(",", ":"), default=str)


def logged_events(by_kind: object) -> list[dict[str, object]]:
    """The failed and retried events of a CALL's by_kind ``events``, each with EVENT_FIELDS only
    (a server from before issue 36 lists none)."""
    events = by_kind.get("events") if isinstance(by_kind, dict) else None
    if not isinstance(events, list):
        return []
    out = []
    for event in events:
        if not isinstance(event, dict) or event.get("outcome") not in LOGGED_OUTCOMES:
            continue
        out.append(
            {
                name: event[name]
                for name in EVENT_FIELDS
                if isinstance(event.get(name), str | int) and not isinstance(event[name], bool)
            }
        )
    return out


def _batch_kinds(by_kind: object) -> dict[str, dict[str, int]]:
    """A CALL's counts per kind (by_kind without its ``events``), for the batch's log object."""
    if not isinstance(by_kind, dict):
        return {}
    return {
        kind: {name: _count(counts.get(name)) for name in names}
        for kind, names in KIND_COUNTS.items()
        if isinstance(counts := by_kind.get(kind), dict)
    }


def _stderr(line: str) -> None:
    # A closed standard error must not stop the worker: its lines are lost, not its work.
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


class Log:
    """Where the worker reports. As text (the default): a line through ``say`` (standard output)
    per change of state and per batch, as before issue 36. As JSON (``json_format``): one object
    per line through ``err`` (standard error) instead, and one per failed or retried event.
    ``quiet`` drops the per-batch lines (and objects). A backlog's progress is not the log's: it
    goes to standard error in both (:class:`Progress`, :class:`ProgressObjects`)."""

    def __init__(
        self,
        say: Callable[[str], None],
        err: Callable[[str], None] | None = None,
        *,
        json_format: bool = False,
        quiet: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.say = say
        self.err = err or _stderr
        self.json_format = json_format
        self.quiet = quiet
        self.clock = clock

    def __call__(self, msg: str, text: str, *, level: str = "info", **fields: object) -> None:
        """A change of state: ``text`` as a line, or ``msg`` and ``fields`` as an object."""
        if self.json_format:
            self.err(json_line(msg, level, fields, self.clock()))
        else:
            self.say(text)

    def trouble(
        self, msg: str, text: str, error: psycopg.Error, delay: float, level: str = "error"
    ) -> None:
        """A failed CALL or a lost connection, and when the worker tries again."""
        self(
            msg,
            text,
            level=level,
            error=first_line(error),
            sqlstate=error.sqlstate,
            retry_in_s=delay,
        )

    def batch(self, text: str, **fields: object) -> None:
        """A batch that did something (unless ``quiet``)."""
        if self.quiet:
            return
        if self.json_format:
            self.err(json_line("batch", "info", fields, self.clock()))
        else:
            self.say(text)

    def events(self, by_kind: object) -> None:
        """An object per failed or retried event of a CALL (JSON only: the text log has the
        batch's counts)."""
        if self.json_format:
            for event in logged_events(by_kind):
                level = LOGGED_OUTCOMES[str(event.get("outcome"))]
                self.err(json_line("event", level, event, self.clock()))


class ProgressObjects(io.StringIO):
    """The stream of a ``--log-format json`` worker's progress Reporter: each line the Reporter
    writes goes out as a ``progress`` log object, with the figures of the backlog's ``task`` (set
    by :class:`Progress`)."""

    def __init__(self, log: Log) -> None:
        super().__init__()
        self.log = log
        self.task: Task | None = None

    def isatty(self) -> bool:
        return sys.stderr.isatty()  # "auto": objects as lines would be, on a terminal

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line:
                fields: dict[str, object] = {"text": line}
                if self.task is not None:
                    fields.update(done=self.task.done, total=self.task.total)
                self.log.err(json_line("progress", "info", fields, self.log.clock()))
        return len(text)


class Progress:
    """A backlog being drained, as a :class:`aidb_memory.progress.Task` of ``reporter`` (which
    decides whether lines go out: a terminal, ``--progress``, ``--quiet``; and how often): the
    events done of those waiting when it last looked (``remaining``:
    ``aidb_memory.event_remaining()``, None when it cannot say), their rate and the time left. A
    task starts when a CALL finds its batch full and ends when one finds the queue empty; it
    looks at ``remaining`` only when a line is due and it has done as many as it saw waiting, so
    a burst drained within the interval costs no query and prints nothing."""

    def __init__(self, remaining: Callable[[], int | None], reporter: Reporter) -> None:
        self.remaining = remaining
        self.reporter = reporter
        self.task: Task | None = None
        self._looked = 0.0

    def handled(self, n: int, more: bool) -> None:
        """After a CALL that handled ``n`` events; ``more``: its batch was full, so more may be
        waiting (otherwise the queue is empty and the backlog in view is done)."""
        task = self.task
        if task is None:
            if not more:
                return
            task = self.task = self.reporter.task("worker: backlog", unit="events")
            self._looked = task.started
            if isinstance(self.reporter.stream, ProgressObjects):
                self.reporter.stream.task = task
        done = task.done + n
        if not more:
            task.done = done
            task.finish()
            self.task = None
            return
        total = None
        now = self.reporter.clock()
        if now - self._looked >= self.reporter.interval_s:  # a line is due (Task.update)
            self._looked = now
            if task.total is None or done >= task.total:
                left = self.remaining()
                total = None if left is None else done + left
        task.update(done, total)


# The kinds of event whose outcomes the worker counts for its exporter
# (aidb_memory_worker_events_total; expiry deletes memories, not events).
EVENT_KINDS = ("extraction", "compaction")


@dataclass(frozen=True)
class StatsSnapshot:
    """WorkerStats at one moment."""

    batches: dict[str, int]  # "ok", "failed"
    last_success: float  # Unix time of the last successful CALL; 0 if none yet
    events: dict[str, dict[str, int]]  # kind -> outcome (KIND_COUNTS' names) -> count


class WorkerStats:
    """This process's own figures for its exporter (``--metrics-port``): CALLs that worked and
    that failed, the time of the last that worked, and the events it handled by kind and outcome.
    The worker's thread updates them after each CALL; the exporter's threads read them. Only a
    worker with ``--metrics-port`` keeps one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a scrape sees one CALL's update whole
        self._batches = {"ok": 0, "failed": 0}
        self._last_success = 0.0
        self._events = {kind: dict.fromkeys(KIND_COUNTS[kind], 0) for kind in EVENT_KINDS}

    def batch_ok(self, totals: Totals, now: float) -> None:
        """A CALL worked; ``totals`` is what the worker did so far."""
        with self._lock:
            self._batches["ok"] += 1
            self._last_success = now
            for kind in EVENT_KINDS:
                self._events[kind].update(totals.by_kind[kind])

    def batch_failed(self) -> None:
        """A CALL failed (an error, a cancel, a lost connection)."""
        with self._lock:
            self._batches["failed"] += 1

    def snapshot(self) -> StatsSnapshot:
        with self._lock:
            return StatsSnapshot(
                dict(self._batches),
                self._last_success,
                {kind: dict(counts) for kind, counts in self._events.items()},
            )


# The queue's families of aidb_memory.metrics() (issue 36), which `aidb-memory status` prints and
# the exporter's /healthz checks.
QUEUE_DEPTH = "aidb_memory_queue_events"
QUEUE_LATENCY = "aidb_memory_queue_latency_seconds"
# 1 when the depths count the oldest 5,000 pending events and estimate the rest (a backlog).
QUEUE_ESTIMATED = "aidb_memory_queue_events_estimated"
QUEUE_STATUSES = ("ready", "waiting", "processing", "failed")
QUEUE_KINDS = ("extraction", "compaction")
_QUEUE = "SELECT metric, labels, value FROM aidb_memory.metrics() WHERE metric = ANY(%s::text[])"


@dataclass
class QueueState:
    """One kind's queue: events by status, and the age of its oldest ready event (0: none)."""

    kind: str
    depth: dict[str, int] = field(default_factory=dict)
    latency_s: float = 0.0
    # The depths past the oldest 5,000 pending events are an estimate (metrics()' sample).
    estimated: bool = False

    def line(self) -> str:
        about = "~" if self.estimated else ""
        counts = ", ".join(
            f"{status} {about if status != 'failed' else ''}{self.depth.get(status, 0)}"
            for status in QUEUE_STATUSES
        )
        return f"queue {self.kind}: {counts}; oldest ready event {self.latency_s:.1f} s old"

    def as_json(self) -> dict[str, object]:
        return {
            **{status: self.depth.get(status, 0) for status in QUEUE_STATUSES},
            "latency_seconds": self.latency_s,
            "estimated": self.estimated,
        }


def queue_states(rows: Iterable[tuple[object, object, object]]) -> list[QueueState]:
    """The queue families among aidb_memory.metrics() rows (metric, labels, value), one
    QueueState per kind: extraction and compaction first (always), then any other by name."""
    states: dict[str, QueueState] = {kind: QueueState(kind) for kind in QUEUE_KINDS}
    estimated = False
    for metric, labels, value in rows:
        if metric == QUEUE_ESTIMATED:
            estimated = value == 1
            continue
        if metric not in (QUEUE_DEPTH, QUEUE_LATENCY) or not isinstance(labels, dict):
            continue
        kind = labels.get("kind")
        if not isinstance(kind, str) or not isinstance(value, int | float):
            continue
        state = states.setdefault(kind, QueueState(kind))
        if metric == QUEUE_LATENCY:
            state.latency_s = float(value)
        elif isinstance(status := labels.get("status"), str):
            state.depth[status] = int(value)
    for state in states.values():
        state.estimated = estimated
    return [states[k] for k in QUEUE_KINDS] + [
        states[k] for k in sorted(states) if k not in QUEUE_KINDS
    ]


def read_queue(conn: Connection) -> list[QueueState] | None:
    """The queue by kind from ``aidb_memory.metrics()``; None when the database has no such
    function (aidb_memory from before issue 36)."""
    present = conn.execute(
        "SELECT pg_catalog.to_regprocedure('aidb_memory.metrics(integer)') IS NOT NULL"
    ).fetchone()
    if not present or not present[0]:
        return None
    rows = conn.execute(_QUEUE, ([QUEUE_DEPTH, QUEUE_LATENCY, QUEUE_ESTIMATED],)).fetchall()
    return queue_states((r[0], r[1], r[2]) for r in rows)


class Stop:
    """Set by SIGINT/SIGTERM: finish the batch in hand, then stop."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        self.requested = True


Connection = psycopg.Connection[tuple[object, ...]]


class ConfigError(Exception):
    """The worker cannot run as configured (exit 2): retrying would fail the same way."""

    def __init__(self, error: psycopg.Error) -> None:
        super().__init__(first_line(error))
        self.error = error


def classify(sqlstate: str | None, connection_lost: bool) -> str:
    """What a failed CALL means for the worker: 'lost' (reconnect), 'cancelled' (the event
    counted as a failed attempt), 'config' (stop, exit 2) or 'failed' (go on)."""
    if connection_lost or (sqlstate or "").startswith("08") or sqlstate in {"57P01", "57P02"}:
        return "lost"
    if sqlstate == "57014":
        return "cancelled"
    if sqlstate in CONFIG_SQLSTATES:
        return "config"
    return "failed"


def retry_delay(failures: int) -> float:
    """Seconds to wait after the ``failures``-th failure in a row: doubling, capped."""
    return float(min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** max(0, failures - 1)))


def run(
    connect: Callable[[], Connection],
    options: Options,
    *,
    say: Callable[[str], None],
    stop: Stop | None = None,
    log: Log | None = None,
    stats: WorkerStats | None = None,
    progress: Reporter | None = None,
) -> Totals:
    """Work the queue on connections from ``connect`` (autocommit) until ``stop`` or, with
    ``once``, until empty. The first connection's failure (a :class:`CliError`) propagates; a
    later loss is retried. It reports through ``log`` (default: text lines through ``say``),
    given ``stats`` counts each CALL there, and given ``progress`` reports a backlog's progress
    there."""
    stop = stop or Stop()
    log = log or Log(say)
    totals = Totals()
    conn: Connection | None = _listen(connect())
    log(
        "started",
        "worker: started"
        + (
            " (--once: until the queue is empty)"
            if options.once
            else "; Ctrl-C or SIGTERM stops it"
        )
        + (
            f"; only actor keys {options.key_range[0]} to {options.key_range[1]}"
            if options.key_range
            else ""
        ),
        once=options.once,
        batch=options.batch,
        key_range=list(options.key_range) if options.key_range else None,
    )

    def remaining() -> int | None:
        return _remaining(conn) if conn is not None else None

    backlog = Progress(remaining, progress) if progress is not None and progress.enabled else None
    statement, params = options.call()
    failures = 0
    while not stop.requested:
        if conn is None:
            try:
                conn = _listen(connect())
            except (CliError, psycopg.OperationalError) as e:
                failures += 1
                delay = retry_delay(failures)
                log(
                    "cannot reconnect",
                    f"worker: cannot reconnect ({_reason(e)}); next try in {delay:g} s",
                    level="error",
                    error=_reason(e),
                    retry_in_s=delay,
                )
                _pause(delay, stop)
                continue
            log("reconnected", "worker: reconnected")
            failures = 0
        started = time.monotonic()
        try:
            row = conn.execute(statement, params).fetchone()
            processed, failed, retried = (_count(v) for v in row[:3]) if row else (0, 0, 0)
            by_kind = row[3] if row and len(row) > 3 else None
        except psycopg.Error as e:
            if stats is not None:
                stats.batch_failed()
            kind = classify(e.sqlstate, conn.closed or conn.broken)
            if kind == "config":
                raise ConfigError(e) from None
            failures += 1
            delay = retry_delay(failures)
            if kind == "lost":
                _drop(conn)
                conn = None
                log.trouble(
                    "connection lost",
                    f"worker: connection lost ({first_line(e)}); reconnecting in {delay:g} s",
                    e,
                    delay,
                )
            elif kind == "cancelled":
                log.trouble(
                    "call cancelled",
                    f"worker: call cancelled ({first_line(e)}); the event in hand counts as a "
                    f"failed attempt; going on in {delay:g} s",
                    e,
                    delay,
                    level="warning",
                )
            else:
                log.trouble(
                    "call failed",
                    f"worker: call failed ({first_line(e)}); going on in {delay:g} s",
                    e,
                    delay,
                )
            _pause(delay, stop)
            continue
        failures = 0
        totals.processed += processed
        totals.failed += failed
        totals.retried += retried
        totals.add_kinds(by_kind)
        if stats is not None:
            stats.batch_ok(totals, time.time())
        expired = _expired(by_kind)
        if processed or failed or retried or expired:
            log.batch(
                f"worker: {totals.line()}",
                processed=processed,
                failed=failed,
                retried=retried,
                expired=expired,
                duration_ms=round((time.monotonic() - started) * 1000),
                kinds=_batch_kinds(by_kind),
            )
            log.events(by_kind)
        more = processed + failed + retried >= options.batch or expired >= EXPIRE_BATCH
        if backlog is not None:
            backlog.handled(processed + failed + retried, more)
        if more:
            continue  # maybe more queued, or more expired
        if options.once:
            break
        try:
            _wait(conn, options.idle_s, stop)
        except psycopg.OperationalError as e:
            _drop(conn)
            conn = None
            failures += 1
            delay = retry_delay(failures)
            log.trouble(
                "connection lost",
                f"worker: connection lost ({first_line(e)}); reconnecting in {delay:g} s",
                e,
                delay,
            )
            _pause(delay, stop)
    if conn is not None:
        conn.close()
    log(
        "stopped",
        f"worker: stopped; {totals.line()}",
        processed=totals.processed,
        failed=totals.failed,
        retried=totals.retried,
        kinds=totals.by_kind,
        elapsed_s=round(time.monotonic() - totals.started, 3),
    )
    return totals


def _remaining(conn: Connection) -> int | None:
    """Events waiting for a worker (for Progress); None when the server cannot say (older than
    event_remaining, or an error: the CALL after it reports a lost connection)."""
    try:
        row = conn.execute("SELECT aidb_memory.event_remaining()").fetchone()
    except psycopg.Error:
        return None
    return _count(row[0]) if row else None


def _listen(conn: Connection) -> Connection:
    conn.execute(f"LISTEN {CHANNEL}")
    return conn


def _drop(conn: Connection) -> None:
    """Close a connection that is gone; nothing it could say matters any more."""
    with contextlib.suppress(psycopg.Error):
        conn.close()


def _reason(error: Exception) -> str:
    return (
        str(error).removeprefix("aidb-memory: ")
        if isinstance(error, CliError)
        else first_line(error)
    )


def _pause(seconds: float, stop: Stop) -> None:
    """Sleep ``seconds`` in short steps, so that a stop request is seen promptly."""
    deadline = time.monotonic() + seconds
    while not stop.requested:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.2))


def _count(value: object) -> int:
    return value if isinstance(value, int) else 0


def _expired(by_kind: object) -> int:
    """The expired memories a CALL deleted (its by_kind; an older server reports none)."""
    counts = by_kind.get("expiry") if isinstance(by_kind, dict) else None
    return _count(counts.get("expired")) if isinstance(counts, dict) else 0


def _wait(conn: Connection, idle_s: float, stop: Stop) -> None:
    """Until a notification, ``idle_s`` or a stop request, whichever comes first."""
    deadline = time.monotonic() + idle_s
    while not stop.requested:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        # Short steps, so that a signal is seen promptly.
        for _ in conn.notifies(timeout=min(left, 0.5), stop_after=1):
            return


def install_signal_handlers(stop: Stop) -> None:
    """SIGINT and SIGTERM request a clean stop."""
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
