"""Verbatim extraction (issue 26): which turns count and how a turn is cut into memories."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aidb_memory_server.validation import EXTRACTION_MODES as MODES
from aidb_memory_server.verbatim import mode, pieces, spoken


def test_auto_is_model_extraction_only_with_a_model_that_can_extract() -> None:
    assert mode("auto", True) == "model"
    assert mode("auto", False) == "verbatim"
    for configured in MODES[1:]:
        assert mode(configured, True) == mode(configured, False) == configured


def test_the_users_turns_count_and_the_assistants_only_under_verbatim_all() -> None:
    assert spoken("user", "user_prompt", False) and spoken("user", "user_prompt", True)
    assert not spoken("assistant", "model_response", False)
    assert spoken("assistant", "model_response", True)
    assert spoken("user", None, False)


@pytest.mark.parametrize(
    ("role", "kind"),
    [
        ("tool", "tool_result"),
        ("assistant", "tool_call"),
        ("assistant", "reasoning"),
        ("system", "system"),
        ("developer", "developer"),
        ("user", "tool_result"),  # an mcp_approval_response-like user item that is a tool's
    ],
)
def test_tool_calls_results_reasoning_and_instructions_never_count(role: str, kind: str) -> None:
    assert not spoken(role, kind, True)


def test_short_text_is_one_piece_stripped() -> None:
    assert pieces("  I live in Lyon.  ", 100) == ["I live in Lyon."]
    assert pieces("", 100) == []
    assert pieces(" \n\t ", 100) == []


def test_sentences_are_packed_while_they_fit() -> None:
    text = "I live in Lyon. I drink tea! Do I? Yes… and\nnew line"
    assert pieces(text, 100) == ["I live in Lyon. I drink tea! Do I? Yes… and new line"]
    assert pieces(text, 30) == ["I live in Lyon. I drink tea!", "Do I? Yes… and new line"]
    assert pieces(text, 15) == ["I live in Lyon.", "I drink tea!", "Do I? Yes… and", "new line"]


def test_a_dot_inside_a_word_is_no_boundary() -> None:
    assert pieces("Version 1.2.3 is out.Really", 14) == ["Version 1.2.3", "is out.Really"]


def test_a_long_sentence_is_split_at_the_last_whitespace_before_the_limit() -> None:
    assert pieces("aaa bbb ccc ddd", 9) == ["aaa bbb", "ccc ddd"]
    assert pieces("aaa bbbbbbbbbbbbb", 9) == ["aaa", "bbbbbbbbb", "bbbb"]


def test_a_sentence_without_whitespace_is_cut_hard() -> None:
    assert pieces("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]


def test_the_rest_of_a_long_sentence_packs_with_the_next() -> None:
    assert pieces("aaaa bbbb cc. dd.", 10) == ["aaaa bbbb", "cc. dd."]


_TEXT = st.text(
    alphabet=st.sampled_from([*"ab .!?…\n\t", "\u00a0", "\u2028", "é", "字"]), max_size=300
)


@given(_TEXT, st.integers(min_value=1, max_value=60))
def test_pieces_fit_are_stripped_and_lose_no_character(text: str, max_chars: int) -> None:
    out = pieces(text, max_chars)
    for piece in out:
        assert 0 < len(piece) <= max_chars
        assert piece == piece.strip()
    assert "".join(" ".join(out).split()) == "".join(text.split())


@given(st.text(max_size=200), st.integers(min_value=1, max_value=50))
def test_any_text_loses_no_character(text: str, max_chars: int) -> None:
    out = pieces(text, max_chars)
    assert all(0 < len(p) <= max_chars and p == p.strip() for p in out)
    assert "".join(" ".join(out).split()) == "".join(text.split())


@given(_TEXT)
def test_text_that_fits_is_one_piece(text: str) -> None:
    out = pieces(text, 1000)
    assert len(out) <= 1
    # Sentences end only before whitespace: one piece has the same words, in order.
    assert (out[0].split() if out else []) == text.split()
