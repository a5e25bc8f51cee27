"""Provider-native histories (issue 11): chat messages in every shape the Chat Completions API
takes, Responses API items, both read back losslessly in their own shape and converted into the
other by session_messages(format => ...). The conversions themselves are unit-tested
(tests/unit/test_items.py); here they run through add, the read window, pop and the worker.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import psycopg
import pytest
from agents.models.chatcmpl_converter import Converter

from conftest import APP_USER, WORKER_USER, Database
from fake_openai import FakeOpenAI, Reply

NS = "native"


@pytest.fixture
def ns(db: Database) -> Database:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    return db


def add(db: Database, turns: list[dict[str, Any]], session: str | None = "s") -> str:
    return str(
        db.value(
            "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, %s)",
            (NS, json.dumps(turns), session),
            user=APP_USER,
        )
    )


def messages(db: Database, format: str = "chat", session: str = "s", **limits: Any) -> Any:
    args = "".join(f", {k} => %s" for k in limits)
    return db.value(
        f"SELECT aidb_memory.session_messages(%s, 'alice', %s{args}, format => %s)",
        (NS, session, *limits.values(), format),
        user=APP_USER,
    )


def read(db: Database, session: str = "s", limit_chars: int | None = None) -> tuple[Any, ...]:
    rows = db.sql(
        "SELECT items, overflow_chars, warnings FROM aidb_memory.session_get(%s, 'alice', %s, %s)",
        (NS, session, limit_chars),
        user=APP_USER,
    )
    return tuple(rows[0])


def refused(db: Database, turns: list[dict[str, Any]], field: str) -> str:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        add(db, turns)
    message = caught.value.diag.message_primary or ""
    assert message.startswith(f"aidb_memory.add: {field} "), message
    return message


# A chat conversation in every shape the Chat Completions API allows (issue item 1).
CHAT = [
    {"role": "developer", "content": "Answer in French."},
    {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is on this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}},
        ],
        "name": "alice",
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": ""},
    {"role": "assistant", "content": None, "refusal": "I cannot describe people."},
    {"role": "user", "content": "Fine."},
    {"role": "assistant", "content": "Bien."},
]

# An Agents SDK run with a reasoning item and two parallel calls (issue item 2).
RESPONSES = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Two cities: call both tools."}],
        "encrypted_content": "gAAAAB" + "x" * 200,
    },
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_paris",
        "name": "weather",
        "arguments": '{"city": "Paris"}',
        "status": "completed",
    },
    {
        "type": "function_call",
        "id": "fc_2",
        "call_id": "call_rome",
        "name": "weather",
        "arguments": '{"city": "Rome"}',
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "call_rome", "output": "sunny, 24C"},
    {"type": "function_call_output", "call_id": "call_paris", "output": "rain, 14C"},
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Paris: rain. Rome: sun.", "annotations": []}],
    },
]


def test_every_chat_shape_round_trips(ns: Database) -> None:
    add(ns, CHAT)
    assert messages(ns) == CHAT
    items, _, warnings = read(ns)
    assert warnings == []
    by_role = [(i["role"], i.get("format"), i.get("item")) for i in items]
    # The caller's object is kept (as `item`) where the columns could not give it back.
    assert by_role[0] == ("developer", "chat", CHAT[0])
    assert by_role[2] == ("user", "chat", CHAT[2])
    assert by_role[6] == ("user", None, None)
    # content stays text in session_get: the parts' text.
    assert items[2]["content"] == "What is on this picture?"
    assert items[4]["content"] == ""


def test_responses_items_round_trip_and_convert_as_the_agents_sdk_does(ns: Database) -> None:
    add(ns, RESPONSES[:3])  # the second call comes in the next add: it still joins the first
    add(ns, RESPONSES[3:])
    assert messages(ns, "responses") == RESPONSES
    assert messages(ns, "chat") == Converter.items_to_messages(copy.deepcopy(RESPONSES))
    items, _, _ = read(ns)
    assert [i["item"] for i in items] == RESPONSES
    assert {i["format"] for i in items} == {"responses"}
    assert [i["kind"] for i in items] == [
        "user_prompt",
        "reasoning",
        "tool_call",
        "tool_call",
        "tool_result",
        "tool_result",
        "model_response",
    ]


def test_a_chat_history_reads_as_responses_input(ns: Database) -> None:
    add(
        ns,
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Time?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c9", "type": "function", "function": {"name": "now", "arguments": ""}}
                ],
            },
            {"role": "tool", "tool_call_id": "c9", "content": "12:00"},
            {"role": "assistant", "content": "Noon."},
        ],
    )
    converted = messages(ns, "responses")
    assert [i.get("type", "message") for i in converted] == [
        "message",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert converted[2]["call_id"] == "c9" and converted[2]["name"] == "now"
    assert converted[3] == {"type": "function_call_output", "call_id": "c9", "output": "12:00"}


def test_an_output_needs_its_call_earlier_in_the_session(ns: Database) -> None:
    refused(
        ns, [{"type": "function_call_output", "call_id": "nope", "output": "x"}], "turns[0].call_id"
    )
    assert read(ns)[0] == []  # nothing stored
    add(ns, RESPONSES[:3])
    add(ns, [RESPONSES[5]])  # the output of call_paris, one add later


def test_a_call_awaiting_its_output_is_withheld(ns: Database) -> None:
    add(ns, RESPONSES[:4])
    items, _, warnings = read(ns)
    assert [i["item"] for i in items] == RESPONSES[:1]
    assert warnings == ["tool_results_pending"]
    assert messages(ns, "responses") == RESPONSES[:1]
    add(ns, RESPONSES[4:6])
    assert messages(ns, "responses") == RESPONSES[:6]


def test_a_batch_is_one_shape(ns: Database) -> None:
    mixed = [RESPONSES[2], {"role": "tool", "tool_call_id": "call_paris", "content": "x"}]
    message = refused(ns, mixed, "turns[1].tool_call_id")
    assert "Responses-shaped" in message
    assert read(ns)[0] == []


def test_unknown_keys_of_a_chat_message_are_still_refused(ns: Database) -> None:
    refused(ns, [{"role": "user", "content": "hi", "colour": "red"}], "turns[0].colour")


def test_pop_gives_back_the_item_and_reopens_its_call(ns: Database) -> None:
    add(ns, RESPONSES[:6])
    popped = ns.value("SELECT aidb_memory.session_pop(%s, 'alice', 's')", (NS,), user=APP_USER)
    assert popped["item"] == RESPONSES[5] and popped["format"] == "responses"
    # call_paris is open again: a read withholds the round, and only its output may follow.
    assert read(ns)[2] == ["tool_results_pending"]
    refused(ns, [{"role": "user", "content": "next"}], "turns[0]")
    add(ns, [RESPONSES[5], RESPONSES[6]])
    assert messages(ns, "responses") == RESPONSES


def test_images_cost_the_namespace_s_fixed_chars(ns: Database) -> None:
    ns.sql(
        "SELECT aidb_memory.namespace_update(%s, config => '{\"non_text_part_chars\": 700}')",
        (NS,),
    )
    add(ns, [CHAT[2]])
    total = ns.value(
        "SELECT total_chars FROM aidb_memory.session_list(%s, 'alice')", (NS,), user=APP_USER
    )
    assert total == len("What is on this picture?") + 700


def test_a_bad_format_is_refused(ns: Database) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        messages(ns, "xml")
    assert caught.value.diag.message_primary == (
        "aidb_memory.session_messages: format must be chat or responses"
    )


def test_the_worker_extracts_from_responses_items_sent_without_a_session(
    db: Database, fake: FakeOpenAI
) -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\')', (NS,))
    add(db, RESPONSES, session=None)
    fake.queue(Reply(content=json.dumps({"operations": []})))
    with db.connect(WORKER_USER) as conn:
        conn.execute("CALL aidb_memory.process_events()")
    (request,) = fake.calls()
    sent = str(request.body["messages"][-1]["content"])
    assert "Weather in Paris and Rome?" in sent and "rain, 14C" in sent
    assert "gAAAAB" not in sent
    status = db.value("SELECT status FROM aidb_memory.events")
    assert status == "processed"


def test_a_compacted_responses_history_reads_back_with_a_summary_in_either_format(
    db: Database, fake: FakeOpenAI
) -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\')', (NS,))
    picture = {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "Look at this."},
            {"type": "input_image", "image_url": "data:image/png;base64,QUJDRA" + "A" * 500},
        ],
    }
    for i in range(6):
        add(db, [{**picture}] if i == 0 else [{"role": "user", "content": f"question {i} " * 20}])
        add(db, [RESPONSES[1], *RESPONSES[2:]])
    fake.queue(Reply(content="They asked about the weather, twice."))
    budget = 1200
    _, _, warnings = read(db, limit_chars=budget)
    assert warnings == [], warnings
    responses = messages(db, "responses", limit_chars=budget)
    assert responses[0] == {"role": "system", "content": "They asked about the weather, twice."}
    assert responses[-len(RESPONSES) + 1 :] == RESPONSES[1:]
    chat = messages(db, "chat", limit_chars=budget)
    assert chat[0] == {"role": "system", "content": "They asked about the weather, twice."}
    # The summarizer saw the texts and the image by type, never its payload nor encrypted text.
    (request,) = fake.calls()
    prompt = json.dumps(request.body["messages"])
    assert "Look at this." in prompt and "rain, 14C" in prompt
    assert "[image]" in prompt
    assert "QUJDRA" not in prompt and "gAAAAB" not in prompt


def test_pinned_instructions_come_back_in_their_own_shape(ns: Database) -> None:
    ns.sql(
        "SELECT aidb_memory.namespace_update(%s, config => '{\"pin_instructions\": true}')", (NS,)
    )
    rules = {"role": "developer", "content": [{"type": "text", "text": "Answer in French."}]}
    add(ns, [rules])
    for i in range(5):
        add(
            ns, [{"role": "user", "content": f"q{i} " * 30}, {"role": "assistant", "content": "ok"}]
        )
    chat = messages(ns, limit_chars=200)
    assert chat[0] == rules
    assert chat[-1] == {"role": "assistant", "content": "ok"}
    responses = messages(ns, "responses", limit_chars=200)
    assert responses[0] == {
        "role": "developer",
        "content": [{"type": "input_text", "text": "Answer in French."}],
    }


def test_every_kind_of_responses_item_is_kept_as_it_came(ns: Database) -> None:
    batch = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go."}]},
        {
            "type": "web_search_call",
            "id": "ws_1",
            "status": "completed",
            "action": {"type": "search", "query": "weather"},
        },
        {"type": "file_search_call", "id": "fs_1", "status": "completed", "queries": ["q"]},
        {
            "type": "custom_tool_call",
            "id": "ct_1",
            "call_id": "call_custom",
            "name": "grammar",
            "input": "SELECT 1",
        },
        {"type": "custom_tool_call_output", "call_id": "call_custom", "output": "1"},
        {
            "type": "computer_call",
            "id": "cu_1",
            "call_id": "call_screen",
            "action": {"type": "screenshot"},
            "pending_safety_checks": [],
            "status": "completed",
        },
        {
            "type": "computer_call_output",
            "call_id": "call_screen",
            "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AAAA"},
        },
        {"type": "some_future_item", "id": "x_1", "payload": {"any": ["thing", None]}},
    ]
    add(ns, batch)
    assert messages(ns, "responses") == batch
    items, _, warnings = read(ns)
    assert warnings == []
    assert [i["kind"] for i in items] == [
        "user_prompt",
        "tool_call",
        "tool_call",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
        "some_future_item",
    ]
