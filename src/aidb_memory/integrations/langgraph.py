"""A LangGraph store over aidb_memory's long-term memories: :class:`AidbStore`.

Needs ``aidb-memory[langgraph]`` (langgraph).

**Namespaces.** Every call of the SQL API is one actor's, so a store namespace names an
aidb_memory namespace and an actor, and what else it holds is a *sub-namespace* within that
actor. The store's ``namespace`` setting is the aidb_memory namespace (None, the default: the
tuple's first element is), ``actor_position`` the index of the actor id in the tuple (default 1
without ``namespace``, 0 with it). The default layout is ``(namespace, actor_id, *sub)``, e.g.
``("helpdesk", "alice")`` or ``("helpdesk", "alice", "prefs")``; with ``namespace="helpdesk"``
it is LangGraph's ``(user_id, *sub)``, e.g. ``(user_id, "memories")``. ``get``, ``put``,
``delete`` and ``search`` need a tuple that reaches the actor (else ``InvalidNamespaceError``):
a search spans one actor's sub-namespaces, never several actors.

**Items are memories.** ``put(ns, key, value)`` is ``remember(..., key=<key>, metadata=value)``:
the value, any JSON object, is the memory's metadata verbatim (bounded by the server:
``config.memory_metadata_max_chars``, 4,000 characters of JSON by default, nested at most 8
deep; beyond, the client's ``InvalidArgument`` says so and nothing is stored), recorded with the
store's ``agent_id``. A put on a key the actor already has changes that memory in place (the
same id; an ``update`` in ``memory_history``); a put of what it already holds, equal as JSON (1
and 1.0 alike), changes nothing. No model and no worker is involved: ``search`` finds it at
once.

- The memory's *content*, which word search (and the namespace's embedding model, if any)
  indexes, is the text of the value: the fields the store's ``index={"fields": [...]}`` or
  ``put(index=[...])`` names (paths as LangGraph's: ``"a.b"``, ``"tags[*]"``, ``"list[0].x"``;
  a string as it is, a number as text, an object as JSON), by default the whole value (``"$"``:
  its strings, one per line); a value with no such text has its JSON as content. The content
  is at most ``config.memory_max_chars`` (1,000 by default): a longer one is a ``ValueError``
  (index fewer fields). ``put(index=False)``: stored as any item, but its content is its key
  (``-`` for a blank key), so a query never finds it by its value.
- The aidb key of an item encodes its sub-namespace: each label and a ``.`` (labels have no
  ``.``), then ``.`` and the item's key, e.g. ``prefs..theme``. At the actor's root (no
  sub-namespace) the key is the item's key itself when it has no ``.`` and is not blank (else
  ``.`` and the key), so a memory keyed through the SQL API (``remember(key => 'home_airport')``)
  is the root item of that key and back. Keys are bounded as the server bounds them (the encoded
  key at most ``config.max_identifier_chars``, 255 by default; no control characters). A key set
  through the SQL API that the store would not have written (``a.b``: a ``.`` but no ``..``) is
  read as the sub-namespace before its last ``.`` and the key after it, and ``get`` does not find
  it under that key (it looks for ``a..b``).
- ``get(ns, key)``: ``get_memory(key=...)``, one probe of the key's index. ``delete(ns, key)``
  (and ``put`` of None): ``get_memory`` then ``delete`` of that id, audited with the store's
  ``delete_reason``; a key the actor has not is nothing.
- A memory without a key (the extraction worker's, or a keyless ``remember``) is an item of the
  actor's root: its key is its id (as text), its value ``{**metadata, "content": text,
  "agent_id": ..., "session_id": ...}``. ``get`` and ``delete`` of a root key that is a memory's
  id and no key of the actor's fall back to ``get_memory(id=...)`` (a keyed or superseded memory
  is not reached by its id), and a ``put`` on such a key stores the keyed item and then deletes
  the keyless memory, so the key names one item.
- ``created_at`` and ``updated_at`` are the memory's (a search with a query has only the
  creation time: both are it).

**search.** Without a query: ``list_memories``, newest first (by creation: a put in place keeps
its place; InMemoryStore lists in insertion order, by namespace), ``score`` None, any ``offset``
and ``limit`` (pages of 1,000 with the ``after`` cursor). With a query: ``search`` (words,
misspellings, vectors when the namespace embeds), best first, ``score`` in [0, 1]; ``limit`` at
most 100 and ``offset`` at most 1,000 (else ``ValueError``). A namespace prefix longer than the
actor is a range of aidb keys (a filter on ``key``, compared by code point). ``filter`` is
LangGraph's, applied by the server to the value (the metadata): ``{"field": value}`` (equality;
a list is equal element by element, a nested object names nested fields:
``{"a": {"b": 1}}`` holds when ``value["a"]["b"] == 1``), ``{"field": {"$eq" | "$ne" | "$gt" |
"$gte" | "$lt" | "$lte": value}}``; equality to None holds where the field is absent or null,
``$ne`` where it is absent. Compared as JSON: a number with numbers (1 equals 1.0; ``true`` is
not 1, where Python's ``==`` says it is), order operators compare a number with numbers and a
string with strings by code point, and are false on a value of another type or an absent one
(InMemoryStore raises, or compares a numeric string as a number). A filter the server cannot
express exactly is a ``ValueError`` naming it, never applied in part: another operator, a field
name with a ``.`` or empty, a nested object that is empty or whose condition would hold where the
field is absent (a None, a ``$ne``: "is an object" is not expressible), a nested field name that
reads as an array index (``"0"``), a list holding an object. A keyless memory's ``content``,
``agent_id`` and ``session_id`` are columns, not metadata: a filter does not reach them.

**list_namespaces** lists the namespaces that hold items, as InMemoryStore lists (prefix and
suffix conditions with ``*``, ``max_depth``, ``limit``, ``offset``, sorted). A prefix condition
must name the aidb namespace (unless the store has the ``namespace`` setting; else
``NotImplementedError``). When it names the actor too, that actor's items' keys are read (1,000 a
call); otherwise every actor's, as ``list_actors`` pages them: only in a namespace granted to the
store's role (``namespace_grant``), since in an open one the server lists no actors (55000, an
``AidbMemoryError``).

``batch`` runs its operations in order, each through its own calls of the client (InMemoryStore
applies a batch's puts after its reads); an operation that is refused is refused before any of
the batch runs.

**TTL** (``supports_ttl`` is True), as LangGraph's PostgresStore, on the server's expiry:

- ``put(..., ttl=minutes)`` is ``remember(..., ttl_s=ceil(minutes * 60))`` (at least 1 second,
  at most ten years; a negative or non-finite ttl is a ``ValueError`` before any call). A put
  without ``ttl`` has the store's ``ttl={"default_ttl": minutes}`` (LangGraph's put applies it;
  a ``PutOp`` given to ``batch`` is taken as it is); ``ttl=None``, or no default: no expiry of
  the store's (the namespace's ``config.memory_ttl_s`` then applies, if an admin set one). A put
  on a key the actor has sets the expiry it gives, none included.
- An expired item is gone from ``get``, ``search`` and ``list_namespaces`` from the moment it
  expires, swept or not (every read of the server leaves it out; ``omit_expired`` is accepted,
  and expired items are left out whatever it says); a ``put`` on its key makes it anew.
- A read renews the time to live of what it returns (its expiry pushed ``ttl`` from now; an
  item without one, or with a fixed ``expires_at`` set through the SQL API, is left as it is) as
  LangGraph resolves it: the read's ``refresh_ttl``, else ``refresh_on_read`` (True by default),
  **in a store made with** ``ttl`` (``ttl={}``: renewals without a default ttl). A store made
  without it renews nothing, whatever a read says (LangGraph: without a TTLConfig the argument
  is ignored), so that its reads stay reads: a renewing read is a write, refused on a standby,
  in a read-only transaction and in an INACTIVE namespace (pass ``refresh_ttl=False`` there).
  ``get`` is ``get_memory(key=..., refresh_ttl=True)``: the same one call. The server renews
  one memory a call, so ``search`` renews with a ``get_memory(id, refresh_ttl=True)`` per item
  returned that expires (``list_memories`` and ``search`` say which), up to ``limit`` calls
  more.
- Sweeping is the server's: the worker deletes expired memories (``process_events`` calls
  ``expire_memories``; without the worker, pg_cron can), not the store, whose role may not.
  ``sweep_interval_minutes`` is accepted and not used; ``start_ttl_sweeper()`` starts nothing
  and returns a future that is done, ``stop_ttl_sweeper()`` returns True, so that code written
  for PostgresStore runs unchanged.

Give the store exactly one of ``dsn`` (sync and async clients, each with its own connection),
``pool`` (a psycopg_pool ``ConnectionPool`` for the sync methods, an ``AsyncConnectionPool`` for
the async ones) or ``memory`` (an :class:`~aidb_memory.client.Memory` or ``AsyncMemory``).
"""

