"""``add`` (SPEC §3): a batch of turns stored all or none, with its event.

Its own module so that the add path imports what it needs (json, turns) once, at load, while a
read, which imports ``sessions``, loads neither (docs/architecture.md, "Loading the code").
Two statements on the common path: lock (namespace, session, key), then store.
"""

from __future__ import annotations

import json

from aidb_memory_server import db, turns
from aidb_memory_server.errors import (
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    UNIQUE_VIOLATION,
    ApiError,
    required,
)
from aidb_memory_server.sessions import (
    NS_COLUMNS,
    Namespace,
    check_namespace,
    create_session,
    identifier,
    namespace,
    one,
    quote,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


_BY_KEY = """
SELECT public_id::text AS public_id, turns_hash FROM aidb_memory.event
WHERE namespace_id = $1 AND actor_id = $2 AND idempotency_key = $3
"""
# The hot path's first statement: the namespace, the session row locked (positions are
# allocated under this lock, so they are gap-free), and an earlier event with this key.
_LOCK_FOR_ADD = f"""
SELECT {NS_COLUMNS},
       s.id AS ref, s.next_seq, s.total_chars, s.closed_at IS NOT NULL AS closed,
       s.tail_sequence_id, s.tail_round_start, s.open_calls, s.tail_joinable, s.tail_item_type,
       s.pinned_seq, l.ahead_at, l.read_budget,
       r.public_id::text AS replay_id, r.turns_hash AS replay_hash
FROM aidb_memory.session s
JOIN aidb_memory.namespace n ON n.id = s.namespace_id
-- Where a compaction task becomes due (compactor._remember); read, never locked.
LEFT JOIN aidb_memory.compaction_ahead l ON l.session_ref = s.id
LEFT JOIN aidb_memory.event r
       ON $4::text IS NOT NULL AND r.namespace_id = n.id AND r.actor_id = $2
      AND r.idempotency_key = $4
WHERE n.name = $1 AND s.actor_id = $2 AND s.session_id = $3
FOR NO KEY UPDATE OF s
"""
_NAMESPACE_AND_KEY = f"""
SELECT {NS_COLUMNS},
       r.public_id::text AS replay_id, r.turns_hash AS replay_hash
FROM aidb_memory.namespace n
LEFT JOIN aidb_memory.event r
       ON $3::text IS NOT NULL AND r.namespace_id = n.id AND r.actor_id = $2
      AND r.idempotency_key = $3
WHERE n.name = $1
"""
# The second statement: the event, the turns, the session's counters and tail. With an
# idempotency key the event insert may meet a concurrent twin (committed after our snapshot);
# then nothing else is written and no row comes back.
_STORE = """
WITH e AS (
    INSERT INTO aidb_memory.event
        (namespace_id, actor_id, agent_id, session_id, idempotency_key, turns_hash, turns,
         turn_count, status)
    VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9)
    ON CONFLICT (namespace_id, actor_id, idempotency_key) WHERE idempotency_key IS NOT NULL
    DO NOTHING
    RETURNING id, public_id
), t AS (
    INSERT INTO aidb_memory.turn
        (session_ref, seq, round_start, char_offset, chars, role, content, kind, name,
         tool_calls, tool_call_id, meta, item, item_format, event_ref)
    SELECT $10, $11 + u.o - 1, u.round_start, u.char_offset, u.chars, u.role, u.content, u.kind,
           u.name, u.tool_calls::jsonb, u.tool_call_id, u.meta::jsonb, u.item::jsonb,
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
    WHERE id = $10 AND EXISTS (SELECT 1 FROM e)
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
    *("text[]", "text[]", "boolean", "text", "bigint", "bigint"),
)
# A compaction task for the worker (issue 13), only when this add passes the session's ahead
# threshold (_ahead_budget): a statement of its own, so that the common path stays two
# statements and its second one costs what it did (a second insert into event in it, even one
# that inserts nothing, costs every add its executor setup). At most one task is pending per
# session; it wakes the workers that LISTEN (at commit).
_QUEUE_COMPACTION = """
WITH c AS (
    INSERT INTO aidb_memory.event
        (namespace_id, actor_id, session_id, turn_count, status, kind, session_ref, budget)
    VALUES ($1, $2, $3, 0, 'accepted', 'compaction', $4, $5)
    ON CONFLICT (session_ref) WHERE kind = 'compaction' AND status IN ('accepted', 'processing')
    DO NOTHING
    RETURNING 1
)
SELECT pg_notify('aidb_memory_events', '') AS woke FROM c
"""
_NO_TURNS: tuple[Any, ...] = ([],) * 10
_INSTRUCTION_ROLES = frozenset(("system", "developer"))
_NO_ITEMS: tuple[Any, ...] = ([], [], False, None, 0, 0)


def _event_status(ns: Namespace) -> str:
    # Extraction needs a model; without one (or with extraction off) the event is skipped.
    return "accepted" if ns.config["extraction"] and ns.model_spec.get("llm") else "skipped"


def _replayed(fn: str, public_id: str, stored_hash: str | None, new_hash: str, key: str) -> str:
    if stored_hash != new_hash:
        raise ApiError(
            UNIQUE_VIOLATION,
            f"aidb_memory.{fn}: idempotency_key {quote(key)} was already used with a different "
            "batch (other turns, session or agent)",
            hint="use a new idempotency_key for a new batch; a retry must send the same request",
        )
    return public_id


def _after_lost_race(fn: str, ns: Namespace, actor: str, key: str | None, batch_hash: str) -> str:
    # Our event insert met a twin committed after our snapshot: answer as a retry of it.
    assert key is not None
    seen = db.execute(_BY_KEY, ("bigint", "text", "text"), (ns.id, actor, key))
    return _replayed(fn, seen[0]["public_id"], seen[0]["turns_hash"], batch_hash, key)


def add(
    namespace_name: str | None,
    actor_id: str | None,
    turns_json: str | None,
    session_id: str | None,
    agent_id: str | None,
    idempotency_key: str | None,
) -> str:
    """Store a batch of turns (all or none) and record its event; returns the event id.

    Two statements on the common path: lock (namespace, session, key), then store.
    """
    fn = "add"
    if namespace_name is None:
        raise required(fn, "namespace")
    if turns_json is None:
        raise required(fn, "turns")
    if actor_id is None:
        raise required(fn, "actor_id")
    if session_id is None:
        row = one(
            db.execute(
                _NAMESPACE_AND_KEY,
                ("text", "text", "text"),
                (namespace_name, actor_id, idempotency_key),
            )
        )
    else:
        row = one(
            db.execute(
                _LOCK_FOR_ADD,
                ("text", "text", "text", "text"),
                (namespace_name, actor_id, session_id, idempotency_key),
            )
        )
        if row is None:  # a new session, or no such namespace
            ns, actor = namespace(fn, namespace_name, actor_id, writing=True)
            sid = identifier(fn, "session_id", session_id, ns.config["max_identifier_chars"])
            assert sid is not None
            _validate_batch(fn, ns, turns_json)  # refuse a bad batch before creating anything
            agent = identifier(
                fn, "agent_id", agent_id, ns.config["max_identifier_chars"], optional=True
            )
            create_session(ns, actor, sid, agent)
            row = one(
                db.execute(
                    _LOCK_FOR_ADD,
                    ("text", "text", "text", "text"),
                    (namespace_name, actor_id, session_id, idempotency_key),
                )
            )
    ns, actor = check_namespace(fn, namespace_name, row, actor_id, writing=True)
    limit = ns.config["max_identifier_chars"]
    sid = identifier(fn, "session_id", session_id, limit, optional=True)
    agent = identifier(fn, "agent_id", agent_id, limit, optional=True)
    key = identifier(fn, "idempotency_key", idempotency_key, limit, optional=True)
    raw, checked = _validate_batch(fn, ns, turns_json)
    batch_hash = turns.turns_hash(turns_json, sid, agent) if key is not None else None
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
            ),
        )
        if stored.nrows():
            return str(stored[0]["public_id"])
        return _after_lost_race(fn, ns, actor, key, batch_hash or "")

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
    offsets, running = [], int(row["total_chars"])
    last_user = None
    # The instructions prefix extends only while every turn so far belongs to it.
    pinning = int(row["pinned_seq"]) == first_seq - 1
    items = False
    pinned_turns = pinned_chars = 0
    for i, t in enumerate(checked):
        offsets.append(running)
        running += t.chars
        if t.role == "user":
            last_user = first_seq + i
        if t.item is not None:
            items = True
        if pinning:
            if t.role in _INSTRUCTION_ROLES:
                pinned_turns += 1
                pinned_chars += t.chars
            else:
                pinning = False
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
        ),
    )
    if stored.nrows():
        if ahead is not None:
            db.execute(
                _QUEUE_COMPACTION,
                ("bigint", "text", "text", "bigint", "int"),
                (ns.id, actor, sid, row["ref"], ahead),
            )
        return str(stored[0]["public_id"])
    return _after_lost_race(fn, ns, actor, key, batch_hash or "")


def _ahead_budget(ns: Namespace, row: Any, total_chars: int) -> int | None:
    """The budget of the compaction task this add queues (issue 13), or None: when the
    session's total_chars pass its ahead threshold (recorded by the last compaction, which
    knows the newest summary and the budget of the reads), compaction ahead is on and the
    namespace names a model (the worker has no read's fallback_model). The worker checks
    the exact state again under the session's compaction lock."""
    at = row["ahead_at"]
    if at is None or total_chars <= int(at) or row["read_budget"] is None:
        return None
    if not ns.config["compaction_ahead"] or not ns.model_spec.get("llm"):
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
