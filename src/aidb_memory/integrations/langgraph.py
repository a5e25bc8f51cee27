"""A LangGraph store over aidb_memory's long-term memories: :class:`AidbStore`.

Needs ``aidb-memory[langgraph]`` (langgraph).

**Namespaces.** A store namespace is the tuple ``(namespace, actor_id)``: an aidb_memory
namespace and an actor in it, e.g. ``("helpdesk", "alice")``. Every call of the SQL API is
per actor, so every operation names both; a shorter tuple (across actors) is refused with
``InvalidNamespaceError``, and so is a longer one.

**Items are memories.** An item's ``key`` is the memory's id (a UUID, as text), its ``value``
``{"content": text, "agent_id": ..., "session_id": ...}``, its ``created_at`` and
``updated_at`` the memory's. Only current memories are items (a fact a later one superseded is
not).

- ``get(ns, key)``: the memory with that id among the actor's newest 1,000 current memories
  (``list_memories`` returns at most 1,000; the SQL API has no read by id), else None.
- ``search(ns, query=...)``: ``search`` (full text, near words, vectors when the namespace
  embeds), best first, ``score`` in [0, 1]; ``offset + limit`` at most 100. Without a query:
  ``list_memories``, newest first, ``score`` None; ``offset + limit`` at most 1,000.
  ``filter`` may name ``session_id`` and ``agent_id`` (equality), which the server applies;
  any other filter is refused (``ValueError``).
- ``delete(ns, key)`` (and ``put`` of ``None``): ``delete`` of that id, audited with the
  store's ``delete_reason``. A key that is not a memory's id deletes nothing.
- ``put(ns, key, {"content": text})`` stores ``text`` as one memory now, through ``remember``
  (no model, no worker; ``search`` finds it at once), with the store's ``agent_id``. The value
  may also name ``agent_id`` and ``session_id`` (a string or None), so an item's value can be put
  back as it is. The memory gets an id of its own, which is its key (``put`` returns nothing:
  ``search`` shows it). Put is a replace: when ``key`` is the id of another of the actor's
  memories, that memory is deleted after the new one is stored (audited with
  ``delete_reason``), so ``put(ns, item.key, {"content": corrected})`` corrects a memory; a key
  that is no memory's id deletes nothing. A text the actor already has, word for word, is not
  stored twice (``remember`` answers with the existing memory), so a retried ``put`` is safe.
  Any other value (other keys, non-text content), ``index`` and ``ttl`` are refused rather than
  dropped. To have the extraction worker make memories of a conversation instead, ``add``
  its turns with the client.
- ``list_namespaces``: the SQL API lists no actors, so it answers only a prefix naming one
  ``(namespace, actor_id)``: that namespace when the actor has memories, else nothing; any other
  listing raises ``NotImplementedError``.

Give the store exactly one of ``dsn`` (sync and async clients, each with its own connection),
``pool`` (a psycopg_pool ``ConnectionPool`` for the sync methods, an ``AsyncConnectionPool`` for
the async ones) or ``memory`` (an :class:`~aidb_memory.client.Memory` or ``AsyncMemory``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    validate_op_namespace,
)

from aidb_memory.client import MemoryRecord, SearchHit
from aidb_memory.integrations._framework_clients import FrameworkClients

if TYPE_CHECKING:
    from aidb_memory.client import AsyncMemory, Memory

__all__ = ["AidbStore"]

DEFAULT_DELETE_REASON = "deleted through the LangGraph store (AidbStore)"
MAX_SEARCH = 100  # search's "limit"
MAX_LIST = 1000  # list_memories' "limit"


@dataclass
class _Call:
    """One call of the client and what makes its answer the op's result."""

    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    finish: Callable[[Any], Result] = lambda answer: None
    then: Callable[[Any], _Call | None] | None = None
    """The call to make next with this call's answer (its result is the op's), if any."""


def _pair(namespace: tuple[str, ...], what: str) -> tuple[str, str]:
    if len(namespace) != 2 or not all(isinstance(label, str) and label for label in namespace):
        raise InvalidNamespaceError(
            f"AidbStore: a {what} is (namespace, actor_id), not {namespace!r}; aidb_memory "
            "reads and writes one actor's memories at a time"
        )
    return namespace[0], namespace[1]


