"""Issue 36, item 6: the progress reporter of long work, without a database (the clock and the
stream are injected)."""

from __future__ import annotations

import io

import pytest

from aidb_memory import progress
from aidb_memory.progress import Reporter, duration


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_at_most_one_line_per_interval_with_done_total_percent_rate_and_time_left() -> None:
    clock, out = Clock(), io.StringIO()
    task = Reporter(out, mode="always", interval_s=5, clock=clock).task("memory", total=1000)
    for _ in range(4):  # 4 s: nothing yet
        clock.now += 1
        task.advance(50)
    assert lines(out) == []
    clock.now += 1
    task.advance(50)  # 5 s, 250 rows
    assert lines(out) == ["memory: 250 of 1,000 rows (25%), 50 rows/s, about 15 s left"]
    clock.now += 4.9
    task.update(400)
    assert len(lines(out)) == 1  # 4.9 s after the last line
    clock.now += 0.1
    task.update(500)
    assert lines(out)[1] == "memory: 500 of 1,000 rows (50%), 50 rows/s, about 10 s left"


def test_the_final_line_says_how_many_in_how_long() -> None:
    clock, out = Clock(), io.StringIO()
    with Reporter(out, mode="always", interval_s=5, clock=clock).task("t", total=90_000) as task:
        clock.now += 30
        task.update(90_000)
    assert lines(out) == [
        "t: 90,000 of 90,000 rows (100%), 3,000 rows/s, nearly done",
        "t: done, 90,000 rows in 30 s (3,000 rows/s)",
    ]


def test_work_shorter_than_the_interval_prints_nothing() -> None:
    clock, out = Clock(), io.StringIO()
    with Reporter(out, mode="always", interval_s=5, clock=clock).task("t", total=10) as task:
        clock.now += 4
        task.update(10)
    assert out.getvalue() == ""


def test_a_failed_task_writes_no_final_line() -> None:
    clock, out = Clock(), io.StringIO()
    reporter = Reporter(out, mode="always", interval_s=1, clock=clock)
    with pytest.raises(RuntimeError), reporter.task("t", total=10):
        clock.now += 2
        raise RuntimeError("boom")
    assert out.getvalue() == ""


def test_auto_writes_only_to_a_terminal() -> None:
    clock = Clock()
    for stream, expected in ((io.StringIO(), 0), (Tty(), 1)):
        task = Reporter(stream, interval_s=0, clock=clock).task("t", total=2)
        clock.now += 1
        task.update(1)
        assert len(lines(stream)) == expected


def test_flags_quiet_wins_and_progress_forces() -> None:
    assert Reporter.from_flags(stream=io.StringIO()).mode == "auto"
    assert Reporter.from_flags(progress=True, stream=io.StringIO()).enabled
    never = Reporter.from_flags(progress=True, quiet=True, stream=Tty())
    assert never.mode == "never" and not never.enabled


def test_an_unknown_total_and_a_total_that_grows() -> None:
    clock, out = Clock(), io.StringIO()
    task = Reporter(out, mode="always", interval_s=0, clock=clock).task("queue", unit="events")
    clock.now += 2
    task.update(10)
    task.update(20, total=80)  # more found waiting
    assert lines(out) == [
        "queue: 10 events, 5.0 events/s",
        "queue: 20 of 80 events (25%), 10 events/s, about 6 s left",
    ]


def test_no_rate_before_time_passes_and_no_time_left_without_a_rate() -> None:
    clock, out = Clock(), io.StringIO()
    task = Reporter(out, mode="always", interval_s=0, clock=clock).task("t", total=10)
    task.update(0)
    clock.now += 1
    task.update(0)
    assert lines(out) == [
        "t: 0 of 10 rows (0%), rate unknown, time left unknown",
        "t: 0 of 10 rows (0%), 0.0 rows/s, time left unknown",
    ]


def test_a_closed_stream_silences_the_reporter_without_failing_the_work() -> None:
    clock, out = Clock(), io.StringIO()
    reporter = Reporter(out, mode="always", interval_s=0, clock=clock)
    out.close()
    task = reporter.task("t", total=10)
    clock.now += 1
    task.update(5)
    task.finish()
    assert not reporter.enabled


def test_durations() -> None:
    assert [duration(s) for s in (0, 8.4, 59.6, 185, 7800)] == [
        "0 s",
        "8 s",
        "1 min 0 s",
        "3 min 5 s",
        "2 h 10 min",
    ]


@pytest.mark.parametrize(
    ("value", "expected"), [("0.5", 0.5), ("0", 0.0), ("", 5.0), ("x", 5.0), ("-1", 5.0)]
)
def test_the_interval_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: float
) -> None:
    monkeypatch.setenv(progress.INTERVAL_ENV, value)
    assert progress.interval_from_env() == expected
    assert Reporter(io.StringIO()).interval_s == expected
