"""The regression gate's arithmetic (bench/compare.py): what a version's rounds say, pure Python.

A version is flagged when one of its calls is more than :data:`SLOWER` slower than the base's,
by median wall time or by median backend CPU, or when its rounds split into two modes: a
spell of slow rounds (a plan that changes with the statistics, a lock, a background job) that a
median over the whole run hides when the spell is short, and that one run of a few seconds
sees either all of or none of.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

SLOWER = 1.05  # a call this much slower than the base's (median wall time or CPU) is flagged
MODE_GAP = 1.25  # two neighbouring rounds, in sorted order, this far apart split two modes
MODE_SHARE = 0.05  # ... when each side holds at least this share of the rounds (and 2 rounds)


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p`` quantile (0..1) of ``values``, nearest rank."""
    ys = sorted(values)
    if not ys:
        raise ValueError("no values")
    return ys[min(len(ys) - 1, max(0, math.ceil(p * len(ys)) - 1))]


def median(values: Sequence[float]) -> float:
    ys = sorted(values)
    mid = len(ys) // 2
    return ys[mid] if len(ys) % 2 else (ys[mid - 1] + ys[mid]) / 2


@dataclass(frozen=True)
class Modes:
    """Two modes of a series of per-round values: the medians of the fast and the slow rounds,
    and how many rounds each holds."""

    fast: float
    slow: float
    fast_rounds: int
    slow_rounds: int

    def __str__(self) -> str:
        return (
            f"two modes: {self.fast_rounds} rounds at {self.fast:.1f}, {self.slow_rounds} at "
            f"{self.slow:.1f} ({self.slow / self.fast:.2f}x)"
        )


def two_modes(rounds: Sequence[float]) -> Modes | None:
    """The two modes of per-round times ``rounds``, or None when they form one.

    Sorted, the rounds of one mode rise smoothly, however noisy the machine: neighbours differ by
    a few percent. A jump of :data:`MODE_GAP` between two neighbours, with at least
    :data:`MODE_SHARE` of the rounds (and two) on each side, is a second mode. A single slow
    round (a context switch) is not."""
    ys = sorted(rounds)
    n = len(ys)
    least = max(2, math.ceil(MODE_SHARE * n))
    best: tuple[float, int] | None = None
    for k in range(least, n - least + 1):
        if ys[k - 1] <= 0:
            continue
        gap = ys[k] / ys[k - 1]
        if gap >= MODE_GAP and (best is None or gap > best[0]):
            best = (gap, k)
    if best is None:
        return None
    k = best[1]
    return Modes(median(ys[:k]), median(ys[k:]), k, n - k)


@dataclass(frozen=True)
class Verdict:
    """What the gate says of one call of one version against the base."""

    wall_ratio: float
    cpu_ratio: float | None
    modes: Modes | None

    @property
    def flags(self) -> list[str]:
        found = []
        if self.wall_ratio > SLOWER:
            found.append(f"{(self.wall_ratio - 1) * 100:.1f}% slower (median wall time)")
        if self.cpu_ratio is not None and self.cpu_ratio > SLOWER:
            found.append(f"{(self.cpu_ratio - 1) * 100:.1f}% slower (median backend CPU)")
        if self.modes is not None:
            found.append(str(self.modes))
        return found


def judge(
    rounds: Sequence[float],
    base_rounds: Sequence[float],
    cpu: Sequence[float] | None = None,
    base_cpu: Sequence[float] | None = None,
) -> Verdict:
    """One call of one version against the same call of the base: per-round µs per call (wall
    time), and the backend CPU µs per call of each round where it could be read. The base is
    judged against itself for its modes (its ratios are 1)."""
    wall = median(rounds) / median(base_rounds)
    cpu_ratio = median(cpu) / median(base_cpu) if cpu and base_cpu else None
    return Verdict(wall, cpu_ratio, two_modes(rounds))
