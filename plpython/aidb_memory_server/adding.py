"""``add`` (SPEC §3): a batch of turns stored all or none, with its event.

Its own module so that the add path imports what it needs (json, turns) once, at load, while a
read, which imports ``sessions``, loads neither (docs/architecture.md, "Loading the code").
One statement on the common path (_fast_add: _FAST_STORE), two on the general one: lock
(namespace, session, key), then store (docs/architecture.md, "Why add costs one statement, or
two"). Every statement is on one actor's rows, by its key (issue 15): keys.actor_key of the
namespace name and actor the call names, passed as a parameter.
"""

from __future__ import annotations

import json

from aidb_memory_server import db, keys, turns
from aidb_memory_server import metadata as metadata_rules
from aidb_memory_server.access import (
    NS_COLUMNS,
    Namespace,
    check_namespace,
    identifier,
    namespace,
    quote,
)
from aidb_memory_server.errors import (
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    UNIQUE_VIOLATION,
    ApiError,
    required,
)
from aidb_memory_server.sessions import create_session, one

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


_BY_KEY = """
SELECT public_id::text AS public_id, turns_hash FROM aidb_memory.event
WHERE actor_key = $4 AND namespace_id = $1 AND actor_id = $2 AND idempotency_key = $3
"""
# The general path's first statement: the namespace, the session row locked (positions are
# allocated under this lock, so they are gap-free), and an earlier event with this key. $5 is
# the actor's key. Without an idempotency key the event is not joined at all (_UNKEYED): a join
# condition that a NULL parameter makes constant-false leaves Citus no shard of that table to
# route to, and it plans the whole statement over every shard (docs/scaling.md).
_REPLAY_COLUMNS = "r.public_id::text AS replay_id, r.turns_hash AS replay_hash"


def _replay_join(key: str, actor_key: str) -> str:
    return f"""
LEFT JOIN aidb_memory.event r
       ON r.actor_key = {actor_key} AND r.namespace_id = n.id AND r.actor_id = $2
      AND r.idempotency_key = {key}"""


