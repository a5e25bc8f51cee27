"""Reconciliation (SPEC §5): what an extraction's operations do to the actor's memories.

Runs in the event's transaction under a per-(namespace, actor) lock, so two events of one actor
never reconcile at once: the same new fact stated by both is stored once. The lock is a row lock
on ``actor_lock`` (migration 0007_locks), a table no role but ours can touch: unlike an advisory
key, no foreign session can hold it.

- ``add``: not stored when a current memory has the same normalized content (exact duplicate)
  or is a near duplicate: trigram similarity at least ``NEAR_DUPLICATE`` and the same
  identifiers (numbers, dates, emails, URLs, codes: ``identifiers.py``), so that "order 4417"
  and "order 4418" stay two facts.
- ``update``: the target is superseded (``valid_to``, ``superseded_by``) by the new memory (or by
  the current one that already says the same).
- ``invalidate``: the target's ``valid_to`` is set; nothing replaces it.

Nothing is deleted; every change is a row in ``memory_history`` naming the event.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aidb_memory_server import (
    db,
    expiry,
    extensions,
    extraction,
    identifiers,
    keys,
    validation,
)
from aidb_memory_server import metadata as metadata_rules

NEAR_DUPLICATE = 0.8
RELATED_LIMIT = 20
# How many of the most similar current memories are checked for the same identifiers.
NEAR_CANDIDATES = 20
EMPTY_RESULT: dict[str, Any] = {
    "added": 0,
    "updated": 0,
    "invalidated": 0,
    "duplicates": 0,
    "memories": [],
}
_WORD = re.compile(r"\w{3,}")


@dataclass(frozen=True)
class Memory:
    """A current memory as extraction sees it."""

    id: int
    public_id: str
    content: str


# Current memories that share words with the event's turns, then the newest, up to the limit
# ($5: the actor's key; every statement here names it, keys.actor_key). The words are found on the
# GIN index (actor_key, tsv); the namespace and actor are no key of that scan, as in
# memories._SEARCH (otherwise the generic plan scans all of a large actor's memories on a btree).
_RELATED = """
SELECT id, public_id::text AS public_id, content FROM (
    (SELECT m.id, m.public_id, m.content, 0 AS tier,
            ts_rank_cd(m.tsv, to_tsquery('simple', $3)) AS rank
     FROM aidb_memory.memory m
     WHERE m.actor_key = $5 AND m.namespace_id + 0 = $1 AND m.actor_id || '' = $2
       AND m.valid_to IS NULL AND $3 <> '' AND m.tsv @@ to_tsquery('simple', $3)
       AND (m.expires_at IS NULL OR m.expires_at > statement_timestamp())
     ORDER BY rank DESC LIMIT $4)
    UNION ALL
    (SELECT m.id, m.public_id, m.content, 1, 0
     FROM aidb_memory.memory m
     WHERE m.actor_key = $5 AND m.namespace_id = $1 AND m.actor_id = $2 AND m.valid_to IS NULL
       AND (m.expires_at IS NULL OR m.expires_at > statement_timestamp())
     ORDER BY m.created_at DESC LIMIT $4)
) AS c
GROUP BY id, public_id, content
ORDER BY min(tier), max(rank) DESC, id DESC
LIMIT $4
"""
# The actor's lock row, once it exists (every call after the actor's first): one statement.
_LOCK = """
SELECT 1 FROM aidb_memory.actor_lock
WHERE actor_key = $3 AND namespace_id = $1 AND actor_id = $2
FOR UPDATE
"""
# Otherwise create and lock it. DO UPDATE (not DO NOTHING) so that it always ends holding the row
# lock: it waits for a concurrent creator, and after a concurrent forget deleted the row it
# inserts a new one.
_LOCK_NEW = """
INSERT INTO aidb_memory.actor_lock (actor_key, namespace_id, actor_id) VALUES ($3, $1, $2)
ON CONFLICT (actor_key, namespace_id, actor_id) DO UPDATE SET actor_id = excluded.actor_id
"""
_LOCK_TYPES = ("bigint", "text", "bigint")
# The namespace's name, for a caller that does not pass the actor's key (keys.actor_key).
_NAMESPACE_NAME = "SELECT name FROM aidb_memory.namespace WHERE id = $1"
# forget erases the actor's row too (it holds its lock); waiters then create a new one.
_UNLOCK_FORGOTTEN = """
DELETE FROM aidb_memory.actor_lock WHERE actor_key = $3 AND namespace_id = $1 AND actor_id = $2
"""
# The exact duplicate first, then the near ones, most similar first; the caller keeps the first
# with the same identifiers. pg_trgm's schema goes where "@trgm@" is (extensions.trgm_sql).
# Expired memories are no duplicates (expiry.py): an exact one is deleted, then the text stored
# (it holds the text's place in memory_current_hash_idx); a near one is passed over. expiring:
# whether the memory has an expiry a new statement of it may push back (_OUTLIVE).
_SAME = """
SELECT id, public_id::text AS public_id, content, content_hash = $3 AS exact,
       expires_at <= statement_timestamp() AS expired, expires_at IS NOT NULL AS expiring
