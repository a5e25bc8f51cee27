"""One memory addressed by its id or its key (issue 34): ``get_memory``, ``update_memory`` and
``memory_history``, as mem0's ``get``, ``update`` and ``history`` and LangGraph's ``get``.

Each reads or changes one row found by one index probe (the memory's public id and the actor's
key, memory_public_id_key; or its key among the actor's current memories, memory_key_idx), every
statement the actor's (keys.actor_key). A change is made under the actor's lock, by the writer
extraction and ``remember`` use (reconciliation.Writer), so that it is ordered with them and
recorded in memory_history (an ``update``: the text before and after, the metadata after, the
login role, the reason).
"""

from __future__ import annotations

from typing import Any

from aidb_memory_server import db, eventqueue, expiry, extraction, keys, reconciliation
from aidb_memory_server import metadata as metadata_rules
from aidb_memory_server.access import identifier, namespace, quote
from aidb_memory_server.errors import (
    UNDEFINED_OBJECT,
    UNIQUE_VIOLATION,
    ApiError,
    invalid,
    required,
)
from aidb_memory_server.listing import MEMORY_ROW
from aidb_memory_server.remembering import checked_content

# An expired memory is not there for any of these (expiry.py), swept or not.
_LIVE = "\n  AND (m.expires_at IS NULL OR m.expires_at > statement_timestamp())"
# $1 namespace, $2 actor, $3 the actor's key, $4 the memory's public id: current or not. The
# namespace and actor are tested on the row found by (public_id, actor_key), written
# "m.namespace_id + 0" and "m.actor_id || ''" so that they are no index key: as keys they make
# memory_actor_idx, which the generic plan costs at an average actor's few rows, look as good
# (migration 0024 says why the id leads that index).
_BY_ID = (
    "SELECT"
    + MEMORY_ROW
    + "WHERE m.actor_key = $3 AND m.public_id = $4"
    + " AND m.namespace_id + 0 = $1 AND m.actor_id || '' = $2"
    + _LIVE
)
# $4 the key: the actor's current memory of it.
_BY_KEY = (
    "SELECT"
    + MEMORY_ROW
    + "WHERE m.actor_key = $3 AND m.namespace_id = $1 AND m.actor_id = $2 AND m.key = $4"
    + " AND m.valid_to IS NULL"
    + _LIVE
)
_BY_ID_TYPES = ("bigint", "text", "bigint", "uuid")
# get_memory's refresh_ttl: the memory's expiry pushed its time to live from now (LangGraph's
# refresh_on_read), before it is read; only a memory with a time to live that has not expired.
# Found as _BY_ID and _BY_KEY find it. The new time is epoch arithmetic, IMMUTABLE over the
# column: Citus refuses a STABLE expression over a column in an UPDATE's SET (now() + interval).
_REFRESH = """
UPDATE aidb_memory.memory m
SET expires_at = pg_catalog.to_timestamp(pg_catalog.date_part('epoch', pg_catalog.now()) + m.ttl_s)
WHERE m.ttl_s IS NOT NULL AND m.expires_at > statement_timestamp() AND m.actor_key = $3
"""
_REFRESH_BY_ID = (
    _REFRESH + "  AND m.public_id = $4 AND m.namespace_id + 0 = $1 AND m.actor_id || '' = $2"
)
_REFRESH_BY_KEY = (
    _REFRESH + "  AND m.namespace_id = $1 AND m.actor_id = $2 AND m.key = $4 AND m.valid_to IS NULL"
)
_BY_KEY_TYPES = ("bigint", "text", "bigint", "text")
# What update_memory changes, under the actor's lock: the current memory of the id (found as
# _BY_ID finds it).
_TARGET = """
SELECT id, content, metadata::text AS metadata, key, agent_id, session_id
FROM aidb_memory.memory
WHERE actor_key = $3 AND public_id = $4 AND namespace_id + 0 = $1 AND actor_id || '' = $2
  AND valid_to IS NULL AND (expires_at IS NULL OR expires_at > statement_timestamp())
"""
# Another current keyless memory with the text a keyless memory is to say (one per text:
# memory_current_hash_idx); an expired one is deleted first (expiry.purge).
_TWIN = """
SELECT id, public_id::text AS public_id,
       expires_at <= statement_timestamp() AS expired
FROM aidb_memory.memory
WHERE actor_key = $3 AND namespace_id = $1 AND actor_id = $2 AND valid_to IS NULL
  AND key IS NULL AND content_hash = $4 AND id <> $5
"""
# Every version of the memory, oldest first: what the change made it say (content) and what it
# said before, its metadata after, when, by which login role, why; the event of an extraction.
# The memory is found first, on its own (as _BY_ID finds it): joined with its history, a generic
# plan would read the actor's memories on the primary key for the id.
_HISTORY = """
WITH target AS MATERIALIZED (
    SELECT m.id FROM aidb_memory.memory m
    WHERE m.actor_key = $3 AND m.public_id = $4
      AND m.namespace_id + 0 = $1 AND m.actor_id || '' = $2
      AND (m.expires_at IS NULL OR m.expires_at > statement_timestamp())
)
SELECT (row_number() OVER (ORDER BY h.id))::int AS version, h.operation,
       h.new_content AS content, h.old_content AS previous_content, h.metadata,
       to_json(h.at) #>> '{}' AS at, h.by_role, h.reason, e.public_id::text AS event_id
FROM aidb_memory.memory_history h
LEFT JOIN aidb_memory.event e ON e.actor_key = h.actor_key AND e.id = h.event_id
WHERE h.actor_key = $3 AND h.memory_id = (SELECT t.id FROM target t)
ORDER BY h.id
"""


