"""How search ranks (plpython/aidb_memory_server/ranking.py): the query's terms and the score.
tests/db/test_memories_api.py holds the SQL statement equal to these formulas."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aidb_memory_server import ranking


def test_a_tsquery_is_read_into_its_words_and_its_negations() -> None:
    assert ranking.parse_tsquery("'caroline' & 'go' & 'lgbtq'") == (
        ["caroline", "go", "lgbtq"],
        [],
    )
    assert ranking.parse_tsquery("'tea' & !'coffee'") == (["tea"], ["'coffee'"])
    assert ranking.parse_tsquery("'a' <-> 'b' | 'c' <2> 'a'") == (["a", "b", "c"], [])
    assert ranking.parse_tsquery("!( 'green' <-> 'tea' ) & 'drink'") == (
        ["drink"],
        ["( 'green' <-> 'tea' )"],
    )
    assert ranking.parse_tsquery("'it''s' & 'back\\\\slash'") == (["it's", "back\\slash"], [])
    assert ranking.parse_tsquery(None) == ([], [])
    assert ranking.parse_tsquery("!'x'", negation=False) == (["x"], [])


@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=6, unique=True))
def test_quoted_lexemes_read_back_as_themselves(words: list[str]) -> None:
    text = " & ".join(ranking.quoted(w) for w in words)
    assert ranking.parse_tsquery(text) == (words, [])


def test_a_plan_has_a_group_per_word_and_leaves_out_stop_words_and_negated_words() -> None:
    plan = ranking.plan(
        "'tea' & !'coffe' & 'lisbon'",
        {"tea": ["tea"], "coffee": ["coffe"], "the": [], "lisbon": ["lisbon"]},
        {},
    )
    assert plan.lexemes == ["tea", "lisbon"]
    assert plan.groups == [0, 1]
    assert plan.group_count == 2
    assert plan.negated == "( 'coffe' )"
    assert plan.operands == ["'tea'", "'lisbon'"]


def test_a_misspelled_word_stands_for_the_stems_of_its_near_words() -> None:
    plan = ranking.plan(
        "'pasport' & 'march'",
        {"pasport": ["pasport"], "march": ["march"]},
        {"pasport": ["passport", "passport-like"]},
    )
    assert plan.lexemes == ["pasport", "passport", "passport-like", "march"]
    assert plan.groups == [0, 0, 0, 1]


def test_two_words_with_one_stem_make_one_group() -> None:
    plan = ranking.plan("'run' & 'run'", {"runs": ["run"], "running": ["run"]}, {})
    assert (plan.lexemes, plan.groups) == (["run"], [0])


def test_idf_falls_with_the_memories_that_hold_a_word_and_never_goes_below_zero() -> None:
    assert ranking.idf(100, 1) > ranking.idf(100, 10) > ranking.idf(100, 100) > 0
    assert ranking.idf(10, 20) > 0  # a capped count above the capped total
    assert ranking.idf(100, 0) == pytest.approx(math.log(1 + 100.5 / 0.5))


def test_a_memory_with_every_word_once_at_average_length_scores_one() -> None:
    idfs = {"tea": 2.0, "lisbon": 1.0}
    groups = {"tea": 0, "lisbon": 1}
    held = {"tea": 1.0, "lisbon": 1.0}
    assert ranking.lexical(held, 5, 5, idfs, groups, whole=True) == pytest.approx(1.0)
    # Half the words: the rarer half is worth more, and the share of groups halves it again.
    tea = ranking.lexical({"tea": 1.0}, 5, 5, idfs, groups, whole=False)
    lisbon = ranking.lexical({"lisbon": 1.0}, 5, 5, idfs, groups, whole=False)
    assert tea == pytest.approx(2 / 3 * 1 / 2)
    assert lisbon == pytest.approx(1 / 3 * 1 / 2)
    # "tea or lisbon": a memory that matches the whole query has every group's share.
    assert ranking.lexical({"tea": 1.0}, 5, 5, idfs, groups, whole=True) == pytest.approx(2 / 3)


def test_length_and_repetition_move_the_score_the_way_bm25_does() -> None:
    idfs, groups = {"tea": 1.0}, {"tea": 0}
    short = ranking.lexical({"tea": 1.0}, 3, 10, idfs, groups, whole=True)
    long = ranking.lexical({"tea": 1.0}, 30, 10, idfs, groups, whole=True)
    assert long < short == 1.0  # capped at 1
    twice = ranking.term(2, 10, 10)
    assert ranking.term(1, 10, 10) < twice < 2 * ranking.term(1, 10, 10)
    assert twice < ranking.K1 + 1  # saturates


def test_a_word_no_memory_holds_lowers_no_best_possible_score() -> None:
    idfs = {"tea": 1.0, "zzz": 9.0}
    groups = {"tea": 0, "zzz": 0}
    score = ranking.lexical({"tea": 1.0}, 4, 4, idfs, groups, True, frozenset({"zzz"}))
    assert score == pytest.approx(1.0)


def test_the_blend_weighs_words_and_meaning() -> None:
    assert ranking.lexical_weight(False, True) == 1.0
    assert ranking.lexical_weight(True, True) == ranking.LEXICAL_WEIGHT
    assert ranking.lexical_weight(True, False) == 0.0
    assert ranking.score(1.0, 1.0, 0.7) == pytest.approx(1.0)
    assert ranking.score(0.5, -0.3, 0.7) == pytest.approx(0.35)  # a negative cosine adds nothing
    assert ranking.score(0.0, 0.8, 0.0) == pytest.approx(0.8)