_LOCK_FOR_ADD = f"""
SELECT {NS_COLUMNS},
       s.id AS ref, s.next_seq, s.total_chars, s.closed_at IS NOT NULL AS closed,
       s.tail_sequence_id, s.tail_round_start, s.open_calls, s.tail_joinable, s.tail_item_type,
       s.pinned_seq, l.ahead_at, l.read_budget,
       {_REPLAY_COLUMNS}
FROM aidb_memory.session s
JOIN aidb_memory.namespace n ON n.id = s.namespace_id
-- Where a compaction task becomes due (compactor._remember); read, never locked.
LEFT JOIN aidb_memory.compaction_ahead l ON l.actor_key = $5 AND l.session_ref = s.id\
{_replay_join("$4", "$5")}
-- A namespace with grants: only once check_namespace let the caller in ($6), so that a refused
-- caller never holds a lock on another tenant's session.
WHERE n.name = $1 AND (NOT n.restricted OR $6)
  AND s.actor_key = $5 AND s.namespace_id = n.id AND s.actor_id = $2 AND s.session_id = $3
FOR NO KEY UPDATE OF s
"""
_NAMESPACE_AND_KEY = f"""
SELECT {NS_COLUMNS},
       {_REPLAY_COLUMNS}
FROM aidb_memory.namespace n\
{_replay_join("$3", "$4")}
WHERE n.name = $1
"""
# The same statements for a call without an idempotency key.
_UNKEYED = {
    sql: sql.replace(_REPLAY_COLUMNS, "NULL::text AS replay_id, NULL::text AS replay_hash").replace(
        join, ""
    )
    for sql, join in (
        (_LOCK_FOR_ADD, _replay_join("$4", "$5")),
        (_NAMESPACE_AND_KEY, _replay_join("$3", "$4")),
    )
}
# The second statement: the event, the turns, the session's counters and tail. With an
# idempotency key the event insert may meet a concurrent twin (committed after our snapshot);
# then nothing else is written and no row comes back. $33 is the actor's key.
_STORE = """
WITH e AS (
    INSERT INTO aidb_memory.event
        (actor_key, namespace_id, actor_id, agent_id, session_id, idempotency_key, turns_hash,
         turns, turn_count, status, memory_metadata)
    VALUES ($33, $1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $34)
    ON CONFLICT (actor_key, namespace_id, actor_id, idempotency_key)
        WHERE idempotency_key IS NOT NULL
    DO NOTHING
    RETURNING id, public_id
), t AS (
    INSERT INTO aidb_memory.turn
        (actor_key, session_ref, seq, round_start, char_offset, chars, role, content, kind, name,
         tool_calls, tool_call_id, meta, item, item_format, event_ref)
    SELECT $33, $10, $11 + u.o - 1, u.round_start, u.char_offset, u.chars, u.role, u.content,
           u.kind, u.name, u.tool_calls::jsonb, u.tool_call_id, u.meta::jsonb, u.item::jsonb,
           u.item_format, e.id
    FROM e, unnest($12::bigint[], $13::bigint[], $14::int[], $15::text[], $16::text[], $17::text[],
                   $18::text[], $19::text[], $20::text[], $21::text[], $27::text[], $28::text[])
         WITH ORDINALITY AS u(round_start, char_offset, chars, role, content, kind, name,
                              tool_calls, tool_call_id, meta, item, item_format, o)
    WHERE $10 IS NOT NULL
), s AS (
    UPDATE aidb_memory.session
    SET next_seq = next_seq + $8, total_chars = total_chars + $26, updated_at = now(),
        tail_sequence_id = $22, tail_round_start = $23, open_calls = $24,
        last_user_seq = coalesce($25, last_user_seq), tail_joinable = $29,
        tail_item_type = $30,
        -- The instructions prefix (pin_instructions) grows by the batch's leading
        -- system/developer turns while every turn so far is one (computed under the row lock).
        pinned_seq = pinned_seq + $31, pinned_chars = pinned_chars + $32
    WHERE actor_key = $33 AND id = $10 AND EXISTS (SELECT 1 FROM e)
)
-- An event for the extraction worker wakes the workers that LISTEN (delivered at commit).
SELECT public_id::text AS public_id,
       CASE WHEN $9 = 'accepted' THEN pg_notify('aidb_memory_events', '') END AS woke
FROM e
"""
_STORE_TYPES = (
    *("bigint", "text", "text", "text", "text", "text", "text", "int", "text"),
    *("bigint", "bigint", "bigint[]", "bigint[]", "int[]"),
    *("text[]",) * 7,
    *("text", "bigint", "text[]", "bigint", "bigint"),
    *("text[]", "text[]", "boolean", "text", "bigint", "bigint", "bigint", "jsonb"),
)
# A compaction task for the worker (issue 13), only when this add passes the session's ahead
# threshold (_ahead_budget): a statement of its own, so that the common path stays two
# statements and its second one costs what it did (a second insert into event in it, even one
# that inserts nothing, costs every add its executor setup). At most one task is pending per
# session; it wakes the workers that LISTEN (at commit).
_QUEUE_COMPACTION = """
WITH c AS (
    INSERT INTO aidb_memory.event
        (actor_key, namespace_id, actor_id, session_id, turn_count, status, kind, session_ref,
         budget)
    VALUES ($6, $1, $2, $3, 0, 'accepted', 'compaction', $4, $5)
    ON CONFLICT (actor_key, session_ref)
        WHERE kind = 'compaction' AND status IN ('accepted', 'processing')
    DO NOTHING
    RETURNING 1
)
SELECT pg_notify('aidb_memory_events', '') AS woke FROM c
"""
_QUEUE_TYPES = ("bigint", "text", "text", "bigint", "int", "bigint")
# The common path in one statement (issue 14): an add without an idempotency key to an open
# session whose tail cannot change how the batch is placed (no open tool calls, and for a
# Responses batch no reasoning or call item last), by a backend that has read the namespace
# before (_known). The batch was validated and placed in its rounds against that namespace row
# and a neutral tail, positions relative to the batch; the session's counters are moved by the
# UPDATE, whose RETURNING gives the positions it allocated under its row lock (a concurrent add
# committed first is seen there, as in _LOCK_FOR_ADD). No row comes back when the namespace row
# is another version now, the session is missing, closed or has another tail: nothing is
# written, and add takes the general path. $32 is the actor's key.
# The namespace row's version is what validated the batch: its config and model_spec ($2, $3, as
# _known holds them), and the row ACTIVE. Not its xmin and ctid: on Citus the namespace is a
# reference table, and each node's copy of a row has its own (this statement reads the copy on
# the session's worker, which another actor's add may have cached from another node's copy).
_FAST_STORE = """
WITH s AS (
    UPDATE aidb_memory.session AS s
    SET next_seq = s.next_seq + $7, total_chars = s.total_chars + $8, updated_at = now(),
        tail_sequence_id = $9, tail_round_start = s.next_seq + $10, open_calls = $11,
        last_user_seq = coalesce(s.next_seq + $12, s.last_user_seq), tail_joinable = $13,
        tail_item_type = $14,
        -- The instructions prefix grows only while every turn so far is one (as in add).
        pinned_seq = s.pinned_seq + CASE WHEN s.pinned_seq = s.next_seq - 1 THEN $15 ELSE 0 END,
        pinned_chars = s.pinned_chars + CASE WHEN s.pinned_seq = s.next_seq - 1 THEN $16 ELSE 0 END
    FROM aidb_memory.namespace AS n
    WHERE n.name = $1 AND n.config = $2::jsonb AND n.model_spec = $3::jsonb
      AND n.state = 'ACTIVE' AND session_user = $4 AND NOT n.restricted
      AND s.actor_key = $32 AND s.namespace_id = n.id AND s.actor_id = $5 AND s.session_id = $6
      AND s.closed_at IS NULL AND s.open_calls = '{}'
      AND NOT ($17 AND (s.tail_item_type = 'reasoning' OR right(s.tail_item_type, 5) = '_call'))
    RETURNING s.id, s.namespace_id, s.next_seq - $7 AS first_seq,
              s.total_chars - $8 AS first_offset, s.total_chars
), e AS (
    INSERT INTO aidb_memory.event
        (actor_key, namespace_id, actor_id, agent_id, session_id, turn_count, status)
    SELECT $32, s.namespace_id, $5, $18, $6, $7, $19 FROM s
    RETURNING id, public_id
), t AS (
    INSERT INTO aidb_memory.turn
        (actor_key, session_ref, seq, round_start, char_offset, chars, role, content, kind, name,
         tool_calls, tool_call_id, meta, item, item_format, event_ref)
    SELECT $32, s.id, s.first_seq + u.o - 1, s.first_seq + coalesce(u.round_start, u.o - 1),
           s.first_offset + u.char_offset, u.chars, u.role, u.content, u.kind, u.name,
           u.tool_calls::jsonb, u.tool_call_id, coalesce(u.meta::jsonb, '{}'), u.item::jsonb,
           u.item_format, e.id
    FROM s, e, unnest($20::bigint[], $21::bigint[], $22::int[], $23::text[], $24::text[],
                      $25::text[], $26::text[], $27::text[], $28::text[], $29::text[],
                      $30::text[], $31::text[])
         WITH ORDINALITY AS u(round_start, char_offset, chars, role, content, kind, name,
                              tool_calls, tool_call_id, meta, item, item_format, o)
)
SELECT e.public_id::text AS public_id, s.id AS ref, s.total_chars, l.ahead_at, l.read_budget,
       CASE WHEN $19 = 'accepted' THEN pg_notify('aidb_memory_events', '') END AS woke
FROM e CROSS JOIN s
LEFT JOIN aidb_memory.compaction_ahead l ON l.actor_key = $32 AND l.session_ref = s.id
"""
# The same without the ahead threshold, for a namespace that queues no compaction task
# (_ahead_budget would return None whatever it says): its lookup cost ~2% of such an add.
_FAST_STORE_NO_AHEAD = _FAST_STORE.replace(
    "l.ahead_at, l.read_budget,", "NULL AS ahead_at, NULL AS read_budget,"
).replace(
    "\nLEFT JOIN aidb_memory.compaction_ahead l ON l.actor_key = $32 AND l.session_ref = s.id", ""
)
_FAST_TYPES = (
    *("text", "text", "text", "text", "text", "text", "int", "bigint", "text", "bigint"),
    *("text[]", "bigint", "boolean", "text", "bigint", "bigint", "boolean", "text", "text"),
    *("bigint[]", "bigint[]", "int[]"),
    *("text[]",) * 9,
    "bigint",
)
# Per backend: each namespace's row as add last read it, whose config validates the batches of
# the one-statement path (which writes only while the row still has that config, _FAST_STORE).
# Bounded: cleared when it grows past _KNOWN_MAX namespaces.
_known: dict[str, Any] = {}
_KNOWN_MAX = 64
_NO_TURNS: tuple[Any, ...] = ([],) * 10
_INSTRUCTION_ROLES = frozenset(("system", "developer"))
_NO_ITEMS: tuple[Any, ...] = ([], [], False, None, 0, 0)


