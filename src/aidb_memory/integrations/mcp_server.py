"""``aidb-memory mcp``: an MCP server that gives an agent the long-term memory of one actor.

Built on the official ``mcp`` package (the ``[mcp]`` extra) and the typed client. The server is
bound to one namespace and one actor when it starts; its tools never take either, so the model
cannot read or erase another actor's memories. The tools:

- ``search_memories(query, limit, filter)``: the actor's current memories that best match a
  query;
- ``remember(fact)``: stores the fact as one memory now (the SQL API's ``remember``: no model,
  no worker), so ``search_memories`` and ``list_memories`` show it in the same turn; it answers
  with the memory's id (for ``forget_memory``). A fact the actor already has, word for word, is
  not stored twice: the answer names the memory that holds it;
- ``list_memories(limit, filter)``: the actor's current memories, newest first;
- ``get_memory(memory_id)``, ``update_memory(memory_id, fact, metadata, reason)`` (in place,
  recorded in its history) and ``memory_history(memory_id)`` (every version);
- ``forget_memory(memory_id, reason)``: delete one memory by id, audited with the reason.

A memory carries its ``metadata`` (a JSON object: ``remember`` and ``update_memory`` take one);
``search_memories`` and ``list_memories`` take a ``filter`` on it (the SQL API's filters).

There is deliberately no tool that reads a session: the host owns the conversation.

A failure of a call (an error the SQL API raised) comes back as an MCP tool error whose text is
the server's message (with its SQLSTATE and hint), never a traceback. A connection lost between
calls is reopened on the next call; a read or ``remember`` that meets the lost connection is
tried once more on a new one (a ``remember`` that was stored before the connection was lost
is an exact duplicate the second time, which stores nothing and answers with the same id), a
``forget_memory`` is not.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import psycopg
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from psycopg import conninfo
from pydantic import BaseModel, Field

from aidb_memory import __version__
from aidb_memory.client import (
    AidbMemoryError,
    AsyncMemory,
    MemoryRecord,
    MemoryVersion,
    SearchHit,
)
from aidb_memory.client.errors import from_psycopg

__all__ = [
    "Forgotten",
    "FoundMemory",
    "History",
    "Link",
    "ListedMemory",
    "Memories",
    "MemoryItem",
    "Remembered",
    "SearchResult",
    "Version",
    "build_server",
    "serve",
]

T = TypeVar("T")

SERVER_NAME = "aidb-memory"
APPLICATION_NAME = "aidb-memory mcp"


class MemoryItem(BaseModel):
    """One long-term memory of the actor."""

    id: str = Field(description="the memory's id (for forget_memory)")
    content: str = Field(description="the fact")
    created_at: str = Field(description="when it was stored (ISO 8601)")
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="the memory's tags (a JSON object; {} when none)"
    )


class ListedMemory(MemoryItem):
    """A memory as list_memories, get_memory and update_memory show it."""

    expires_at: str | None = Field(
        default=None, description="when it will be forgotten (ISO 8601); null: never"
    )


class FoundMemory(MemoryItem):
    """A memory that search_memories found."""

    score: float = Field(description="how well it matches the query, in [0, 1]")


class SearchResult(BaseModel):
    memories: list[FoundMemory] = Field(description="best match first")


class Memories(BaseModel):
    memories: list[ListedMemory] = Field(description="newest first")


class Remembered(BaseModel):
    memory_id: str = Field(
        description="the id of the memory that holds the fact (for forget_memory); a fact "
        "already remembered word for word keeps its memory and id"
    )


class Forgotten(BaseModel):
    deleted: int = Field(description="how many memories were deleted (1)")


class Version(BaseModel):
    """One version of a memory."""

    version: int = Field(description="1 for the first")
    operation: str = Field(description="add, update, supersede or invalidate")
    content: str | None = Field(description="what the memory said after the change")
    previous_content: str | None = Field(description="what it said before")
    at: str = Field(description="when (ISO 8601)")
    reason: str | None = Field(description="why, when the change was given a reason")


class History(BaseModel):
    versions: list[Version] = Field(description="oldest first")


_FILTER_DESCRIPTION = (
    "only the memories whose metadata (or created_at, updated_at, agent_id, session_id, key) "
    'match, e.g. {"category": "preference"} or {"score": {"$gte": 3}}; operators $eq $ne $gt '
    "$gte $lt $lte $in $nin $exists, $and $or $not"
)


def _found(hit: SearchHit) -> FoundMemory:
    return FoundMemory(
        id=str(hit.id),
        content=hit.content,
        created_at=hit.created_at.isoformat(),
        metadata=hit.metadata,
        score=float(hit.score),
    )


def _item(record: MemoryRecord) -> ListedMemory:
    return ListedMemory(
        id=str(record.id),
        content=record.content,
        created_at=record.created_at.isoformat(),
        metadata=record.metadata,
        expires_at=None if record.expires_at is None else record.expires_at.isoformat(),
    )


def _version(version: MemoryVersion) -> Version:
    return Version(
        version=version.version,
        operation=version.operation,
        content=version.content,
        previous_content=version.previous_content,
        at=version.at.isoformat(),
        reason=version.reason,
    )


def _tool_error(error: AidbMemoryError) -> ToolError:
    """The MCP tool error for a failed call: the server's message, its SQLSTATE and hint."""
    return ToolError(str(error))


