"""``aidb-memory mcp`` (issue 12, acceptance 4): the MCP server, driven by the ``mcp`` package's
own client over stdio, as a host (Claude Desktop, Cursor) would drive it.

Each test spawns ``python -m aidb_memory mcp ...`` connecting as the application role; the
memories come from the ``remember`` tool (a direct write, no worker and no model: the namespace's
model is the fake OpenAI server, which must see no request) or are inserted as the worker would
write them.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult

from conftest import APP_USER, REPO, Database, run_cli
from fake_openai import FakeOpenAI, serve

NS = "mem"
TOOLS = {
    "search_memories",
    "remember",
    "list_memories",
    "get_memory",
    "update_memory",
    "memory_history",
    "forget_memory",
}


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    """The namespace's model, which the tools never call."""
    with serve() as server:
        yield server


@pytest.fixture
def ns(db: Database, fake: FakeOpenAI) -> None:
    """A namespace with a model (the fake server) for extraction."""
    opts = {"model": "fake-chat", "base_url": fake.base_url}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\')', (NS,))


def _params(
    db: Database, *options: str, env: dict[str, str] | None = None
) -> StdioServerParameters:
    args = ["-m", "aidb_memory", "mcp", "--dsn", db.dsn(APP_USER), *options]
    return StdioServerParameters(
        command=sys.executable,
        args=args,
        env={"PYTHONPATH": str(REPO / "src"), **(env or {})},
    )


def _with_client(
    db: Database,
    body: Callable[[Client], Awaitable[Any]],
    *options: str,
    env: dict[str, str] | None = None,
) -> Any:
    """Run ``body`` with a client connected to a fresh ``aidb-memory mcp`` over stdio."""
    options = options or ("--namespace", NS, "--actor", "alice")

    async def main() -> Any:
        async with Client(_params(db, *options, env=env), cache=None) as client:
            return await body(client)

    return asyncio.run(main())


def _call(db: Database, tool: str, arguments: dict[str, Any], *options: str) -> CallToolResult:
    return _with_client(db, lambda c: c.call_tool(tool, arguments), *options)  # type: ignore[no-any-return]


def _text(result: CallToolResult) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def _memory(db: Database, content: str, actor: str) -> str:
    """A memory inserted as the worker writes one; its public id."""
    return str(
        db.value(
            """INSERT INTO aidb_memory.memory
                   (actor_key, namespace_id, actor_id, content, content_hash, lexemes)
               VALUES (aidb_memory.actor_key(%s, %s),
                       (SELECT id FROM aidb_memory.namespace WHERE name = %s), %s, %s, md5(%s),
                       to_tsvector('english', %s))
               RETURNING public_id::text""",
            (NS, actor, NS, actor, content, content, content),
        )
    )


def test_the_tools_are_the_memory_tools_and_none_reads_a_session(db: Database, ns: None) -> None:
    async def body(client: Client) -> Any:
        return (await client.list_tools()).tools

    tools = {tool.name: tool for tool in _with_client(db, body)}
    assert set(tools) == TOOLS
    # The namespace and actor are the server's, never the model's to choose.
    for tool in tools.values():
        properties = set(tool.input_schema.get("properties", {}))
        assert not properties & {"namespace", "actor_id", "actor", "session_id"}, tool.name
    assert set(tools["search_memories"].input_schema["required"]) == {"query"}
    assert set(tools["forget_memory"].input_schema["required"]) == {"memory_id", "reason"}
    assert tools["search_memories"].annotations is not None
    assert tools["search_memories"].annotations.read_only_hint is True
    assert tools["forget_memory"].annotations is not None
    assert tools["forget_memory"].annotations.destructive_hint is True


def _memories(db: Database) -> list[tuple[str, str, str]]:
    """Every memory stored: (public id, actor, content), oldest first."""
    return db.sql(  # type: ignore[no-any-return]
        "SELECT public_id::text, actor_id, content FROM aidb_memory.memory ORDER BY id"
    )


