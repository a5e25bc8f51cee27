"""``aidb-memory worker``: runs the extraction queue (SPEC §5) until stopped.

It calls ``aidb_memory.process_events`` in batches; when the queue is empty it waits on
``LISTEN aidb_memory_events`` (every ``add`` that queues an event notifies at commit), with a
timeout so that events due after a backoff are picked up too. SIGINT or SIGTERM stops it after
the event in hand (by default one event per CALL; each event commits on its own). Several
workers at once are safe: the procedure claims events with ``FOR UPDATE SKIP LOCKED``.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

import psycopg

CHANNEL = "aidb_memory_events"
_PROCESS = (
    "CALL aidb_memory.process_events(max_events => %s::int, lease_s => %s::int, "
    "max_attempts => %s::int, backoff_s => %s::real)"
)


@dataclass
class Options:
    """How the worker runs."""

    once: bool = False
    batch: int = 1  # events per CALL: a stop request is seen after each batch
    lease_s: int = 300
    max_attempts: int = 5
    backoff_s: float = 10.0
    idle_s: float = 5.0  # longest wait for a notification before looking again


@dataclass
class Totals:
    """What the worker did so far."""

    processed: int = 0
    failed: int = 0
    retried: int = 0
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.processed / elapsed
        return (
            f"processed {self.processed}, failed {self.failed}, retried {self.retried} "
            f"({rate:.1f} events/s)"
        )


class Stop:
    """Set by SIGINT/SIGTERM: finish the batch in hand, then stop."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        self.requested = True


def run(
    conn: psycopg.Connection[tuple[object, ...]],
    options: Options,
    *,
    say: Callable[[str], None],
    stop: Stop | None = None,
) -> Totals:
    """Work the queue on ``conn`` (autocommit) until ``stop`` or, with ``once``, until empty."""
    stop = stop or Stop()
    totals = Totals()
    conn.execute(f"LISTEN {CHANNEL}")
    say(
        "worker: started"
        + (
            " (--once: until the queue is empty)"
            if options.once
            else "; Ctrl-C or SIGTERM stops it"
        )
    )
    while not stop.requested:
        row = conn.execute(
            _PROCESS, (options.batch, options.lease_s, options.max_attempts, options.backoff_s)
        ).fetchone()
        processed, failed, retried = (_count(v) for v in row) if row else (0, 0, 0)
        totals.processed += processed
        totals.failed += failed
        totals.retried += retried
        if processed or failed or retried:
            say(f"worker: {totals.line()}")
        if processed + failed + retried >= options.batch:
            continue  # maybe more queued
        if options.once:
            break
        _wait(conn, options.idle_s, stop)
    say(f"worker: stopped; {totals.line()}")
    return totals


def _count(value: object) -> int:
    return value if isinstance(value, int) else 0


def _wait(conn: psycopg.Connection[tuple[object, ...]], idle_s: float, stop: Stop) -> None:
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
