"""The budget rule in plain Python, against a brute-force reading of SPEC §3."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aidb_memory_server import budget
from aidb_memory_server.budget import Row
from aidb_memory_server.errors import ApiError


def _rounds_to_rows(rounds: list[list[int]]) -> list[Row]:
    rows, seq = [], 1
    for chars_of_round in rounds:
        start = seq
        for chars in chars_of_round:
            rows.append(Row(seq, start, chars))
            seq += 1
    return rows


def _brute_force(rounds: list[list[int]], limit_chars: int | None, limit_turns: int | None) -> int:
    """How many whole newest rounds fit: try every suffix of rounds, keep the longest that fits."""
    best = 0
    for k in range(len(rounds) + 1):
        suffix = rounds[len(rounds) - k :]
        chars = sum(sum(r) for r in suffix)
        turns = sum(len(r) for r in suffix)
        if (limit_chars is None or chars <= limit_chars) and (
            limit_turns is None or turns <= limit_turns
        ):
            best = k
        else:
            break
    return sum(len(r) for r in rounds[len(rounds) - best :])


rounds_strategy = st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=5), max_size=12)


@given(rounds_strategy, st.none() | st.integers(1, 400), st.none() | st.integers(1, 30))
def test_window_is_the_longest_suffix_of_whole_rounds_that_fits(
    rounds: list[list[int]], limit_chars: int | None, limit_turns: int | None
) -> None:
    rows = _rounds_to_rows(rounds)
    kept = budget.window(rows, limit_chars, limit_turns)
    assert len(kept) == _brute_force(rounds, limit_chars, limit_turns)
    assert kept == rows[len(rows) - len(kept) :]
    if limit_chars is not None:
        assert sum(r.chars for r in kept) <= limit_chars


def test_a_round_that_does_not_fit_drops_with_everything_older() -> None:
    rows = _rounds_to_rows([[10], [30, 30], [5]])
    assert [r.seq for r in budget.window(rows, 40, None)] == [4]
    assert [r.seq for r in budget.window(rows, 65, None)] == [2, 3, 4]
    assert budget.window(rows, 4, None) == []


def test_no_limits_returns_everything() -> None:
    rows = _rounds_to_rows([[1, 2], [3]])
    assert budget.window(rows, None, None) == rows


@pytest.mark.parametrize(
    ("chars", "turns"), [(0, None), (-5, None), (None, 0), (budget.BUDGET_MAX + 1, None)]
)
def test_limits_out_of_range_are_22023(chars: int | None, turns: int | None) -> None:
    with pytest.raises(ApiError) as e:
        budget.check_limits("session_get", chars, turns)
    assert e.value.sqlstate == "22023"
    assert "limit_" in e.value.message