def _memory_id(key: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(key))
    except ValueError:
        return None


def _value(record: MemoryRecord | SearchHit) -> dict[str, Any]:
    return {
        "content": record.content,
        "agent_id": record.agent_id,
        "session_id": record.session_id,
    }


def _item(namespace: tuple[str, ...], record: MemoryRecord) -> Item:
    return Item(
        value=_value(record),
        key=str(record.id),
        namespace=namespace,
        created_at=record.created_at,
        updated_at=record.updated_at or record.created_at,
    )


def _filters(filter: dict[str, Any] | None) -> dict[str, str]:
    """The server-side filters of a search's ``filter``."""
    result: dict[str, str] = {}
    for key, wanted in (filter or {}).items():
        value = wanted.get("$eq") if isinstance(wanted, dict) and set(wanted) == {"$eq"} else wanted
        if key not in ("session_id", "agent_id") or not isinstance(value, str):
            raise ValueError(
                f"AidbStore: search filters by session_id or agent_id (a string) only, not "
                f"{key}={wanted!r}"
            )
        result[key] = value
    return result


def _window(offset: int, limit: int, most: int, how: str) -> int:
    if offset < 0 or limit < 1 or offset + limit > most:
        raise ValueError(
            f"AidbStore: {how} returns at most {most} memories: offset + limit must be 1 to "
            f"{most}, not {offset} + {limit}"
        )
    return offset + limit


