"""``aidb-memory mcp`` (issue 12, acceptance 4): the MCP server, driven by the ``mcp`` package's
own client over stdio, as a host (Claude Desktop, Cursor) would drive it.

Each test spawns ``python -m aidb_memory mcp ...`` connecting as the application role; the
memories come from the real extraction worker (with the fake OpenAI server as its model) or are
inserted as the worker would write them.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult

from conftest import APP_USER, REPO, WORKER_USER, Database, run_cli
from fake_openai import FakeOpenAI, Reply, serve

NS = "mem"
TOOLS = {"search_memories", "remember", "list_memories", "forget_memory"}


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    """The model of extraction: every event becomes one memory, the text of its user turn."""
    with serve() as server:

        def extract(request: Any) -> Reply:
            prompt = json.dumps(request.body.get("messages", []))
            fact = "Alice prefers window seats" if "window" in prompt else "A fact."
            op = {"op": "add", "text": fact, "target": None}
            return Reply(content=json.dumps({"operations": [op]}))

        server.default = extract
        yield server


@pytest.fixture
def ns(db: Database, fake: FakeOpenAI) -> None:
    """A namespace that extracts memories (its model is the fake server)."""
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
                   (actor_key, namespace_id, actor_id, content, content_hash)
               VALUES (aidb_memory.actor_key(%s, %s),
                       (SELECT id FROM aidb_memory.namespace WHERE name = %s), %s, %s, md5(%s))
               RETURNING public_id::text""",
            (NS, actor, NS, actor, content, content),
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


def test_remember_extract_search_list_forget(db: Database, ns: None) -> None:
    async def remember(client: Client) -> CallToolResult:
        return await client.call_tool("remember", {"fact": "I prefer window seats"})

    result = _with_client(db, remember)
    assert not result.is_error, _text(result)
    assert result.structured_content is not None
    assert result.structured_content["status"] == "accepted"
    event_id = result.structured_content["event_id"]
    # A user turn, added without a session, for the extraction worker.
    row = db.sql(
        "SELECT actor_id, session_id, turns FROM aidb_memory.event WHERE public_id = %s",
        (event_id,),
    )
    assert len(row) == 1
    actor, session, turns = row[0]
    assert (actor, session) == ("alice", None)
    assert [(t["role"], t["content"]) for t in turns] == [("user", "I prefer window seats")]

    worker = run_cli("worker", "--once", dsn=db.dsn(WORKER_USER))
    assert worker.returncode == 0, worker.stderr

    async def read_and_forget(client: Client) -> list[CallToolResult]:
        found = await client.call_tool("search_memories", {"query": "window seat"})
        listed = await client.call_tool("list_memories", {})
        assert found.structured_content is not None
        memory_id = found.structured_content["memories"][0]["id"]
        forgotten = await client.call_tool(
            "forget_memory", {"memory_id": memory_id, "reason": "the user asked"}
        )
        again = await client.call_tool(
            "forget_memory", {"memory_id": memory_id, "reason": "the user asked"}
        )
        after = await client.call_tool("list_memories", {"limit": 5})
        return [found, listed, forgotten, again, after]

    found, listed, forgotten, again, after = _with_client(db, read_and_forget)
    assert not found.is_error, _text(found)
    assert found.structured_content is not None and listed.structured_content is not None
    hits = found.structured_content["memories"]
    assert [h["content"] for h in hits] == ["Alice prefers window seats"]
    assert 0 < hits[0]["score"] <= 1
    assert [m["content"] for m in listed.structured_content["memories"]] == [
        "Alice prefers window seats"
    ]
    assert listed.structured_content["memories"][0]["id"] == hits[0]["id"]
    # The text content carries the same JSON, for hosts that read only text.
    assert json.loads(_text(found)) == found.structured_content
    assert not forgotten.is_error and forgotten.structured_content == {"deleted": 1}
    assert again.is_error and f"no memory of this user has the id {hits[0]['id']}" in _text(again)
    assert after.structured_content == {"memories": []}
    assert db.sql("SELECT action, reason FROM aidb_memory.audit_log WHERE action = 'delete'") == [
        ("delete", "the user asked")
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
            # And the server is still there after them.
            await client.call_tool("list_memories", {}),
        ]

    empty, too_many, bad_id, bad_limit, fine = _with_client(db, body)
    for result in (empty, too_many, bad_id, bad_limit):
        assert result.is_error
        assert "Traceback" not in _text(result)
        assert "22023: aidb_memory." in _text(result)
    assert "aidb_memory.search: query must not be empty" in _text(empty)
    assert "aidb_memory.search: limit must be between 1 and 100" in _text(too_many)
    assert "aidb_memory.delete:" in _text(bad_id)
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


def test_remember_in_a_namespace_that_does_not_extract_says_skipped(db: Database) -> None:
    db.sql("SELECT aidb_memory.init(%s, '{}', '{\"extraction\": false}')", (NS,))
    result = _call(db, "remember", {"fact": "I like tea"})
    assert not result.is_error, _text(result)
    assert result.structured_content is not None
    assert result.structured_content["status"] == "skipped"


def test_the_actor_can_come_from_the_environment(db: Database, ns: None) -> None:
    async def body(client: Client) -> CallToolResult:
        return await client.call_tool("remember", {"fact": "I live in Porto"})

    options = ("--namespace", NS, "--actor-from-env", "HOST_USER")
    result = _with_client(db, body, *options, env={"HOST_USER": "carol"})
    assert not result.is_error, _text(result)
    assert db.sql("SELECT actor_id FROM aidb_memory.event") == [("carol",)]


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
        remembered = await client.call_tool("remember", {"fact": "I like tea"})
        return [first, second, remembered]

    first, second, remembered = _with_client(db, body)
    assert not first.is_error and not second.is_error, _text(second)
    assert second.structured_content == first.structured_content
    assert not remembered.is_error, _text(remembered)
    assert db.value("SELECT count(*) FROM aidb_memory.event") == 1


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
