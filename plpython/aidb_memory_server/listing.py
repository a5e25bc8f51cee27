"""``list_memories`` (SPEC §5): the actor's memories, newest first, a page at a time (issue 34:
a cursor, and search's filters), and the row of one memory that get_memory and update_memory
(addressed.py) return too; ``list_actors`` (issue 35): a namespace's actors, for its tenant.
"""

from __future__ import annotations

from typing import Any

from aidb_memory_server import db, filtering, keys
from aidb_memory_server.access import identifier, namespace, namespace_of, quote
from aidb_memory_server.errors import OBJECT_NOT_IN_PREREQUISITE_STATE, ApiError, invalid
from aidb_memory_server.memories import filters, limit_argument, memory_filter

LIST_MAX = 1000
LIST_DEFAULT = 50

# A memory as list_memories, get_memory and update_memory return it (list_memories_result), from
# m, the memory, and s, the one that superseded it (LEFT JOIN): what follows their SELECT. Every
# statement that reads through it leaves expired memories out (expiry.py).
MEMORY_ROW = """
       m.public_id::text AS id, m.content, m.agent_id, m.session_id,
       to_json(m.valid_from) #>> '{}' AS valid_from, to_json(m.valid_to) #>> '{}' AS valid_to,
       s.public_id::text AS superseded_by, to_json(m.created_at) #>> '{}' AS created_at,
       to_json(m.updated_at) #>> '{}' AS updated_at, m.metadata, m.key,
       to_json(m.expires_at) #>> '{}' AS expires_at
FROM aidb_memory.memory m
LEFT JOIN aidb_memory.memory s ON s.actor_key = m.actor_key AND s.id = m.superseded_by
"""
# $1 namespace, $2 actor, $3 session_id, $4 agent_id, $5 include_superseded, $6 limit, $7 the
# actor's key; after a cursor (_AFTER in place of /*after*/), $8 and $9 its memory's created_at
# and id (the redundant bound on created_at is what memory_actor_idx seeks to); then the filter's
# parameters (at filtering.SLOT).
_LIST = (
    "SELECT"
    + MEMORY_ROW
    + """WHERE m.actor_key = $7 AND m.namespace_id = $1 AND m.actor_id = $2
  AND ($3::text IS NULL OR m.session_id = $3) AND ($4::text IS NULL OR m.agent_id = $4)
  AND ($5 OR m.valid_to IS NULL)
  AND (m.expires_at IS NULL OR m.expires_at > statement_timestamp())/*after*//*filter*/
ORDER BY m.created_at DESC, m.id DESC
LIMIT $6
"""
)
_LIST_TYPES = ("bigint", "text", "text", "text", "boolean", "int", "bigint")
_AFTER = "\n  AND m.created_at <= $8 AND (m.created_at, m.id) < ($8, $9)"
_AFTER_TYPES = ("timestamptz", "bigint")
# The memory a cursor names: where the next page starts (found as addressed._BY_ID finds it).
_CURSOR = """
SELECT m.created_at, m.id FROM aidb_memory.memory m
WHERE m.actor_key = $3 AND m.public_id = $4 AND m.namespace_id + 0 = $1 AND m.actor_id || '' = $2
"""
_CURSOR_TYPES = ("bigint", "text", "bigint", "uuid")