FROM aidb_memory.memory
WHERE actor_key = $7 AND namespace_id = $1 AND actor_id = $2 AND valid_to IS NULL
  AND (content_hash = $3 OR "@trgm@".similarity(content, $4) >= $5)
ORDER BY content_hash = $3 DESC, "@trgm@".similarity(content, $4) DESC, id
LIMIT $6
"""
# Verbatim extraction merges only the exact duplicate (the unique index on current hashes).
# A keyed memory (remember with a key) is the application's item, no duplicate of another: the
# keyless ones alone are one current memory per text (memory_current_hash_idx).
_SAME_EXACT = """
SELECT id, public_id::text AS public_id, content, true AS exact,
       expires_at <= statement_timestamp() AS expired, expires_at IS NOT NULL AS expiring
FROM aidb_memory.memory
WHERE actor_key = $4 AND namespace_id = $1 AND actor_id = $2 AND valid_to IS NULL
  AND content_hash = $3 AND key IS NULL
LIMIT 1
"""
# The actor's current memory of a key (memory_key_idx), and whether it is already what a put
# asks for ($5 content, $6 metadata, compared as jsonb: 1 and 1.0 alike, true and 1 not; $7 and
# $8 agent_id and session_id), and expires when it asks ($9 expires_at, $10 ttl_s: a time to live
# counts from now, so a put with one always pushes the expiry back). An expired one is deleted
# first (expiry.py).
_KEYED = """
SELECT id, public_id::text AS public_id, content,
       content = $5 AND metadata = $6 AND agent_id IS NOT DISTINCT FROM $7
           AND session_id IS NOT DISTINCT FROM $8 AS unchanged,
       expires_at IS NOT DISTINCT FROM
           coalesce($9, pg_catalog.now() + pg_catalog.make_interval(secs => $10))
           AND ttl_s IS NOT DISTINCT FROM $10 AS same_expiry,
       expires_at <= statement_timestamp() AS expired
FROM aidb_memory.memory
WHERE actor_key = $4 AND namespace_id = $1 AND actor_id = $2 AND valid_to IS NULL AND key = $3
"""
_KEYED_TYPES = (
    *("bigint", "text", "text", "bigint", "text", "jsonb", "text", "text"),
    *("timestamptz", "int"),
)
_CURRENT = """
SELECT content FROM aidb_memory.memory
WHERE actor_key = $2 AND id = $1 AND valid_to IS NULL
  AND (expires_at IS NULL OR expires_at > statement_timestamp())
"""
_INSERT = """
INSERT INTO aidb_memory.memory
    (actor_key, namespace_id, actor_id, agent_id, session_id, content, content_hash, source_event,
     embedding, embedding_model, lexemes, metadata, key, expires_at, ttl_s)