def test_remember_is_searchable_at_once_then_forgotten(
    db: Database, ns: None, fake: FakeOpenAI
) -> None:
    async def body(client: Client) -> list[CallToolResult]:
        remembered = await client.call_tool("remember", {"fact": "I prefer window seats"})
        # In the same conversation, with no worker and no model: found and listed at once.
        found = await client.call_tool("search_memories", {"query": "window seat"})
        listed = await client.call_tool("list_memories", {})
        # The same fact again (a host retrying, or the model repeating itself): the same memory.
        again = await client.call_tool("remember", {"fact": "I prefer window seats"})
        assert remembered.structured_content is not None
        memory_id = remembered.structured_content["memory_id"]
        forgotten = await client.call_tool(
            "forget_memory", {"memory_id": memory_id, "reason": "the user asked"}
        )
        twice = await client.call_tool(
            "forget_memory", {"memory_id": memory_id, "reason": "the user asked"}
        )
        after = await client.call_tool("list_memories", {"limit": 5})
        return [remembered, found, listed, again, forgotten, twice, after]

    remembered, found, listed, again, forgotten, twice, after = _with_client(db, body)
    assert not remembered.is_error, _text(remembered)
    assert remembered.structured_content is not None
    memory_id = remembered.structured_content["memory_id"]
    assert remembered.structured_content == {"memory_id": memory_id}
    assert json.loads(_text(remembered)) == remembered.structured_content
    assert found.structured_content is not None and listed.structured_content is not None
    hits = found.structured_content["memories"]
    assert [(h["id"], h["content"]) for h in hits] == [(memory_id, "I prefer window seats")]
    assert 0 < hits[0]["score"] <= 1
    assert [(m["id"], m["content"]) for m in listed.structured_content["memories"]] == [
        (memory_id, "I prefer window seats")
    ]
    # The text content carries the same JSON, for hosts that read only text.
    assert json.loads(_text(found)) == found.structured_content
    assert again.structured_content == {"memory_id": memory_id}
    # Stored directly: no event for the worker, no model call, the fact as the user said it.
    assert db.value("SELECT count(*) FROM aidb_memory.event") == 0
    assert fake.requests == []
    assert not forgotten.is_error and forgotten.structured_content == {"deleted": 1}
    assert twice.is_error and f"no memory of this user has the id {memory_id}" in _text(twice)
    assert after.structured_content == {"memories": []}
    assert _memories(db) == []
    assert db.sql("SELECT action, reason FROM aidb_memory.audit_log WHERE action = 'delete'") == [
        ("delete", "the user asked")
    ]


def test_metadata_filters_and_a_correction_kept_in_the_history(db: Database, ns: None) -> None:
    async def body(client: Client) -> list[CallToolResult]:
        seat = await client.call_tool(
            "remember", {"fact": "I prefer window seats", "metadata": {"topic": "travel"}}
        )
        await client.call_tool(
            "remember", {"fact": "I like green tea", "metadata": {"topic": "food"}}
        )
        assert seat.structured_content is not None
        memory_id = seat.structured_content["memory_id"]
        travel = await client.call_tool("list_memories", {"filter": {"topic": "travel"}})
        found = await client.call_tool(
            "search_memories", {"query": "tea seats", "filter": {"topic": {"$ne": "travel"}}}
        )
        updated = await client.call_tool(
            "update_memory",
            {"memory_id": memory_id, "fact": "I prefer aisle seats", "reason": "changed mind"},
        )
        got = await client.call_tool("get_memory", {"memory_id": memory_id})
        history = await client.call_tool("memory_history", {"memory_id": memory_id})
        return [travel, found, updated, got, history]

    travel, found, updated, got, history = _with_client(db, body)
    for result in (travel, found, updated, got, history):
        assert not result.is_error, _text(result)
        assert result.structured_content is not None
    assert [(m["content"], m["metadata"]) for m in travel.structured_content["memories"]] == [
        ("I prefer window seats", {"topic": "travel"})
    ]
    assert [m["content"] for m in found.structured_content["memories"]] == ["I like green tea"]
    assert updated.structured_content["content"] == "I prefer aisle seats"
    assert updated.structured_content["metadata"] == {"topic": "travel"}
    assert got.structured_content == updated.structured_content
    versions = history.structured_content["versions"]
    assert [(v["version"], v["operation"], v["content"], v["reason"]) for v in versions] == [
        (1, "add", "I prefer window seats", None),
        (2, "update", "I prefer aisle seats", "changed mind"),
    ]