def _memory_id(fn: str, value: str | None) -> str:
    """A memory's id argument (a uuid: PostgreSQL refuses any other text before the call)."""
    if value is None:
        raise required(fn, "id")
    return value


def get_memory(
    namespace_name: str | None,
    actor_id: str | None,
    memory_id: str | None,
    key: str | None,
    refresh_ttl: bool | None = False,
) -> list[dict[str, Any]]:
    """The actor's memory of ``memory_id`` (current or superseded) or its current memory of
    ``key``: one row, or none. ``refresh_ttl``: a memory with a time to live lives that long
    again from now."""
    fn = "get_memory"
    ns, actor = namespace(fn, namespace_name, actor_id, writing=bool(refresh_ttl))
    name = identifier(fn, "key", key, ns.config["max_identifier_chars"], optional=True)
    if (memory_id is None) == (name is None):
        raise invalid(
            fn, "id", "or key must be given, not both", hint="address the memory by one of them"
        )
    ident = (ns.id, actor, keys.actor_key(ns.name, actor))
    if name is not None:
        if refresh_ttl:
            db.execute(_REFRESH_BY_KEY, _BY_KEY_TYPES, (*ident, name))
        return [dict(r) for r in db.execute(_BY_KEY, _BY_KEY_TYPES, (*ident, name))]
    if refresh_ttl:
        db.execute(_REFRESH_BY_ID, _BY_ID_TYPES, (*ident, memory_id))
    return [dict(r) for r in db.execute(_BY_ID, _BY_ID_TYPES, (*ident, memory_id))]


def update_memory(
    namespace_name: str | None,
    actor_id: str | None,
    memory_id: str | None,
    content: str | None,
    metadata: str | None,
    reason: str | None,
) -> list[dict[str, Any]]:
    """Change the actor's current memory ``memory_id`` in place: its text (searchable by its new
    words at once, its vector computed again by the worker) and/or its metadata (replaced as a
    whole); recorded in its history with ``reason``. The memory as it is afterwards."""
    fn = "update_memory"
    ns, actor = namespace(fn, namespace_name, actor_id, writing=True)
    found = _memory_id(fn, memory_id)
    if content is None and metadata is None:
        raise invalid(
            fn, "content", "and metadata are both NULL", hint="pass what the memory becomes"
        )
    text = None if content is None else checked_content(fn, ns, content)
    tags = (
        None
        if metadata is None
        else metadata_rules.parse(fn, "metadata", metadata, ns.config["memory_metadata_max_chars"])
    )
    if reason is not None and not reason.strip():
        raise invalid(fn, "reason", "must not be empty", hint="say why, or pass NULL")
    if reason is not None and len(reason) > ns.config["max_turn_chars"]:
        raise invalid(fn, "reason", f"is longer than {ns.config['max_turn_chars']} characters")
    key = keys.actor_key(ns.name, actor)
    ident = (ns.id, actor, key)
    # The actor's lock first (the writer takes it), then the memory as it is under it: a
    # concurrent change may have superseded or erased it.
    writer = reconciliation.Writer(ns.id, actor, key, text_search=ns.config["text_search_config"])
    target = db.execute(_TARGET, _BY_ID_TYPES, (*ident, found))
    if not target.nrows():
        raise _no_current(fn, actor, found)
    row = target[0]
    # It keeps its session and agent.
    writer.agent_id, writer.session_id = row["agent_id"], row["session_id"]
    new_text = row["content"] if text is None else text
    new_tags = row["metadata"] if tags is None else tags
    if row["key"] is None and new_text != row["content"]:
        twin = db.execute(
            _TWIN,
            ("bigint", "text", "bigint", "text", "bigint"),
            (*ident, extraction.content_hash(new_text), int(row["id"])),
        )
        if twin.nrows() and twin[0]["expired"]:
            expiry.purge(ns.id, ns.name, actor, key, [int(twin[0]["id"])])
        elif twin.nrows():
            raise ApiError(
                UNIQUE_VIOLATION,
                f"aidb_memory.{fn}: actor_id {quote(actor)} already has a current memory that "
                f"says this ({twin[0]['public_id']})",
                hint="delete one of the two, or give the memory another text",
            )
    writer.replace(int(row["id"]), row["content"], new_text, new_tags, reason)
    if new_text != row["content"] and ns.model_spec.get("embedding"):
        eventqueue.queue_embedding(key, ns.id, actor)
    return [dict(r) for r in db.execute(_BY_ID, _BY_ID_TYPES, (*ident, found))]


def _no_current(fn: str, actor: str, memory_id: str) -> ApiError:
    return ApiError(
        UNDEFINED_OBJECT,
        f"aidb_memory.{fn}: actor_id {quote(actor)} has no current memory {memory_id}",
        hint="list_memories shows the actor's current memories; a superseded one is not changed",
    )


def memory_history(
    namespace_name: str | None, actor_id: str | None, memory_id: str | None
) -> list[dict[str, Any]]:
    """Every version of the actor's memory ``memory_id``, oldest first (none: no such memory of
    the actor; delete and forget leave no history)."""
    fn = "memory_history"
    ns, actor = namespace(fn, namespace_name, actor_id, writing=False)
    found = _memory_id(fn, memory_id)
    ident = (ns.id, actor, keys.actor_key(ns.name, actor))
    return [dict(r) for r in db.execute(_HISTORY, _BY_ID_TYPES, (*ident, found))]
