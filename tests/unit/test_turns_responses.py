"""turns.py for provider-native histories (issue 11): the complete chat shape, Responses items,
batch shapes, budget costs, the protocol of parallel calls and reasoning, rounds."""

from __future__ import annotations

from typing import Any

import pytest

from aidb_memory_server import turns
from aidb_memory_server.errors import INVALID_PARAMETER_VALUE, ApiError
from aidb_memory_server.turns import Limits, Tail, Turn

LIMITS = Limits(
    max_turn_chars=5000, max_turns_per_add=100, max_identifier_chars=40, non_text_part_chars=7
)
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def _batch(*raw: Any, limits: Limits = LIMITS) -> list[Turn]:
    return turns.validate_batch("add", list(raw), limits)


def _refused(*raw: Any, limits: Limits = LIMITS) -> ApiError:
    with pytest.raises(ApiError) as info:
        _batch(*raw, limits=limits)
    assert info.value.sqlstate == INVALID_PARAMETER_VALUE
    assert "\n" not in info.value.message
    return info.value


def _fc(call_id: str, name: str = "f", arguments: str = "{}") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def _out(call_id: str, output: Any = "ok") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def _reasoning(*summary: str, encrypted: str | None = "gAAAA" * 20) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": s} for s in summary],
        "encrypted_content": encrypted,
    }


def _said(role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    part: dict[str, Any] = {"type": kind, "text": text}
    if role == "assistant":
        part["annotations"] = []
        return {
            "type": "message",
            "id": "msg_1",
            "role": role,
            "status": "completed",
            "content": [part],
        }
    return {"type": "message", "role": role, "content": [part]}


# --- chat, complete -----------------------------------------------------------------------------


def test_a_plain_chat_turn_has_no_item_and_chat_shape() -> None:
    [t] = _batch({"role": "user", "content": "hi", "kind": "note", "meta": {"sequence_id": 1}})
    assert (t.item, t.shape, t.kind, t.chars) == (None, "chat", "note", 2)


@pytest.mark.parametrize(
    "message",
    [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "look"}, IMAGE]},
        {"role": "assistant", "content": None, "refusal": "no"},
        {"role": "assistant", "refusal": "no"},
        {"role": "assistant", "content": None, "audio": {"id": "audio_1"}},
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "type": "custom", "custom": {"name": "g", "input": "x"}}],
        },
        {"role": "tool", "content": "", "tool_call_id": "c", "name": "f"},
        {"role": "user", "content": "x", "name": None},
        {"role": "user", "content": [{"type": "video_url", "video_url": {"url": "u"}}]},
    ],
)
def test_chat_messages_the_columns_cannot_give_back_keep_their_item(
    message: dict[str, Any],
) -> None:
    [t] = _batch({**message, "kind": "k", "meta": {"a": 1}})
    assert t.item == message, "the item is the message without our kind and meta"
    assert t.shape == "chat"


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "x", "name": "bob"},
        {"role": "system", "content": "x"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}
            ],
        },
        {"role": "tool", "content": "", "tool_call_id": "c"},
        {"role": "tool", "content": "42", "tool_call_id": "c"},
    ],
)
def test_chat_messages_the_columns_give_back_store_no_item(message: dict[str, Any]) -> None:
    assert _batch(message)[0].item is None


def test_chat_content_parts_project_their_text_and_cost_non_text_parts() -> None:
    parts = [
        {"type": "text", "text": "abc"},
        IMAGE,
        {"type": "input_audio", "input_audio": {"data": "QUFB", "format": "wav"}},
        {"type": "file", "file": {"file_data": "QUFB", "filename": "r.pdf"}},
        {"type": "text", "text": "de"},
        {"type": "shiny", "text": "xyz"},
        {"type": "shiny"},
    ]
    [t] = _batch({"role": "user", "content": parts})
    assert t.content == "abc\nde\nxyz"
    assert t.chars == 3 + 7 + 7 + 7 + 2 + 3 + 7
    assert t.kind == "user_prompt"


