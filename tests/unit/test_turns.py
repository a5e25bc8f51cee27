"""turns.py without a database: the turn shape, the tool-call protocol, rounds, batch hashes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aidb_memory_server import turns
from aidb_memory_server.errors import INVALID_PARAMETER_VALUE, ApiError
from aidb_memory_server.turns import Limits, Tail, Turn

LIMITS = Limits(max_turn_chars=100, max_turns_per_add=3, max_identifier_chars=10)


def _call(call_id: str = "c1", arguments: str = "{}", name: str = "f") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _validate(raw: Any, i: int = 0, limits: Limits = LIMITS) -> Turn:
    return turns.validate_turn("add", i, raw, limits)


def _refused(raw: Any, i: int = 0, limits: Limits = LIMITS) -> ApiError:
    with pytest.raises(ApiError) as info:
        _validate(raw, i, limits)
    return info.value


# --- validate_turn: accepted shapes -----------------------------------------------------------


def test_a_user_turn_gets_its_default_kind_and_chars() -> None:
    t = _validate({"role": "user", "content": "héllo 😀"})
    assert (t.role, t.content, t.kind, t.chars) == ("user", "héllo 😀", "user_prompt", 7)
    assert t.meta == {} and t.sequence_id is None
    assert t.tool_calls is None and t.tool_call_id is None and t.name is None


@pytest.mark.parametrize(
    ("role", "kind"),
    [("user", "user_prompt"), ("assistant", "model_response"), ("system", "system")],
)
def test_default_kind_per_role(role: str, kind: str) -> None:
    assert _validate({"role": role, "content": "x"}).kind == kind


def test_tool_result_defaults() -> None:
    t = _validate({"role": "tool", "content": "42", "tool_call_id": "c1", "name": "calc"})
    assert (t.kind, t.tool_call_id, t.name, t.chars) == ("tool_result", "c1", "calc", 2)


@pytest.mark.parametrize("content", [None, ""])
def test_assistant_with_tool_calls_may_have_no_content(content: str | None) -> None:
    t = _validate({"role": "assistant", "content": content, "tool_calls": [_call("a", '{"x": 1}')]})
    assert t.content == content
    assert t.kind == "tool_call"
    assert t.chars == len('{"x": 1}'), "chars count tool-call arguments"


def test_assistant_tool_call_content_key_may_be_left_out() -> None:
    t = _validate({"role": "assistant", "tool_calls": [_call("a", "ab")]})
    assert t.content is None and t.chars == 2


def test_chars_are_content_plus_every_call_arguments() -> None:
    t = _validate(
        {"role": "assistant", "content": "abc", "tool_calls": [_call("a", "12"), _call("b", "345")]}
    )
    assert t.chars == 3 + 2 + 3


def test_tool_call_is_normalized_type_and_arguments_default() -> None:
    t = _validate({"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f"}}]})
    assert t.tool_calls == [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": ""}}
    ]


def test_explicit_kind_and_sequence_id_as_integer() -> None:
    t = _validate({"role": "user", "content": "x", "kind": "note", "meta": {"sequence_id": 7}})
    assert t.kind == "note"
    assert t.sequence_id == "7", "an integer sequence_id groups with its string form"
    assert t.meta == {"sequence_id": 7}, "meta is stored as sent"


def test_a_turn_exactly_at_the_limit_is_accepted() -> None:
    assert _validate({"role": "user", "content": "é" * 100}).chars == 100
    t = _validate({"role": "assistant", "content": "x" * 60, "tool_calls": [_call("a", "y" * 40)]})
    assert t.chars == 100


# --- validate_turn: refused shapes --------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field", "problem"),
    [
        ("hi", "turns[2]", "must be an object, not a string"),
        ([], "turns[2]", "must be an object, not an array"),
        (None, "turns[2]", "must be an object, not null"),
        ({"content": "x"}, "turns[2].role", "is required"),
        ({"role": None, "content": "x"}, "turns[2].role", "is required"),
        ({"role": "bot", "content": "x"}, "turns[2].role", 'not "bot"'),
        ({"role": 3, "content": "x"}, "turns[2].role", "must be one of"),
        ({"role": "user", "contnet": "x"}, "turns[2].contnet", "is not a known key"),
        ({"role": "user"}, "turns[2].content", "is required"),
        ({"role": "user", "content": ""}, "turns[2].content", "is required"),
        ({"role": "user", "content": None}, "turns[2].content", "is required"),
        ({"role": "system", "content": ""}, "turns[2].content", "is required"),
        ({"role": "assistant", "content": None}, "turns[2].content", "is required"),
        ({"role": "assistant", "content": ""}, "turns[2].content", "is required"),
        (
            {"role": "user", "content": 5},
            "turns[2].content",
            "array of content parts, not a number",
        ),
        ({"role": "user", "content": ["a"]}, "turns[2].content[0]", "must be an object"),
        ({"role": "user", "content": []}, "turns[2].content", "must not be an empty array"),
        ({"role": "user", "content": {"t": 1}}, "turns[2].content", "must be a string"),
        ({"role": "user", "content": True}, "turns[2].content", "not a boolean"),
        ({"role": "user", "content": "x" * 101}, "turns[2].content", "longer than 100"),
        (
            {"role": "user", "content": "x", "tool_calls": [_call()]},
            "turns[2].tool_calls",
            "only on an assistant turn",
        ),
        (
            {"role": "tool", "content": "x", "tool_call_id": "c", "tool_calls": [_call()]},
            "turns[2].tool_calls",
            "only on an assistant turn",
        ),
        (
            {"role": "assistant", "content": "x", "tool_calls": {}},
            "turns[2].tool_calls",
            "non-empty array",
        ),
        (
            {"role": "assistant", "content": "x", "tool_calls": []},
            "turns[2].tool_calls",
            "non-empty array",
        ),
        (
            {"role": "assistant", "content": "x", "tool_calls": ["c1"]},
            "turns[2].tool_calls[0]",
            "must be an object",
        ),
        (
            {"role": "assistant", "tool_calls": [{**_call(), "idd": "x"}]},
            "turns[2].tool_calls[0].idd",
            "is not a known key",
        ),
        (
            {"role": "assistant", "tool_calls": [_call(), {**_call("c2"), "type": "tool"}]},
            "turns[2].tool_calls[1].type",
            'must be "function" or "custom"',
        ),
        (
            {"role": "assistant", "tool_calls": [{**_call(), "id": 1}]},
            "turns[2].tool_calls[0].id",
            "must be a string",
        ),
        (
            {"role": "assistant", "tool_calls": [{**_call(), "id": ""}]},
            "turns[2].tool_calls[0].id",
            "must not be empty",
        ),
        (
            {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]},
            "turns[2].tool_calls[0].id",
            "must be a string, not null",
        ),
        (
            {"role": "assistant", "tool_calls": [{**_call(), "id": "x" * 11}]},
            "turns[2].tool_calls[0].id",
            "longer than 10",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": "a", "type": "function"}]},
            "turns[2].tool_calls[0].function",
            "must be an object",
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [{"id": "a", "function": {"name": "f", "args": ""}}],
            },
            "turns[2].tool_calls[0].function.args",
            "is not a known key",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": "a", "function": {"arguments": ""}}]},
            "turns[2].tool_calls[0].function.name",
            "must be a string",
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {}}}],
            },
            "turns[2].tool_calls[0].function.arguments",
            "must be a string",
        ),
        ({"role": "tool", "content": "x"}, "turns[2].tool_call_id", "is required"),
        (
            {"role": "tool", "content": "x", "tool_call_id": 7},
            "turns[2].tool_call_id",
            "must be a string",
        ),
        (
            {"role": "assistant", "content": "x", "tool_call_id": "c"},
            "turns[2].tool_call_id",
            "only on a tool turn",
        ),
        ({"role": "user", "content": "x", "name": "n" * 11}, "turns[2].name", "longer than 10"),
        ({"role": "user", "content": "x", "name": 1}, "turns[2].name", "must be a string"),
        ({"role": "user", "content": "x", "kind": "summary"}, "turns[2].kind", "reserved"),
        ({"role": "user", "content": "x", "kind": ""}, "turns[2].kind", "must not be empty"),
        ({"role": "user", "content": "x", "kind": "k" * 65}, "turns[2].kind", "longer than 64"),
        ({"role": "user", "content": "x", "meta": []}, "turns[2].meta", "must be an object"),
        ({"role": "user", "content": "x", "meta": "m"}, "turns[2].meta", "must be an object"),
        (
            {"role": "user", "content": "x", "meta": {"sequence_id": 1.5}},
            "turns[2].meta.sequence_id",
            "string or an integer",
        ),
        (
            {"role": "user", "content": "x", "meta": {"sequence_id": True}},
            "turns[2].meta.sequence_id",
            "string or an integer",
        ),
        (
            {"role": "user", "content": "x", "meta": {"sequence_id": ["a"]}},
            "turns[2].meta.sequence_id",
            "string or an integer",
        ),
        (
            {"role": "user", "content": "x", "meta": {"sequence_id": "s" * 11}},
            "turns[2].meta.sequence_id",
            "longer than 10",
        ),
        (
            {"role": "user", "content": "x", "meta": {"sequence_id": 10**10}},
            "turns[2].meta.sequence_id",
            "longer than 10",
        ),
    ],
)
def test_every_shape_rule_names_the_turn_and_field(raw: Any, field: str, problem: str) -> None:
    e = _refused(raw, 2)
    assert e.sqlstate == INVALID_PARAMETER_VALUE
    assert e.message.startswith(f"aidb_memory.add: {field} "), e.message
    assert problem in e.message, e.message
    assert "\n" not in e.message


def test_arguments_push_a_turn_over_the_limit_and_the_error_names_the_tool_calls() -> None:
    e = _refused({"role": "assistant", "content": "x" * 60, "tool_calls": [_call("a", "y" * 41)]})
    assert e.sqlstate == INVALID_PARAMETER_VALUE
    assert e.message.startswith("aidb_memory.add: turns[0].tool_calls "), e.message
    assert "101 characters" in e.message and "100" in e.message
    assert e.hint and "max_turn_chars" in e.hint


def test_unknown_key_hint_lists_the_known_keys() -> None:
    e = _refused({"role": "user", "content": "x", "tool_call": []})
    assert e.hint is not None
    for key in turns.TURN_KEYS:
        assert key in e.hint


# --- parse_turns -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"role": "user"}', "must be a JSON array of turns, not an object"),
        ('"x"', "not a string"),
        ("null", "not null"),
        ("[]", "at least one turn"),
        ("[1, 2, 3, 4]", "has 4 turns, more than the namespace limit of 3"),
    ],
)
def test_parse_turns_refuses_what_is_not_a_batch(text: str, problem: str) -> None:
    with pytest.raises(ApiError) as info:
        turns.parse_turns("add", text, LIMITS)
    assert info.value.sqlstate == INVALID_PARAMETER_VALUE
    assert info.value.message.startswith("aidb_memory.add: turns ")
    assert problem in info.value.message


def test_parse_turns_returns_the_array() -> None:
    assert turns.parse_turns("add", "[1, 2, 3]", LIMITS) == [1, 2, 3]


# --- check_protocol -------------------------------------------------------------------------


def _t(role: str, **extra: Any) -> Turn:
    raw: dict[str, Any] = {"role": role, **extra}
    if role != "assistant" or "tool_calls" not in extra:
        raw.setdefault("content", "x")
    return _validate(raw)


def _calls(*ids: str) -> Turn:
    return _t("assistant", tool_calls=[_call(i) for i in ids])


def _result(call_id: str) -> Turn:
    return _t("tool", tool_call_id=call_id)


def _protocol_error(batch: list[Turn], tail: Tail | None = None) -> str:
    with pytest.raises(ApiError) as info:
        turns.check_protocol("add", batch, tail or Tail())
    assert info.value.sqlstate == INVALID_PARAMETER_VALUE
    return info.value.message


def test_results_answer_calls_in_any_order() -> None:
    batch = [_t("user"), _calls("a", "b"), _result("b"), _result("a"), _t("assistant")]
    assert turns.check_protocol("add", batch, Tail()) == []


def test_a_batch_may_end_with_open_calls_and_the_next_may_answer_them() -> None:
    assert turns.check_protocol("add", [_calls("a", "b"), _result("a")], Tail()) == ["b"]
    tail = Tail(open_calls=["b"])
    assert turns.check_protocol("add", [_result("b"), _t("user")], tail) == []


def test_open_calls_of_the_tail_are_not_mutated() -> None:
    tail = Tail(open_calls=["a"])
    turns.check_protocol("add", [_result("a")], tail)
    assert tail.open_calls == ["a"]


def test_a_result_without_an_open_call_is_refused() -> None:
    message = _protocol_error([_t("user"), _result("a")])
    assert message.startswith("aidb_memory.add: turns[1].tool_call_id ")
    assert '"a" does not answer an open tool call' in message


def test_a_result_answering_the_same_call_twice_is_refused() -> None:
    message = _protocol_error([_calls("a", "b"), _result("a"), _result("a")])
    assert message.startswith("aidb_memory.add: turns[2].tool_call_id ")


def test_a_result_for_an_older_round_is_refused() -> None:
    message = _protocol_error([_calls("a"), _result("a"), _calls("b"), _result("a")])
    assert message.startswith("aidb_memory.add: turns[3].tool_call_id ")


@pytest.mark.parametrize("role", ["user", "assistant", "system"])
def test_nothing_but_results_may_come_before_open_calls_are_answered(role: str) -> None:
    message = _protocol_error([_calls("a", "b"), _result("a"), _t(role)])
    assert message.startswith('aidb_memory.add: turns[2] comes before tool call "b"')


def test_a_new_call_before_open_calls_are_answered_is_refused() -> None:
    message = _protocol_error([_calls("b")], Tail(open_calls=["a"]))
    assert message.startswith('aidb_memory.add: turns[0] comes before tool call "a"')


def test_duplicate_call_ids_in_one_turn_are_refused() -> None:
    message = _protocol_error([_t("user"), _calls("a", "a")])
    assert message.startswith("aidb_memory.add: turns[1].tool_calls has two calls with the same id")


def test_a_call_id_may_be_reused_once_answered() -> None:
    batch = [_calls("a"), _result("a"), _calls("a"), _result("a")]
    assert turns.check_protocol("add", batch, Tail()) == []


# --- place_in_rounds ---------------------------------------------------------------------------


def _seq(sequence_id: Any) -> dict[str, Any]:
    return {"meta": {"sequence_id": sequence_id}}


def test_each_plain_turn_starts_its_own_round() -> None:
    batch = [_t("user"), _t("assistant"), _t("user")]
    assert turns.place_in_rounds(batch, 1, Tail()) == [1, 2, 3]


def test_tool_results_join_their_call_round() -> None:
    batch = [_t("user"), _calls("a", "b"), _result("a"), _result("b"), _t("assistant")]
    assert turns.place_in_rounds(batch, 10, Tail()) == [10, 11, 11, 11, 14]


def test_consecutive_turns_sharing_a_sequence_id_form_one_round() -> None:
    batch = [
        _t("user", **_seq("s")),
        _t("assistant", **_seq("s")),
        _t("assistant", **_seq(1)),
        _t("assistant", **_seq("1")),
        _t("user"),
        _t("user"),
        _t("user", **_seq("s")),
    ]
    assert turns.place_in_rounds(batch, 1, Tail()) == [1, 1, 3, 3, 5, 6, 7]


def test_a_round_continues_across_batches_through_the_tail() -> None:
    tail = Tail(sequence_id="s", round_start=4, open_calls=[])
    batch = [_t("assistant", **_seq("s")), _t("user", **_seq("t"))]
    assert turns.place_in_rounds(batch, 8, tail) == [4, 9]
    tail = Tail(sequence_id=None, round_start=6, open_calls=["a"])
    assert turns.place_in_rounds([_result("a"), _t("user")], 8, tail) == [6, 9]


def test_the_first_turn_of_a_session_starts_a_round_even_as_a_sequence_match() -> None:
    # An empty session has no round to join: a round_start of None must never be stored.
    assert turns.place_in_rounds([_t("user", **_seq("s"))], 1, Tail(sequence_id="s")) == [1]


def test_a_different_sequence_id_after_a_tool_result_starts_a_round() -> None:
    batch = [_t("user", **_seq("s")), _calls("a"), _result("a"), _t("assistant", **_seq("s"))]
    assert turns.place_in_rounds(batch, 1, Tail()) == [1, 2, 2, 4]


# --- turns_hash ------------------------------------------------------------------------------


def test_turns_hash_ignores_key_order_and_whitespace() -> None:
    a = '[{"role": "user", "content": "hé", "meta": {"a": 1, "b": [1, 2]}}]'
    b = '[ {"meta":{"b":[1,2],"a":1},"content":"h\\u00e9","role":"user"} ]'
    assert turns.turns_hash(a) == turns.turns_hash(b)


@pytest.mark.parametrize(
    "other",
    [
        '[{"role": "user", "content": "he"}]',
        '[{"role": "user", "content": "hé", "name": "n"}]',
        '[{"role": "user", "content": "hé"}, {"role": "user", "content": "hé"}]',
        '[{"role": "assistant", "content": "hé"}]',
    ],
)
def test_turns_hash_tells_different_batches_apart(other: str) -> None:
    assert turns.turns_hash('[{"role": "user", "content": "hé"}]') != turns.turns_hash(other)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=4), json_values, max_size=6), st.randoms())
def test_turns_hash_is_insensitive_to_key_order(value: dict[str, Any], rnd: Any) -> None:
    def shuffled(v: Any) -> Any:
        if isinstance(v, dict):
            items = list(v.items())
            rnd.shuffle(items)
            return {k: shuffled(x) for k, x in items}
        if isinstance(v, list):
            return [shuffled(x) for x in v]
        return v

    one = json.dumps([value])
    two = json.dumps([shuffled(value)], indent=1, ensure_ascii=False)
    assert turns.turns_hash(one) == turns.turns_hash(two)


def test_turns_hash_covers_the_session_and_agent() -> None:
    batch = '[{"role": "user", "content": "hi"}]'
    assert turns.turns_hash(batch, "s1", None) == turns.turns_hash(batch, "s1", None)
    assert turns.turns_hash(batch, "s1", None) != turns.turns_hash(batch, "s2", None)
    assert turns.turns_hash(batch, "s1", None) != turns.turns_hash(batch, "s1", "agent")


_PLAINISH = st.lists(
    st.dictionaries(
        st.sampled_from(["role", "content", "name", "meta"]),
        st.one_of(
            st.sampled_from(["user", "assistant", "system", "developer", "tool", "", " "]),
            st.text(max_size=120),
            st.none(),
            st.integers(),
            st.just({}),
        ),
        min_size=1,
        max_size=3,
    ),
    min_size=1,
    max_size=3,
)


@given(_PLAINISH)
def test_the_plain_batch_shortcut_is_validate_turn(batch: list[dict[str, Any]]) -> None:
    """validate_batch's one pass over plain chat messages gives what validate_turn gives, and
    leaves everything else to it (issue 14)."""
    plain = turns._plain_batch(batch, LIMITS)
    try:
        full: list[Turn] | str = [
            turns.validate_turn("add", i, t, LIMITS) for i, t in enumerate(batch)
        ]
    except ApiError as e:
        full = e.message
    if plain is not None:
        assert plain == full
    try:
        assert turns.validate_batch("add", batch, LIMITS) == full
    except ApiError as e:
        assert e.message == full