def _event_status(ns: Namespace) -> str:
    # Skipped with extraction off, or when extraction_mode "model" has no model to call; else
    # the worker extracts (verbatim without a model that can extract: issue 26).
    if not ns.config["extraction"]:
        return "skipped"
    if ns.config["extraction_mode"] == "model" and not ns.model_spec.get("llm"):
        return "skipped"
    return "accepted"


def _replayed(fn: str, public_id: str, stored_hash: str | None, new_hash: str, key: str) -> str:
    if stored_hash != new_hash:
        raise ApiError(
            UNIQUE_VIOLATION,
            f"aidb_memory.{fn}: idempotency_key {quote(key)} was already used with a different "
            "batch (other turns, session or agent)",
            hint="use a new idempotency_key for a new batch; a retry must send the same request",
        )
    return public_id


def _after_lost_race(
    fn: str, ns: Namespace, actor: str, key: str | None, batch_hash: str, actor_key: int
) -> str:
    # Our event insert met a twin committed after our snapshot: answer as a retry of it.
    assert key is not None
    seen = db.execute(_BY_KEY, ("bigint", "text", "text", "bigint"), (ns.id, actor, key, actor_key))
    return _replayed(fn, seen[0]["public_id"], seen[0]["turns_hash"], batch_hash, key)