from __future__ import annotations

import concurrent.futures
import json
import uuid
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    validate_op_namespace,
)

from aidb_memory.client import AidbMemoryError, InvalidArgument, MemoryRecord, SearchHit
from aidb_memory.integrations._framework_clients import FrameworkClients
from aidb_memory.integrations._langgraph_items import (
    BLANK_KEY_CONTENT,
    Layout,
    all_of,
    checked_ttl_config,
    content_of,
    decode_key,
    encode_key,
    index_fields,
    item_parts,
    key_range,
    keyless_item,
    matches,
    memory_id_of,
    translate_filter,
    ttl_seconds,
)

if TYPE_CHECKING:
    from aidb_memory.client import AsyncMemory, Memory

__all__ = ["AidbStore"]

DEFAULT_DELETE_REASON = "deleted through the LangGraph store (AidbStore)"
MAX_SEARCH = 100  # search's "limit"
MAX_SEARCH_OFFSET = 1000  # search's "offset"
MAX_LIST = 1000  # list_memories' "limit", one page


@dataclass
class _Call:
    """One call of the client: a method of ``Memory`` (and ``AsyncMemory``) and its arguments."""

    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


# An operation as the calls it makes: a generator that yields each call, is sent its answer (or
# has the call's AidbMemoryError thrown into it) and returns the operation's result. Both the
# sync and the async store run the same plans.
Plan = Generator[_Call, Any, Result]