def list_memories(
    namespace_name: str | None,
    actor_id: str | None,
    session_id: str | None,
    agent_id: str | None,
    limit: int | None,
    include_superseded: bool | None,
    filter_json: str | None = None,
    after: str | None = None,
) -> list[dict[str, Any]]:
    """The actor's memories, newest first; superseded ones only when asked for; those that
    ``filter_json`` selects; after the memory ``after`` (the last of the previous page)."""
    fn = "list_memories"
    ns, actor = namespace(fn, namespace_name, actor_id, writing=False)
    sid, agent = filters(fn, ns, session_id, agent_id)
    n = limit_argument(fn, limit, LIST_DEFAULT, LIST_MAX)
    # The filter is refused before anything is read.
    first = len(_LIST_TYPES) + (len(_AFTER_TYPES) if after is not None else 0) + 1
    condition = memory_filter(fn, ns, filter_json, first)
    key = keys.actor_key(ns.name, actor)
    types: tuple[str, ...] = _LIST_TYPES
    params: tuple[Any, ...] = (ns.id, actor, sid, agent, bool(include_superseded), n, key)
    cursor = ""
    if after is not None:
        found = db.execute(_CURSOR, _CURSOR_TYPES, (ns.id, actor, key, after))
        if not found.nrows():
            raise invalid(
                fn,
                "after",
                "is not a memory of the actor",
                hint="pass the id of the last memory of the previous page (NULL: the first page)",
            )
        cursor = _AFTER
        types += _AFTER_TYPES
        params += (found[0]["created_at"], found[0]["id"])
    where = ""
    if condition is not None:
        where = f"\n  AND {condition.sql}"
        types += condition.types
        params += condition.params
    rows = db.execute(
        _LIST.replace("/*after*/", cursor).replace(filtering.SLOT, where), types, params
    )
    return [dict(r) for r in rows]


# --- list_actors (issue 35) -------------------------------------------------------------------

ACTORS_MAX = 1000
ACTORS_DEFAULT = 100
# The actors of a namespace: those with a session and those with a current memory (memory_lexeme's
# '' row, which exists while the actor has one), each in code-point order from a bound: two
# statements (on Citus each spans the shards; a UNION of the two would not be planned there),
# merged here. $2: the prefix (every actor starting with it is >= it), $3 the cursor (exclusive),
# $4 the page. The indexes (migrations/0028_list_actors.sql) are in the same order (COLLATE "C"),
# on namespace_id + 0: only these statements use them.
_ACTORS = """
-- spans actors: list_actors pages a namespace's actors for the role it is granted to
SELECT DISTINCT t.actor_id COLLATE "C" AS actor_id FROM aidb_memory.{table} t
WHERE t.namespace_id + 0 = $1{only}
  AND t.actor_id COLLATE "C" >= $2 AND t.actor_id COLLATE "C" > $3
  AND pg_catalog.starts_with(t.actor_id, $2)
ORDER BY 1
LIMIT $4
"""
_ACTOR_STATEMENTS = (
    _ACTORS.format(table="session", only=""),
    _ACTORS.format(table="memory_lexeme", only="\n  AND t.lexeme = ''"),
)


def list_actors(
    namespace_name: str | None, prefix: str | None, limit: int | None, after: str | None
) -> list[str]:
    """The namespace's actors (with a session or a current memory) in code-point order, those
    starting with ``prefix``, after the actor ``after`` (the last of the previous page). Only in
    a namespace with grants, for its roles: in an open one it would show every tenant's users to
    every application."""
    fn = "list_actors"
    ns = namespace_of(fn, namespace_name)
    if not ns.restricted:
        raise ApiError(
            OBJECT_NOT_IN_PREREQUISITE_STATE,
            f"aidb_memory.{fn}: namespace {quote(ns.name)} has no grants",
            hint="actors are listed only in a namespace granted to its application's roles "
            "(an admin grants it with aidb_memory.namespace_grant)",
        )
    n = limit_argument(fn, limit, ACTORS_DEFAULT, ACTORS_MAX)
    cap = ns.setting("max_identifier_chars")
    start = identifier(fn, "prefix", prefix, cap, optional=True) if prefix != "" else ""
    cursor = identifier(fn, "after", after, cap, optional=True)
    params = (ns.id, start or "", cursor or "", n)
    found: set[str] = set()
    for sql in _ACTOR_STATEMENTS:
        rows = db.execute(sql, ("bigint", "text", "text", "int"), params)
        found.update(r["actor_id"] for r in rows)
    # Code-point order, as the statements' COLLATE "C": Python compares str by code point.
    # One column: PL/Python takes each value as the row.
    return sorted(found)[:n]
