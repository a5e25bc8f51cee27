"""items.py: stored rows to Chat Completions messages and Responses input, both ways, and what
the summarizer is shown. Round trips are hypothesis properties; Responses → chat is checked
against the OpenAI Agents SDK's own converter."""

from __future__ import annotations

import copy
import json
from typing import Any

from agents.models.chatcmpl_converter import Converter
from hypothesis import given, settings
from hypothesis import strategies as st

from aidb_memory_server import items, turns
from aidb_memory_server.compaction import Source, extractive_sources, transcript
from aidb_memory_server.turns import Limits, Turn

LIMITS = Limits(
    max_turn_chars=10**6, max_turns_per_add=1000, max_identifier_chars=64, non_text_part_chars=100
)
B64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "YPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
ENCRYPTED = "gAAAAABoZENCRYPTEDxyz"


def row_of(t: Turn) -> dict[str, Any]:
    """A turn as the database stores and reads it back (jsonb columns through JSON)."""
    return json.loads(
        json.dumps(
            {
                "role": t.role,
                "content": t.content,
                "kind": t.kind,
                "name": t.name,
                "tool_calls": t.tool_calls,
                "tool_call_id": t.tool_call_id,
                "item": t.item,
                "shape": t.shape,
            }
        )
    )


def stored(batch: list[Any]) -> list[dict[str, Any]]:
    return [row_of(t) for t in turns.validate_batch("add", batch, LIMITS)]


def _plain(value: Any) -> Any:
    """As JSON values (the SDK's TypedDicts are dicts already; tuples become lists)."""
    return json.loads(json.dumps(value))


# --- strategies ---------------------------------------------------------------------------------

text = st.text(min_size=1, max_size=8).filter(lambda s: s.strip() != "")
any_text = st.text(max_size=8)
ident = st.text("abcdef0123_", min_size=1, max_size=8)
names = st.none() | ident
json_leaf = st.none() | st.booleans() | st.integers(-5, 5) | any_text
breakpoint_ = st.just({"mode": "explicit"})


