"""``remember`` (issue 26): one memory written directly by the application or the agent, now, in
the caller's transaction, without a model.

The same rules as the worker's: under the actor's lock (reconciliation.lock_actor), so that a
direct write and an extraction of the same text store it once; an exact duplicate of a current
memory (the same normalized text, extraction.content_hash) is not stored again and its id is
returned; every new memory has its ``add`` row in memory_history. Where the namespace has an
embedding model the vector is added by the worker (an ``embedding`` task of the event queue,
eventqueue.embedding_task), so the call never waits for a model; until then search finds the
memory by its words. Every statement is the actor's (keys.actor_key).
"""

from __future__ import annotations

from aidb_memory_server import db, extraction, keys, reconciliation
from aidb_memory_server.errors import invalid, required
from aidb_memory_server.memories import filters
from aidb_memory_server.sessions import namespace

_EXISTING = """
SELECT public_id::text AS public_id FROM aidb_memory.memory
WHERE actor_key = $4 AND namespace_id = $1 AND actor_id = $2 AND valid_to IS NULL
  AND content_hash = $3
"""
_EXISTING_TYPES = ("bigint", "text", "text", "bigint")
# The memory and its audit row in one statement.
_INSERT = """
WITH m AS (
    INSERT INTO aidb_memory.memory
        (actor_key, namespace_id, actor_id, agent_id, session_id, content, content_hash)
    VALUES ($1, $2, $3, $4, $5, $6, $7)
    RETURNING id, public_id
), h AS (
    INSERT INTO aidb_memory.memory_history
        (actor_key, memory_id, namespace_id, actor_id, operation, new_content)
    SELECT $1, m.id, $2, $3, 'add', $6 FROM m
)
SELECT public_id::text AS public_id FROM m
"""
_INSERT_TYPES = ("bigint", "bigint", "text", "text", "text", "text", "text")
# The actor's embedding task, unless one already waits to be claimed (0017).
_EMBED_LATER = """
WITH t AS (
    INSERT INTO aidb_memory.event (actor_key, namespace_id, actor_id, turn_count, status, kind)
    VALUES ($1, $2, $3, 0, 'accepted', 'embedding')
    ON CONFLICT (actor_key, namespace_id, actor_id)
        WHERE kind = 'embedding' AND status = 'accepted'
    DO NOTHING
    RETURNING 1
)
SELECT pg_notify('aidb_memory_events', '') AS woke FROM t
"""
_EMBED_LATER_TYPES = ("bigint", "bigint", "text")


def content_problem(content: str, limit: int) -> str | None:
    """Why ``content`` cannot be a memory (None when it can): what ``remember`` refuses."""
    if not content.strip():
        return "must not be empty"
    if len(content) > limit:
        return f"is longer than {limit} characters"
    return None


def remember(
    namespace_name: str | None,
    actor_id: str | None,
    content: str | None,
    session_id: str | None,
    agent_id: str | None,
) -> str:
    """Store ``content`` as a memory of the actor (or find the current one that says the same);
    its id."""
    fn = "remember"
    ns, actor = namespace(fn, namespace_name, actor_id, writing=True)
    sid, agent = filters(fn, ns, session_id, agent_id)
    if content is None:
        raise required(fn, "content")
    limit = ns.config["memory_max_chars"]
    problem = content_problem(content, limit)
    if problem is not None:
        too_long = len(content) > limit
        hint = "split it into facts, or an admin raises config.memory_max_chars"
        raise invalid(fn, "content", problem, hint=hint if too_long else None)
    key = keys.actor_key(ns.name, actor)
    digest = extraction.content_hash(content)
    reconciliation.lock_actor(ns.id, actor, key)
    same = db.execute(_EXISTING, _EXISTING_TYPES, (ns.id, actor, digest, key))
    if same.nrows():
        return str(same[0]["public_id"])
    row = db.execute(_INSERT, _INSERT_TYPES, (key, ns.id, actor, agent, sid, content, digest))[0]
    if ns.model_spec.get("embedding"):
        db.execute(_EMBED_LATER, _EMBED_LATER_TYPES, (key, ns.id, actor))
    return str(row["public_id"])