VALUES ($10, $1, $2, $3, $4, $5, $6, $7, $8, CASE WHEN $8 IS NOT NULL THEN $9 END,
        pg_catalog.to_tsvector($11::pg_catalog.regconfig, $5), $12, $13,
        coalesce($14, pg_catalog.now() + pg_catalog.make_interval(secs => $15)), $15)
RETURNING id, public_id::text AS public_id
"""
_INSERT_TYPES = (
    *("bigint", "text", "text", "text", "text", "text", "bigint", "real[]", "text"),
    *("bigint", "text", "jsonb", "text", "timestamptz", "int"),
)
# A memory's expiry as a write asks for it ($3 expires_at, $4 ttl_s: at most one of them). The
# new time is computed from the parameters alone: Citus refuses a STABLE expression (now(), a
# timestamptz sum) over a column in an UPDATE's SET.
_SET_EXPIRY = """
UPDATE aidb_memory.memory
SET expires_at = coalesce($3, pg_catalog.now() + pg_catalog.make_interval(secs => $4)),
    ttl_s = $4
WHERE actor_key = $1 AND id = $2
"""
# A text stated again outlives the expiry it had: the later of the two wins (never, when the new
# statement has none: the comparison is NULL, not true).
_OUTLIVE = (
    _SET_EXPIRY
    + """  AND (coalesce($3, pg_catalog.now() + pg_catalog.make_interval(secs => $4)) <= expires_at)
      IS NOT TRUE
"""
)
_EXPIRY_TYPES = ("bigint", "bigint", "timestamptz", "int")
# A memory changed in place (a put on its key, update_memory): its words at once (lexemes, and
# tsv, generated), its vector dropped when its text changed (the worker embeds it again). $3 its
# content, $4 its hash, $5 the text search configuration, $6 its metadata, $7 and $8 its agent_id
# and session_id.
_REPLACE = """
UPDATE aidb_memory.memory
SET content = $3, content_hash = $4,
    lexemes = pg_catalog.to_tsvector($5::pg_catalog.regconfig, $3), metadata = $6,
    agent_id = $7, session_id = $8,
    embedding = CASE WHEN content = $3 THEN embedding END,
    embedding_model = CASE WHEN content = $3 THEN embedding_model END,
    updated_at = pg_catalog.now()
WHERE actor_key = $1 AND id = $2
"""
_REPLACE_TYPES = ("bigint", "bigint", "text", "text", "text", "jsonb", "text", "text")
_CLOSE = """
UPDATE aidb_memory.memory SET valid_to = now(), superseded_by = $2, updated_at = now()
WHERE actor_key = $3 AND id = $1 AND valid_to IS NULL
"""
_CLOSE_TYPES = ("bigint", "bigint", "bigint")
_SUPERSEDE = """
UPDATE aidb_memory.memory SET superseded_by = $2 WHERE actor_key = $3 AND id = $1
"""
# Who made a change: the login role (an API call's caller, or the worker's), as the audit log.
_HISTORY = """
INSERT INTO aidb_memory.memory_history
    (actor_key, memory_id, namespace_id, actor_id, event_id, operation, old_content, new_content,
     metadata, by_role, reason)
VALUES ($8, $1, $2, $3, $4, $5, $6, $7, $9, session_user, $10)
"""
_HISTORY_TYPES = (
    *("bigint", "bigint", "text", "bigint", "text", "text", "text", "bigint"),
    *("jsonb", "text"),
)


def query_words(turns: Sequence[extraction.Turn], limit: int = 32) -> str:
    """A to_tsquery OR-expression of the longest distinct words of the turns (only \\w chars:
    nothing the tsquery parser could read as an operator)."""
    words: dict[str, None] = {}
    for t in turns:
        for w in _WORD.findall(t.content.casefold()):
            words.setdefault(w, None)
    chosen = sorted(words, key=len, reverse=True)[:limit]
    return " | ".join(chosen)


def _key(namespace_id: int, actor_id: str, key: int | None) -> int:
    """The actor's key: ``key`` when the caller knows it (every API call and every event does),
    else from the namespace's name (keys.actor_key), read by id."""
    if key is not None:
        return key
    name = db.execute(_NAMESPACE_NAME, ("bigint",), (namespace_id,))[0]["name"]
    return keys.actor_key(name, actor_id)