def _maybe(key: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(st.just({}), values.map(lambda v: {key: v}))


chat_text_part = st.builds(
    lambda t, extra: {"type": "text", "text": t, **extra},
    any_text,
    _maybe("prompt_cache_breakpoint", breakpoint_),
)
chat_user_part = st.one_of(
    chat_text_part,
    st.builds(
        lambda u, d: {"type": "image_url", "image_url": {"url": u, **d}},
        text,
        _maybe("detail", st.sampled_from(["auto", "low", "high"])),
    ),
    st.builds(
        lambda d, f: {"type": "input_audio", "input_audio": {"data": d, "format": f}},
        text,
        st.sampled_from(["wav", "mp3"]),
    ),
    st.builds(
        lambda d: {"type": "file", "file": d},
        st.dictionaries(st.sampled_from(["file_id", "filename", "file_data"]), text, min_size=1),
    ),
    st.builds(lambda x: {"type": "shiny_new_part", "payload": x}, json_leaf),
)
refusal_part = st.builds(lambda r: {"type": "refusal", "refusal": r}, any_text)


def _with_name(message: dict[str, Any], name: str | None) -> dict[str, Any]:
    return message if name is None else {**message, "name": name}


function_call = st.builds(
    lambda i, n, a, typed: {
        "id": i,
        **({"type": "function"} if typed else {}),
        "function": {"name": n, "arguments": a},
    },
    ident,
    ident,
    any_text,
    st.booleans(),
)
custom_call = st.builds(
    lambda i, n, x: {"id": i, "type": "custom", "custom": {"name": n, "input": x}},
    ident,
    ident,
    any_text,
)
tool_calls = st.lists(function_call | custom_call, min_size=1, max_size=3)

user_message = st.builds(
    lambda c, n: _with_name({"role": "user", "content": c}, n),
    text | st.lists(chat_user_part | chat_text_part, min_size=1, max_size=3),
    names,
)
instruction_message = st.builds(
    lambda r, c, n: _with_name({"role": r, "content": c}, n),
    st.sampled_from(["system", "developer"]),
    text | st.lists(chat_text_part, min_size=1, max_size=2),
    names,
)


@st.composite
def assistant_message(draw: st.DrawFn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant"}
    calls = draw(st.none() | tool_calls)
    refusal = draw(st.none() | any_text)
    if calls is not None:
        message["tool_calls"] = calls
    if refusal is not None:
        message["refusal"] = refusal
    if calls is not None or refusal is not None:
        content = draw(st.sampled_from(["absent", "null", "empty", "text", "parts"]))
    else:
        content = draw(st.sampled_from(["text", "parts"]))
    if content == "null":
        message["content"] = None
    elif content == "empty":
        message["content"] = ""
    elif content == "text":
        message["content"] = draw(text)
    elif content == "parts":
        message["content"] = draw(st.lists(chat_text_part | refusal_part, min_size=1, max_size=2))
    if draw(st.booleans()):
        message["audio"] = {"id": draw(ident)}
        message.setdefault("content", None)
    return _with_name(message, draw(names))


tool_message = st.builds(
    lambda i, c, n: _with_name({"role": "tool", "tool_call_id": i, "content": c}, n),
    ident,
    any_text | st.lists(chat_text_part, min_size=1, max_size=2),
    names,
)
chat_message = st.one_of(user_message, instruction_message, assistant_message(), tool_message)


# Responses items: what the Agents SDK converts (for the comparison with its converter).
def _input_part(role: str) -> st.SearchStrategy[dict[str, Any]]:
    text_part = st.builds(
        lambda t, extra: {"type": "input_text", "text": t, **extra},
        any_text,
        _maybe("prompt_cache_breakpoint", breakpoint_),
    )
    if role != "user":
        return text_part
    return st.one_of(
        text_part,
        st.builds(
            lambda u, d: {"type": "input_image", "image_url": u, **d},
            text,
            _maybe("detail", st.sampled_from(["auto", "low", "high", "original"])),
        ),
        st.builds(
            lambda d, f: {"type": "input_file", "file_data": d, **f},
            text,
            _maybe("filename", text),
        ),
        st.builds(lambda i: {"type": "input_file", "file_id": i}, ident),
        st.builds(
            lambda d, f: {"type": "input_audio", "input_audio": {"data": d, "format": f}},
            text,
            st.sampled_from(["wav", "mp3"]),
        ),
    )


@st.composite
def input_message(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["user", "system", "developer"]))
    content = draw(text | st.lists(_input_part(role), min_size=1, max_size=3))
    form = draw(st.sampled_from(["easy", "typed", "returned"]))
    if form == "easy":
        return {"role": role, "content": content}
    message = {"type": "message", "role": role, "content": content}
    if form == "returned":
        message |= {"id": draw(ident), "status": "completed"}
    return message


output_text = st.builds(lambda t: {"type": "output_text", "text": t, "annotations": []}, any_text)
output_message = st.builds(
    lambda i, parts, phase: {
        "type": "message",
        "id": i,
        "role": "assistant",
        "status": "completed",
        "content": parts,
        **phase,
    },
    ident,
    st.lists(output_text | refusal_part, max_size=3),
    _maybe("phase", st.sampled_from(["commentary", "final_answer"])),
)
easy_assistant = st.builds(lambda t: {"role": "assistant", "content": t}, text)
responses_function_call = st.builds(
    lambda c, n, a, extra: {
        "type": "function_call",
        "call_id": c,
        "name": n,
        "arguments": a,
        **extra,
    },
    ident,
    ident,
    any_text,
    st.just({}) | st.builds(lambda i: {"id": i, "status": "completed"}, ident),
)
function_output = st.builds(
    lambda c, o: {"type": "function_call_output", "call_id": c, "output": o},
    ident,
    any_text | st.lists(_input_part("system") | _input_part("user"), min_size=1, max_size=3),
)
reasoning = st.builds(
    lambda i, s, enc: {
        "type": "reasoning",
        "id": i,
        "summary": [{"type": "summary_text", "text": t} for t in s],
        **enc,
    },
    ident,
    st.lists(any_text, max_size=2),
    st.just({}) | st.just({"encrypted_content": ENCRYPTED}),
)
file_search = st.builds(
    lambda i, q: {"type": "file_search_call", "id": i, "queries": q, "status": "completed"},
    ident,
    st.lists(text, max_size=2),
)
sdk_item = st.one_of(
    input_message(),
    output_message,
    easy_assistant,
    responses_function_call,
    function_output,
    reasoning,
    file_search,
)
# And what only the Responses API knows: kept verbatim all the same.
other_item = st.one_of(
    st.builds(
        lambda i, q: {
            "type": "web_search_call",
            "id": i,
            "status": "completed",
            "action": {"type": "search", "query": q},
        },
        ident,
        any_text,
    ),
    st.builds(
        lambda c, n, x: {"type": "custom_tool_call", "call_id": c, "name": n, "input": x},
        ident,
        ident,
        any_text,
    ),
    st.builds(
        lambda c, o: {"type": "custom_tool_call_output", "call_id": c, "output": o}, ident, any_text
    ),
    st.builds(
        lambda i, c: {
            "type": "computer_call",
            "id": i,
            "call_id": c,
            "status": "completed",
            "action": {"type": "click", "button": "left", "x": 1, "y": 2},
            "pending_safety_checks": [],
        },
        ident,
        ident,
    ),
    st.builds(
        lambda t, payload: {"type": t, **payload},
        st.sampled_from(["mcp_call", "image_generation_call", "item_reference", "future_item"]),
        st.dictionaries(st.sampled_from(["name", "output", "x"]), json_leaf, max_size=3),
    ),
)


# --- round trips --------------------------------------------------------------------------------


@settings(max_examples=300)
@given(st.lists(chat_message, min_size=1, max_size=6))
def test_chat_to_stored_to_chat_is_identity(messages: list[dict[str, Any]]) -> None:
    assert items.to_chat(stored(copy.deepcopy(messages))) == _plain(messages)


@settings(max_examples=300)
@given(st.lists(sdk_item | other_item, min_size=1, max_size=8))
def test_responses_to_stored_to_responses_is_identity(batch: list[dict[str, Any]]) -> None:
    assert items.to_responses(stored(copy.deepcopy(batch))) == _plain(batch)


@settings(max_examples=400, deadline=None)
@given(st.lists(sdk_item, min_size=1, max_size=8))
def test_responses_to_chat_matches_the_agents_sdk(batch: list[dict[str, Any]]) -> None:
    expected = _plain(Converter.items_to_messages(copy.deepcopy(batch)))
    assert items.to_chat(stored(batch)) == expected


def test_kind_and_meta_are_ours_and_never_read_back() -> None:
    rows = stored(
        [{"role": "developer", "content": "x", "kind": "rules", "meta": {"sequence_id": 1}}]
    )
    assert rows[0]["kind"] == "rules"
    assert items.to_chat(rows) == [{"role": "developer", "content": "x"}]
    rows = stored(
        [
            {
                "type": "function_call",
                "call_id": "c",
                "name": "f",
                "arguments": "{}",
                "meta": {"m": 1},
            }
        ]
    )
    assert items.to_responses(rows) == [
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    ]


# --- examples: parallel calls and reasoning in both formats --------------------------------------

RUN = [
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Two cities."}],
        "encrypted_content": ENCRYPTED,
    },
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_a",
        "name": "weather",
        "arguments": '{"city": "Paris"}',
        "status": "completed",
    },
    {
        "type": "function_call",
        "id": "fc_2",
        "call_id": "call_b",
        "name": "weather",
        "arguments": '{"city": "Oslo"}',
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "call_b", "output": "-3C"},
    {"type": "function_call_output", "call_id": "call_a", "output": "12C"},
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Paris 12C, Oslo -3C.", "annotations": []}],
    },
]


