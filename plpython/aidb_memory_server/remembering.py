"""``remember`` (issue 26): one memory written directly by the application or the agent, now, in
the caller's transaction, without a model.

The worker's own writer (reconciliation.Writer, as verbatim extraction stores): under the
actor's lock, so that a direct write and an extraction of the same text store it once; an exact
duplicate of a current memory (the same normalized text, extraction.content_hash) is not stored
again and its id is returned; every new memory has its ``add`` row in memory_history, without
an event. Where the namespace has an embedding model the vector is added by the worker (an
``embedding`` task of the event queue, eventqueue.queue_embedding), so the call never waits for
a model; until then search finds the memory by its words. Every statement is the actor's
(keys.actor_key).

With a ``key`` (the application's name for the memory, issue 34) it is a put: the actor's current
memory of that key is changed in place (same id, an ``update`` in its history), or made; no
duplicate rule applies to it (two keys may hold one text), and a repeated put changes nothing.

A memory may expire (expiry.py): at ``expires_at``, or ``ttl_s`` seconds after it is written
(the namespace's config.memory_ttl_s when neither is given). An expired memory is as if deleted: a
remember of its text or its key makes a new one.
"""

from __future__ import annotations

from aidb_memory_server import eventqueue, expiry, keys, reconciliation
from aidb_memory_server import metadata as metadata_rules
from aidb_memory_server.access import Namespace, identifier, namespace
from aidb_memory_server.errors import invalid, required
from aidb_memory_server.memories import filters


def remember(
    namespace_name: str | None,
    actor_id: str | None,
    content: str | None,
    session_id: str | None,
    agent_id: str | None,
    metadata: str | None = None,
    key: str | None = None,
    expires_at: str | None = None,
    ttl_s: int | None = None,
) -> str:
    """Store ``content`` as a memory of the actor, tagged with ``metadata`` (a JSON object; NULL:
    ``{}``), or find the current one that says the same (left as it is, but for an expiry this
    call pushes back); its id. With ``key``: the actor's memory of that key, made or changed in
    place. ``expires_at`` or ``ttl_s`` (seconds from now, refreshed by get_memory's refresh_ttl):
    when it expires; neither: config.memory_ttl_s, or never."""
    fn = "remember"
    ns, actor = namespace(fn, namespace_name, actor_id, writing=True)
    sid, agent = filters(fn, ns, session_id, agent_id)
    name = identifier(fn, "key", key, ns.config["max_identifier_chars"], optional=True)
    text = checked_content(fn, ns, content)
    tags = metadata_rules.parse(fn, "metadata", metadata, ns.config["memory_metadata_max_chars"])
    until, ttl = expiry.arguments(fn, ns, expires_at, ttl_s)
    actor_key = keys.actor_key(ns.name, actor)
    writer = reconciliation.Writer(
        ns.id,
        actor,
        actor_key,
        agent_id=agent,
        session_id=sid,
        text_search=ns.config["text_search_config"],
        expires_at=until,
        ttl_s=ttl,
    )
    if name is None:
        _, public_id, new = writer.store(text, near=False, metadata=tags)
    else:
        public_id, new = writer.put(name, text, tags)
    if new and ns.model_spec.get("embedding"):
        eventqueue.queue_embedding(actor_key, ns.id, actor)
    return public_id


def checked_content(fn: str, ns: Namespace, content: str | None) -> str:
    """A memory's text as the application gives it: not empty, within
    config.memory_max_chars."""
    if content is None:
        raise required(fn, "content")
    if not content.strip():
        raise invalid(fn, "content", "must not be empty")
    limit = ns.config["memory_max_chars"]
    if len(content) > limit:
        raise invalid(
            fn,
            "content",
            f"is longer than {limit} characters",
            hint="split it into facts, or an admin raises config.memory_max_chars",
        )
    return content