def lock_actor(namespace_id: int, actor_id: str, key: int | None = None) -> None:
    """Serialize with every other change to this actor's memories, to the end of the
    transaction (reconciliation, delete, forget). Waits only for those, never for a foreign
    session. ``key``: the actor's (keys.actor_key), looked up when not given."""
    ident = (namespace_id, actor_id, _key(namespace_id, actor_id, key))
    if not db.execute(_LOCK, _LOCK_TYPES, ident).nrows():
        db.execute(_LOCK_NEW, _LOCK_TYPES, ident)


def drop_actor_lock(namespace_id: int, actor_id: str, key: int | None = None) -> None:
    """forget: remove the actor's lock row (every trace goes), held until the end of the
    transaction like the lock itself."""
    db.execute(
        _UNLOCK_FORGOTTEN, _LOCK_TYPES, (namespace_id, actor_id, _key(namespace_id, actor_id, key))
    )


def related(
    namespace_id: int, actor_id: str, turns: Sequence[extraction.Turn], key: int | None = None
) -> list[Memory]:
    """The actor's current memories the model is shown beside the turns (``key``: the actor's,
    the event's actor_key; looked up when not given)."""
    rows = db.execute(
        _RELATED,
        ("bigint", "text", "text", "int", "bigint"),
        (
            *(namespace_id, actor_id, query_words(turns), RELATED_LIMIT),
            _key(namespace_id, actor_id, key),
        ),
    )
    return [Memory(int(r["id"]), r["public_id"], r["content"]) for r in rows]