def _tags(fn: str, ns: Namespace, memory_metadata: str | None) -> str | None:
    """add's memory_metadata, checked as remember's metadata (metadata.parse); None: none."""
    if memory_metadata is None:
        return None
    cap = ns.config["memory_metadata_max_chars"]
    return metadata_rules.parse(fn, "memory_metadata", memory_metadata, cap)


def add(
    namespace_name: str | None,
    actor_id: str | None,
    turns_json: str | None,
    session_id: str | None,
    agent_id: str | None,
    idempotency_key: str | None,
    memory_metadata: str | None = None,
) -> str:
    """Store a batch of turns (all or none) and record its event; returns the event id.
    ``memory_metadata``: the JSON object the worker copies onto the memories it makes of them.

    One statement when the backend knows the namespace (_fast_add), else two: lock
    (namespace, session, key), then store.
    """
    fn = "add"
    if namespace_name is None:
        raise required(fn, "namespace")
    if turns_json is None:
        raise required(fn, "turns")
    if actor_id is None:
        raise required(fn, "actor_id")
    if (
        session_id is not None
        and idempotency_key is None
        and memory_metadata is None
        and namespace_name in _known
    ):
        done = _fast_add(fn, namespace_name, actor_id, turns_json, session_id, agent_id)
        if done is not None:
            return done
    actor_key = keys.actor_key(namespace_name, actor_id)
    row = _first(namespace_name, actor_id, session_id, idempotency_key, actor_key)
    if row is None:  # a new session, no such namespace, or one with grants
        ns, actor = namespace(fn, namespace_name, actor_id, writing=True)
        let_in = ns.restricted  # the caller was let in: now the session may be locked
        if let_in:
            row = _first(namespace_name, actor_id, session_id, idempotency_key, actor_key, True)
        if row is None and session_id is not None:
            sid = identifier(fn, "session_id", session_id, ns.config["max_identifier_chars"])
            assert sid is not None
            _validate_batch(fn, ns, turns_json)  # refuse a bad batch before creating anything
            _tags(fn, ns, memory_metadata)
            agent = identifier(
                fn, "agent_id", agent_id, ns.config["max_identifier_chars"], optional=True
            )
            create_session(ns, actor, sid, agent)
            row = _first(namespace_name, actor_id, session_id, idempotency_key, actor_key, let_in)
    ns, actor = check_namespace(fn, namespace_name, row, actor_id, writing=True)
    if len(_known) >= _KNOWN_MAX:
        _known.clear()
    if not ns.restricted:  # one with grants never takes _fast_add's one statement
        _known[namespace_name] = row
    else:
        _known.pop(namespace_name, None)
    limit = ns.config["max_identifier_chars"]
    sid = identifier(fn, "session_id", session_id, limit, optional=True)
    agent = identifier(fn, "agent_id", agent_id, limit, optional=True)
    key = identifier(fn, "idempotency_key", idempotency_key, limit, optional=True)
    raw, checked = _validate_batch(fn, ns, turns_json)
    tags = _tags(fn, ns, memory_metadata)
    # The metadata is part of what a retry repeats (only when given: the hashes of the events
    # stored before it existed stay what they were).
    context = (sid, agent) if tags is None else (sid, agent, tags)
    batch_hash = turns.turns_hash(turns_json, *context) if key is not None else None
    if row["replay_id"] is not None:
        assert key is not None and batch_hash is not None
        return _replayed(fn, row["replay_id"], row["replay_hash"], batch_hash, key)
    status = _event_status(ns)

    if sid is None:
        turns.check_protocol(fn, checked, turns.Tail())
        stored = db.execute(
            _STORE,
            _STORE_TYPES,
            (
                ns.id,
                actor,
                agent,
                None,
                key,
                batch_hash,
                turns_json,
                len(raw),
                status,
                None,
                None,
                *_NO_TURNS,
                None,
                None,
                [],
                None,
                0,
                *_NO_ITEMS,
                actor_key,
                tags,
            ),
        )
        if stored.nrows():
            return str(stored[0]["public_id"])
        return _after_lost_race(fn, ns, actor, key, batch_hash or "", actor_key)

    if row["closed"]:
        raise ApiError(
            OBJECT_NOT_IN_PREREQUISITE_STATE,
            f"aidb_memory.add: session {quote(sid)} is closed",
            hint="session_end closed it; start a new session for new turns",
        )
    tail = turns.Tail(
        row["tail_sequence_id"],
        row["tail_round_start"],
        list(row["open_calls"] or ()),
        bool(row["tail_joinable"]),
        row["tail_item_type"],
    )
    first_seq = int(row["next_seq"])
    sequence_ids = turns.effective_sequence_ids(checked, tail)
    starts = turns.place_in_rounds(checked, first_seq, tail, sequence_ids)
    after = turns.next_tail(fn, checked, tail, sequence_ids, starts)
    # The instructions prefix extends only while every turn so far belongs to it.
    offsets, running, user_at, pinned_turns, pinned_chars = _layout(
        checked, int(row["total_chars"]), int(row["pinned_seq"]) == first_seq - 1
    )
    last_user = None if user_at is None else first_seq + user_at
    items = any(t.item is not None for t in checked)
    ahead = _ahead_budget(ns, row, running)
    stored = db.execute(
        _STORE,
        _STORE_TYPES,
        (
            ns.id,
            actor,
            agent,
            sid,
            key,
            batch_hash,
            None,
            len(checked),
            status,
            row["ref"],
            first_seq,
            starts,
            offsets,
            [t.chars for t in checked],
            [t.role for t in checked],
            [t.content for t in checked],
            [t.kind for t in checked],
            [t.name for t in checked],
            [json.dumps(t.tool_calls) if t.tool_calls else None for t in checked],
            [t.tool_call_id for t in checked],
            [json.dumps(t.meta) if t.meta else "{}" for t in checked],
            after.sequence_id,
            after.round_start,
            after.open_calls,
            last_user,
            running - int(row["total_chars"]),
            # Plain chat turns keep no item: NULL arrays, which unnest pads with NULLs.
            [None if t.item is None else json.dumps(t.item) for t in checked] if items else None,
            [None if t.item is None else t.shape for t in checked] if items else None,
            after.joinable,
            after.last_type,
            pinned_turns,
            pinned_chars,
            actor_key,
            tags,
        ),
    )
    if stored.nrows():
        if ahead is not None:
            db.execute(
                _QUEUE_COMPACTION, _QUEUE_TYPES, (ns.id, actor, sid, row["ref"], ahead, actor_key)
            )
        return str(stored[0]["public_id"])
    return _after_lost_race(fn, ns, actor, key, batch_hash or "", actor_key)


