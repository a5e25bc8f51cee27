"""Erasure of memories, the one statement ``delete`` (memories.py) and the expiry of memories
(expiry.py) run: the memories a condition selects go with their history, their text leaves the
history of the actor's other memories, and one audit row keeps the counts and the reason, never
content or ids."""

from __future__ import annotations

# What a selector names, in one statement each: $1 namespace, $2 actor, $3 session_id,
# $4 agent_id, $5 the selector's value, $6 namespace name, $7 subject hash, $8 reason,
# $9 selector kind, $10 the actor's key. The deleted memories' history goes with them (ON DELETE
# CASCADE); their text is also blanked where the history of the actor's other memories quotes it
# (a fact that superseded or was superseded by one deleted), unless a remaining memory still
# holds it. A remaining memory superseded by a deleted one no longer names it (superseded_by: the
# foreign key is NO ACTION, Citus refuses SET NULL between distributed tables; migration 0015).
_DELETE = """
WITH d AS (
    DELETE FROM aidb_memory.memory m
    WHERE m.actor_key = $10 AND m.namespace_id = $1 AND m.actor_id = $2
      AND ($3::text IS NULL OR m.session_id = $3) AND ($4::text IS NULL OR m.agent_id = $4)
      AND {condition}
    RETURNING m.id, m.content
), unlink AS (
    UPDATE aidb_memory.memory x SET superseded_by = NULL
    WHERE x.actor_key = $10 AND x.superseded_by IN (SELECT id FROM d)
      AND x.id NOT IN (SELECT id FROM d)
    RETURNING 1
), h AS (
    SELECT count(*) AS n FROM aidb_memory.memory_history x
    WHERE x.actor_key = $10 AND x.memory_id IN (SELECT id FROM d)
), gone AS (
    SELECT DISTINCT d.content FROM d
    WHERE NOT EXISTS (
        SELECT 1 FROM aidb_memory.memory r
        WHERE r.actor_key = $10 AND r.namespace_id = $1 AND r.actor_id = $2
          AND r.content = d.content
          AND r.id NOT IN (SELECT id FROM d))
), scrub AS (
    UPDATE aidb_memory.memory_history x
    SET old_content = CASE WHEN x.old_content IN (SELECT content FROM gone) THEN NULL
                           ELSE x.old_content END,
        new_content = CASE WHEN x.new_content IN (SELECT content FROM gone) THEN NULL
                           ELSE x.new_content END
    WHERE x.actor_key = $10 AND x.namespace_id = $1 AND x.actor_id = $2
      AND x.memory_id NOT IN (SELECT id FROM d)
      AND (x.old_content IN (SELECT content FROM gone)
           OR x.new_content IN (SELECT content FROM gone))
    RETURNING 1
), a AS (
    INSERT INTO aidb_memory.audit_log (by_role, action, namespace, subject_hash, counts, reason)
    SELECT session_user, '{action}', $6, $7,
           jsonb_build_object('memories', count(*), 'memory_history', (SELECT n FROM h),
                              'selector', $9::text),
           $8
    FROM d HAVING count(*) > 0
)
SELECT count(*) AS n FROM d
"""
# The parameters' types, $5 (the condition's value) aside: the caller's.
TYPES = (
    *("bigint", "text", "text", "text", "text"),
    *("text", "text", "text", "text", "bigint"),
)


def statement(condition: str, action: str) -> str:
    """The erasure of the memories (alias ``m``) for which ``condition`` holds, audited as
    ``action``."""
    return _DELETE.format(condition=condition, action=action)