class Link:
    """The server's connection: one autocommit connection from a DSN, opened again when it was
    lost. ``memory()`` is the client on the current connection."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._memory: AsyncMemory | None = None
        self._lock = asyncio.Lock()

    @property
    def lost(self) -> bool:
        return self._conn is None or self._conn.closed

    async def memory(self) -> AsyncMemory:
        async with self._lock:
            if self._memory is None or self.lost:
                await self._close()
                try:
                    dsn = self.dsn
                    named = conninfo.conninfo_to_dict(dsn).get("application_name")
                    if not (named or os.environ.get("PGAPPNAME")):
                        dsn = conninfo.make_conninfo(dsn, application_name=APPLICATION_NAME)
                    self._conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
                except psycopg.Error as error:
                    raise from_psycopg(error) from error
                self._memory = AsyncMemory(self._conn)
            return self._memory

    async def run(self, call: Callable[[AsyncMemory], Awaitable[T]], *, retry: bool) -> T:
        """``call`` on the current connection; with ``retry``, once more on a new connection
        when the connection was lost during it."""
        memory = await self.memory()
        try:
            return await call(memory)
        except AidbMemoryError:
            # Lost: this call's connection is closed, or another call has replaced it already.
            if not (retry and (self.lost or memory is not self._memory)):
                raise
        return await call(await self.memory())

    async def _close(self) -> None:
        conn, self._conn, self._memory = self._conn, None, None
        if conn is not None and not conn.closed:
            await conn.close()

    async def close(self) -> None:
        async with self._lock:
            await self._close()


def build_server(link: Link, namespace: str, actor_id: str) -> MCPServer[Any]:
    """The MCP server with the memory tools, bound to ``namespace`` and ``actor_id``."""
    server: MCPServer[Any] = MCPServer(
        SERVER_NAME,
        version=__version__,
        instructions=(
            "Long-term memory of the user across conversations (aidb_memory). Search it before "
            "answering when earlier facts about the user could matter; remember a lasting fact "
            "the user states (a preference, a detail of their situation); forget a memory the "
            "user asks you to forget or that is wrong."
        ),
    )

    async def run(call: Callable[[AsyncMemory], Awaitable[T]], *, retry: bool = True) -> T:
        try:
            return await link.run(call, retry=retry)
        except AidbMemoryError as error:
            raise _tool_error(error) from error

    @server.tool(
        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
    )
    async def search_memories(
        query: Annotated[str, Field(description="what to look for, in words")],
        limit: Annotated[int, Field(description="at most this many (1 to 100)")] = 10,
        filter: Annotated[dict[str, Any] | None, Field(description=_FILTER_DESCRIPTION)] = None,
    ) -> SearchResult:
        """Search the user's long-term memories: the current facts that best match the query,
        best first."""
        hits = await run(lambda m: m.search(namespace, actor_id, query, limit=limit, filter=filter))
        return SearchResult(memories=[_found(hit) for hit in hits])

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True, open_world_hint=False))
    async def remember(
        fact: Annotated[
            str, Field(description="the fact, in a sentence, e.g. 'I prefer window seats'")
        ],
        metadata: Annotated[
            dict[str, Any] | None,
            Field(description='tags for the memory, e.g. {"category": "preference"}'),
        ] = None,
        ttl_s: Annotated[
            int | None,
            Field(
                description="forget it after this many seconds (e.g. 86400 for a fact that holds "
                "for a day); omit for a lasting fact",
                ge=1,
            ),
        ] = None,
    ) -> Remembered:
        """Remember a fact about the user: it is stored as a memory at once, so search_memories
        finds it in this same conversation. The fact is kept as written (no model rewrites or
        merges it); a fact already remembered word for word is not stored twice. To correct a
        fact, use update_memory; for one that holds only for a while, give ttl_s."""
        memory_id = await run(
            lambda m: m.remember(namespace, actor_id, fact, metadata=metadata, ttl_s=ttl_s)
        )
        return Remembered(memory_id=str(memory_id))

    @server.tool(
        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
    )
    async def list_memories(
        limit: Annotated[int, Field(description="at most this many (1 to 1000)")] = 50,
        filter: Annotated[dict[str, Any] | None, Field(description=_FILTER_DESCRIPTION)] = None,
    ) -> Memories:
        """List the user's current long-term memories, newest first."""
        records = await run(
            lambda m: m.list_memories(namespace, actor_id, limit=limit, filter=filter)
        )
        return Memories(memories=[_item(record) for record in records])

    @server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    async def get_memory(
        memory_id: Annotated[
            str, Field(description="the memory's id, from search_memories or list_memories")
        ],
    ) -> ListedMemory:
        """Read one of the user's memories by id."""
        record = await run(lambda m: m.get_memory(namespace, actor_id, memory_id=memory_id))
        if record is None:
            raise ToolError(f"no memory of this user has the id {memory_id}")
        return _item(record)

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True, open_world_hint=False))
    async def update_memory(
        memory_id: Annotated[
            str, Field(description="the memory's id, from search_memories or list_memories")
        ],
        fact: Annotated[str | None, Field(description="what the memory says now")] = None,
        metadata: Annotated[
            dict[str, Any] | None, Field(description="its tags now (replacing the old ones)")
        ] = None,
        reason: Annotated[
            str | None, Field(description="why, kept in its history (e.g. 'the user moved')")
        ] = None,
    ) -> ListedMemory:
        """Correct one of the user's memories in place (same id): its fact and/or its tags. The
        change is kept in the memory's history."""
        record = await run(
            lambda m: m.update_memory(
                namespace, actor_id, memory_id, content=fact, metadata=metadata, reason=reason
            ),
            retry=False,
        )
        return _item(record)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    async def memory_history(
        memory_id: Annotated[
            str, Field(description="the memory's id, from search_memories or list_memories")
        ],
    ) -> History:
        """Every version of one of the user's memories, oldest first: what it said, when, why."""
        versions = await run(lambda m: m.memory_history(namespace, actor_id, memory_id))
        return History(versions=[_version(v) for v in versions])

    @server.tool(
        annotations=ToolAnnotations(
            destructive_hint=True, idempotent_hint=True, open_world_hint=False
        ),
    )
    async def forget_memory(
        memory_id: Annotated[
            str, Field(description="the memory's id, from search_memories or list_memories")
        ],
        reason: Annotated[str, Field(description="why, for the audit log (e.g. 'the user asked')")],
    ) -> Forgotten:
        """Delete one of the user's memories by id, for good (the reason is audited)."""
        deleted = await run(
            lambda m: m.delete(namespace, actor_id, {"ids": [memory_id]}, reason),
            retry=False,
        )
        if deleted == 0:
            raise ToolError(f"no memory of this user has the id {memory_id}")
        return Forgotten(deleted=deleted)

    return server


async def serve(dsn: str, namespace: str, actor_id: str) -> None:
    """Connect, check that the namespace and actor can be used (a wrong one fails here, before
    any tool runs, with an :class:`AidbMemoryError`), then serve MCP over stdin and stdout until
    the host closes stdin."""
    link = Link(dsn)
    try:
        memory = await link.memory()
        await memory.list_memories(namespace, actor_id, limit=1)
        await build_server(link, namespace, actor_id).run_stdio_async()
    finally:
        await link.close()


def main(dsn: str, namespace: str, actor_id: str) -> int:
    """Run :func:`serve` (what ``aidb-memory mcp`` calls)."""
    asyncio.run(serve(dsn, namespace, actor_id))
    return 0
