"""The builtin extractive summarizer: deterministic, within its target, honest about itself."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aidb_memory_server.extractive import MODEL_NAME, Source, header, summarize

CONVERSATION = [
    Source("user", "Hi. My discount was not applied to the renewal of account 4411."),
    Source("assistant", "Let me check the renewal history. The discount expired on March 3."),
    Source("tool", "renewal_history: plan=pro, discount=none"),
    Source("user", "Please fix it, Dana said it was approved."),
    Source("assistant", "I have reapplied the 15% discount. You will see it on the next invoice."),
]


def test_the_first_user_goal_comes_first_then_the_latest_state() -> None:
    goal = "- user: My discount was not applied to the renewal of account 4411."
    room_for_goal = len(header(1, 5)) + 1 + len(goal)
    # Room for one sentence: the goal, not the greeting before it.
    assert summarize(CONVERSATION, room_for_goal, 1, 5).splitlines()[1:] == [goal]
    text = summarize(CONVERSATION, 300, 1, 5)
    assert goal in text
    assert "You will see it on the next invoice." in text


def test_it_says_what_it_is() -> None:
    text = summarize(CONVERSATION, 1000, 7, 11)
    assert text.startswith(header(7, 11))
    assert "not a model" in text.splitlines()[0]
    assert MODEL_NAME == "builtin:extractive"


def test_quoted_sentences_keep_their_order_and_are_whole() -> None:
    text = summarize(CONVERSATION, 1000, 1, 5)
    lines = text.splitlines()[1:]
    sources = " ".join(s.content for s in CONVERSATION)
    positions = [sources.find(line.split(": ", 1)[1]) for line in lines]
    assert all(p >= 0 for p in positions)
    assert positions == sorted(positions)


sources = st.lists(
    st.builds(
        Source,
        st.sampled_from(["user", "assistant", "tool", "system"]),
        st.text(alphabet=st.characters(codec="utf-8"), max_size=300),
    ),
    max_size=12,
)


@given(sources, st.integers(1, 2000))
def test_never_over_target_and_deterministic(turns: list[Source], target: int) -> None:
    first = summarize(turns, target, 1, max(1, len(turns)))
    assert len(first) <= target
    assert first == summarize(turns, target, 1, max(1, len(turns)))


def test_a_decimal_point_does_not_end_a_sentence() -> None:
    turns = [Source("user", "The plan costs $1,536.00 a year. Version 2.1 is out!")]
    text = summarize(turns, 500, 1, 1)
    assert "- user: The plan costs $1,536.00 a year." in text.splitlines()
    assert "- user: Version 2.1 is out!" in text.splitlines()
