"""The asynchronous client, :class:`AsyncMemory`."""

# sync_client.py is generated from this file: edit this one, then run
#     python -m aidb_memory.client._async_to_sync
# There `async` and `await` are gone and the Async names are the sync ones; an `if True:  # ASYNC`
# block is AsyncMemory's alone (its `else:` part Memory's), an `if False:  # SYNC` block Memory's
# alone; Memory's docstring and the module's are _async_to_sync.DOCSTRINGS.

from __future__ import annotations

import datetime
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from aidb_memory.client import calls
from aidb_memory.client._shared import is_pool, log_read_warnings
from aidb_memory.client.errors import from_psycopg
from aidb_memory.client.types import (
    EventStatus,
    Handoff,
    Item,
    MemoryRecord,
    MemoryVersion,
    ReadResult,
    SearchHit,
    Session,
    SessionRow,
)

if True:  # ASYNC
    import asyncio

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

__all__ = ["AsyncMemory"]

T = TypeVar("T")


class AsyncMemory:
    """aidb_memory over psycopg 3, asynchronous: the methods of :class:`Memory`, awaited.

    ``AsyncMemory(source)``: ``source`` is a DSN (the client connects on first use, or in
    ``async with``, in autocommit, and closes in :meth:`close`), a ``psycopg.AsyncConnection``
    (used as it is, in the caller's transaction: never committed, rolled back or closed) or a
    ``psycopg_pool.AsyncConnectionPool`` (a connection borrowed for each call).
    ``log_warnings`` and ``prepare`` as for :class:`Memory`.
    """

    def __init__(
        self,
        source: str | psycopg.AsyncConnection[Any] | AsyncConnectionPool[Any],
        *,
        log_warnings: bool = False,
        prepare: bool = True,
    ) -> None:
        self.log_warnings = log_warnings
        self.prepare = prepare
        self._dsn: str | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._pool: AsyncConnectionPool[Any] | None = None
        if True:  # ASYNC
            self._lock: asyncio.Lock | None = None
        if isinstance(source, str):
            self._dsn = source
            if False:  # SYNC: Memory connects at once, AsyncMemory on first use
                self._conn = self._open(source)
        elif isinstance(source, psycopg.AsyncConnection):
            self._conn = source
        elif is_pool(source, "AsyncConnectionPool"):
            self._pool = source
        else:
            if True:  # ASYNC
                raise TypeError(
                    "AsyncMemory takes a DSN, a psycopg.AsyncConnection or a "
                    f"psycopg_pool.AsyncConnectionPool, not {type(source).__name__} "
                    "(Memory takes the sync ones)"
                )
            else:
                raise TypeError(
                    "Memory takes a DSN, a psycopg.Connection or a psycopg_pool.ConnectionPool, "
                    f"not {type(source).__name__} (AsyncMemory takes the async ones)"
                )

    # --- lifecycle ------------------------------------------------------------------------

    @staticmethod
    async def _open(dsn: str) -> psycopg.AsyncConnection[Any]:
        try:
            return await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        except psycopg.Error as error:
            raise from_psycopg(error) from error

    if True:  # ASYNC

        async def connect(self) -> AsyncMemory:
            """Open the connection of a client made from a DSN (the first call does it too)."""
            if self._dsn is not None and self._conn is None:
                if self._lock is None:
                    self._lock = asyncio.Lock()
                async with self._lock:
                    if self._conn is None:
                        self._conn = await self._open(self._dsn)
            return self

    async def close(self) -> None:
        """Close the connection the client opened from a DSN (a connection or pool it was
        given stays open)."""
        if self._dsn is not None and self._conn is not None:
            if True:  # ASYNC: the next call connects again
                conn, self._conn = self._conn, None
                await conn.close()
            else:  # Memory keeps it: a call after close() fails
                self._conn.close()

    async def __aenter__(self) -> AsyncMemory:
        if True:  # ASYNC
            return await self.connect()
        else:
            return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self._pool is not None:
            async with self._pool.connection() as conn:
                yield conn
        else:
            if True:  # ASYNC
                if self._conn is None:
                    await self.connect()
            assert self._conn is not None
            yield self._conn

    async def _run(self, call: calls.Call[T]) -> T:
        try:
            async with self._connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(call.query, call.params, prepare=self.prepare)
                rows = await cur.fetchall() if cur.description is not None else []
        except psycopg.Error as error:
            raise from_psycopg(error) from error
        return call.decode(rows)

    # --- sessions -------------------------------------------------------------------------

    async def session_start(
        self,
        namespace: str,
        actor_id: str,
        *,
        agent_id: str | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Open a session, or resume one (its stored row and the previous handoff)."""
        return await self._run(calls.session_start(namespace, actor_id, agent_id, session_id))

    async def add(
        self,
        namespace: str,
        actor_id: str,
        turns: Sequence[Mapping[str, Any]] | Jsonb,
        *,
        session_id: str | None = None,
        agent_id: str | None = None,
        idempotency_key: str | None = None,
        memory_metadata: Mapping[str, Any] | None = None,
    ) -> uuid.UUID:
        """Store a batch of turns (chat messages or Responses items), all or none; the id of
        the event recorded for long-term memory. ``memory_metadata``: a JSON object the worker
        copies onto every memory it makes of these turns."""
        return await self._run(
            calls.add(
                namespace, actor_id, turns, session_id, agent_id, idempotency_key, memory_metadata
            )
        )

    async def session_get(
        self,
        namespace: str,
        actor_id: str,
        session_id: str,
        *,
        limit_chars: int | None = None,
        fallback_model: str | None = None,
        limit_turns: int | None = None,
        limit_items: int | None = None,
    ) -> ReadResult:
        """Read a session's history under the budget rule (compacting when over budget)."""
        result = await self._run(
            calls.session_get(
                namespace,
                actor_id,
                session_id,
                limit_chars,
                fallback_model,
                limit_turns,
                limit_items,
            )
        )
        if self.log_warnings and result.warnings:
            log_read_warnings("session_get", namespace, actor_id, session_id, result.warnings)
        return result

    async def session_messages(
        self,
        namespace: str,
        actor_id: str,
        session_id: str,
        *,
        limit_chars: int | None = None,
        fallback_model: str | None = None,
        limit_turns: int | None = None,
        limit_items: int | None = None,
        format: str = "chat",
    ) -> list[dict[str, Any]]:
        """The same read, as chat messages (``format="chat"``) or a Responses input list
        (``format="responses"``)."""
        return await self._run(
            calls.session_messages(
                namespace,
                actor_id,
                session_id,
                limit_chars,
                fallback_model,
                limit_turns,
                limit_items,
                format,
            )
        )

    async def session_end(
        self, namespace: str, actor_id: str, session_id: str, *, notes: str | None = None
    ) -> Handoff | None:
        """Close a session and return its handoff (None for an unknown session)."""
        return await self._run(calls.session_end(namespace, actor_id, session_id, notes))

    async def session_pop(self, namespace: str, actor_id: str, session_id: str) -> Item | None:
        """Remove the newest turn and return it (None when the session is empty)."""
        return await self._run(calls.session_pop(namespace, actor_id, session_id))

    async def session_list(
        self,
        namespace: str,
        actor_id: str,
        *,
        agent_id: str | None = None,
        include_closed: bool | None = None,
        limit: int | None = None,
    ) -> list[SessionRow]:
        """The actor's sessions, most recently active first."""
        return await self._run(
            calls.session_list(namespace, actor_id, agent_id, include_closed, limit)
        )

    async def session_delete(
        self, namespace: str, actor_id: str, session_id: str, reason: str
    ) -> int:
        """Erase a session with its turns and summaries (audited with the reason); how many
        turns it removed (0: no such session)."""
        return await self._run(calls.session_delete(namespace, actor_id, session_id, reason))

    # --- long-term memory -----------------------------------------------------------------

    async def search(
        self,
        namespace: str,
        actor_id: str,
        query: str,
        *,
        limit: int | None = None,
        session_id: str | None = None,
        agent_id: str | None = None,
        query_embedding: Sequence[float] | None = None,
        filter: Mapping[str, Any] | None = None,
        offset: int | None = None,
    ) -> list[SearchHit]:
        """The actor's current memories that best match ``query``, best first, among those
        ``filter`` selects (metadata keys and created_at, updated_at, agent_id, session_id, key;
        $eq $ne $gt $gte $lt $lte $in $nin $exists $and $or $not), the best ``offset`` skipped.
        ``query_embedding``: the query's vector by the namespace's embedding model, when the
        application has it (no embedding call is made)."""
        return await self._run(
            calls.search(
                namespace,
                actor_id,
                query,
                limit,
                session_id,
                agent_id,
                query_embedding,
                filter,
                offset,
            )
        )

    async def remember(
        self,
        namespace: str,
        actor_id: str,
        content: str,
        *,
        session_id: str | None = None,
        agent_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        key: str | None = None,
        expires_at: datetime.datetime | None = None,
        ttl_s: int | None = None,
    ) -> uuid.UUID:
        """Store one memory now, in this call's transaction and without a model, tagged with
        ``metadata`` (a JSON object, which search and list_memories return); its id (an exact
        duplicate of a current keyless memory of the actor stores nothing and returns that
        memory's id, so a retry is safe). ``search`` finds it at once. ``key``: the
        application's name for the memory; a put on a key the actor has changes that memory in
        place (same id). ``expires_at``, or ``ttl_s`` (seconds from now): when it expires
        (neither: the namespace's config.memory_ttl_s, or never)."""
        return await self._run(
            calls.remember(
                namespace, actor_id, content, session_id, agent_id, metadata, key, expires_at, ttl_s
            )
        )

    async def list_memories(
        self,
        namespace: str,
        actor_id: str,
        *,
        session_id: str | None = None,
        agent_id: str | None = None,
        limit: int | None = None,
        include_superseded: bool | None = None,
        filter: Mapping[str, Any] | None = None,
        after: uuid.UUID | str | None = None,
    ) -> list[MemoryRecord]:
        """The actor's memories, newest first, those ``filter`` selects (as search's); ``after``
        the id of the last memory of the previous page, for the next."""
        return await self._run(
            calls.list_memories(
                namespace,
                actor_id,
                session_id,
                agent_id,
                limit,
                include_superseded,
                filter,
                after,
            )
        )

    async def list_actors(
        self,
        namespace: str,
        *,
        prefix: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[str]:
        """The actors of a namespace granted to the caller's role, in code-point order, a page
        at a time (``after``: the last actor of the previous page)."""
        return await self._run(calls.list_actors(namespace, prefix, limit, after))

    async def get_memory(
        self,
        namespace: str,
        actor_id: str,
        *,
        memory_id: uuid.UUID | str | None = None,
        key: str | None = None,
        refresh_ttl: bool | None = None,
    ) -> MemoryRecord | None:
        """The actor's memory with this id (current or superseded) or its current memory with
        this key (one of the two); None when there is none (or it expired). ``refresh_ttl``: a
        memory with a time to live lives that long again from now."""
        return await self._run(calls.get_memory(namespace, actor_id, memory_id, key, refresh_ttl))

    async def update_memory(
        self,
        namespace: str,
        actor_id: str,
        memory_id: uuid.UUID | str,
        *,
        content: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> MemoryRecord:
        """Correct a current memory in place (same id): its text and/or its metadata (replaced
        as a whole), recorded in its history with ``reason``; the memory afterwards."""
        return await self._run(
            calls.update_memory(namespace, actor_id, memory_id, content, metadata, reason)
        )

    async def memory_history(
        self, namespace: str, actor_id: str, memory_id: uuid.UUID | str
    ) -> list[MemoryVersion]:
        """Every version of the actor's memory, oldest first (none for an id it does not
        have)."""
        return await self._run(calls.memory_history(namespace, actor_id, memory_id))

    async def delete(
        self,
        namespace: str,
        actor_id: str,
        selector: Mapping[str, Any] | Jsonb,
        reason: str,
        *,
        session_id: str | None = None,
        agent_id: str | None = None,
    ) -> int:
        """Delete the memories ``selector`` names (``{"ids": [...]}``, ``{"all": True}``,
        ``{"before": timestamp}``); how many."""
        return await self._run(
            calls.delete(namespace, actor_id, selector, reason, session_id, agent_id)
        )

    async def forget(self, namespace: str, actor_id: str, reason: str) -> dict[str, int]:
        """Erase every trace of an actor in a namespace; the counts of what went."""
        return await self._run(calls.forget(namespace, actor_id, reason))

    async def status(
        self, namespace: str, actor_id: str, event_id: uuid.UUID | str
    ) -> EventStatus | None:
        """The status of an event ``add`` returned (None: unknown, or another actor's)."""
        return await self._run(calls.status(namespace, actor_id, event_id))