def test_sql_errors_are_tool_errors_with_the_message_never_a_traceback(
    db: Database, ns: None
) -> None:
    async def body(client: Client) -> list[CallToolResult]:
        return [
            await client.call_tool("search_memories", {"query": "   "}),
            await client.call_tool("search_memories", {"query": "seats", "limit": 500}),
            await client.call_tool("forget_memory", {"memory_id": "not-a-uuid", "reason": "x"}),
            await client.call_tool("list_memories", {"limit": 0}),
            # Longer than the namespace's memory_max_chars (1000 by default).
            await client.call_tool("remember", {"fact": "x" * 1001}),
            # And the server is still there after them.
            await client.call_tool("list_memories", {}),
        ]

    empty, too_many, bad_id, bad_limit, too_long, fine = _with_client(db, body)
    for result in (empty, too_many, bad_id, bad_limit, too_long):
        assert result.is_error
        assert "Traceback" not in _text(result)
        assert "22023: aidb_memory." in _text(result)
    assert "aidb_memory.search: query must not be empty" in _text(empty)
    assert "aidb_memory.search: limit must be between 1 and 100" in _text(too_many)
    assert "aidb_memory.delete:" in _text(bad_id)
    assert "aidb_memory.remember: content" in _text(too_long)
    assert _memories(db) == []
    assert not fine.is_error and fine.structured_content == {"memories": []}


def test_the_tools_see_only_the_servers_actor(db: Database, ns: None) -> None:
    mine = _memory(db, "Alice has a cat called Miso", "alice")
    theirs = _memory(db, "Bob has a cat called Pixel", "bob")

    async def body(client: Client) -> list[CallToolResult]:
        return [
            await client.call_tool("search_memories", {"query": "cat called"}),
            await client.call_tool("list_memories", {}),
            await client.call_tool("forget_memory", {"memory_id": theirs, "reason": "x"}),
        ]

    found, listed, forget = _with_client(db, body)
    assert found.structured_content is not None and listed.structured_content is not None
    assert [m["id"] for m in found.structured_content["memories"]] == [mine]
    assert [m["id"] for m in listed.structured_content["memories"]] == [mine]
    assert forget.is_error
    assert db.value("SELECT count(*) FROM aidb_memory.memory WHERE actor_id = 'bob'") == 1


def test_a_fact_remembered_for_a_while_says_when_it_will_be_forgotten(
    db: Database, ns: None
) -> None:
    async def body(client: Client) -> list[CallToolResult]:
        brief = await client.call_tool("remember", {"fact": "I am in a meeting", "ttl_s": 3600})
        await client.call_tool("remember", {"fact": "I live in Lisbon"})
        listed = await client.call_tool("list_memories", {})
        refused = await client.call_tool("remember", {"fact": "I am away", "ttl_s": 0})
        return [brief, listed, refused]

    brief, listed, refused = _with_client(db, body)
    assert not brief.is_error and not listed.is_error
    assert listed.structured_content is not None
    expiry = {m["content"]: m["expires_at"] for m in listed.structured_content["memories"]}
    assert expiry["I live in Lisbon"] is None
    left = datetime.datetime.fromisoformat(expiry["I am in a meeting"]) - datetime.datetime.now(
        datetime.UTC
    )
    assert datetime.timedelta(minutes=59) < left <= datetime.timedelta(hours=1)
    assert refused.is_error, "a time to live of 0 is refused before the call"
    assert [content for _, _, content in _memories(db)] == ["I am in a meeting", "I live in Lisbon"]