def _first(
    namespace_name: str,
    actor_id: str,
    session_id: str | None,
    idempotency_key: str | None,
    actor_key: int,
    checked: bool = False,
) -> Any:
    """The general path's first statement: the namespace, with an earlier event of the
    idempotency key and, for a session, the session row locked; None when the namespace or the
    session is missing, or (unless the caller was ``checked``) the namespace has grants."""
    if session_id is None:
        return one(
            db.execute(
                _NAMESPACE_AND_KEY if idempotency_key is not None else _UNKEYED[_NAMESPACE_AND_KEY],
                ("text", "text", "text", "bigint"),
                (namespace_name, actor_id, idempotency_key, actor_key),
            )
        )
    return one(
        db.execute(
            _LOCK_FOR_ADD if idempotency_key is not None else _UNKEYED[_LOCK_FOR_ADD],
            ("text", "text", "text", "text", "bigint", "boolean"),
            (namespace_name, actor_id, session_id, idempotency_key, actor_key, checked),
        )
    )


def _fast_add(
    fn: str,
    namespace_name: str,
    actor_id: str,
    turns_json: str,
    session_id: str,
    agent_id: str | None,
) -> str | None:
    """``add`` in one statement (_FAST_STORE), or None when it does not apply: then nothing was
    written and the general path runs (and raises any error, from the namespace as it is now:
    a refusal here may come from a config changed since)."""
    row = _known[namespace_name]
    try:
        ns, actor = check_namespace(fn, namespace_name, row, actor_id, writing=True)
        limit = ns.config["max_identifier_chars"]
        sid = identifier(fn, "session_id", session_id, limit)
        agent = identifier(fn, "agent_id", agent_id, limit, optional=True)
        _, checked = _validate_batch(fn, ns, turns_json)
        first = checked[0]
        # Only these depend on the session's tail beyond what _FAST_STORE checks.
        if first.role == "tool" or first.sequence_id is not None:
            return None
        n = len(checked)
        plain = all(t.item is None and t.tool_calls is None and t.role != "tool" for t in checked)
        if plain and all(t.sequence_id is None for t in checked):
            # Chat messages without calls or sequence ids: each starts its own round.
            starts, after = None, turns.Tail(None, n - 1)
        else:
            tail = turns.Tail(round_start=0)  # neutral: the first turn starts a round
            sequence_ids = turns.effective_sequence_ids(checked, tail)
            starts = turns.place_in_rounds(checked, 0, tail, sequence_ids)
            after = turns.next_tail(fn, checked, tail, sequence_ids, starts)
    except ApiError:
        return None
    # Positions relative to the batch; _FAST_STORE applies the prefix only while the session's
    # turns so far all belong to it.
    offsets, running, last_user, pinned_turns, pinned_chars = _layout(checked, 0, True)
    actor_key = keys.actor_key(namespace_name, actor)
    # A plain batch sends NULL for the columns its turns leave NULL (unnest pads a NULL array
    # with NULLs; meta is '{}').
    rest: tuple[Any, ...] = (None,) * 6
    if not plain or any(t.name is not None or t.meta for t in checked):
        items = any(t.item is not None for t in checked)
        rest = (
            _or_null([t.name for t in checked]),
            _or_null([json.dumps(t.tool_calls) if t.tool_calls else None for t in checked]),
            _or_null([t.tool_call_id for t in checked]),
            [json.dumps(t.meta) if t.meta else "{}" for t in checked],
            [None if t.item is None else json.dumps(t.item) for t in checked] if items else None,
            [None if t.item is None else t.shape for t in checked] if items else None,
        )
    stored = db.execute(
        _FAST_STORE if _ahead_on(ns) else _FAST_STORE_NO_AHEAD,
        _FAST_TYPES,
        (
            namespace_name,
            row["config"],
            row["model_spec"],
            row["caller"],
            actor,
            sid,
            n,
            running,
            after.sequence_id,
            after.round_start,
            after.open_calls,
            last_user,
            after.joinable,
            after.last_type,
            pinned_turns,
            pinned_chars,
            first.shape == "responses",
            agent,
            _event_status(ns),
            # NULL where every turn starts its own round: then the SQL gives each its position.
            starts,
            offsets,
            [t.chars for t in checked],
            [t.role for t in checked],
            [t.content for t in checked],
            [t.kind for t in checked],
            *rest,
            actor_key,
        ),
    )
    if not stored.nrows():
        return None
    done = stored[0]
    ahead = _ahead_budget(ns, done, int(done["total_chars"]))
    if ahead is not None:
        db.execute(
            _QUEUE_COMPACTION, _QUEUE_TYPES, (ns.id, actor, sid, done["ref"], ahead, actor_key)
        )
    return str(done["public_id"])