def test_a_run_with_parallel_calls_reads_as_chat() -> None:
    assert items.to_chat(stored(RUN)) == [
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_b", "content": "-3C"},
        {"role": "tool", "tool_call_id": "call_a", "content": "12C"},
        {"role": "assistant", "content": "Paris 12C, Oslo -3C."},
    ]


def test_a_summary_reads_as_a_system_message_in_both_formats() -> None:
    summary = {
        "role": "system",
        "content": "Earlier: hi.",
        "kind": "summary",
        "name": None,
        "tool_calls": None,
        "tool_call_id": None,
        "item": None,
        "shape": "chat",
    }
    rows = [summary, *stored(RUN)]
    assert items.to_chat(rows)[0] == {"role": "system", "content": "Earlier: hi."}
    assert items.to_responses(rows)[0] == {"role": "system", "content": "Earlier: hi."}
    assert items.to_responses(rows)[1:] == RUN


def test_chat_rows_read_as_responses_input() -> None:
    chat = [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "c2", "type": "custom", "custom": {"name": "g", "input": "raw"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": ""},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "ok"}]},
        {"role": "assistant", "refusal": "I can't say."},
        {"role": "assistant", "content": "A cat.", "name": "bot"},
    ]
    assert items.to_responses(stored(chat)) == [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "https://x/y.png", "detail": "auto"},
            ],
        },
        {"role": "assistant", "content": "Let me look."},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "g", "input": "raw"},
        {"type": "function_call_output", "call_id": "c1", "output": ""},
        {
            "type": "custom_tool_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "ok"}],
        },
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't say."}]},
        {"role": "assistant", "content": "A cat."},
    ]


def test_old_rows_read_in_both_formats() -> None:
    old = [
        {
            "role": "user",
            "content": "hi",
            "kind": "user_prompt",
            "name": None,
            "tool_calls": None,
            "tool_call_id": None,
            "item": None,
            "shape": "chat",
        },
        {
            "role": "assistant",
            "content": None,
            "kind": "tool_call",
            "name": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "1"}}
            ],
            "tool_call_id": None,
            "item": None,
            "shape": "chat",
        },
        {
            "role": "tool",
            "content": "2",
            "kind": "tool_result",
            "name": "f",
            "tool_calls": None,
            "tool_call_id": "c",
            "item": None,
            "shape": "chat",
        },
    ]
    assert items.to_chat(old) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": old[1]["tool_calls"]},
        {"role": "tool", "tool_call_id": "c", "content": "2"},
    ]
    assert items.to_responses(old) == [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "1"},
        {"type": "function_call_output", "call_id": "c", "output": "2"},
    ]


