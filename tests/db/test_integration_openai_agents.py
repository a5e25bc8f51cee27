"""aidb_memory.integrations.openai_agents.AidbSession against the Agents SDK's own SQLiteSession.

The same agent (two function tools the model calls in parallel, after a reasoning item) runs
three turns with each session, against the fake OpenAI server's Responses API; every request the
model gets must carry the same ``input``. Then pop_item, get_items(limit) and clear_session are
compared on the same sequence of calls.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    SQLiteSession,
    function_tool,
)
from openai import AsyncOpenAI
from psycopg_pool import AsyncConnectionPool

from aidb_memory.client import AsyncMemory
from aidb_memory.integrations.openai_agents import CLEAR_REASON, AidbSession
from conftest import APP_USER, Database
from fake_openai import FakeOpenAI, Reply

NS = "agents_ns"
ACTOR = "erin"
QUESTIONS = [
    "Weather and time in Paris?",
    "And in Rome?",
    "Which of the two is warmer right now?",
]
CITIES = ["Paris", "Rome", "Oslo"]


@function_tool
async def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: {len(city) * 3}C, clear"


@function_tool
async def local_time(city: str) -> str:
    """The local time in a city."""
    return f"{city}: {len(city)}:00"


def script(turn: int) -> list[Reply]:
    """One turn: a reasoning item and two parallel calls, then the answer."""
    city = CITIES[turn]
    arguments = json.dumps({"city": city})
    return [
        Reply(
            output=[
                {
                    "type": "reasoning",
                    "id": f"rs_{turn}",
                    "summary": [{"type": "summary_text", "text": f"Look up {city} twice."}],
                    "encrypted_content": f"gAAAA-{turn}",
                },
                {
                    "type": "function_call",
                    "id": f"fc_{turn}_w",
                    "call_id": f"call_{turn}_w",
                    "name": "weather",
                    "arguments": arguments,
                    "status": "completed",
                },
                {
                    "type": "function_call",
                    "id": f"fc_{turn}_t",
                    "call_id": f"call_{turn}_t",
                    "name": "local_time",
                    "arguments": arguments,
                    "status": "completed",
                },
            ]
        ),
        Reply(
            output=[
                {
                    "type": "message",
                    "id": f"msg_{turn}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": answer(turn), "annotations": []}],
                }
            ]
        ),
    ]


def answer(turn: int) -> str:
    return f"In {CITIES[turn]} it is warm and early (turn {turn})."


def agent(fake: FakeOpenAI) -> Agent[Any]:
    client = AsyncOpenAI(base_url=fake.base_url, api_key="sk-fake", max_retries=0)
    return Agent(
        name="weather-bot",
        instructions="Answer with the tools.",
        tools=[weather, local_time],
        model=OpenAIResponsesModel(model="fake-model", openai_client=client),
        model_settings=ModelSettings(parallel_tool_calls=True),
    )


async def three_turns(fake: FakeOpenAI, session: Any) -> tuple[list[Any], list[str]]:
    """Run the three turns; the ``input`` of every request the model got, and the answers."""
    first = len(fake.calls("/responses"))
    answers = []
    for turn, question in enumerate(QUESTIONS):
        fake.queue(*script(turn))
        result = await Runner.run(
            agent(fake), question, session=session, run_config=RunConfig(tracing_disabled=True)
        )
        answers.append(str(result.final_output))
    return [r.body["input"] for r in fake.calls("/responses")[first:]], answers


@pytest.fixture
def ns(db: Database) -> Database:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    return db


@pytest.fixture
def sqlite() -> Iterator[SQLiteSession]:
    session = SQLiteSession("conv-1")
    try:
        yield session
    finally:
        session.close()


def test_runner_sends_the_same_input_as_with_sqlite_session(
    ns: Database, fake: FakeOpenAI, sqlite: SQLiteSession
) -> None:
    async def run() -> None:
        theirs, their_answers = await three_turns(fake, sqlite)
        async with AsyncConnectionPool(ns.dsn(APP_USER), open=False) as pool:
            session = AidbSession(
                "conv-1", namespace=NS, actor_id=ACTOR, agent_id="weather-bot", pool=pool
            )
            ours, our_answers = await three_turns(fake, session)
            stored = await session.get_items()
        assert our_answers == their_answers == [answer(t) for t in range(3)]
        assert len(ours) == len(theirs) == 6  # two model calls a turn
        for i, (mine, reference) in enumerate(zip(ours, theirs, strict=True)):
            assert mine == reference, f"request {i}"
        # The last request carries the whole history: 3 questions, and per turn a reasoning
        # item, two calls, their two outputs and the answer (but the newest turn's answer).
        kinds = [item.get("type", "message") for item in ours[-1]]
        assert kinds.count("reasoning") == 3
        assert kinds.count("function_call") == kinds.count("function_call_output") == 6
        assert stored == await sqlite.get_items()
        assert len(stored) == 3 * 7
        agent_id = ns.value("SELECT agent_id FROM aidb_memory.sessions WHERE session_id = 'conv-1'")
        assert agent_id == "weather-bot"

    asyncio.run(run())


async def both(
    ours: AidbSession, theirs: SQLiteSession, call: Callable[[Any], Any]
) -> tuple[Any, Any]:
    return await call(ours), await call(theirs)


def test_pop_get_and_clear_behave_like_sqlite_session(
    ns: Database, fake: FakeOpenAI, sqlite: SQLiteSession
) -> None:
    async def run() -> None:
        ours = AidbSession("conv-2", namespace=NS, actor_id=ACTOR, dsn=ns.dsn(APP_USER))
        try:
            # An unknown session: nothing to read or pop; clearing it is no error.
            assert await both(ours, sqlite, lambda s: s.get_items()) == ([], [])
            assert await both(ours, sqlite, lambda s: s.pop_item()) == (None, None)
            await ours.clear_session()
            fake.queue(*script(0))
            await Runner.run(
                agent(fake), QUESTIONS[0], session=ours, run_config=RunConfig(tracing_disabled=True)
            )
            await sqlite.add_items(await ours.get_items())
            history = await sqlite.get_items()
            assert len(history) == 7

            # get_items(limit): the newest items, in order; limit 0 is nothing, a negative one
            # everything. Ours never returns a tool result without its call, nor a call without
            # the reasoning item it came with (the model would refuse either): limits 2 to 5,
            # which cut into that round, give the answer alone.
            for limit in (0, 1, 6, 7, 8, -1):
                mine, reference = await both(ours, sqlite, lambda s, n=limit: s.get_items(n))
                assert mine == reference, limit
            for limit in (2, 3, 4, 5):
                assert await ours.get_items(limit) == history[-1:]
                assert await sqlite.get_items(limit) == history[-limit:]
            # The session's settings give the default limit, as the SDK's sessions do.
            ours.session_settings = sqlite.session_settings = type(sqlite.session_settings)(limit=6)
            mine, reference = await both(ours, sqlite, lambda s: s.get_items())
            assert mine == reference == history[-6:]
            ours.session_settings = sqlite.session_settings = type(sqlite.session_settings)()

            # pop_item: the newest item as it was added, until the session is empty.
            popped = await ours.pop_item()
            assert popped == await sqlite.pop_item() == history[-1]
            assert await both(ours, sqlite, lambda s: s.get_items()) == (history[:-1],) * 2
            for _ in range(6):
                mine, reference = await both(ours, sqlite, lambda s: s.pop_item())
                assert mine == reference
            assert reference == {"role": "user", "content": QUESTIONS[0]}
            assert await both(ours, sqlite, lambda s: s.pop_item()) == (None, None)
            assert await both(ours, sqlite, lambda s: s.get_items()) == ([], [])

            # Popped items go back in as they came (what the SDK's rewind does).
            await ours.add_items(history)
            await sqlite.add_items(history)
            assert await both(ours, sqlite, lambda s: s.get_items()) == (history, history)

            # clear_session: everything goes; the session can be used again.
            await ours.clear_session()
            await sqlite.clear_session()
            assert await both(ours, sqlite, lambda s: s.get_items()) == ([], [])
            assert await both(ours, sqlite, lambda s: s.pop_item()) == (None, None)
            again = [{"role": "user", "content": "hello again"}]
            await ours.add_items(again)  # type: ignore[arg-type]
            await sqlite.add_items(again)  # type: ignore[arg-type]
            assert await both(ours, sqlite, lambda s: s.get_items()) == (again, again)
        finally:
            await ours.close()

    asyncio.run(run())
    # The deletion is audited with the session's reason, and only that session's rows went.
    rows = ns.sql("SELECT action, counts, reason FROM aidb_memory.audit_log ORDER BY at")
    assert rows[-1] == ("session_delete", {"turns": 7, "sessions": 1}, CLEAR_REASON)


def test_limit_chars_budgets_the_read(ns: Database) -> None:
    async def run() -> None:
        ours = AidbSession(
            "conv-3", namespace=NS, actor_id=ACTOR, dsn=ns.dsn(APP_USER), limit_chars=30
        )
        try:
            turns = [
                {"role": "user", "content": "a" * 20},
                {"role": "assistant", "content": "b" * 20},
                {"role": "user", "content": "c" * 20},
            ]
            await ours.add_items(turns)  # type: ignore[arg-type]
            assert await ours.get_items() == turns[-1:]
            async with AsyncMemory(ns.dsn(APP_USER)) as memory:
                read = await memory.session_get(NS, ACTOR, "conv-3", limit_chars=30)
            assert read.overflow_chars == 40
        finally:
            await ours.close()

    asyncio.run(run())


def test_needs_a_dsn_or_a_pool() -> None:
    with pytest.raises(TypeError, match="dsn or a pool"):
        AidbSession("s", namespace=NS, actor_id=ACTOR)
    with pytest.raises(TypeError, match="dsn or a pool"):
        AidbSession("s", namespace=NS, actor_id=ACTOR, dsn="x", pool=object())  # type: ignore[arg-type]
