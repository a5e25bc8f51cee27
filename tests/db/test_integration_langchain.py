"""LangChain chat history (issue 12, item 3): AidbChatMessageHistory against a real server with
the real langchain-core: tool calls and tool messages round-trip with their ids, sync and async,
clear, budgets, a session written in the Responses shape, and LangChain's own
RunnableWithMessageHistory driving it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from aidb_memory.client import InvalidTurn, Memory
from aidb_memory.integrations.langchain import AidbChatMessageHistory
from conftest import APP_USER, Database

NS = "lc"


@pytest.fixture
def dsn(db: Database) -> str:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    return db.dsn(APP_USER)


def conversation() -> list[BaseMessage]:
    return [
        SystemMessage("You are a travel agent.", id="sys-1"),
        HumanMessage("Weather in Paris and Rome?", id="h-1", name="erin"),
        AIMessage(
            "",
            id="ai-1",
            tool_calls=[
                {"name": "weather", "args": {"city": "Paris"}, "id": "call_paris"},
                {"name": "weather", "args": {"city": "Rome"}, "id": "call_rome"},
            ],
        ),
        ToolMessage("sunny, 24C", tool_call_id="call_rome", id="t-rome"),
        ToolMessage("rain, 14C", tool_call_id="call_paris", id="t-paris"),
        AIMessage("Paris: rain. Rome: sun.", id="ai-2"),
        HumanMessage(
            [
                {"type": "text", "text": "And this one?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/map.png"}},
            ],
            id="h-2",
        ),
    ]


def shape(messages: list[BaseMessage]) -> list[tuple[Any, ...]]:
    """What must round-trip: type, id, content, name, tool calls, tool call id."""
    return [
        (
            m.type,
            m.id,
            m.content,
            m.name,
            [(c["name"], c["args"], c["id"]) for c in getattr(m, "tool_calls", [])],
            getattr(m, "tool_call_id", None),
        )
        for m in messages
    ]


def test_is_a_base_chat_message_history(dsn: str) -> None:
    history = AidbChatMessageHistory("c", namespace=NS, actor_id="erin", dsn=dsn)
    assert isinstance(history, BaseChatMessageHistory)
    history.close()


def test_round_trip_with_tool_calls_and_ids(dsn: str, db: Database) -> None:
    history = AidbChatMessageHistory(
        "conv-1", namespace=NS, actor_id="erin", agent_id="travel", dsn=dsn
    )
    assert history.messages == []
    sent = conversation()
    history.add_messages(sent[:3])
    # The round's calls are open: the read leaves it out until the tool messages are added.
    assert shape(history.messages) == shape(sent[:2])
    history.add_messages(sent[3:])
    assert shape(history.messages) == shape(sent)
    # add_message / add_user_message / add_ai_message go through add_messages.
    history.add_user_message("thanks")
    history.add_ai_message(AIMessage("you are welcome", id="ai-3"))
    got = history.messages
    assert [(m.type, m.content, m.id) for m in got[-2:]] == [
        ("human", "thanks", None),
        ("ai", "you are welcome", "ai-3"),
    ]
    # Stored as chat turns, the session's agent recorded, readable as chat by any client.
    with Memory(dsn) as memory:
        chat = memory.session_messages(NS, "erin", "conv-1")
        rows = memory.session_list(NS, "erin")
    assert chat[2]["tool_calls"][1]["id"] == "call_rome"
    assert chat[3] == {"role": "tool", "tool_call_id": "call_rome", "content": "sunny, 24C"}
    assert [(r.session_id, r.agent_id, r.turn_count) for r in rows] == [("conv-1", "travel", 9)]
    history.close()


def test_a_batch_is_all_or_none(dsn: str) -> None:
    history = AidbChatMessageHistory("conv-2", namespace=NS, actor_id="erin", dsn=dsn)
    history.add_messages([HumanMessage("hi")])
    with pytest.raises(InvalidTurn) as error:
        # A tool message that answers no call: the server refuses the batch, naming the turn.
        history.add_messages([AIMessage("hello"), ToolMessage("x", tool_call_id="nope")])
    assert error.value.index == 1
    assert [m.content for m in history.messages] == ["hi"]
    history.close()


def test_clear_erases_the_session(dsn: str) -> None:
    history = AidbChatMessageHistory("conv-3", namespace=NS, actor_id="erin", dsn=dsn)
    history.add_messages(conversation())
    other = AidbChatMessageHistory("conv-3", namespace=NS, actor_id="fred", dsn=dsn)
    other.add_messages([HumanMessage("fred's")])
    history.clear()
    assert history.messages == []
    assert [m.content for m in other.messages] == ["fred's"]
    history.add_messages([HumanMessage("again", id="h-9")])
    assert [(m.type, m.id, m.content) for m in history.messages] == [("human", "h-9", "again")]
    history.close()
    other.close()


def test_limit_items_and_summaries(dsn: str, db: Database) -> None:
    db.sql("SELECT aidb_memory.create_model('quotes', 'builtin', '{\"kind\": \"extractive\"}')")
    db.sql('SELECT aidb_memory.namespace_update(%s, \'{"llm": "quotes"}\')', (NS,))
    history = AidbChatMessageHistory(
        "conv-4", namespace=NS, actor_id="erin", dsn=dsn, limit_items=5
    )
    history.add_messages(conversation())
    # The newest 5 items: the tool round from its call on.
    assert [m.id for m in history.messages] == ["ai-1", "t-rome", "t-paris", "ai-2", "h-2"]
    # With 4, the round's results cannot come without their call: only what follows them.
    history.limit_items = 4
    assert [m.id for m in history.messages] == ["ai-2", "h-2"]
    long = AidbChatMessageHistory(
        "conv-5", namespace=NS, actor_id="erin", dsn=dsn, limit_chars=1200
    )
    for i in range(8):
        long.add_messages(
            [
                HumanMessage(f"Question {i}. " + "The trip is long. " * 10, id=f"q{i}"),
                AIMessage(f"Answer {i}. " + "Pack light. " * 10, id=f"a{i}"),
            ]
        )
    got = long.messages
    assert isinstance(got[0], SystemMessage) and got[0].id is None
    assert "Extractive summary" in str(got[0].content)
    assert [m.id for m in got[-2:]] == ["q7", "a7"]
    history.close()
    long.close()


def test_a_session_in_the_responses_shape_reads_through_the_server(dsn: str) -> None:
    with Memory(dsn) as memory:
        memory.add(
            NS,
            "erin",
            [
                {"role": "user", "content": "Weather in Paris?"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "call_p",
                    "name": "weather",
                    "arguments": '{"city": "Paris"}',
                },
                {"type": "function_call_output", "call_id": "call_p", "output": "rain"},
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Rain.", "annotations": []}],
                },
            ],
            session_id="agents-1",
        )
    history = AidbChatMessageHistory("agents-1", namespace=NS, actor_id="erin", dsn=dsn)
    got = history.messages
    assert [m.type for m in got] == ["human", "ai", "tool", "ai"]
    assert isinstance(got[1], AIMessage) and got[1].tool_calls[0]["args"] == {"city": "Paris"}
    assert got[3].content == "Rain."
    history.close()


def test_async_methods_with_a_pool(dsn: str) -> None:
    async def main() -> list[BaseMessage]:
        async with AsyncConnectionPool(dsn, open=False) as pool:
            history = AidbChatMessageHistory("conv-6", namespace=NS, actor_id="erin", pool=pool)
            await history.aadd_messages(conversation())
            got = await history.aget_messages()
            with pytest.raises(TypeError, match="async"):
                history.add_messages([HumanMessage("sync?")])
            await history.aclear()
            assert await history.aget_messages() == []
            return got

    assert shape(asyncio.run(main())) == shape(conversation())


def test_async_methods_with_a_dsn(dsn: str) -> None:
    async def main() -> list[BaseMessage]:
        history = AidbChatMessageHistory("conv-7", namespace=NS, actor_id="erin", dsn=dsn)
        await history.aadd_messages(conversation()[:2])
        got = await history.aget_messages()
        await history.aclose()
        return got

    assert shape(asyncio.run(main())) == shape(conversation()[:2])


@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")
def test_sync_pool_and_runnable_with_message_history(dsn: str) -> None:
    """LangChain's RunnableWithMessageHistory drives the history: it reads the messages into
    the prompt and stores the exchange after the call."""
    seen: list[list[BaseMessage]] = []

    def fake_model(prompt: Any) -> AIMessage:
        messages = prompt.to_messages()
        seen.append(messages)
        return AIMessage(f"echo: {messages[-1].content}")

    prompt = ChatPromptTemplate.from_messages(
        [MessagesPlaceholder("history"), ("human", "{question}")]
    )
    with ConnectionPool(dsn, open=True) as pool:
        chain = RunnableWithMessageHistory(
            prompt | RunnableLambda(fake_model),
            lambda session_id: AidbChatMessageHistory(
                session_id, namespace=NS, actor_id="erin", pool=pool
            ),
            input_messages_key="question",
            history_messages_key="history",
        )
        config: Any = {"configurable": {"session_id": "chain-1"}}
        assert chain.invoke({"question": "one"}, config=config).content == "echo: one"
        assert chain.invoke({"question": "two"}, config=config).content == "echo: two"
        history = AidbChatMessageHistory("chain-1", namespace=NS, actor_id="erin", pool=pool)
        assert [(m.type, m.content) for m in history.messages] == [
            ("human", "one"),
            ("ai", "echo: one"),
            ("human", "two"),
            ("ai", "echo: two"),
        ]
    assert [m.content for m in seen[1]] == ["one", "echo: one", "two"]


def test_exactly_one_source(dsn: str) -> None:
    with pytest.raises(TypeError, match="exactly one"):
        AidbChatMessageHistory("c", namespace=NS, actor_id="erin")
    with pytest.raises(TypeError, match="exactly one"):
        AidbChatMessageHistory("c", namespace=NS, actor_id="erin", dsn=dsn, memory=Memory(dsn))