def test_a_chat_refusal_is_the_assistant_text_and_counts() -> None:
    [t] = _batch({"role": "assistant", "refusal": "I can't"})
    assert (t.content, t.chars, t.kind) == ("I can't", 7, "model_response")


def test_a_custom_chat_tool_call_is_projected_as_a_function_call() -> None:
    call = {"id": "c", "type": "custom", "custom": {"name": "grep", "input": "a.*b"}}
    [t] = _batch({"role": "assistant", "tool_calls": [call]})
    assert t.tool_calls == [
        {"id": "c", "type": "function", "function": {"name": "grep", "arguments": "a.*b"}}
    ]
    assert t.chars == 4 and t.kind == "tool_call"


def test_developer_kind_and_the_empty_tool_output() -> None:
    d, tool = _batch(
        {"role": "developer", "content": "rules"},
        {"role": "tool", "content": "", "tool_call_id": "c"},
    )
    assert (d.role, d.kind) == ("developer", "developer")
    assert (tool.content, tool.chars, tool.kind) == ("", 0, "tool_result")


@pytest.mark.parametrize(
    ("raw", "field", "problem"),
    [
        ({"role": "user", "content": "x", "type2": 1}, "turns[0].type2", "is not a known key"),
        ({"role": "user", "content": [{"text": "a"}]}, "turns[0].content[0].type", "is required"),
        (
            {"role": "user", "content": [{"type": 3}]},
            "turns[0].content[0].type",
            "must be a string",
        ),
        ({"role": "user", "content": [{"type": "text"}]}, "turns[0].content[0].text", "string"),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": "u"}]},
            "turns[0].content[0].image_url",
            "must be an object",
        ),
        (
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "x"}}]},
            "turns[0].content[0].input_audio.format",
            "must be a string",
        ),
        (
            {"role": "user", "content": [{"type": "file", "file": None}]},
            "turns[0].content[0].file",
            "must be an object",
        ),
        (
            {"role": "user", "refusal": "no", "content": "x"},
            "turns[0].refusal",
            "only on an assistant",
        ),
        ({"role": "user", "audio": {}, "content": "x"}, "turns[0].audio", "only on an assistant"),
        ({"role": "assistant", "audio": "a"}, "turns[0].audio", "must be an object"),
        ({"role": "assistant", "content": None}, "turns[0].content", "is required"),
        ({"role": "developer", "content": ""}, "turns[0].content", "is required"),
        (
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "type": "custom", "custom": {"name": "g", "x": 1}}],
            },
            "turns[0].tool_calls[0].custom.x",
            "is not a known key",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "function": {}}]},
            "turns[0].tool_calls[0].custom",
            "must be an object",
        ),
        (
            {"role": "user", "content": [{"type": "text", "text": "x" * 40}, IMAGE]},
            "turns[0].content",
            "has 47 characters",
        ),
    ],
)
def test_chat_refusals_name_the_element_and_field(raw: Any, field: str, problem: str) -> None:
    limits = Limits(46, 10, 40, non_text_part_chars=7)
    e = _refused(raw, limits=limits)
    assert e.message.startswith(f"aidb_memory.add: {field} "), e.message
    assert problem in e.message, e.message


# --- Responses items ----------------------------------------------------------------------------


def test_a_batch_with_any_type_is_responses_shaped() -> None:
    easy, msg = _batch({"role": "user", "content": "hi"}, _said("assistant", "hello"))
    assert easy.shape == msg.shape == "responses"
    assert easy.item == {"role": "user", "content": "hi"}
    assert (easy.role, easy.content, easy.kind, easy.item_type) == (
        "user",
        "hi",
        "user_prompt",
        "message",
    )
    assert (msg.role, msg.content, msg.kind) == ("assistant", "hello", "model_response")
    assert turns.batch_shape([{"role": "user", "content": "x"}]) == ("chat", None)


