"""The synchronous client, :class:`Memory`."""

# Generated from async_client.py by `python -m aidb_memory.client._async_to_sync`: do not edit
# this file, edit that one and run this command (tests/unit/test_async_to_sync.py checks it).

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
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

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

__all__ = ["Memory"]

T = TypeVar("T")


class Memory:
    """aidb_memory over psycopg 3, synchronous.

    ``Memory(source)``: ``source`` is a DSN (the client opens its own autocommit connection and
    closes it in :meth:`close` or at the end of a ``with`` block), a ``psycopg.Connection`` (used
    as it is, in the caller's transaction: never committed, rolled back or closed) or a
    ``psycopg_pool.ConnectionPool`` (a connection borrowed for each call, committed when the call
    succeeds). ``log_warnings=True`` logs the warnings of ``session_get`` on the
    ``aidb_memory.client`` logger; they are on the result either way. Every statement is
    prepared on its connection the first time it runs; ``prepare=False`` turns that off (for a
    pooler in transaction mode that cannot keep prepared statements).

    One method per function of the SQL API, with its parameters' names; errors are
    :class:`~aidb_memory.client.AidbMemoryError` subclasses.
    """

    def __init__(
        self,
        source: str | psycopg.Connection[Any] | ConnectionPool[Any],
        *,
        log_warnings: bool = False,
        prepare: bool = True,
    ) -> None:
        self.log_warnings = log_warnings
        self.prepare = prepare
        self._dsn: str | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._pool: ConnectionPool[Any] | None = None
        if isinstance(source, str):
            self._dsn = source
            self._conn = self._open(source)
        elif isinstance(source, psycopg.Connection):
            self._conn = source
        elif is_pool(source, "ConnectionPool"):
            self._pool = source
        else:
            raise TypeError(
                "Memory takes a DSN, a psycopg.Connection or a psycopg_pool.ConnectionPool, "
                f"not {type(source).__name__} (AsyncMemory takes the async ones)"
            )

    # --- lifecycle ------------------------------------------------------------------------

    @staticmethod
    def _open(dsn: str) -> psycopg.Connection[Any]:
        try:
            return psycopg.Connection.connect(dsn, autocommit=True)
        except psycopg.Error as error:
            raise from_psycopg(error) from error

    def close(self) -> None:
        """Close the connection the client opened from a DSN (a connection or pool it was
        given stays open)."""
        if self._dsn is not None and self._conn is not None:
            self._conn.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        if self._pool is not None:
            with self._pool.connection() as conn:
                yield conn
        else:
            assert self._conn is not None
            yield self._conn

    def _run(self, call: calls.Call[T]) -> T:
        try:
            with self._connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
                cur.execute(call.query, call.params, prepare=self.prepare)
                rows = cur.fetchall() if cur.description is not None else []
        except psycopg.Error as error:
            raise from_psycopg(error) from error
        return call.decode(rows)

    # --- sessions -------------------------------------------------------------------------

    def session_start(
        self,
        namespace: str,
        actor_id: str,
        *,
        agent_id: str | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Open a session, or resume one (its stored row and the previous handoff)."""
        return self._run(calls.session_start(namespace, actor_id, agent_id, session_id))

    def add(
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
        return self._run(
            calls.add(
                namespace, actor_id, turns, session_id, agent_id, idempotency_key, memory_metadata
            )
        )

    def session_get(
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
        result = self._run(
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

    def session_messages(
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
        return self._run(
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

    def session_end(
        self, namespace: str, actor_id: str, session_id: str, *, notes: str | None = None
    ) -> Handoff | None:
        """Close a session and return its handoff (None for an unknown session)."""
        return self._run(calls.session_end(namespace, actor_id, session_id, notes))

    def session_pop(self, namespace: str, actor_id: str, session_id: str) -> Item | None:
        """Remove the newest turn and return it (None when the session is empty)."""
        return self._run(calls.session_pop(namespace, actor_id, session_id))

    def session_list(
        self,
        namespace: str,
        actor_id: str,
        *,
        agent_id: str | None = None,
        include_closed: bool | None = None,
        limit: int | None = None,
    ) -> list[SessionRow]:
        """The actor's sessions, most recently active first."""
        return self._run(calls.session_list(namespace, actor_id, agent_id, include_closed, limit))

    def session_delete(self, namespace: str, actor_id: str, session_id: str, reason: str) -> int:
        """Erase a session with its turns and summaries (audited with the reason); how many
        turns it removed (0: no such session)."""
        return self._run(calls.session_delete(namespace, actor_id, session_id, reason))

    # --- long-term memory -----------------------------------------------------------------

    def search(
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
        return self._run(
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

    def remember(
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
        return self._run(
            calls.remember(
                namespace, actor_id, content, session_id, agent_id, metadata, key, expires_at, ttl_s
            )
        )

    def list_memories(
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
        return self._run(
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

    def list_actors(
        self,
        namespace: str,
        *,
        prefix: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[str]:
        """The actors of a namespace granted to the caller's role, in code-point order, a page
        at a time (``after``: the last actor of the previous page)."""
        return self._run(calls.list_actors(namespace, prefix, limit, after))

    def get_memory(
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
        return self._run(calls.get_memory(namespace, actor_id, memory_id, key, refresh_ttl))

    def update_memory(
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
        return self._run(
            calls.update_memory(namespace, actor_id, memory_id, content, metadata, reason)
        )

    def memory_history(
        self, namespace: str, actor_id: str, memory_id: uuid.UUID | str
    ) -> list[MemoryVersion]:
        """Every version of the actor's memory, oldest first (none for an id it does not
        have)."""
        return self._run(calls.memory_history(namespace, actor_id, memory_id))

    def delete(
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
        return self._run(calls.delete(namespace, actor_id, selector, reason, session_id, agent_id))

    def forget(self, namespace: str, actor_id: str, reason: str) -> dict[str, int]:
        """Erase every trace of an actor in a namespace; the counts of what went."""
        return self._run(calls.forget(namespace, actor_id, reason))

    def status(
        self, namespace: str, actor_id: str, event_id: uuid.UUID | str
    ) -> EventStatus | None:
        """The status of an event ``add`` returned (None: unknown, or another actor's)."""
        return self._run(calls.status(namespace, actor_id, event_id))