def test_remember_without_a_model_or_extraction_stores_the_fact(db: Database) -> None:
    # remember is no extraction: it stores in a namespace with extraction off too.
    db.sql("SELECT aidb_memory.init(%s, '{}', '{\"extraction\": false}')", (NS,))

    async def body(client: Client) -> list[CallToolResult]:
        return [
            await client.call_tool("remember", {"fact": "I like green tea"}),
            await client.call_tool("search_memories", {"query": "tea"}),
        ]

    remembered, found = _with_client(db, body)
    assert not remembered.is_error, _text(remembered)
    assert remembered.structured_content is not None and found.structured_content is not None
    memory_id = remembered.structured_content["memory_id"]
    assert [m["id"] for m in found.structured_content["memories"]] == [memory_id]
    assert _memories(db) == [(memory_id, "alice", "I like green tea")]


def test_the_actor_can_come_from_the_environment(db: Database, ns: None) -> None:
    async def body(client: Client) -> CallToolResult:
        return await client.call_tool("remember", {"fact": "I live in Porto"})

    options = ("--namespace", NS, "--actor-from-env", "HOST_USER")
    result = _with_client(db, body, *options, env={"HOST_USER": "carol"})
    assert not result.is_error, _text(result)
    assert [(actor, content) for _, actor, content in _memories(db)] == [
        ("carol", "I live in Porto")
    ]


def test_a_lost_connection_is_opened_again(db: Database, ns: None) -> None:
    _memory(db, "Alice has a cat called Miso", "alice")

    async def body(client: Client) -> list[CallToolResult]:
        first = await client.call_tool("list_memories", {})
        # An administrator (or a failover) ends the server's backend between two calls.
        terminated = db.sql(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
            "WHERE application_name = 'aidb-memory mcp' AND datname = current_database()"
        )
        assert terminated == [(True,)]
        second = await client.call_tool("list_memories", {})
        # A remember that meets a lost connection is tried again on a new one.
        assert db.sql(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
            "WHERE application_name = 'aidb-memory mcp' AND datname = current_database()"
        ) == [(True,)]
        remembered = await client.call_tool("remember", {"fact": "I like tea"})
        # What makes that retry safe when the first try was stored before the connection was
        # lost: the same fact again is the same memory, stored once.
        again = await client.call_tool("remember", {"fact": "I like tea"})
        return [first, second, remembered, again]

    first, second, remembered, again = _with_client(db, body)
    assert not first.is_error and not second.is_error, _text(second)
    assert second.structured_content == first.structured_content
    assert not remembered.is_error, _text(remembered)
    assert again.structured_content == remembered.structured_content
    assert [content for _, _, content in _memories(db)] == [
        "Alice has a cat called Miso",
        "I like tea",
    ]


def test_the_server_stops_when_the_host_closes_stdin(db: Database, ns: None) -> None:
    result = run_cli("mcp", "--namespace", NS, "--actor", "alice", dsn=db.dsn(APP_USER), input="")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""


def test_a_wrong_namespace_fails_at_start_with_one_line(db: Database, ns: None) -> None:
    result = run_cli(
        "mcp", "--namespace", "nope", "--actor", "alice", dsn=db.dsn(APP_USER), input=""
    )
    assert result.returncode == 1
    assert result.stderr == (
        'aidb-memory: mcp: namespace "nope" does not exist '
        "(hint: an admin creates it with aidb_memory.init)\n"
    )
    assert result.stdout == ""


def test_a_wrong_dsn_fails_at_start_with_one_line(db: Database) -> None:
    dsn = db.dsn("no_such_role")
    result = run_cli("mcp", "--namespace", NS, "--actor", "alice", dsn=dsn, input="")
    assert result.returncode == 1
    assert result.stderr.startswith("aidb-memory: cannot connect to "), result.stderr
    assert 'role "no_such_role" does not exist' in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_an_actor_from_an_unset_variable_is_a_usage_error(db: Database) -> None:
    result = run_cli(
        "mcp", "--namespace", NS, "--actor-from-env", "AIDB_TEST_UNSET", dsn=db.dsn(APP_USER)
    )
    assert result.returncode == 2
    assert "$AIDB_TEST_UNSET is empty or not set" in result.stderr
    result = run_cli("mcp", "--namespace", NS, dsn=db.dsn(APP_USER))
    assert result.returncode == 2
    assert "one of the arguments --actor --actor-from-env is required" in result.stderr