class Writer:
    """Changes to one actor's memories, under the actor's lock (taken when made): by an event
    (:meth:`for_event`; ``event_id`` names it in memory_history and as source_event) or by a
    direct write (remembering.remember: no event). ``out``: what they did (counts and the new
    memories' public ids)."""

    def __init__(
        self,
        namespace_id: int,
        actor_id: str,
        key: int,
        *,
        event_id: int | None = None,
        agent_id: str | None = None,
        session_id: str | None = None,
        vectors: dict[str, list[float]] | None = None,
        embedding_model: str | None = None,
        text_search: str = validation.CONFIG_DEFAULTS["text_search_config"],
        metadata: str = metadata_rules.EMPTY,
        expires_at: str | None = None,
        ttl_s: int | None = None,
    ) -> None:
        self.ns, self.actor, self.key = namespace_id, actor_id, key
        # The namespace's text search configuration, qualified: what memory.lexemes is made with.
        self.text_search = "pg_catalog." + text_search
        self.event_id, self.agent_id, self.session_id = event_id, agent_id, session_id
        self.vectors = vectors or {}
        self.embedding_model = embedding_model
        # What a new memory is tagged with unless told otherwise: the event's memory_metadata.
        self.metadata = metadata
        # When the memories it writes expire (expiry.arguments: at most one of the two).
        self.expires_at, self.ttl_s = expires_at, ttl_s
        lock_actor(self.ns, self.actor, self.key)
        self.out: dict[str, Any] = {
            k: (list(v) if isinstance(v, list) else v) for k, v in EMPTY_RESULT.items()
        }

    @classmethod
    def for_event(
        cls,
        event: Any,
        vectors: dict[str, list[float]] | None,
        embedding_model: str | None,
    ) -> Writer:
        ns, actor = int(event["namespace_id"]), event["actor_id"]
        found = event.get("actor_key")
        config = validation.effective_config(json.loads(event["config"]))
        return cls(
            ns,
            actor,
            _key(ns, actor, None if found is None else int(found)),
            event_id=int(event["id"]),
            agent_id=event["agent_id"],
            session_id=event["session_id"],
            vectors=vectors,
            embedding_model=embedding_model,
            text_search=config["text_search_config"],
            metadata=event.get("memory_metadata") or metadata_rules.EMPTY,
            ttl_s=config["memory_ttl_s"],
        )

    def history(
        self,
        memory_id: int,
        op: str,
        old: str | None,
        new: str | None,
        metadata: str | None = None,
        reason: str | None = None,
    ) -> None:
        """One row of memory_history: ``op`` on the memory, its text before and after, its
        metadata after (JSON text), why (an API call's reason)."""
        db.execute(
            _HISTORY,
            _HISTORY_TYPES,
            (
                *(memory_id, self.ns, self.actor, self.event_id, op, old, new, self.key),
                *(metadata, reason),
            ),
        )

    def store(
        self, text: str, near: bool = True, metadata: str | None = None
    ) -> tuple[int, str, bool]:
        """(memory id, its public id, whether it is new) for ``text``: an existing duplicate or a
        new row, with ``metadata`` (JSON text, checked: metadata.parse; None: the writer's).
        ``near``: a near duplicate (same identifiers) counts too; otherwise only an exact one."""
        digest = extraction.content_hash(text)
        if near:
            same = db.execute(
                extensions.trgm_sql(_SAME, "process_events"),
                ("bigint", "text", "text", "text", "float4", "int", "bigint"),
                (self.ns, self.actor, digest, text, NEAR_DUPLICATE, NEAR_CANDIDATES, self.key),
            )
        else:
            same = db.execute(
                _SAME_EXACT,
                ("bigint", "text", "text", "bigint"),
                (self.ns, self.actor, digest, self.key),
            )
        for candidate in same:
            if candidate["expired"]:
                if candidate["exact"]:
                    self._purge(int(candidate["id"]))
                continue
            if candidate["exact"] or identifiers.same_identifiers(candidate["content"], text):
                if candidate["expiring"]:
                    self._set_expiry(_OUTLIVE, int(candidate["id"]))
                return int(candidate["id"]), str(candidate["public_id"]), False
        return self._insert(text, digest, self.metadata if metadata is None else metadata, None)

    def _set_expiry(self, statement: str, memory_id: int) -> None:
        db.execute(statement, _EXPIRY_TYPES, (self.key, memory_id, self.expires_at, self.ttl_s))

    def _purge(self, memory_id: int) -> None:
        """Delete the actor's expired memory ``memory_id`` where it holds the place of what is
        written now (expiry.purge)."""
        name = db.execute(_NAMESPACE_NAME, ("bigint",), (self.ns,))[0]["name"]
        expiry.purge(self.ns, name, self.actor, self.key, [memory_id])

    def _insert(
        self, text: str, digest: str, metadata: str, key: str | None
    ) -> tuple[int, str, bool]:
        row = db.execute(
            _INSERT,
            _INSERT_TYPES,
            (
                self.ns,
                self.actor,
                self.agent_id,
                self.session_id,
                text,
                digest,
                self.event_id,
                self.vectors.get(text),
                self.embedding_model,
                self.key,
                self.text_search,
                metadata,
                key,
                self.expires_at,
                self.ttl_s,
            ),
        )[0]
        self.history(int(row["id"]), "add", None, text, metadata)
        self.out["memories"].append(row["public_id"])
        return int(row["id"]), str(row["public_id"]), True

    def put(self, key: str, text: str, metadata: str) -> tuple[str, bool]:
        """(public id, whether its text is new) of the actor's current memory of ``key``, which
        says ``text`` with ``metadata`` (and this writer's agent_id, session_id and expiry)
        afterwards: a new memory, or the one of the key changed in place (an ``update`` in its
        history) unless it was that already (a repeated put changes nothing but its expiry)."""
        found = db.execute(
            _KEYED,
            _KEYED_TYPES,
            (
                *(self.ns, self.actor, key, self.key, text, metadata),
                *(self.agent_id, self.session_id, self.expires_at, self.ttl_s),
            ),
        )
        if found.nrows() and found[0]["expired"]:
            self._purge(int(found[0]["id"]))
        elif found.nrows():
            row = found[0]
            if not row["same_expiry"]:
                self._set_expiry(_SET_EXPIRY, int(row["id"]))
            if row["unchanged"]:
                return str(row["public_id"]), False
            self.replace(int(row["id"]), row["content"], text, metadata, None)
            return str(row["public_id"]), row["content"] != text
        _, public_id, _ = self._insert(text, extraction.content_hash(text), metadata, key)
        return public_id, True

    def replace(
        self, memory_id: int, old: str, text: str, metadata: str, reason: str | None
    ) -> None:
        """Change the memory ``memory_id`` (which says ``old``) in place to ``text`` and
        ``metadata`` (this writer's agent_id and session_id), recorded as an ``update``."""
        db.execute(
            _REPLACE,
            _REPLACE_TYPES,
            (
                *(self.key, memory_id, text, extraction.content_hash(text), self.text_search),
                *(metadata, self.agent_id, self.session_id),
            ),
        )
        self.history(memory_id, "update", old, text, metadata, reason)


