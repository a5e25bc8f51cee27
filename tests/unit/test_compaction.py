"""The rules of compaction (SPEC §3) in plain Python: when to compact, where the cut falls, what
the model is sent, and what of its answer is kept."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aidb_memory_server import compaction
from aidb_memory_server.compaction import Source, Span

NO_CAP = 10**12


# --- target_chars and needed ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "target"), [(1, 0), (3, 0), (4, 1), (7, 1), (8, 2), (4000, 1000), (4003, 1000)]
)
def test_target_is_a_quarter_of_the_budget_rounded_down(limit: int, target: int) -> None:
    assert compaction.target_chars(limit) == target


@given(st.integers(1, 10**9))
def test_target_never_exceeds_a_quarter(limit: int) -> None:
    target = compaction.target_chars(limit)
    assert 4 * target <= limit < 4 * (target + 1)


def test_nothing_unsummarized_never_needs_compaction() -> None:
    assert not compaction.needed(0, 0, 100)
    assert not compaction.needed(0, 500, 100)  # even when the summary alone is over budget


def test_needed_exactly_when_turns_and_summary_do_not_fit() -> None:
    assert not compaction.needed(100, 0, 100)  # exact fit
    assert compaction.needed(101, 0, 100)  # over by one
    assert not compaction.needed(75, 25, 100)  # exact fit with a summary
    assert compaction.needed(76, 25, 100)  # over by one with a summary
    assert compaction.needed(1, 100, 100)
    assert not compaction.needed(1, 99, 100)


@given(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(1, 10_000))
def test_needed_is_positive_and_over_budget(unsummarized: int, summary: int, limit: int) -> None:
    expected = unsummarized > 0 and unsummarized + summary > limit
    assert compaction.needed(unsummarized, summary, limit) == expected


# --- choose_cut: examples -------------------------------------------------------------------------


def _spans(*rows: tuple[int, int, int]) -> list[Span]:
    return [Span(seq, start, chars) for seq, start, chars in rows]


def _own_rounds(chars: Sequence[int], first_seq: int = 1) -> list[Span]:
    """Every turn its own round."""
    return [Span(first_seq + i, first_seq + i, c) for i, c in enumerate(chars)]


def test_no_spans_no_cut() -> None:
    assert compaction.choose_cut([], 1, NO_CAP) is None


def test_one_round_cannot_be_cut() -> None:
    spans = _spans((1, 1, 10), (2, 1, 10), (3, 1, 10))
    assert compaction.choose_cut(spans, 1, NO_CAP) is None


def test_a_single_turn_that_is_the_newest_round_cannot_be_cut() -> None:
    assert compaction.choose_cut(_own_rounds([100]), 1, NO_CAP) is None


def test_cut_at_the_first_boundary_past_three_quarters() -> None:
    # 40 chars; three quarters is 30, reached exactly after seq 3.
    spans = _own_rounds([10, 10, 10, 10])
    assert compaction.choose_cut(spans, 4, NO_CAP) == 3
    # 100 chars; three quarters 75: prefixes 50, 70, 90 -> 90 (seq 3), although 70 is nearer.
    spans = _own_rounds([50, 20, 20, 10])
    assert compaction.choose_cut(spans, 4, NO_CAP) == 3


def test_no_boundary_past_three_quarters_takes_the_last_before() -> None:
    # 70 chars; the newest round (50) is more than a quarter: cuts after 1 (10) and 2 (20).
    spans = _own_rounds([10, 10, 50])
    assert compaction.choose_cut(spans, 3, NO_CAP) == 2


def test_three_quarters_is_not_rounded() -> None:
    # 5 chars: three quarters is 3.75; 3 chars fall short of it, 4 reach it.
    assert compaction.choose_cut(_own_rounds([3, 1, 1]), 3, NO_CAP) == 2
    # 8 chars: exactly 6 is enough.
    assert compaction.choose_cut(_own_rounds([5, 1, 2]), 3, NO_CAP) == 2


def test_never_summarizes_the_newest_round() -> None:
    # The last turn is heavy: three quarters would want it, but it is the newest round.
    spans = _own_rounds([1, 1, 100])
    assert compaction.choose_cut(spans, 3, NO_CAP) == 2
    # The newest round has three turns; none of them is summarized.
    spans = _spans((1, 1, 5), (2, 2, 5), (3, 3, 50), (4, 3, 50), (5, 3, 50))
    assert compaction.choose_cut(spans, 3, NO_CAP) == 2


def test_turns_at_or_after_stop_seq_are_never_summarized_even_in_later_rounds() -> None:
    spans = _own_rounds([1, 1, 100, 100, 100])
    assert compaction.choose_cut(spans, 2, NO_CAP) == 1
    assert compaction.choose_cut(spans, 1, NO_CAP) is None


def test_a_cut_after_the_last_span_is_allowed_when_the_newest_round_is_not_among_them() -> None:
    # The compactor leaves an open tail round out of the spans; stop_seq is then past them.
    spans = _own_rounds([10, 10, 10])
    assert compaction.choose_cut(spans, 4, NO_CAP) == 3  # 30 chars: 20 < 22.5 <= 30
    spans = _own_rounds([1, 1, 100])
    assert compaction.choose_cut(spans, 4, NO_CAP) == 3


def test_never_cuts_inside_a_round() -> None:
    # Rounds {1, 2, 3} and {4}: three quarters would be after seq 2, inside the first round.
    spans = _spans((1, 1, 10), (2, 1, 20), (3, 1, 10), (4, 4, 10))
    assert compaction.choose_cut(spans, 4, NO_CAP) == 3


def test_an_interleaved_tool_result_keeps_its_round_whole() -> None:
    # seq 2 calls a tool, seq 3 is a user turn, seq 4 is the tool result pointing back to round 2:
    # round 2 is {2, 4}, so no cut after seq 2 or seq 3.
    spans = _spans((1, 1, 10), (2, 2, 10), (3, 3, 10), (4, 2, 10), (5, 5, 10), (6, 6, 10))
    # 60 chars, three quarters 45; allowed cuts after 1 (10), 4 (40), 5 (50) -> 50.
    assert compaction.choose_cut(spans, 6, NO_CAP) == 5
    # Pointing back past every earlier start: only a cut after 4 (40) or 5 (50) remains.
    spans = _spans((1, 1, 10), (2, 2, 10), (3, 3, 10), (4, 1, 10), (5, 5, 10), (6, 6, 10))
    assert compaction.choose_cut(spans, 6, NO_CAP) == 5
    assert compaction.choose_cut(spans, 6, 45) == 4
    # The back-pointing turn is past the newest round start: no cut is left at all.
    spans = _spans((1, 1, 10), (2, 2, 10), (3, 1, 10))
    assert compaction.choose_cut(spans, 2, NO_CAP) is None


def test_a_cut_with_nothing_before_it_is_no_cut() -> None:
    spans = _own_rounds([0, 0, 10])
    assert compaction.choose_cut(spans, 3, NO_CAP) is None
    spans = _own_rounds([0, 4, 0, 4])
    # 8 chars; neither allowed cut (4 chars after seq 2 or 3) reaches 6: the last of them.
    assert compaction.choose_cut(spans, 4, NO_CAP) == 3


def test_cap_takes_the_last_cut_within_it() -> None:
    spans = _own_rounds([10, 10, 10, 10, 10])  # 50 chars; three quarters 37.5 -> 40 (seq 4)
    assert compaction.choose_cut(spans, 5, NO_CAP) == 4
    assert compaction.choose_cut(spans, 5, 40) == 4
    assert compaction.choose_cut(spans, 5, 39) == 3  # 40 is over the cap: 30
    assert compaction.choose_cut(spans, 5, 25) == 2  # 20 is within, 30 is not
    assert compaction.choose_cut(spans, 5, 10) == 1


def test_cap_below_every_candidate_takes_the_smallest() -> None:
    spans = _own_rounds([30, 10, 10, 10])
    assert compaction.choose_cut(spans, 4, 29) == 1
    assert compaction.choose_cut(spans, 4, 1) == 1
    # The smallest allowed one, not the first span when it cannot be cut after.
    spans = _spans((1, 1, 30), (2, 1, 30), (3, 3, 10), (4, 4, 10))
    assert compaction.choose_cut(spans, 4, 5) == 2


# --- choose_cut: properties -----------------------------------------------------------------------


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[Span], int]:
    """Unsummarized spans and the newest round start. Each turn either starts a round or joins an
    earlier round (the newest, or, like a tool result after intervening turns, an older one)."""
    first = draw(st.integers(1, 50))
    n = draw(st.integers(0, 14))
    spans: list[Span] = []
    starts: list[int] = []
    for i in range(n):
        seq = first + i
        chars = draw(st.integers(0, 60))
        if not starts or draw(st.integers(0, 2)) == 0:
            start = seq
        elif draw(st.booleans()):
            start = starts[-1]  # a turn of the current round
        else:
            start = draw(st.sampled_from(starts))  # a turn pointing back past other rounds
        if start == seq:
            starts.append(seq)
        spans.append(Span(seq, start, chars))
    stop = max(starts) if starts else first
    return spans, stop


def _allowed_cuts(spans: Sequence[Span], stop_seq: int) -> list[tuple[int, int]]:
    """Brute force: (chars summarized, last seq) of every cut that splits no round, summarizes
    no turn at or after stop_seq, and summarizes some chars."""
    rounds: dict[int, list[int]] = {}
    for i, s in enumerate(spans):
        rounds.setdefault(s.round_start, []).append(i)
    out = []
    for k in range(1, len(spans) + 1):  # summarize spans[:k]
        splits = any(min(ix) < k <= max(ix) for ix in rounds.values())
        late = any(s.seq >= stop_seq for s in spans[:k])
        chars = sum(s.chars for s in spans[:k])
        if not splits and not late and chars > 0:
            out.append((chars, spans[k - 1].seq))
    return out


@given(sessions(), st.one_of(st.just(NO_CAP), st.integers(0, 800)))
def test_cut_is_none_or_allowed(session: tuple[list[Span], int], cap: int) -> None:
    spans, stop = session
    cut = compaction.choose_cut(spans, stop, cap)
    allowed = _allowed_cuts(spans, stop)
    if cut is None:
        assert allowed == []
    else:
        assert cut in [seq for _, seq in allowed]
        assert all(s.seq < stop for s in spans if s.seq <= cut)


@given(sessions(), st.integers(1, 60))
def test_turns_at_or_after_any_stop_seq_are_never_summarized(
    session: tuple[list[Span], int], stop: int
) -> None:
    spans, _ = session
    cut = compaction.choose_cut(spans, stop, NO_CAP)
    if cut is not None:
        assert cut < stop
        assert cut in [seq for _, seq in _allowed_cuts(spans, stop)]


@given(sessions())
def test_uncapped_cut_is_the_first_past_three_quarters(session: tuple[list[Span], int]) -> None:
    spans, stop = session
    cut = compaction.choose_cut(spans, stop, NO_CAP)
    allowed = _allowed_cuts(spans, stop)
    if cut is None:
        return
    total = sum(s.chars for s in spans)
    # Times four to stay in integers.
    past = [seq for chars, seq in allowed if 4 * chars >= 3 * total]
    assert cut == (past[0] if past else allowed[-1][1])


@given(sessions(), st.integers(0, 800))
def test_capped_cut_stays_within_the_cap_when_it_can(
    session: tuple[list[Span], int], cap: int
) -> None:
    spans, stop = session
    cut = compaction.choose_cut(spans, stop, cap)
    allowed = _allowed_cuts(spans, stop)
    if cut is None:
        return
    chosen = next(chars for chars, seq in allowed if seq == cut)
    within = [chars for chars, _ in allowed if chars <= cap]
    if not within:
        assert chosen == min(chars for chars, _ in allowed)
        return
    assert chosen <= cap
    total = sum(s.chars for s in spans)
    past = [chars for chars in within if 4 * chars >= 3 * total]
    assert chosen == (past[0] if past else within[-1])


# --- amortization: a chat read after every exchange -----------------------------------------------


def _simulate(
    turn_chars: Sequence[int], limit: int, summary_chars: Callable[[int], int]
) -> tuple[int, int]:
    """A chat of exchanges (user, assistant; each turn its own round), read with budget ``limit``
    after every exchange, compacting by the rules. Returns (compactions, most in one read)."""
    chars: list[int] = []  # chars[i] is the turn with seq i + 1
    covered = 0  # last summarized seq
    newest_summary = 0
    count = 0
    most_per_read = 0
    for i in range(0, len(turn_chars) - 1, 2):
        chars.extend(turn_chars[i : i + 2])
        per_read = 0
        unsummarized = [
            Span(seq, seq, chars[seq - 1]) for seq in range(covered + 1, len(chars) + 1)
        ]
        if compaction.needed(sum(s.chars for s in unsummarized), newest_summary, limit):
            cut = compaction.choose_cut(unsummarized, len(chars), NO_CAP)
            if cut is not None:
                assert covered < cut < len(chars)
                covered = cut
                newest_summary = summary_chars(limit)
                assert newest_summary <= compaction.target_chars(limit)
                count += 1
                per_read += 1
        most_per_read = max(most_per_read, per_read)
    return count, most_per_read


SUMMARY_SIZES: dict[str, Callable[[int], int]] = {
    "exactly the target": compaction.target_chars,
    "tiny": lambda limit: 1,
}


@st.composite
def chats(draw: st.DrawFn) -> tuple[int, list[int]]:
    """A budget and the chars of an even number of turns, each at most a quarter of the budget:
    either free-form, or a few exchanges repeated many times (a steady conversation)."""
    limit = draw(st.integers(8, 4000))
    turn = st.integers(0, limit // 4)
    if draw(st.booleans()):
        turns = draw(st.lists(turn, max_size=300))
    else:
        head = draw(st.lists(turn, max_size=8))
        pattern = draw(st.lists(turn, min_size=2, max_size=8))
        turns = head + pattern * draw(st.integers(1, 80))
    return limit, turns[: len(turns) - len(turns) % 2]


def _assert_amortized(limit: int, turns: Sequence[int], summary: str) -> None:
    count, most_per_read = _simulate(turns, limit, SUMMARY_SIZES[summary])
    assert most_per_read <= 1
    total = sum(turns)
    assert count <= total // (limit // 2) + 1, (count, total, limit)


@pytest.mark.parametrize("summary", sorted(SUMMARY_SIZES))
@given(chat=chats())
def test_compactions_are_amortized_over_the_history(
    summary: str, chat: tuple[int, list[int]]
) -> None:
    limit, turns = chat
    _assert_amortized(limit, turns, summary)


def test_compactions_are_amortized_in_a_steady_chat_of_small_and_quarter_turns() -> None:
    # Budget 1600 (summaries of at most 400, turns of at most 400); exchanges (201, 400) and
    # (99, 1) repeated. Once a 400-char summary exists, reads compact whenever 1201 unsummarized
    # chars have gathered, laid out as [400, 99, 1, 201, 400, 99, 1]. Three quarters is 900.75;
    # a cut "nearest" it would summarize 701 chars (199.75 below, nearer than 1101), less than
    # half the budget, and make 48 compactions for 35,000 chars where the bound is
    # 35,000 // 800 + 1 = 44. The first cut past three quarters (1101) keeps the bound.
    _assert_amortized(1600, [201, 400, 99, 1] * 50, "exactly the target")


# --- what the model is sent -----------------------------------------------------------------------

CALL = {"id": "call_7", "type": "function", "function": {"name": "lookup", "arguments": '{"a":1}'}}
TURNS = [
    Source(3, "user", "Where is my order 4411?"),
    Source(4, "assistant", None, tool_calls=[CALL]),
    Source(5, "tool", "shipped on May 2", tool_call_id="call_7"),
    Source(6, "assistant", "It shipped on May 2.", name="helper"),
]


def test_transcript_numbers_every_turn() -> None:
    lines = compaction.transcript(TURNS).splitlines()
    assert lines == [
        "[3] user: Where is my order 4411?",
        "[4] assistant:",
        '    calls lookup({"a":1}) as call_7',
        "[5] tool result for call_7: shipped on May 2",
        "[6] assistant (helper): It shipped on May 2.",
    ]


def test_transcript_renders_several_calls_and_missing_fields() -> None:
    calls: list[dict[str, Any]] = [
        CALL,
        {"id": "call_8", "function": {"name": "weather"}},
        {"id": "call_9"},
    ]
    text = compaction.transcript([Source(1, "assistant", "Checking.", tool_calls=calls)])
    assert text.splitlines() == [
        "[1] assistant: Checking.",
        '    calls lookup({"a":1}) as call_7',
        "    calls weather() as call_8",
        "    calls None() as call_9",
    ]


def test_prompt_asks_for_the_target_and_shows_only_the_given_turns() -> None:
    messages = compaction.prompt(TURNS[1:3], 321)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "at most 321 characters" in messages[0]["content"]
    user = messages[1]["content"]
    assert user.startswith("Turns 4 to 5 of the conversation:\n\n")
    assert compaction.transcript(TURNS[1:3]) in user
    assert "[4] assistant:" in user
    assert "[5] tool result for call_7" in user
    assert "order 4411" not in user and "[3]" not in user
    assert "helper" not in user and "[6]" not in user


@given(st.lists(st.text(max_size=40), min_size=1, max_size=6), st.integers(1, 10_000))
def test_prompt_contains_each_turn_once_in_order(contents: list[str], target: int) -> None:
    turns = [Source(10 + i, "user", c) for i, c in enumerate(contents)]
    user = compaction.prompt(turns, target)[1]["content"]
    assert user.startswith(f"Turns 10 to {9 + len(contents)} of the conversation:")
    positions = [user.find(f"[{t.seq}] user:") for t in turns]
    assert all(p >= 0 for p in positions)
    assert positions == sorted(positions)
    assert str(target) in compaction.prompt(turns, target)[0]["content"]


def test_retry_prompt_keeps_the_request_and_asks_for_shorter() -> None:
    first = compaction.prompt(TURNS, 100)
    answer = "x" * 150
    messages = compaction.retry_prompt(first, answer, 100)
    assert messages[:2] == first
    assert messages[2] == {"role": "assistant", "content": answer}
    assert messages[3]["role"] == "user"
    assert "150" in messages[3]["content"] and "100" in messages[3]["content"]
    assert "at most 100 characters" in messages[3]["content"]
    assert len(messages) == 4
    assert first == compaction.prompt(TURNS, 100)  # not modified in place


def test_extractive_sources_give_a_tool_call_a_text() -> None:
    out = compaction.extractive_sources(TURNS)
    assert out[0] == {"role": "user", "content": "Where is my order 4411?"}
    assert out[1] == {"role": "assistant", "content": 'Called lookup with {"a":1}.'}
    assert out[2] == {"role": "tool", "content": "shipped on May 2"}
    assert out[3] == {"role": "assistant", "content": "It shipped on May 2."}
    with_text = compaction.extractive_sources(
        [Source(1, "assistant", "Let me look.", None, [CALL])]
    )
    assert with_text == [
        {"role": "assistant", "content": 'Let me look. Called lookup with {"a":1}.'}
    ]
    assert compaction.extractive_sources([Source(1, "user", None)]) == [
        {"role": "user", "content": ""}
    ]


@pytest.mark.parametrize(
    ("answer", "kept"),
    [("", None), ("   ", None), ("\n\t \n", None), (" ok ", "ok"), ("a\nb\n", "a\nb")],
)
def test_usable_strips_and_blank_is_nothing(answer: str, kept: str | None) -> None:
    assert compaction.usable(answer) == kept


def test_tool_calls_parses_json_text() -> None:
    assert compaction.tool_calls(None) is None
    assert compaction.tool_calls(json.dumps([CALL])) == [CALL]
    assert compaction.tool_calls("[]") == []
    assert compaction.tool_calls('{"id": "x"}') is None
    assert compaction.tool_calls("null") is None


# --- compaction ahead of reads (issue 13) -------------------------------------------------------


def test_ahead_threshold_is_two_thirds_of_the_room_rounded_down() -> None:
    assert compaction.ahead_chars(8000) == 5333
    assert compaction.ahead_chars(1000) == 666
    assert not compaction.ahead_due(666, 0, 1000)
    assert compaction.ahead_due(667, 0, 1000)


def test_ahead_is_due_whenever_a_read_would_compact() -> None:
    # A summary written for a larger budget: the read is over budget below two thirds.
    assert compaction.needed(500, 600, 1000)
    assert compaction.ahead_due(500, 600, 1000)
    assert not compaction.ahead_due(0, 900, 1000)


@given(
    st.integers(min_value=1, max_value=100_000),
    st.integers(min_value=0, max_value=25_000),
    st.integers(min_value=4, max_value=100_000),
)
def test_an_ahead_compaction_folds_more_than_half_the_budget(
    unsummarized: int, summary: int, room: int
) -> None:
    """The bound C / (B/2) + 1 holds for ahead compactions too: past two thirds, three quarters
    of the unsummarized chars (at least, when the newest round is small) is more than half."""
    if compaction.ahead_due(unsummarized, summary, room) and not compaction.needed(
        unsummarized, summary, room
    ):
        assert 2 * compaction.past_share(unsummarized) > room