def test_responses_items_are_kept_verbatim_without_our_kind_and_meta() -> None:
    item = {**_fc("c1"), "caller": {"type": "direct"}, "namespace": "ns", "future_key": [1]}
    [t] = _batch({**item, "kind": "lookup", "meta": {"sequence_id": "s"}})
    assert t.item == item
    assert (t.kind, t.sequence_id, t.meta) == ("lookup", "s", {"sequence_id": "s"})


def test_function_call_and_output_projection() -> None:
    call, out = _batch(_fc("c1", "lookup", '{"q": 1}'), _out("c1", "found"))
    assert (call.role, call.content, call.kind, call.chars) == ("assistant", None, "tool_call", 8)
    assert call.tool_calls == [
        {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": 1}'}}
    ]
    assert (out.role, out.content, out.tool_call_id, out.kind, out.chars) == (
        "tool",
        "found",
        "c1",
        "tool_result",
        5,
    )


def test_an_empty_function_output_is_accepted() -> None:
    [out] = _batch(_out("c1", ""))
    assert (out.content, out.chars) == ("", 0)


def test_a_function_output_with_parts_costs_text_and_images() -> None:
    parts = [{"type": "input_text", "text": "chart:"}, {"type": "input_image", "image_url": "x"}]
    [out] = _batch(_out("c1", parts))
    assert (out.content, out.chars) == ("chart:", 6 + 7)


def test_reasoning_costs_its_summary_not_its_encrypted_content() -> None:
    [r] = _batch(
        {**_reasoning("thinking", "more"), "content": [{"type": "reasoning_text", "text": "raw"}]}
    )
    assert (r.role, r.kind, r.content, r.chars) == ("assistant", "reasoning", "thinking\nmore", 15)


def test_custom_and_computer_calls_need_outputs() -> None:
    custom = {"type": "custom_tool_call", "call_id": "k", "name": "grep", "input": "a|b"}
    action = {"type": "click", "button": "left", "x": 1, "y": 2}
    computer = {
        "type": "computer_call",
        "id": "cu_1",
        "call_id": "cc",
        "action": action,
        "pending_safety_checks": [],
        "status": "completed",
    }
    shot = {
        "type": "computer_call_output",
        "call_id": "cc",
        "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA"},
    }
    c, k_out, cc, shot_t = _batch(
        custom,
        {"type": "custom_tool_call_output", "call_id": "k", "output": "2 hits"},
        computer,
        shot,
    )
    assert c.tool_calls == [
        {"id": "k", "type": "function", "function": {"name": "grep", "arguments": "a|b"}}
    ]
    assert k_out.tool_call_id == "k" and k_out.content == "2 hits"
    assert cc.tool_calls is not None
    args = cc.tool_calls[0]["function"]
    assert args["name"] == "computer_call"
    assert args["arguments"] == (
        '{"action":{"type":"click","button":"left","x":1,"y":2},"pending_safety_checks":[]}'
    )
    assert (shot_t.role, shot_t.tool_call_id, shot_t.content, shot_t.chars) == (
        "tool",
        "cc",
        None,
        7,
    )


def test_hosted_calls_and_unknown_items_are_kept() -> None:
    search = {
        "type": "web_search_call",
        "id": "ws_1",
        "status": "completed",
        "action": {"type": "search", "query": "pg"},
    }
    unknown = {"type": "future_thing", "id": "ft_1", "blob": "abc"}
    s, u = _batch(search, unknown)
    assert (s.role, s.kind, s.tool_calls, s.item) == ("assistant", "tool_call", None, search)
    assert s.chars == len('{"action":{"type":"search","query":"pg"}}')
    assert (u.role, u.kind, u.chars) == ("assistant", "future_thing", len('{"blob":"abc"}'))


def test_a_developer_message_item_and_the_tool_search_output() -> None:
    d, o = _batch(_said("developer", "rules"), {"type": "tool_search_output", "tools": []})
    assert (d.role, d.kind, d.content) == ("developer", "developer", "rules")
    assert (o.role, o.kind, o.tool_call_id) == ("tool", "tool_result", None)