class AidbStore(BaseStore):
    """A LangGraph ``BaseStore`` whose items are aidb_memory's long-term memories; the module
    docstring says how each operation maps to the SQL API, and what it does not honour.

    ``agent_id`` is recorded on the memories ``put`` stores (unless the value names one);
    ``delete_reason`` is the audited reason of every delete (and of a memory a ``put`` replaced).
    """

    __slots__ = ("_clients", "agent_id", "delete_reason")

    def __init__(
        self,
        *,
        dsn: str | None = None,
        pool: Any = None,
        memory: Memory | AsyncMemory | None = None,
        agent_id: str | None = None,
        delete_reason: str = DEFAULT_DELETE_REASON,
    ) -> None:
        self._clients = FrameworkClients("AidbStore", dsn=dsn, pool=pool, memory=memory)
        self.agent_id = agent_id
        self.delete_reason = delete_reason

    # --- the operations as calls of the client ----------------------------------------------

    def _plan(self, op: Op) -> _Call | None:
        """The client call that answers ``op`` (None: the answer is None without a call)."""
        validate_op_namespace(op)
        if isinstance(op, GetOp):
            return self._plan_get(op)
        if isinstance(op, SearchOp):
            return self._plan_search(op)
        if isinstance(op, PutOp):
            return self._plan_put(op)
        if isinstance(op, ListNamespacesOp):
            return self._plan_list_namespaces(op)
        raise TypeError(f"AidbStore: unknown operation {type(op).__name__}")

    def _plan_get(self, op: GetOp) -> _Call | None:
        namespace, actor = _pair(op.namespace, "namespace")
        wanted = _memory_id(op.key)
        if wanted is None:
            return None

        def finish(records: list[MemoryRecord]) -> Item | None:
            for record in records:
                if record.id == wanted:
                    return _item(op.namespace, record)
            return None

        return _Call("list_memories", (namespace, actor), {"limit": MAX_LIST}, finish)

    def _plan_search(self, op: SearchOp) -> _Call:
        namespace, actor = _pair(op.namespace_prefix, "namespace prefix")
        filters = _filters(op.filter)
        prefix = op.namespace_prefix
        if op.query:
            count = _window(op.offset, op.limit, MAX_SEARCH, "search with a query")

            def hits(found: list[SearchHit]) -> list[SearchItem]:
                return [
                    SearchItem(
                        prefix, str(h.id), _value(h), h.created_at, h.created_at, score=h.score
                    )
                    for h in found[op.offset :]
                ]

            return _Call("search", (namespace, actor, op.query), {"limit": count, **filters}, hits)
        count = _window(op.offset, op.limit, MAX_LIST, "search without a query")

        def listed(records: list[MemoryRecord]) -> list[SearchItem]:
            return [
                SearchItem(
                    prefix,
                    str(r.id),
                    _value(r),
                    r.created_at,
                    r.updated_at or r.created_at,
                    score=None,
                )
                for r in records[op.offset :]
            ]

        return _Call("list_memories", (namespace, actor), {"limit": count, **filters}, listed)

    def _plan_put(self, op: PutOp) -> _Call | None:
        namespace, actor = _pair(op.namespace, "namespace")
        if op.value is None:
            wanted = _memory_id(op.key)
            if wanted is None:
                return None
            return _Call(
                "delete",
                (namespace, actor, {"ids": [str(wanted)]}, self.delete_reason),
            )
        if op.index is not None:
            raise ValueError(
                "AidbStore: put(index=...) is not supported; every memory is indexed for search"
            )
        if op.ttl is not None:
            raise ValueError("AidbStore: memories have no TTL (put(ttl=...) is not supported)")
        value = op.value
        content = value.get("content")
        extra = {k: value[k] for k in ("agent_id", "session_id") if k in value}
        if (
            set(value) - set(extra) != {"content"}
            or not isinstance(content, str)
            or not content.strip()
            or not all(v is None or isinstance(v, str) for v in extra.values())
        ):
            raise ValueError(
                "AidbStore: put takes a value {'content': text}, optionally with 'agent_id' and "
                f"'session_id' (strings), the shape of the store's items; not {sorted(value)!r}"
            )
        replaced = _memory_id(op.key)

        def then(memory_id: uuid.UUID) -> _Call | None:
            if replaced is None or replaced == memory_id:
                return None
            return _Call("delete", (namespace, actor, {"ids": [str(replaced)]}, self.delete_reason))

        return _Call(
            "remember",
            (namespace, actor, content),
            {
                "session_id": extra.get("session_id"),
                "agent_id": extra.get("agent_id") or self.agent_id,
            },
            then=then,
        )

    def _plan_list_namespaces(self, op: ListNamespacesOp) -> _Call:
        pairs = [
            tuple(c.path)
            for c in op.match_conditions or ()
            if c.match_type == "prefix" and len(c.path) == 2 and "*" not in c.path
        ]
        if len(pairs) != 1 or len(op.match_conditions or ()) != 1:
            raise NotImplementedError(
                "AidbStore.list_namespaces: aidb_memory's API lists no actors; pass "
                "prefix=(namespace, actor_id) to ask whether that actor has memories"
            )
        namespace, actor = _pair(pairs[0], "namespace prefix")
        depth = op.max_depth

        def finish(records: list[MemoryRecord]) -> list[tuple[str, ...]]:
            if not records or op.offset > 0 or op.limit < 1:
                return []
            found = (namespace, actor)
            return [found[:depth] if depth is not None else found]

        return _Call("list_memories", (namespace, actor), {"limit": 1}, finish)

    # --- BaseStore ------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the operations in order, each one call of the sync client."""
        plans = [self._plan(op) for op in ops]
        results: list[Result] = []
        for plan in plans:
            result: Result = None
            while plan is not None:
                answer = getattr(self._clients.sync(), plan.method)(*plan.args, **plan.kwargs)
                result = plan.finish(answer)
                plan = plan.then(answer) if plan.then is not None else None
            results.append(result)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """``batch``, async."""
        plans = [self._plan(op) for op in ops]
        results: list[Result] = []
        for plan in plans:
            result: Result = None
            while plan is not None:
                method = getattr(self._clients.asynchronous(), plan.method)
                answer = await method(*plan.args, **plan.kwargs)
                result = plan.finish(answer)
                plan = plan.then(answer) if plan.then is not None else None
            results.append(result)
        return results

    def close(self) -> None:
        """Close the connection made from ``dsn`` (a pool or client given stays open)."""
        self._clients.close()

    async def aclose(self) -> None:
        """Close the connections made from ``dsn``."""
        await self._clients.aclose()