def _layout(
    checked: list[turns.Turn], first_offset: int, pinning: bool
) -> tuple[list[int], int, int | None, int, int]:
    """Where a batch's turns go: each turn's char offset (the first at ``first_offset``), the
    offset after the batch, the index of its last user turn (None: none), and how many turns and
    chars extend the instructions prefix (``pinning``: whether the prefix still can, i.e. every
    turn before the batch belongs to it)."""
    offsets: list[int] = []
    running, last_user = first_offset, None
    pinned_turns = pinned_chars = 0
    for i, t in enumerate(checked):
        offsets.append(running)
        running += t.chars
        if t.role == "user":
            last_user = i
        if pinning:
            if t.role in _INSTRUCTION_ROLES:
                pinned_turns += 1
                pinned_chars += t.chars
            else:
                pinning = False
    return offsets, running, last_user, pinned_turns, pinned_chars


def _or_null(values: list[Any]) -> list[Any] | None:
    """A column's values, or NULL when all are NULL (unnest pads a NULL array with NULLs)."""
    return values if any(v is not None for v in values) else None


def _ahead_on(ns: Namespace) -> bool:
    """Whether adds to this namespace may queue compaction tasks (_ahead_budget)."""
    return bool(ns.config["compaction_ahead"] and ns.model_spec.get("llm"))


def _ahead_budget(ns: Namespace, row: Any, total_chars: int) -> int | None:
    """The budget of the compaction task this add queues (issue 13), or None: when the
    session's total_chars pass its ahead threshold (recorded by the last compaction, which
    knows the newest summary and the budget of the reads), compaction ahead is on and the
    namespace names a model (the worker has no read's fallback_model). The worker checks
    the exact state again under the session's compaction lock."""
    at = row["ahead_at"]
    if at is None or total_chars <= int(at) or row["read_budget"] is None:
        return None
    if not _ahead_on(ns):
        return None
    return int(row["read_budget"])


def _limits(ns: Namespace) -> turns.Limits:
    c = ns.config
    return turns.Limits(
        c["max_turn_chars"],
        c["max_turns_per_add"],
        c["max_identifier_chars"],
        c["max_add_chars"],
        c["non_text_part_chars"],
    )


def _validate_batch(fn: str, ns: Namespace, turns_json: str) -> tuple[list[Any], list[turns.Turn]]:
    limits = _limits(ns)
    raw = turns.parse_turns(fn, turns_json, limits)
    return raw, turns.validate_batch(fn, raw, limits)