@pytest.mark.parametrize(
    ("raw", "field", "problem"),
    [
        (
            [{"type": "message", "role": "user", "content": "x"}, {"role": "tool", "content": "x"}],
            "turns[1].role",
            "Responses-shaped (turns[0] is a Responses item)",
        ),
        (
            [{"role": "assistant", "tool_calls": []}, _fc("c")],
            "turns[0].tool_calls",
            "Responses-shaped (turns[1] is a Responses item)",
        ),
        (
            [_fc("c"), {"role": "tool", "tool_call_id": "c", "content": "x"}],
            "turns[1].tool_call_id",
            "Chat Completions form",
        ),
        (
            [_fc("c"), {"role": "user", "content": "x", "name": "n"}],
            "turns[1].name",
            "is not a known key of a message without a type",
        ),
        ([_fc("c"), 3], "turns[1]", "must be an object"),
        ([{"type": ""}], "turns[0].type", "must not be empty"),
        ([{"type": 7}], "turns[0].type", "must be a string"),
        ([{"type": "message", "content": "x"}], "turns[0].role", "is required"),
        ([{"type": "message", "role": "tool", "content": "x"}], "turns[0].role", "must be one of"),
        ([{"type": "message", "role": "user"}], "turns[0].content", "is required"),
        (
            [{"type": "message", "role": "user", "content": ""}],
            "turns[0].content",
            "must not be empty",
        ),
        ([{"type": "message", "role": "user", "content": []}], "turns[0].content", "empty array"),
        ([{"type": "message", "role": "user", "content": 4}], "turns[0].content", "not a number"),
        (
            [{"type": "message", "role": "user", "content": [{"type": "input_text"}]}],
            "turns[0].content[0].text",
            "must be a string",
        ),
        ([{**_fc("c"), "call_id": None}], "turns[0].call_id", "is required"),
        ([{**_fc("c"), "call_id": "x" * 41}], "turns[0].call_id", "longer than 40"),
        ([{**_fc("c"), "name": ""}], "turns[0].name", "must not be empty"),
        ([{**_fc("c"), "arguments": {}}], "turns[0].arguments", "must be a string"),
        ([{**_fc("c"), "id": 5}], "turns[0].id", "must be a string"),
        ([{"type": "custom_tool_call", "call_id": "k", "name": "g"}], "turns[0].input", "string"),
        ([{"type": "function_call_output", "output": "x"}], "turns[0].call_id", "is required"),
        ([{"type": "function_call_output", "call_id": "c"}], "turns[0].output", "is required"),
        ([_out("c", {"a": 1})], "turns[0].output", "must be a string or an array"),
        ([_out("c", [{"type": "input_text", "text": 1}])], "turns[0].output[0].text", "string"),
        ([{"type": "reasoning", "id": "r"}], "turns[0].summary", "must be an array"),
        ([{**_reasoning("x"), "content": "raw"}], "turns[0].content", "must be an array"),
        ([{**_reasoning("x"), "encrypted_content": 1}], "turns[0].encrypted_content", "string"),
        ([{**_fc("c"), "kind": "summary"}], "turns[0].kind", "reserved"),
        ([{**_fc("c"), "meta": []}], "turns[0].meta", "must be an object"),
        ([_fc("c", arguments="x" * 47)], "turns[0].arguments", "has 47 characters"),
        ([_out("c", "x" * 47)], "turns[0].output", "has 47 characters"),
        ([_reasoning("x" * 47)], "turns[0].summary", "has 47 characters"),
        ([{"type": "message", "role": "user", "content": [IMAGE] * 7}], "turns[0].content", "49"),
        ([{"type": "future", "blob": "x" * 40}], "turns[0]", "more than the namespace limit"),
    ],
)
def test_responses_refusals_name_the_element_and_field(
    raw: list[Any], field: str, problem: str
) -> None:
    e = _refused(*raw, limits=Limits(46, 10, 40, non_text_part_chars=7))
    assert e.message.startswith(f"aidb_memory.add: {field} "), e.message
    assert problem in e.message, e.message


