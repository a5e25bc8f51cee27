"""Reciprocal-rank fusion and its normalization (plpython/aidb_memory_server/fusion.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aidb_memory_server import fusion


def test_first_in_every_signal_scores_one() -> None:
    for signals in (1, 2, 3):
        rankings = [["a", "b"]] * signals
        assert fusion.fuse(rankings)[0] == ("a", pytest.approx(1.0))


def test_the_constant_is_sixty_and_the_best_grows_with_the_signals() -> None:
    assert fusion.K == 60
    assert fusion.contribution(1) == pytest.approx(1 / 61)
    assert fusion.best(3) == pytest.approx(3 / 61)
    assert fusion.normalize(1 / 61, 1) == pytest.approx(1.0)
    assert fusion.normalize(1 / 61, 2) == pytest.approx(0.5)


def test_agreement_beats_a_single_first_place() -> None:
    # b is second in both signals; a is first in one only.
    fused = fusion.fuse([["a", "b"], ["c", "b"]])
    assert fused[0][0] == "b"
    scores = dict(fused)
    assert scores["b"] == pytest.approx(2 / 62 / (2 / 61))
    assert scores["a"] == pytest.approx(scores["c"])


def test_an_item_no_signal_ranked_is_absent_and_limit_cuts() -> None:
    fused = fusion.fuse([["a", "b", "c"], []], limit=2)
    assert [item for item, _ in fused] == ["a", "b"]
    assert fused[0][1] == pytest.approx(0.5)  # first in one of two signals


def test_ties_keep_first_seen_order() -> None:
    assert [i for i, _ in fusion.fuse([["x", "y"], ["y", "x"]])] == ["x", "y"]


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        fusion.contribution(0)
    with pytest.raises(ValueError):
        fusion.best(0)
    with pytest.raises(ValueError):
        fusion.fuse([["a", "a"]])


@given(
    st.lists(
        st.lists(st.integers(0, 30), max_size=30, unique=True),
        min_size=1,
        max_size=3,
    )
)
def test_scores_lie_in_zero_one_and_are_ordered(rankings: list[list[int]]) -> None:
    fused = fusion.fuse(rankings)
    assert {item for r in rankings for item in r} == {item for item, _ in fused}
    scores = [score for _, score in fused]
    assert all(0.0 < s <= 1.0 for s in scores)
    assert scores == sorted(scores, reverse=True)
    # An item every signal ranked first, and only such an item, scores 1.
    for item, score in fused:
        first_everywhere = all(r and r[0] == item for r in rankings)
        assert (score == pytest.approx(1.0)) == first_everywhere
