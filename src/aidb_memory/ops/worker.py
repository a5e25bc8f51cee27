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
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

import psycopg

from aidb_memory.connection import CliError, first_line

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
) -> Totals:
    """Work the queue on connections from ``connect`` (autocommit) until ``stop`` or, with
    ``once``, until empty. The first connection's failure (a :class:`CliError`) propagates; a
    later loss is retried."""
    stop = stop or Stop()
    totals = Totals()
    conn: Connection | None = _listen(connect())
    say(
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
        )
    )
    statement, params = options.call()
    failures = 0
    while not stop.requested:
        if conn is None:
            try:
                conn = _listen(connect())
            except (CliError, psycopg.OperationalError) as e:
                failures += 1
                delay = retry_delay(failures)
                say(f"worker: cannot reconnect ({_reason(e)}); next try in {delay:g} s")
                _pause(delay, stop)
                continue
            say("worker: reconnected")
            failures = 0
        try:
            row = conn.execute(statement, params).fetchone()
            processed, failed, retried = (_count(v) for v in row[:3]) if row else (0, 0, 0)
            by_kind = row[3] if row and len(row) > 3 else None
        except psycopg.Error as e:
            kind = classify(e.sqlstate, conn.closed or conn.broken)
            if kind == "config":
                raise ConfigError(e) from None
            failures += 1
            delay = retry_delay(failures)
            if kind == "lost":
                _drop(conn)
                conn = None
                say(f"worker: connection lost ({first_line(e)}); reconnecting in {delay:g} s")
            elif kind == "cancelled":
                say(
                    f"worker: call cancelled ({first_line(e)}); the event in hand counts as a "
                    f"failed attempt; going on in {delay:g} s"
                )
            else:
                say(f"worker: call failed ({first_line(e)}); going on in {delay:g} s")
            _pause(delay, stop)
            continue
        failures = 0
        totals.processed += processed
        totals.failed += failed
        totals.retried += retried
        totals.add_kinds(by_kind)
        expired = _expired(by_kind)
        if processed or failed or retried or expired:
            say(f"worker: {totals.line()}")
        if processed + failed + retried >= options.batch or expired >= EXPIRE_BATCH:
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
            say(f"worker: connection lost ({first_line(e)}); reconnecting in {delay:g} s")
            _pause(delay, stop)
    if conn is not None:
        conn.close()
    say(f"worker: stopped; {totals.line()}")
    return totals


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
