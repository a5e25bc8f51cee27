"""Expiry (issue 34): memories that live for a time, and the sweep that deletes them.

A memory expires at ``memory.expires_at`` (NULL: never): remember's ``expires_at``, or now plus
a time to live (remember's ``ttl_s``, else the namespace's ``config.memory_ttl_s``), which the
memory keeps (``memory.ttl_s``) so that a read with ``refresh_ttl`` pushes its expiry as far again
(LangGraph's ``refresh_on_read``). From the moment it expires, a memory is as if deleted: every
read leaves it out (each statement tests ``expires_at`` itself, so nothing waits for a sweep), and
a write that meets it where it holds a place (its text among the keyless memories, its key) first
deletes it (:func:`purge`), then goes on as if it were not there. The worker deletes expired
memories a bounded batch at a time (sweeping.py), each actor's under the actor's lock, with their
history, audited as ``expire`` with counts and no content, as ``delete`` is (:func:`purge`).

Reads compare with ``statement_timestamp()``, writes compute from ``now()`` (as created_at): a
memory written with a time to live of one second is gone for a read one second into the same
transaction.
"""

from __future__ import annotations

from aidb_memory_server import db, erasure, validation
from aidb_memory_server.access import Namespace
from aidb_memory_server.errors import invalid
from aidb_memory_server.sessions import subject_hash

# Whether a time given as expires_at is still to come.
_FUTURE = "SELECT $1::timestamptz > pg_catalog.statement_timestamp() AS future"


# Those of the memories $5 (internal ids) that have expired (erasure.py's $-parameters).
_PURGE = erasure.statement(
    "m.id = ANY ($5::bigint[]) AND m.expires_at <= pg_catalog.statement_timestamp()", "expire"
)
EXPIRED_REASON = "expired"


def arguments(
    fn: str, ns: Namespace, expires_at: str | None, ttl_s: int | None
) -> tuple[str | None, int | None]:
    """(expires_at, ttl_s) of a new memory from a call's arguments: at most one of the two; a
    time to come; a time to live of 1 s to ten years. Neither: the namespace's
    config.memory_ttl_s (None: never)."""
    if expires_at is not None and ttl_s is not None:
        raise invalid(
            fn, "ttl_s", "and expires_at are both given", hint="say when it expires one way"
        )
    if ttl_s is not None:
        if not 1 <= ttl_s <= validation.MEMORY_TTL_MAX_S:
            raise invalid(fn, "ttl_s", f"must be between 1 and {validation.MEMORY_TTL_MAX_S}")
        return None, ttl_s
    if expires_at is not None:
        if not db.execute(_FUTURE, ("text",), (expires_at,))[0]["future"]:
            raise invalid(fn, "expires_at", "is not in the future", hint="pass a time to come")
        return expires_at, None
    return None, ns.config.get("memory_ttl_s")


def purge(namespace_id: int, namespace_name: str, actor: str, key: int, ids: list[int]) -> int:
    """Delete those of the memories ``ids`` of the actor that have expired, with their history,
    audited as ``expire``; how many went. The caller holds the actor's lock."""
    rows = db.execute(
        _PURGE,
        (*erasure.TYPES[:4], "bigint[]", *erasure.TYPES[5:]),
        (
            *(namespace_id, actor, None, None, ids, namespace_name),
            *(subject_hash(namespace_name, actor), EXPIRED_REASON, "expired", key),
        ),
    )
    return int(rows[0]["n"])
