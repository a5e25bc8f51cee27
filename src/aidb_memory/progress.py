"""Progress of long work on a stream (issue 36, item 6): rows done of total, percent, rate and time
left, at most one line every few seconds, and a final line.

One reporter for every long job of the CLI: the migrations of ``install`` that backfill rows, and
the worker draining a backlog. ``--progress`` and ``--quiet`` choose the :class:`Reporter`'s mode;
each job is a :class:`Task`::

    reporter = Reporter.from_flags(progress=args.progress, quiet=args.quiet)  # on sys.stderr
    with reporter.task("migration 0018_lexemes: memory", total=1_000_000) as task:
        for batch in batches:
            ...
            task.advance(len(batch))        # or task.update(done), task.update(done, total)

A task that ends sooner than the interval prints nothing: short work stays quiet. In ``auto``
mode (the default) lines go out only when the stream is a terminal, so that a log or a pipe gets
none unless ``--progress`` asked for them. Writing to the stream never fails the work: a closed
or broken stream silences the reporter. The clock and the stream are injected, so the logic is
tested without waiting (tests/unit/test_progress.py); the interval comes from the caller or from
the environment variable ``AIDB_MEMORY_PROGRESS_INTERVAL`` (seconds; the default is 5).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Literal, TextIO

Mode = Literal["auto", "always", "never"]
DEFAULT_INTERVAL_S = 5.0
INTERVAL_ENV = "AIDB_MEMORY_PROGRESS_INTERVAL"


def interval_from_env(default: float = DEFAULT_INTERVAL_S) -> float:
    """``AIDB_MEMORY_PROGRESS_INTERVAL`` in seconds (0 reports every step), or ``default`` when
    it is unset or not a finite number of seconds >= 0."""
    text = os.environ.get(INTERVAL_ENV, "").strip()
    try:
        value = float(text)
    except ValueError:
        return default
    return value if math.isfinite(value) and value >= 0 else default


def duration(seconds: float) -> str:
    """``seconds`` as a person reads it: "8 s", "3 min 5 s", "2 h 10 min"."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _rate(per_second: float) -> str:
    return f"{per_second:,.0f}" if per_second >= 10 else f"{per_second:.1f}"


class Reporter:
    """Where progress goes and how often: ``mode`` "auto" (only when ``stream`` is a terminal),
    "always" (``--progress``) or "never" (``--quiet``); at most one line per ``interval_s``
    seconds of ``clock`` (default: the environment's :data:`INTERVAL_ENV`, else 5 s)."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        mode: Mode = "auto",
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.mode: Mode = mode
        self.interval_s = interval_from_env() if interval_s is None else max(0.0, interval_s)
        self.clock = clock
        self._broken = False

    @classmethod
    def from_flags(
        cls, *, progress: bool = False, quiet: bool = False, stream: TextIO | None = None
    ) -> Reporter:
        """The reporter of a command's ``--progress`` and ``--quiet`` (quiet wins)."""
        mode: Mode = "never" if quiet else "always" if progress else "auto"
        return cls(stream, mode=mode)

    @property
    def enabled(self) -> bool:
        """Whether lines are written at all."""
        if self._broken or self.mode == "never":
            return False
        if self.mode == "always":
            return True
        try:
            return bool(self.stream.isatty())
        except (AttributeError, OSError, ValueError):  # closed, or not a file
            return False

    def task(self, what: str, total: int | None = None, *, unit: str = "rows") -> Task:
        """Start reporting one job: ``what`` begins each line; ``total`` (None: unknown) is what
        "done" counts towards, in ``unit``."""
        return Task(self, what, total, unit)

    def write(self, line: str) -> None:
        """One line on the stream; a stream that cannot take it silences the reporter."""
        if not self.enabled:
            return
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            self._broken = True


class Task:
    """One job's progress: call :meth:`update` or :meth:`advance` as work gets done (as often as
    is convenient: lines are rate-limited here) and :meth:`finish` at the end (a ``with`` block
    calls it when the block ends without an exception)."""

    def __init__(self, reporter: Reporter, what: str, total: int | None, unit: str) -> None:
        self.reporter = reporter
        self.what = what
        self.total = total
        self.unit = unit
        self.done = 0
        self.started = reporter.clock()
        self._last_line = self.started
        self._lines = 0
        self._finished = False

    def update(self, done: int, total: int | None = None) -> None:
        """``done`` units so far (and, if given, a new ``total``: work found since the start);
        writes a line when the interval has passed since the start or the last line."""
        self.done = done
        if total is not None:
            self.total = total
        now = self.reporter.clock()
        if now - self._last_line >= self.reporter.interval_s:
            self._last_line = now
            self._lines += 1
            self.reporter.write(self.line(now))

    def advance(self, n: int = 1) -> None:
        """``n`` more units done."""
        self.update(self.done + n)

    def finish(self) -> None:
        """The final line, if the job took at least the interval (or lines were written): short
        work stays quiet. A second call does nothing."""
        if self._finished:
            return
        self._finished = True
        now = self.reporter.clock()
        if self._lines or now - self.started >= self.reporter.interval_s:
            self.reporter.write(self.final_line(now))

    def __enter__(self) -> Task:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is None:
            self.finish()

    def rate(self, now: float) -> float | None:
        """Units per second since the start, None before any time has passed."""
        elapsed = now - self.started
        return self.done / elapsed if elapsed > 0 else None

    def line(self, now: float) -> str:
        """e.g. "memory: 20,000 of 80,000 rows (25%), 4,000 rows/s, about 15 s left"."""
        rate = self.rate(now)
        speed = f"{_rate(rate)} {self.unit}/s" if rate is not None else "rate unknown"
        if self.total is None:
            return f"{self.what}: {self.done:,} {self.unit}, {speed}"
        total = max(self.total, 0)
        percent = 100 if total == 0 else min(100, self.done * 100 // total)
        left = max(total - self.done, 0)
        if left == 0:
            eta = "nearly done"
        elif rate:
            eta = f"about {duration(left / rate)} left"
        else:
            eta = "time left unknown"
        return f"{self.what}: {self.done:,} of {total:,} {self.unit} ({percent}%), {speed}, {eta}"

    def final_line(self, now: float) -> str:
        """e.g. "memory: done, 80,000 rows in 20 s (4,000 rows/s)"."""
        rate = self.rate(now)
        speed = f" ({_rate(rate)} {self.unit}/s)" if rate is not None else ""
        took = duration(now - self.started)
        return f"{self.what}: done, {self.done:,} {self.unit} in {took}{speed}"