def test_a_refused_element_refuses_the_whole_batch() -> None:
    with pytest.raises(ApiError):
        _batch(_fc("a"), _out("a"), {"type": "message", "role": "nobody", "content": "x"})


# --- protocol -------------------------------------------------------------------------------------


def _protocol(*raw: Any, tail: Tail | None = None) -> list[str]:
    return turns.check_protocol("add", _batch(*raw), tail or Tail())


def _protocol_error(*raw: Any, tail: Tail | None = None) -> str:
    with pytest.raises(ApiError) as info:
        _protocol(*raw, tail=tail)
    assert info.value.sqlstate == INVALID_PARAMETER_VALUE
    return info.value.message


def test_parallel_calls_with_reasoning_between_and_outputs_in_any_order() -> None:
    assert (
        _protocol(
            {"role": "user", "content": "go"},
            _reasoning("plan"),
            _fc("a"),
            _reasoning("more"),
            _said("assistant", "calling two tools"),
            _fc("b"),
            _out("b"),
            _out("a"),
            _said("assistant", "done"),
        )
        == []
    )


def test_calls_left_open_are_returned_and_answered_later() -> None:
    assert _protocol(_fc("a"), _fc("b"), _out("a")) == ["b"]
    tail = Tail(open_calls=["b"], joinable=False)
    assert _protocol(_out("b"), {"role": "user", "content": "next"}, tail=tail) == []


def test_a_response_still_open_accepts_more_calls_in_the_next_add() -> None:
    batch = _batch(_reasoning("r"), _fc("a"))
    tail = turns.next_tail("add", batch, Tail(), [None, None], [1, 1])
    assert (tail.open_calls, tail.joinable, tail.last_type) == (["a"], True, "function_call")
    assert _protocol(_fc("b"), _out("a"), _out("b"), tail=tail) == []


def test_no_new_model_item_once_an_output_has_arrived() -> None:
    message = _protocol_error(_fc("a"), _fc("b"), _out("a"), _fc("c"))
    assert message.startswith('aidb_memory.add: turns[3] comes before tool call "b" has its output')
    message = _protocol_error(_fc("a"), _fc("b"), _out("a"), _reasoning("x"))
    assert message.startswith("aidb_memory.add: turns[3] comes before")
    tail = turns.next_tail(
        "add", _batch(_fc("a"), _fc("b"), _out("a")), Tail(), [None] * 3, [1] * 3
    )
    assert tail.joinable is False
    assert "comes before" in _protocol_error(_fc("c"), tail=tail)


@pytest.mark.parametrize("role", ["user", "system", "developer"])
def test_an_input_message_while_calls_are_open_is_refused(role: str) -> None:
    message = _protocol_error(_fc("a"), {"role": role, "content": "x"})
    assert message.startswith('aidb_memory.add: turns[1] comes before tool call "a" has its output')


def test_an_output_without_an_open_call_is_refused() -> None:
    message = _protocol_error({"role": "user", "content": "x"}, _out("a"))
    assert message.startswith('aidb_memory.add: turns[1].call_id "a" does not answer an open')
    assert _protocol_error(_fc("a"), _out("a"), _out("a")).startswith(
        "aidb_memory.add: turns[2].call_id"
    )


def test_a_call_id_already_open_is_refused() -> None:
    message = _protocol_error(_fc("a"), _fc("a"))
    assert message.startswith(
        'aidb_memory.add: turns[1].call_id "a" is the call_id of a call still open'
    )


def test_hosted_calls_need_no_output() -> None:
    search = {"type": "web_search_call", "id": "ws", "status": "completed"}
    files = {"type": "file_search_call", "id": "fs", "queries": ["q"], "status": "completed"}
    assert (
        _protocol(search, files, _said("assistant", "found"), {"role": "user", "content": "x"})
        == []
    )