class AidbStore(BaseStore):
    """A LangGraph ``BaseStore`` whose items are aidb_memory's long-term memories; the module
    docstring says how each operation maps to the SQL API, and what it does not honour.

    ``namespace`` and ``actor_position``: where a store namespace names the aidb_memory
    namespace and the actor (the module docstring); ``index``: ``{"fields": [paths]}``, what of a
    value its memory's content is (default the whole value); ``agent_id`` is recorded on the
    memories ``put`` stores; ``delete_reason`` is the audited reason of every delete; ``ttl``:
    LangGraph's ``TTLConfig`` (``default_ttl`` in minutes, ``refresh_on_read``,
    ``sweep_interval_minutes``; the module docstring's **TTL**), None: no default time to live,
    and reads refresh none.
    """

    __slots__ = ("_clients", "_fields", "_layout", "agent_id", "delete_reason", "ttl_config")

    supports_ttl: bool = True

    def __init__(
        self,
        *,
        dsn: str | None = None,
        pool: Any = None,
        memory: Memory | AsyncMemory | None = None,
        agent_id: str | None = None,
        delete_reason: str = DEFAULT_DELETE_REASON,
        namespace: str | None = None,
        actor_position: int | None = None,
        index: Mapping[str, Any] | None = None,
        ttl: TTLConfig | Mapping[str, Any] | None = None,
    ) -> None:
        if namespace is not None and (not isinstance(namespace, str) or not namespace):
            raise ValueError(f"AidbStore: namespace is a namespace's name, not {namespace!r}")
        if actor_position is None:
            actor_position = 1 if namespace is None else 0
        lowest = 1 if namespace is None else 0
        if isinstance(actor_position, bool) or not isinstance(actor_position, int):
            raise TypeError(f"AidbStore: actor_position is an int, not {actor_position!r}")
        if actor_position < lowest:
            raise ValueError(
                f"AidbStore: actor_position is at least {lowest}"
                + (" (the tuple's first element is the namespace)" if namespace is None else "")
                + f", not {actor_position}"
            )
        self._fields = index_fields(index)
        # BaseStore's put and get read it: default_ttl for a put without ttl, refresh_on_read for
        # a read without refresh_ttl.
        self.ttl_config: TTLConfig | None = checked_ttl_config(ttl)
        self._layout = Layout(namespace, actor_position)
        self._clients = FrameworkClients("AidbStore", dsn=dsn, pool=pool, memory=memory)
        self.agent_id = agent_id
        self.delete_reason = delete_reason

    # --- the operations as plans of client calls ---------------------------------------------

    def _plan(self, op: Op) -> Plan:
        """The calls that answer ``op``; what is refused is refused here, before any call."""
        validate_op_namespace(op)
        if isinstance(op, GetOp):
            aidb, actor, sub = self._layout.split(op.namespace, "namespace")
            refresh = self._refreshes(op.refresh_ttl)
            return self._get(op.namespace, aidb, actor, sub, op.key, refresh)
        if isinstance(op, SearchOp):
            return self._plan_search(op)
        if isinstance(op, PutOp):
            return self._plan_put(op)
        if isinstance(op, ListNamespacesOp):
            return self._plan_list_namespaces(op)
        raise TypeError(f"AidbStore: unknown operation {type(op).__name__}")

    def _refreshes(self, asked: bool) -> bool:
        """Whether a read renews the time to live of what it returns: as LangGraph resolved it
        (the op's ``refresh_ttl``, else ``refresh_on_read``, else True), in a store made with a
        ``ttl`` configuration only. LangGraph: "If TTLConfig is not provided [...], this
        argument is ignored"; a refreshing read is a write (refused on a standby and in an
        INACTIVE namespace), and a refreshing search with a query costs a call per item: a store
        that was not asked for TTL does neither."""
        return asked and self.ttl_config is not None

    def _find(
        self, aidb: str, actor: str, sub: tuple[str, ...], key: str, refresh: bool = False
    ) -> Generator[_Call, Any, MemoryRecord | None]:
        """The memory that is the item (sub, key): by its key, or at the root by its id;
        ``refresh``: its time to live renewed."""
        by_key: dict[str, Any] = {"key": encode_key(sub, key)}
        if refresh:
            by_key["refresh_ttl"] = True
        record: MemoryRecord | None = yield _Call("get_memory", (aidb, actor), by_key)
        if record is None and not sub and (memory_id := memory_id_of(key)) is not None:
            record = keyless_item(
                (yield _Call("get_memory", (aidb, actor), {"memory_id": memory_id}))
            )
            # Renewed only once known to be the item: an id also reaches keyed and superseded
            # memories, which are not this item.
            if refresh and record is not None and record.expires_at is not None:
                yield from self._refresh(aidb, actor, [record.id])
        return record

    def _refresh(
        self, aidb: str, actor: str, memory_ids: Iterable[uuid.UUID]
    ) -> Generator[_Call, Any, None]:
        """Renew the time to live of each memory: a get_memory each, as the server renews one
        memory a call (a memory that has none, or a fixed expires_at, is left as it is)."""
        for memory_id in memory_ids:
            yield _Call("get_memory", (aidb, actor), {"memory_id": memory_id, "refresh_ttl": True})

    def _get(
        self,
        namespace: tuple[str, ...],
        aidb: str,
        actor: str,
        sub: tuple[str, ...],
        key: str,
        refresh: bool,
    ) -> Plan:
        record = yield from self._find(aidb, actor, sub, key, refresh)
        if record is None:
            return None
        _, _, value = item_parts(record)
        return Item(
            value=value,
            key=key,
            namespace=namespace,
            created_at=record.created_at,
            updated_at=record.updated_at or record.created_at,
        )

    def _delete(self, aidb: str, actor: str, sub: tuple[str, ...], key: str) -> Plan:
        record = yield from self._find(aidb, actor, sub, key)
        if record is not None:
            yield _Call("delete", (aidb, actor, {"ids": [str(record.id)]}, self.delete_reason))
        return None

    def _plan_put(self, op: PutOp) -> Plan:
        aidb, actor, sub = self._layout.split(op.namespace, "namespace")
        if op.value is None:
            return self._delete(aidb, actor, sub, op.key)
        # LangGraph's minutes as remember's seconds; None: no expiry of the store's own (the
        # namespace's config.memory_ttl_s, if an admin set one).
        ttl_s = None if op.ttl is None else ttl_seconds(op.ttl)
        if not isinstance(op.value, Mapping):
            raise ValueError(f"AidbStore: a value is a JSON object, not {type(op.value).__name__}")
        value = dict(op.value)
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise ValueError(f"AidbStore: a value is a JSON object: {error}") from error
        if op.index is False:
            content = op.key if op.key.strip() else BLANK_KEY_CONTENT
        elif op.index is None:
            content = content_of(value, self._fields)
        elif isinstance(op.index, list) and all(isinstance(p, str) for p in op.index):
            content = content_of(value, op.index)
        else:
            raise ValueError(f"AidbStore: put's index is None, False or paths, not {op.index!r}")
        return self._put(aidb, actor, sub, op.key, value, content, ttl_s)

    def _put(
        self,
        aidb: str,
        actor: str,
        sub: tuple[str, ...],
        key: str,
        value: dict[str, Any],
        content: str,
        ttl_s: int | None,
    ) -> Plan:
        try:
            # A put on a key the actor has sets the expiry it gives (none: none), as a put of
            # LangGraph's PostgresStore does.
            stored = yield _Call(
                "remember",
                (aidb, actor, content),
                {
                    "metadata": value,
                    "key": encode_key(sub, key),
                    "agent_id": self.agent_id,
                    "ttl_s": ttl_s,
                },
            )
        except InvalidArgument as error:
            if error.message.startswith("aidb_memory.remember: content "):
                raise ValueError(
                    f"AidbStore: the text put indexes for key {key!r} is refused: "
                    f"{error.message}; index fewer fields (put(index=[...]) or the store's "
                    "index), or an admin raises config.memory_max_chars"
                ) from error
            raise
        replaced = memory_id_of(key) if not sub else None
        if replaced is not None and replaced != stored:
            # The key was a keyless memory's id, that memory's key as an item: the put replaces it.
            found = keyless_item(
                (yield _Call("get_memory", (aidb, actor), {"memory_id": replaced}))
            )
            if found is not None:
                yield _Call("delete", (aidb, actor, {"ids": [str(replaced)]}, self.delete_reason))
        return None

    def _plan_search(self, op: SearchOp) -> Plan:
        aidb, actor, sub = self._layout.split(op.namespace_prefix, "namespace prefix")
        prefix_range = key_range(sub)
        conditions = ([prefix_range] if prefix_range else []) + translate_filter(op.filter)
        server_filter = all_of(conditions) if conditions else None
        refresh = self._refreshes(op.refresh_ttl)
        if op.offset < 0 or op.limit < 0:
            raise ValueError(
                f"AidbStore: offset and limit are at least 0, not {op.offset} and {op.limit}"
            )
        if op.query:
            if op.limit > MAX_SEARCH or op.offset > MAX_SEARCH_OFFSET:
                raise ValueError(
                    f"AidbStore: a search with a query returns at most {MAX_SEARCH} memories "
                    f"(limit) after at most {MAX_SEARCH_OFFSET} (offset), not limit {op.limit} "
                    f"and offset {op.offset}"
                )
            return self._search(aidb, actor, op.query, server_filter, op.offset, op.limit, refresh)
        return self._list(aidb, actor, server_filter, op.offset, op.limit, refresh)

    def _search(
        self,
        aidb: str,
        actor: str,
        query: str,
        server_filter: dict[str, Any] | None,
        offset: int,
        limit: int,
        refresh: bool,
    ) -> Plan:
        if limit == 0:
            return []
        hits: list[SearchHit] = yield _Call(
            "search",
            (aidb, actor, query),
            {"limit": limit, "offset": offset or None, "filter": server_filter},
        )
        if refresh:
            yield from self._refresh(aidb, actor, [hit.id for hit in hits if hit.expires_at])
        return [self._search_item(aidb, actor, hit, hit.score) for hit in hits]

    def _list(
        self,
        aidb: str,
        actor: str,
        server_filter: dict[str, Any] | None,
        offset: int,
        limit: int,
        refresh: bool,
    ) -> Plan:
        if limit == 0:
            return []
        wanted = offset + limit
        records: list[MemoryRecord] = []
        after: uuid.UUID | None = None
        while len(records) < wanted:
            count = min(MAX_LIST, wanted - len(records))
            page: list[MemoryRecord] = yield _Call(
                "list_memories",
                (aidb, actor),
                {"limit": count, "filter": server_filter, "after": after},
            )
            records += page
            if len(page) < count:
                break
            after = page[-1].id
        returned = records[offset:wanted]
        if refresh:
            # Only the items that expire: list_memories says which.
            yield from self._refresh(aidb, actor, [r.id for r in returned if r.expires_at])
        return [self._search_item(aidb, actor, r, None) for r in returned]

    def _search_item(
        self, aidb: str, actor: str, record: MemoryRecord | SearchHit, score: float | None
    ) -> SearchItem:
        sub, key, value = item_parts(record)
        namespace = self._layout.join(aidb, actor, sub)
        # A search's prefix reaches the actor, so it holds the labels before it: every memory it
        # selects joins.
        assert namespace is not None
        updated = record.updated_at if isinstance(record, MemoryRecord) else None
        return SearchItem(
            namespace, key, value, record.created_at, updated or record.created_at, score=score
        )

    def _plan_list_namespaces(self, op: ListNamespacesOp) -> Plan:
        conditions = tuple(op.match_conditions or ())
        layout = self._layout
        # A prefix condition that names the aidb namespace, and the actor if one does.
        chosen: tuple[tuple[str, ...], bool] | None = None
        for condition in conditions:
            path = tuple(condition.path)
            if condition.match_type != "prefix" or (
                layout.namespace is None and (not path or path[0] == "*")
            ):
                continue
            if len(path) > layout.actor and all(path[i] != "*" for i in layout.fixed):
                chosen = (path, True)
                break
            if chosen is None:
                chosen = (path, False)
        if chosen is None and layout.namespace is not None:
            chosen = ((), False)
        if chosen is None:
            raise NotImplementedError(
                "AidbStore.list_namespaces: pass a prefix condition that names the aidb_memory "
                "namespace (position 0), or make the store with namespace=...: the store lists "
                "the actors of one namespace"
            )
        path, one_actor = chosen
        aidb = layout.namespace if layout.namespace is not None else path[0]
        # The sub-namespace labels the prefix fixes, up to its first wildcard: a key range.
        sub_prefix: list[str] = []
        for i, label in enumerate(path):
            if i in layout.fixed:
                continue
            if label == "*":
                break
            sub_prefix.append(label)
        if one_actor:
            found = yield from self._actor_namespaces(
                aidb, path[layout.actor], tuple(sub_prefix), conditions
            )
        else:
            found = yield from self._all_namespaces(aidb, tuple(sub_prefix), conditions)
        if op.max_depth is not None:
            listed = sorted({namespace[: op.max_depth] for namespace in found})
        else:
            listed = sorted(found)
        return listed[op.offset : op.offset + op.limit]

    def _all_namespaces(
        self, aidb: str, sub_prefix: tuple[str, ...], conditions: tuple[MatchCondition, ...]
    ) -> Generator[_Call, Any, set[tuple[str, ...]]]:
        """Every actor's namespaces (``list_actors``: only in a namespace granted to the store's
        role; in an open one the server refuses, 55000)."""
        found: set[tuple[str, ...]] = set()
        after: str | None = None
        while True:
            actors: list[str] = yield _Call(
                "list_actors", (aidb,), {"limit": MAX_LIST, "after": after}
            )
            for actor in actors:
                found |= yield from self._actor_namespaces(aidb, actor, sub_prefix, conditions)
            if len(actors) < MAX_LIST:
                return found
            after = actors[-1]

    def _actor_namespaces(
        self,
        aidb: str,
        actor: str,
        sub_prefix: tuple[str, ...],
        conditions: tuple[MatchCondition, ...],
    ) -> Generator[_Call, Any, set[tuple[str, ...]]]:
        """One actor's namespaces that hold items and meet every condition."""
        subs: set[tuple[str, ...]] = set()
        if not sub_prefix:
            # Keyless memories are root items: whether there is one is one probe (the worker
            # may have made thousands; they are not read).
            keyless = yield _Call(
                "list_memories", (aidb, actor), {"limit": 1, "filter": {"key": {"$exists": False}}}
            )
            if keyless:
                subs.add(())
        keyed = key_range(sub_prefix) or {"key": {"$exists": True}}
        after: uuid.UUID | None = None
        while True:
            page: list[MemoryRecord] = yield _Call(
                "list_memories", (aidb, actor), {"limit": MAX_LIST, "filter": keyed, "after": after}
            )
            subs.update(decode_key(r.key)[0] for r in page if r.key is not None)
            if len(page) < MAX_LIST:
                break
            after = page[-1].id
        return {
            namespace
            for sub in subs
            if (namespace := self._layout.join(aidb, actor, sub)) is not None
            and all(matches(c, namespace) for c in conditions)
        }

    # --- BaseStore ------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the operations in order, each through the sync client (all are checked first:
        one that is refused runs none)."""
        plans = [self._plan(op) for op in ops]
        results: list[Result] = []
        for plan in plans:
            client = self._clients.sync()
            answer: Any = None
            error: AidbMemoryError | None = None
            while True:
                try:
                    call = plan.throw(error) if error is not None else plan.send(answer)
                except StopIteration as done:
                    results.append(done.value)
                    break
                answer, error = None, None
                try:
                    answer = getattr(client, call.method)(*call.args, **call.kwargs)
                except AidbMemoryError as failed:
                    error = failed
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """``batch``, async."""
        plans = [self._plan(op) for op in ops]
        results: list[Result] = []
        for plan in plans:
            client = self._clients.asynchronous()
            answer: Any = None
            error: AidbMemoryError | None = None
            while True:
                try:
                    call = plan.throw(error) if error is not None else plan.send(answer)
                except StopIteration as done:
                    results.append(done.value)
                    break
                answer, error = None, None
                try:
                    answer = await getattr(client, call.method)(*call.args, **call.kwargs)
                except AidbMemoryError as failed:
                    error = failed
        return results

    def start_ttl_sweeper(
        self, sweep_interval_minutes: int | None = None
    ) -> concurrent.futures.Future[None]:
        """Start nothing, and return a future that is done: aidb_memory's worker sweeps expired
        memories (``process_events`` calls ``expire_memories``; without the worker, pg_cron can),
        and the store's role may not. Reads leave an expired item out from the moment it
        expires, swept or not. Here so that code written for LangGraph's PostgresStore
        (``store.start_ttl_sweeper()``) runs unchanged; ``sweep_interval_minutes`` is not
        used."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        future.set_result(None)
        return future

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop nothing (``start_ttl_sweeper`` starts nothing): True, as PostgresStore answers
        when no sweeper runs."""
        return True

    def close(self) -> None:
        """Close the connection made from ``dsn`` (a pool or client given stays open)."""
        self._clients.close()

    async def aclose(self) -> None:
        """Close the connections made from ``dsn``."""
        await self._clients.aclose()
