"""The regression gate of `make bench-compare` (bench/gate.py): which versions it flags, on
made-up rounds. Issue 33: a call 5% slower, or whose rounds split into a fast and a slow mode
(session_get ten times slower for a minute, then fast again), is flagged; noise is not."""

from __future__ import annotations

import random
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import gate

sys.path.pop(0)


def _noisy(center: float, n: int, spread: float = 0.08, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_one_mode_of_noise_is_no_flag() -> None:
    base = _noisy(450, 400, seed=1)
    same = _noisy(452, 400, seed=2)
    verdict = gate.judge(same, base, _noisy(330, 400, seed=3), _noisy(331, 400, seed=4))
    assert verdict.modes is None
    assert verdict.flags == []


def test_a_slow_spell_is_two_modes() -> None:
    # Issue 33's session_get: ~0.45 ms, and for a minute of a 3-minute run ~7 ms.
    rounds = _noisy(450, 300, seed=5) + _noisy(7000, 100, seed=6) + _noisy(450, 200, seed=7)
    modes = gate.two_modes(rounds)
    assert modes is not None
    assert (modes.fast_rounds, modes.slow_rounds) == (500, 100)
    assert 400 < modes.fast < 500 and 6000 < modes.slow < 8000
    verdict = gate.judge(rounds, _noisy(450, 600, seed=8))
    assert any(flag.startswith("two modes") for flag in verdict.flags)


def test_a_short_spell_still_counts_and_one_outlier_does_not() -> None:
    rounds = _noisy(450, 380, seed=9) + _noisy(900, 20, seed=10)  # 5%: a 10-second spell
    assert gate.two_modes(rounds) is not None
    assert gate.two_modes([*_noisy(450, 399, seed=11), 5000.0]) is None


def test_five_percent_slower_is_flagged_by_wall_time_or_cpu() -> None:
    base, cpu = _noisy(450, 400, seed=12), _noisy(330, 400, seed=13)
    slower = gate.judge([x * 1.07 for x in base], base)
    assert slower.wall_ratio > 1.05 and len(slower.flags) == 1
    assert "slower (median wall time)" in slower.flags[0]
    busy_cpu = gate.judge(base, base, [x * 1.06 for x in cpu], cpu)
    assert busy_cpu.flags == [f"{(busy_cpu.cpu_ratio - 1) * 100:.1f}% slower (median backend CPU)"]  # type: ignore[operator]
    faster = gate.judge([x * 0.9 for x in base], base, [x * 0.9 for x in cpu], cpu)
    assert faster.flags == []


@given(st.lists(st.floats(min_value=100, max_value=124.9), min_size=4, max_size=200))
def test_rounds_within_25_percent_are_one_mode(rounds: list[float]) -> None:
    assert gate.two_modes(rounds) is None


def test_percentile_and_median() -> None:
    xs = [float(x) for x in range(1, 101)]
    assert gate.percentile(xs, 0.95) == 95.0
    assert gate.percentile(xs, 0.1) == 10.0
    assert gate.median([3.0, 1.0, 2.0]) == 2.0
    assert gate.median([4.0, 1.0, 2.0, 3.0]) == 2.5