def test_custom_and_computer_outputs_answer_by_call_id() -> None:
    custom = {"type": "custom_tool_call", "call_id": "k", "name": "g", "input": ""}
    computer = {
        "type": "computer_call",
        "id": "cu",
        "call_id": "cc",
        "action": {"type": "wait"},
        "pending_safety_checks": [],
        "status": "completed",
    }
    assert _protocol(custom, computer) == ["k", "cc"]
    shot = {
        "type": "computer_call_output",
        "call_id": "cc",
        "output": {"type": "computer_screenshot"},
    }
    k_out = {"type": "custom_tool_call_output", "call_id": "k", "output": "x"}
    assert _protocol(custom, computer, shot, k_out) == []


def test_chat_calls_left_open_cannot_be_joined_by_responses_calls() -> None:
    tail = Tail(open_calls=["a"])  # an old session: joinable defaults to False
    assert "comes before" in _protocol_error(_fc("b"), tail=tail)
    assert _protocol(_out("a"), tail=tail) == []


def test_a_chat_batch_after_open_responses_calls_answers_them_as_today() -> None:
    tail = Tail(open_calls=["a"], joinable=True)
    chat = [
        turns.validate_turn("add", 0, {"role": "tool", "content": "1", "tool_call_id": "a"}, LIMITS)
    ]
    assert turns.check_protocol("add", chat, tail) == []
    assistant = [turns.validate_turn("add", 0, {"role": "assistant", "content": "x"}, LIMITS)]
    with pytest.raises(ApiError):
        turns.check_protocol("add", assistant, tail)


# --- rounds ---------------------------------------------------------------------------------------


def _rounds(*raw: Any, tail: Tail | None = None, first: int = 1) -> list[int]:
    return turns.place_in_rounds(_batch(*raw), first, tail or Tail())


def test_parallel_calls_reasoning_and_outputs_form_one_round() -> None:
    assert _rounds(
        {"role": "user", "content": "go"},
        _reasoning("plan"),
        _fc("a"),
        _fc("b"),
        _out("b"),
        _out("a"),
        _reasoning("sum up"),
        _said("assistant", "done"),
    ) == [1, 2, 2, 2, 2, 2, 7, 7]


def test_items_between_open_calls_stay_in_their_round() -> None:
    assert _rounds(
        _fc("a"), _reasoning("x"), _said("assistant", "and"), _fc("b"), _out("a"), _out("b")
    ) == [1, 1, 1, 1, 1, 1]


def test_a_message_after_the_outputs_starts_a_round() -> None:
    assert _rounds(
        _fc("a"), _out("a"), _said("assistant", "x"), {"role": "user", "content": "y"}
    ) == [
        1,
        1,
        3,
        4,
    ]


def test_hosted_calls_of_one_response_form_one_round() -> None:
    search = {"type": "web_search_call", "id": "ws", "status": "completed"}
    assert _rounds(search, search, _said("assistant", "x")) == [1, 1, 3]


def test_rounds_continue_across_adds_through_the_tail() -> None:
    after_reasoning = Tail(round_start=5, last_type="reasoning")
    assert _rounds(_fc("a"), tail=after_reasoning, first=6) == [5]
    after_call = Tail(round_start=5, last_type="function_call", open_calls=["a"], joinable=True)
    assert _rounds(_fc("b"), _out("a"), tail=after_call, first=6) == [5, 5]
    after_chat = Tail(round_start=5, last_type=None)
    assert _rounds(_said("assistant", "x"), tail=after_chat, first=6) == [6]


def test_next_tail_is_everything_an_add_persists() -> None:
    batch = _batch({"role": "user", "content": "x", "meta": {"sequence_id": "s"}}, _reasoning("r"))
    seqs = turns.effective_sequence_ids(batch, Tail())
    starts = turns.place_in_rounds(batch, 3, Tail(), seqs)
    assert turns.next_tail("add", batch, Tail(), seqs, starts) == Tail(
        None, 4, [], False, "reasoning"
    )
    chat = [turns.validate_turn("add", 0, {"role": "user", "content": "x"}, LIMITS)]
    assert turns.next_tail("add", chat, Tail(), [None], [9]).last_type is None
