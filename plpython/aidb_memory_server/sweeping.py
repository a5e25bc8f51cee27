"""The sweep of expired memories (issue 34; expiry.py says what expiry is): ``expire_memories``,
which process_events calls once a call, and an admin or a pg_cron job may call too."""

from __future__ import annotations

from typing import Any

from aidb_memory_server import db, expiry, reconciliation
from aidb_memory_server.errors import invalid

# How many expired memories one call of expire_memories deletes at most, by default (process_events
# calls it once per call: a backlog is worked off a batch per call).
SWEEP_BATCH = 1000
SWEEP_MAX = 100_000

# The expired memories of every actor, soonest expired first, up to $1, grouped by actor in the
# order their locks are taken (every sweep takes them in this order: two never wait on each
# other). $2 and $3: only actor keys in that range (a worker's --key-range), or both NULL.
_EXPIRED = """
-- spans actors: the worker's sweep of every actor's expired memories (memory_expires_idx)
SELECT x.actor_key, x.namespace_id, x.actor_id, n.name AS namespace, array_agg(x.id) AS ids
FROM (
    SELECT m.actor_key, m.namespace_id, m.actor_id, m.id
    FROM aidb_memory.memory m
    WHERE m.expires_at <= pg_catalog.statement_timestamp()
      AND ($2::bigint IS NULL OR m.actor_key BETWEEN $2 AND $3)
    ORDER BY m.expires_at
    LIMIT $1
) x
JOIN aidb_memory.namespace n ON n.id = x.namespace_id
GROUP BY x.actor_key, x.namespace_id, x.actor_id, n.name
ORDER BY x.actor_key, x.namespace_id, x.actor_id
"""


def expire_memories(max_memories: int | None, key_min: int | None, key_max: int | None) -> int:
    """The sweep (workers, admins, pg_cron): delete up to ``max_memories`` expired memories of
    any actor (with ``key_min`` and ``key_max``, of actors whose key is in that range), each
    actor's under its lock; how many went."""
    fn = "expire_memories"
    most = SWEEP_BATCH if max_memories is None else max_memories
    if not 1 <= most <= SWEEP_MAX:
        raise invalid(fn, "max_memories", f"must be between 1 and {SWEEP_MAX}")
    if (key_min is None) != (key_max is None):
        raise invalid(fn, "key_min", "and key_max go together", hint="pass both or neither")
    if key_min is not None and key_max is not None and key_min > key_max:
        raise invalid(fn, "key_min", "is greater than key_max")
    found = db.execute(_EXPIRED, ("int", "bigint", "bigint"), (most, key_min, key_max))
    gone = 0
    for actor in found:
        ident: Any = (int(actor["namespace_id"]), actor["actor_id"], int(actor["actor_key"]))
        reconciliation.lock_actor(*ident)
        gone += expiry.purge(ident[0], actor["namespace"], ident[1], ident[2], list(actor["ids"]))
    return gone