def apply(
    event: Any,
    operations: Sequence[extraction.Operation],
    refs: dict[str, Memory],
    vectors: dict[str, list[float]] | None = None,
    embedding_model: str | None = None,
) -> dict[str, Any]:
    """Apply ``operations`` for ``event``; what changed (counts and the new memories' ids).
    ``vectors``: the embedding of each new text, by ``embedding_model`` (its registered name,
    which search compares with the namespace's)."""
    w = Writer.for_event(event, vectors, embedding_model)
    out, key = w.out, w.key
    for op in operations:
        target = refs.get(op.target) if op.target else None
        old = None
        if target is not None:
            current = db.execute(_CURRENT, ("bigint", "bigint"), (target.id, key))
            old = current[0]["content"] if current.nrows() else None
        if op.op == "add" or (op.op == "update" and old is None):
            assert op.text is not None
            _, _, new = w.store(op.text)
            out["added" if new else "duplicates"] += 1
        elif op.op == "update" and target is not None and op.text is not None:
            if extraction.content_hash(op.text) == extraction.content_hash(old or ""):
                out["duplicates"] += 1
                continue
            # Close the old one first: the new content may be a near duplicate of it.
            db.execute(_CLOSE, _CLOSE_TYPES, (target.id, None, key))
            new_id, _, _ = w.store(op.text)
            db.execute(_SUPERSEDE, _CLOSE_TYPES, (target.id, new_id, key))
            w.history(target.id, "supersede", old, op.text)
            out["updated"] += 1
        elif op.op == "invalidate" and target is not None and old is not None:
            db.execute(_CLOSE, _CLOSE_TYPES, (target.id, None, key))
            w.history(target.id, "invalidate", old, None)
            out["invalidated"] += 1
    return out


def add_verbatim(
    event: Any,
    texts: Sequence[str],
    vectors: dict[str, list[float]] | None = None,
    embedding_model: str | None = None,
) -> dict[str, Any]:
    """Verbatim extraction (issue 26): store each of ``texts`` as a memory of ``event``, merging
    exact duplicates only (the same normalized content as a current memory of the actor, or as
    an earlier text of the event, which is one by then); the same result as :func:`apply`."""
    w = Writer.for_event(event, vectors, embedding_model)
    for text in texts:
        _, _, new = w.store(text, near=False)
        w.out["added" if new else "duplicates"] += 1
    return w.out