def test_items_chat_cannot_express_are_left_out_of_chat() -> None:
    batch = [
        {
            "type": "web_search_call",
            "id": "ws",
            "status": "completed",
            "action": {"type": "search", "query": "q"},
        },
        {"type": "custom_tool_call", "call_id": "k", "name": "g", "input": "x"},
        {"type": "custom_tool_call_output", "call_id": "k", "output": "done"},
        {
            "type": "computer_call",
            "id": "cu",
            "call_id": "cc",
            "status": "completed",
            "action": {"type": "wait"},
            "pending_safety_checks": [],
        },
        {
            "type": "computer_call_output",
            "call_id": "cc",
            "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64," + B64},
        },
    ]
    assert items.to_chat(stored(batch)) == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "k", "type": "custom", "custom": {"name": "g", "input": "x"}}],
        },
        {"role": "tool", "tool_call_id": "k", "content": "done"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "cc",
                    "type": "function",
                    "function": {
                        "name": "computer_call",
                        "arguments": '{"action":{"type":"wait"},"pending_safety_checks":[]}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "cc", "content": "[tool output omitted]"},
    ]


# --- prompt_text --------------------------------------------------------------------------------


def test_prompt_text_describes_non_text_parts_and_never_sends_payloads() -> None:
    batch = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Read these."},
                {
                    "type": "input_image",
                    "image_url": "data:image/png;base64," + B64,
                    "detail": "auto",
                },
                {
                    "type": "input_file",
                    "file_data": "data:application/pdf;base64," + B64,
                    "filename": "report.pdf",
                },
                {"type": "input_audio", "input_audio": {"data": B64, "format": "wav"}},
            ],
        },
        *RUN[1:],
    ]
    texts = [items.prompt_text(r) for r in stored(batch)]
    assert texts[0] == "Read these.\n[image]\n[file report.pdf]\n[audio]"
    assert texts[1] == "(reasoning) Two cities."
    assert texts[2] == 'calls weather({"city": "Paris"}) as call_a'
    assert texts[4] == "-3C"
    assert texts[6] == "Paris 12C, Oslo -3C."
    for t in texts:
        assert B64 not in t and "base64" not in t and ENCRYPTED not in t


@given(st.lists(sdk_item | other_item | chat_message, min_size=1, max_size=5))
def test_prompt_text_never_contains_encrypted_content_or_image_data(batch: list[Any]) -> None:
    for element in batch:
        if "encrypted_content" in element:
            element["encrypted_content"] = ENCRYPTED
        for part in (
            element.get("content") or () if isinstance(element.get("content"), list) else ()
        ):
            if part.get("type") in ("input_image",):
                part["image_url"] = "data:image/png;base64," + B64
            if part.get("type") == "image_url":
                part["image_url"]["url"] = "data:image/png;base64," + B64
    rows = [row_of(turns.validate_batch("add", [e], LIMITS)[0]) for e in batch]
    for row in rows:
        text = items.prompt_text(row)
        assert ENCRYPTED not in text and B64 not in text


def test_chat_items_in_the_summarizer_prompt() -> None:
    [row] = stored(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "see"},
                    {"type": "image_url", "image_url": {"url": "data:," + B64}},
                ],
            }
        ]
    )
    assert items.prompt_text(row) == "see\n[image]"
    [row] = stored(
        [
            {
                "role": "assistant",
                "refusal": "no",
                "tool_calls": [
                    {"id": "c", "type": "custom", "custom": {"name": "g", "input": "x"}}
                ],
            }
        ]
    )
    assert items.prompt_text(row) == "(refused) no\ncalls g(x) as c"


def test_compaction_shows_items_through_prompt_text_and_old_turns_as_before() -> None:
    rows = stored(RUN[:3])
    sources = [
        Source(
            seq,
            r["role"],
            r["content"],
            r["name"],
            r["tool_calls"],
            r["tool_call_id"],
            r["item"],
            r["shape"],
        )
        for seq, r in enumerate(rows, 1)
    ]
    old = Source(
        4, "assistant", None, None, [{"id": "c", "function": {"name": "f", "arguments": "1"}}]
    )
    assert transcript([*sources, old]) == "\n".join(
        [
            "[1] user: Weather in Paris and Oslo?",
            "[2] assistant: (reasoning) Two cities.",
            '[3] assistant: calls weather({"city": "Paris"}) as call_a',
            "[4] assistant:",
            "    calls f(1) as c",
        ]
    )
    assert ENCRYPTED not in transcript(sources)
    assert extractive_sources(sources)[2] == {
        "role": "assistant",
        "content": 'calls weather({"city": "Paris"}) as call_a',
    }
