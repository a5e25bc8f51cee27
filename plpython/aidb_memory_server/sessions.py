"""Sessions (SPEC §3): the thin database layer over ``turns`` and ``budget``.

Every statement is prepared once per connection (``db.execute``). ``add`` costs three statements
on its common path (namespace, position allocation, one insert of event + turns + tail), a read
two (its plan here, then one window query in SQL whose jsonb never passes through Python).
Every statement on a per-actor table filters on the actor's key (issue 15): ``keys.actor_key`` of
the namespace name and actor, passed as a parameter.
"""

from __future__ import annotations

import time

import plpy

from aidb_memory_server import budget, compaction, db, keys
from aidb_memory_server.access import (
    _READ_SETTING_COLUMNS,
    NS_COLUMNS,
    Namespace,
    check_namespace,
    identifier,
    namespace,
    quote,
)
from aidb_memory_server.errors import (
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    ApiError,
    invalid,
    required,
)

# A backend's first read loads only what the read needs: typing, turns (the add path) and items
# (conversion) are imported where they are used (docs/architecture.md, "Loading the code").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from aidb_memory_server import turns

# --- session_start ---------------------------------------------------------------------------

# Every statement on a per-actor table is single-key (issue 15, docs/scaling.md): it filters on
# the actor's actor_key, computed here (keys.actor_key) and passed as a parameter, besides the
# namespace and actor it always named (two actors' keys could collide).

# Two statements rather than IS NOT DISTINCT FROM, so that both can use session_actor_idx.
_PREV_HANDOFF = """
SELECT handoff::text AS handoff FROM aidb_memory.session
WHERE actor_key = $5 AND namespace_id = $1 AND actor_id = $2 AND agent_id = $3
  AND closed_at IS NOT NULL AND session_id <> $4
ORDER BY closed_at DESC, id DESC
LIMIT 1
"""
_PREV_HANDOFF_NO_AGENT = """
SELECT handoff::text AS handoff FROM aidb_memory.session
WHERE actor_key = $4 AND namespace_id = $1 AND actor_id = $2 AND agent_id IS NULL
  AND closed_at IS NOT NULL AND session_id <> $3
ORDER BY closed_at DESC, id DESC
LIMIT 1
"""
# The session and its compaction lock row (migration 0007_locks), in one statement.
_CREATE = """
WITH s AS (
    INSERT INTO aidb_memory.session
        (actor_key, namespace_id, actor_id, session_id, agent_id, prev_handoff)
    VALUES ($6, $1, $2, $3, $4, $5::jsonb)
    ON CONFLICT (actor_key, namespace_id, actor_id, session_id) DO NOTHING
    RETURNING id
)
INSERT INTO aidb_memory.compaction_lock (actor_key, session_ref) SELECT $6, id FROM s
"""
_START_ROW = """
SELECT session_id, to_json(started_at) #>> '{}' AS started_at,
       to_json(closed_at) #>> '{}' AS closed_at, prev_handoff::text AS prev_handoff
FROM aidb_memory.session
WHERE actor_key = $4 AND namespace_id = $1 AND actor_id = $2 AND session_id = $3
"""
_NEW_UUID = "SELECT gen_random_uuid()::text AS id"


def create_session(ns: Namespace, actor: str, session_id: str, agent_id: str | None) -> None:
    key = keys.actor_key(ns.name, actor)
    if agent_id is None:
        prev = db.execute(
            _PREV_HANDOFF_NO_AGENT,
            ("bigint", "text", "text", "bigint"),
            (ns.id, actor, session_id, key),
        )
    else:
        prev = db.execute(
            _PREV_HANDOFF,
            ("bigint", "text", "text", "text", "bigint"),
            (ns.id, actor, agent_id, session_id, key),
        )
    handoff = prev[0]["handoff"] if prev.nrows() else None
    db.execute(
        _CREATE,
        ("bigint", "text", "text", "text", "text", "bigint"),
        (ns.id, actor, session_id, agent_id, handoff, key),
    )


def session_start(
    namespace_name: str | None, actor_id: str | None, agent_id: str | None, session_id: str | None
) -> list[dict[str, Any]]:
    """Open (or resume) a session; returns its stored row."""
    fn = "session_start"
    ns, actor = namespace(fn, namespace_name, actor_id, writing=True)
    limit = ns.config["max_identifier_chars"]
    agent = identifier(fn, "agent_id", agent_id, limit, optional=True)
    sid = identifier(fn, "session_id", session_id, limit, optional=True)
    if sid is None:
        sid = db.execute(_NEW_UUID)[0]["id"]
    args = (ns.id, actor, sid, keys.actor_key(ns.name, actor))
    rows = db.execute(_START_ROW, ("bigint", "text", "text", "bigint"), args)
    if not rows.nrows():
        create_session(ns, actor, sid, agent)
        rows = db.execute(_START_ROW, ("bigint", "text", "text", "bigint"), args)
    return [dict(rows[0])]


def one(rows: Any) -> Any:
    """The first row of a result, or None."""
    return rows[0] if rows.nrows() else None


# --- session_get: the plan; the window itself is SQL (sql/30_sessions.sql) ----------------------

# One statement for the namespace, the session and its newest summary (NULLs when there is no
# such session), the session and summary by the actor's key ($4, computed from the arguments
# before the statement runs).
_NAMESPACE_AND_SESSION = f"""
SELECT {NS_COLUMNS}, {_READ_SETTING_COLUMNS}, n.model_spec->>'llm' AS ns_llm,
       s.id AS ref, s.xmin::text AS version, s.next_seq, s.total_chars, s.open_calls,
       s.tail_round_start, s.pinned_seq, s.pinned_chars,
       coalesce(m.to_seq, 0) AS covered_seq, coalesce(m.to_offset, 0) AS covered_offset,
       coalesce(m.chars, 0) AS newest_summary_chars
FROM aidb_memory.namespace n
LEFT JOIN aidb_memory.session s
       ON s.actor_key = $4 AND s.namespace_id = n.id AND s.actor_id = $2 AND s.session_id = $3
LEFT JOIN LATERAL (
    SELECT x.to_seq, x.to_offset, x.chars FROM aidb_memory.summary x
    WHERE x.actor_key = $4 AND x.session_ref = s.id ORDER BY x.to_seq DESC LIMIT 1
) m ON true
WHERE n.name = $1
"""
_NAMESPACE_AND_SESSION_TYPES = ("text", "text", "text", "bigint")
_OFFSET_OF = """
SELECT char_offset FROM aidb_memory.turn WHERE actor_key = $1 AND session_ref = $2 AND seq = $3
"""
# A turn (alias t) as a read returns it; the read statement's window builds the same object in SQL
# (sql/30_sessions.sql). The caller's own object goes around jsonb_strip_nulls, as it came.
_TURN_ITEM = """jsonb_build_object('seq', t.seq, 'role', t.role, 'content', t.content,
                                   'kind', t.kind, 'meta', t.meta, 'created_at', t.created_at)
                || jsonb_strip_nulls(jsonb_build_object('tool_calls', t.tool_calls,
                                                        'tool_call_id', t.tool_call_id,
                                                        'name', t.name))
                || CASE WHEN t.item IS NOT NULL
                        THEN jsonb_build_object('item', t.item, 'format', t.item_format)
                        ELSE '{}'::jsonb END"""
# The pinned instructions as items, only on a read that pins them (the window query carries no
# subquery for them: an unused one still costs its executor setup on every read).
_PINNED = f"""
SELECT jsonb_agg({_TURN_ITEM} ORDER BY t.seq)::text AS items
FROM aidb_memory.turn AS t WHERE t.actor_key = $1 AND t.session_ref = $2 AND t.seq <= $3
"""
_NO_SESSION: dict[str, Any] = {
    "actor_key": None,
    "session_ref": None,
    "session_version": None,
    "summary_seq": 0,
    "lo_offset": 0,
    "lo_seq": 0,
    "hi_offset": 0,
    "hi_seq": 0,
    "readable_chars": 0,
    "summary_room": -1,
    "warnings": [],
    "compact": False,
    "pin_seq": 0,
    "pinned": None,
    "summary_slots": None,
    "by_items": False,
    "empty_warning": None,
}


def offset_of(key: int, session_ref: int, seq: int) -> int:
    """The char offset of turn ``seq`` of the session (the chars of all turns before it): a read's
    bounds and a compaction's cut (compactor) are (char_offset, seq) positions."""
    rows = db.execute(_OFFSET_OF, ("bigint", "bigint", "bigint"), (key, session_ref, seq))
    return int(rows[0]["char_offset"])


READERS = ("session_get", "session_messages")


def session_read_plan(
    namespace_name: str | None,
    actor_id: str | None,
    session_id: str | None,
    limit_chars: int | None,
    fallback_model: str | None,
    limit_turns: int | None,
    limit_items: int | None,
    caller: str | None,
) -> dict[str, Any]:
    """Which turns and summaries a read may return, plus warnings and whether to compact.

    Turns: bounds in (char_offset, seq) order. Lower bound: the budget (``end - limit_chars``),
    ``limit_turns``/``limit_items`` and, on a budgeted read, the end of the newest summary
    (summaries stand in for the turns they cover); upper bound: the end of the history, before a
    round still waiting for tool results. The SQL window then keeps the newest whole rounds
    inside the bounds (with ``limit_items``: the newest items, never a tool result without its
    call, ``by_items``). Summaries: when every unsummarized turn fits, the newest summaries that
    fit in ``summary_room``, the budget left (-1: none), at most ``summary_slots`` of them (NULL:
    no cap). ``compact``: the read is over budget in a way a new summary would mend
    (``compaction.needed``), and the budget allows one; the read then calls
    ``compactor.session_compact`` and plans again. ``caller`` is the API function that errors
    name.

    Pinned instructions (config ``pin_instructions``, budgeted reads only): the session's leading
    system/developer turns, seqs 1..``pin_seq``, come first (``pinned``, their items); every
    budget is what is left after them, and the window and summaries only cover the turns after
    them. ``empty_warning``: when
    the read has unsummarized turns to return, the warning that an empty window means
    (``newest_round_over_budget``, or ``limit_items_round_split`` when the newest turn fits and
    only the rule of tool results keeps it out); the SQL adds it.

    The read statement runs after this plan, in a statement of its own (Citus routes it to the
    actor's shard only with the key as a parameter, and cannot run this function there), so it
    checks that it reads the state planned here: ``session_version`` (the session row's xmin:
    every add, pop, end or delete of the session writes that row) is still the session's, and it
    takes no summary newer than ``summary_seq`` (the newest one here; a compaction adds summaries
    without writing the session row). The SQL function is STABLE: its own queries run in one
    snapshot on one server.
    """
    fn = caller if caller in READERS else "session_get"
    if namespace_name is None:
        raise required(fn, "namespace")
    key = None if actor_id is None else keys.actor_key(namespace_name, actor_id)
    args = (namespace_name, actor_id, session_id, key)
    s = one(db.execute(_NAMESPACE_AND_SESSION, _NAMESPACE_AND_SESSION_TYPES, args))
    ns, _ = check_namespace(fn, namespace_name, s, actor_id, writing=False)
    identifier(fn, "session_id", session_id, ns.setting("max_identifier_chars"))
    budget.check_limits(fn, limit_chars, limit_turns, limit_items)
    if s["ref"] is None:
        # The key all the same, a session_ref no session has (ids start at 1) and the version
        # of none (''): the read statement finds nothing on the actor's shard. With NULLs,
        # Citus would prune every shard and plan the statement on none, which it cannot do
        # with the check's xmin (invalid attnum -2 for rangetable entry s).
        return {**_NO_SESSION, "actor_key": key, "session_ref": 0, "session_version": ""}
    assert key is not None  # the session was joined by it
    ref, next_seq = int(s["ref"]), int(s["next_seq"])
    warnings: list[str] = []
    end_offset, end_seq = int(s["total_chars"]), next_seq
    if s["open_calls"]:
        # A round whose tool calls have no results yet is not history a model can be sent.
        end_seq = int(s["tail_round_start"])
        end_offset = offset_of(key, ref, end_seq)
        warnings.append("tool_results_pending")
    budgeted = limit_chars is not None or limit_turns is not None or limit_items is not None
    pin_seq, pin_chars = 0, 0
    if budgeted and ns.setting("pin_instructions") and int(s["pinned_seq"]) > 0:
        pin_seq, pin_chars = int(s["pinned_seq"]), int(s["pinned_chars"])
        if pin_seq >= end_seq:  # a pending round that began inside the prefix (a sequence_id)
            pin_seq, pin_chars = end_seq - 1, end_offset
    plan: dict[str, Any] = {
        "actor_key": key,
        "session_ref": ref,
        "session_version": s["version"],
        "summary_seq": int(s["covered_seq"]),
        "lo_offset": pin_chars,
        "lo_seq": pin_seq + 1,
        "hi_offset": end_offset,
        "hi_seq": end_seq,
        # The readable chars other than the pinned ones (those are always returned).
        "readable_chars": end_offset - pin_chars,
        "summary_room": -1,
        "warnings": warnings,
        "compact": False,
        "pin_seq": pin_seq,
        "pinned": None,
        "summary_slots": None,
        "by_items": limit_items is not None,
        "empty_warning": None,
    }
    if pin_seq:
        pinned = db.execute(_PINNED, ("bigint", "bigint", "bigint"), (key, ref, pin_seq))
        plan["pinned"] = pinned[0]["items"]
    # What each budget leaves after the pinned turns.
    room_chars = None if limit_chars is None else limit_chars - pin_chars
    room_turns = None if limit_turns is None else limit_turns - pin_seq
    room_items = None if limit_items is None else limit_items - pin_seq
    if pin_seq and (
        (room_chars is not None and room_chars <= 0)
        or (room_turns is not None and room_turns <= 0)
        or (room_items is not None and room_items <= 0)
    ):
        # The pinned turns alone fill a budget: they are all the read returns.
        warnings.append("pinned_instructions_over_budget")
        plan["lo_offset"], plan["lo_seq"] = end_offset, end_seq
        return plan
    lo_offset, lo_seq = pin_chars, pin_seq + 1
    first_unsummarized = lo_seq
    summary_room, compact = -1, False
    if room_chars is not None:
        covered_offset, covered_seq = int(s["covered_offset"]), int(s["covered_seq"])
        if covered_seq < pin_seq:  # a summary written before pinning was turned on
            covered_offset, covered_seq = pin_chars, pin_seq
        # A summary never covers the newest round, so covered_seq < end_seq.
        lo_offset, lo_seq = covered_offset, covered_seq + 1
        first_unsummarized = lo_seq
        unsummarized = end_offset - covered_offset
        newest = int(s["newest_summary_chars"])
        if unsummarized <= room_chars:
            summary_room = room_chars - unsummarized
        elif 0 < newest <= compaction.target_chars(room_chars):
            # Still catching up: the summary made so far, then the newest turns in what is left.
            summary_room = newest
            lo_offset, lo_seq = end_offset - (room_chars - newest), 0
        else:
            lo_offset, lo_seq = end_offset - room_chars, 0
        if compaction.needed(unsummarized, newest, room_chars):
            if compaction.over_budget_alone(int(s["tail_round_start"]), covered_seq):
                warnings.append("newest_round_over_budget")  # no model could help
            elif compaction.target_chars(room_chars) < ns.setting("compaction_min_target_chars"):
                warnings.append("compaction_budget_too_small")  # no model is contacted
            elif s["ns_llm"] is None and fallback_model is None:
                # No model to ask: what session_compact would answer, without calling it (and
                # planning again) on every read of an over-budget session.
                warnings.append("compaction_model_unavailable")
            else:
                compact = True
    # limit_turns and limit_items bound the count the same way (one turn, one item); the window
    # cuts them differently (by_items).
    room_count = room_turns if room_items is None else room_items
    if room_turns is not None and room_count is not None and room_turns < room_count:
        room_count = room_turns  # both given: the tighter
    if room_count is not None:
        first = end_seq - room_count
        if first > lo_seq:
            lo_offset, lo_seq = max((lo_offset, lo_seq), (offset_of(key, ref, first), first))
            summary_room = -1  # turns before the window are left out, so are their summaries
        elif room_items is not None and summary_room >= 0:
            # Summaries are items too: at most the slots the unsummarized turns leave.
            slots = room_items - (end_seq - first_unsummarized)
            if slots > 0:
                plan["summary_slots"] = slots
            else:
                summary_room = -1
    if end_seq > first_unsummarized and "newest_round_over_budget" not in warnings:
        # There are turns to return: if the window keeps none, the newest round alone is over
        # budget; by items, unless the newest turn is inside the bounds (then only the rule of
        # tool results keeps it out).
        empty = "newest_round_over_budget"
        if room_items is not None and (
            room_chars is None
            or (offset_of(key, ref, end_seq - 1), end_seq - 1) >= (lo_offset, lo_seq)
        ):
            empty = "limit_items_round_split"
        plan["empty_warning"] = empty
    plan.update(lo_offset=lo_offset, lo_seq=lo_seq, summary_room=summary_room, compact=compact)
    return plan


# --- session_end -------------------------------------------------------------------------------

# FOR NO KEY UPDATE, like add: it serializes the writers of a session, but does not conflict with
# the FOR KEY SHARE a compaction's summary insert takes (its foreign key). With FOR UPDATE, a
# transaction that ended (or popped) and then popped again would hold the session row while
# waiting for the compaction lock, and the compaction holding that lock would wait for the
# session row: a deadlock (issue 10, tests/db/test_lock_order.py).
_LOCK_SESSION = """
SELECT id, closed_at IS NOT NULL AS closed, next_seq, last_user_seq, tail_round_start
FROM aidb_memory.session
WHERE actor_key = $4 AND namespace_id = $1 AND actor_id = $2 AND session_id = $3
FOR NO KEY UPDATE
"""
_LOCK_SESSION_TYPES = ("bigint", "text", "text", "bigint")
# The handoff is built from stored facts only (no model call), so it is deterministic. It is
# read first and then written as a parameter: Citus takes no STABLE function called with column
# references (jsonb_build_object of the session's columns) in an UPDATE of a distributed table,
# nor one (to_json) in its RETURNING. now() is the transaction's time in both statements.
_HANDOFF = """
SELECT jsonb_build_object(
        'notes', $2::text,
        'session_id', s.session_id,
        'agent_id', s.agent_id,
        'started_at', s.started_at,
        'closed_at', now(),
        'turn_count', s.next_seq - 1,
        'last_user_prompt',
            (SELECT t.content FROM aidb_memory.turn t
             WHERE t.actor_key = $3 AND t.session_ref = s.id AND t.seq = s.last_user_seq),
        'summary',
            (SELECT jsonb_build_object('content', m.content, 'from_seq', m.from_seq,
                                       'to_seq', m.to_seq, 'model', m.model)
             FROM aidb_memory.summary m WHERE m.actor_key = $3 AND m.session_ref = s.id
             ORDER BY m.to_seq DESC, m.id DESC LIMIT 1))::text AS handoff,
       to_json(now()) #>> '{}' AS closed_at
FROM aidb_memory.session s
WHERE s.actor_key = $3 AND s.id = $1
"""
_CLOSE = """
UPDATE aidb_memory.session SET closed_at = now(), updated_at = now(), handoff = $2::jsonb
WHERE actor_key = $3 AND id = $1
"""
_STORED_HANDOFF = """
SELECT handoff::text AS handoff, to_json(closed_at) #>> '{}' AS closed_at
FROM aidb_memory.session WHERE actor_key = $2 AND id = $1
"""


def session_end(
    namespace_name: str | None, actor_id: str | None, session_id: str | None, notes: str | None
) -> list[dict[str, Any]]:
    """Close a session and store its handoff; a second call returns the stored one."""
    fn = "session_end"
    ns, actor = namespace(fn, namespace_name, actor_id, writing=False)
    sid = identifier(fn, "session_id", session_id, ns.config["max_identifier_chars"])
    if notes is not None and len(notes) > ns.config["max_turn_chars"]:
        raise invalid(fn, "notes", f"is longer than {ns.config['max_turn_chars']} characters")
    key = keys.actor_key(ns.name, actor)
    rows = db.execute(_LOCK_SESSION, _LOCK_SESSION_TYPES, (ns.id, actor, sid, key))
    if not rows.nrows():
        return []
    ref = rows[0]["id"]
    if rows[0]["closed"]:
        return [dict(db.execute(_STORED_HANDOFF, ("bigint", "bigint"), (ref, key))[0])]
    closed = dict(db.execute(_HANDOFF, ("bigint", "text", "bigint"), (ref, notes, key))[0])
    db.execute(_CLOSE, ("bigint", "text", "bigint"), (ref, closed["handoff"], key))
    return [closed]


# --- session_pop -------------------------------------------------------------------------------

# The item is built outside the DELETE: Citus takes no STABLE function (jsonb_build_object) in
# the RETURNING of a write to a distributed table.
_POP = f"""
WITH t AS (
    DELETE FROM aidb_memory.turn t WHERE t.actor_key = $3 AND t.session_ref = $1 AND t.seq = $2
    RETURNING t.*
)
SELECT t.chars, t.role, ({_TURN_ITEM})::text AS item FROM t
"""
# The session's compaction lock row (migration 0007_locks). Taken before the session row: the
# compaction holding it needs that row (FOR KEY SHARE, for its summary's foreign key), so the other
# order would deadlock (issue 10). NOWAIT, tried again until POP_WAIT_S (_hold_compaction_lock):
# a compaction in flight holds it for its model call, and a pop must not wait on a slow model.
_COMPACTION_LOCK = """
SELECT l.session_ref FROM aidb_memory.session s
JOIN aidb_memory.compaction_lock l ON l.actor_key = s.actor_key AND l.session_ref = s.id
WHERE s.actor_key = $4 AND s.namespace_id = $1 AND s.actor_id = $2 AND s.session_id = $3
FOR UPDATE OF l NOWAIT
"""
# How long session_pop waits for a compaction of its session in flight (the caller's
# lock_timeout, when shorter): then 55P03, the turn not popped. A compaction holds the lock row
# for its model call (up to llm_timeout_s) and to the end of the read's transaction; a pop that
# proceeded instead could leave a summary of what is now the newest round, which the read's
# store cannot see while the pop is uncommitted.
POP_WAIT_S = 5.0
_POP_RETRY_S = 0.05
LOCK_NOT_AVAILABLE = "55P03"
_LOCK_TIMEOUT_S = """
SELECT extract(epoch FROM pg_catalog.current_setting('lock_timeout')::interval)::float8 AS s
"""
_SLEEP = "SELECT pg_catalog.pg_sleep($1)"
# The session has no lock row (an older release created it while 0007_locks was being
# installed), or no session: create the row and hold it, or wait for whoever holds it.
_CREATE_COMPACTION_LOCK = """
INSERT INTO aidb_memory.compaction_lock (actor_key, session_ref)
SELECT $4, s.id FROM aidb_memory.session s
WHERE s.actor_key = $4 AND s.namespace_id = $1 AND s.actor_id = $2 AND s.session_id = $3
ON CONFLICT (actor_key, session_ref) DO UPDATE SET session_ref = excluded.session_ref
RETURNING session_ref
"""
_DROP_LOCK_ROW = "DELETE FROM aidb_memory.compaction_lock WHERE actor_key = $2 AND session_ref = $1"
_DROP_COVERING = """
DELETE FROM aidb_memory.summary WHERE actor_key = $3 AND session_ref = $1 AND to_seq >= $2
"""
# The tail's sequence_id is the effective one (turns.effective_sequence_ids): a tool result
# without its own carries that of the turn before it. The subquery filters on the key itself
# ($3), not on t's: Citus routes a correlated key to every shard.
_TAIL_TURN = """
SELECT t.round_start,
       (SELECT e.meta->>'sequence_id' FROM aidb_memory.turn e
        WHERE e.actor_key = $3 AND e.session_ref = $1 AND e.seq <= $2
          AND (e.role <> 'tool' OR e.meta->>'sequence_id' IS NOT NULL)
        ORDER BY e.seq DESC LIMIT 1) AS sequence_id
FROM aidb_memory.turn t
WHERE t.actor_key = $3 AND t.session_ref = $1 AND t.seq = $2
"""
# The newest round, replayed through the tool-call protocol to find what it leaves open.
_ROUND = """
SELECT role, content, kind, name, tool_calls::text AS tool_calls, tool_call_id,
       item::text AS item, item_format
FROM aidb_memory.turn WHERE actor_key = $4 AND session_ref = $1 AND seq >= $2 AND seq <= $3
ORDER BY seq
"""
_LAST_USER = """
SELECT max(seq) AS seq FROM aidb_memory.turn
WHERE actor_key = $2 AND session_ref = $1 AND role = 'user'
"""
_SET_TAIL = """
UPDATE aidb_memory.session
SET next_seq = $2, total_chars = total_chars - $3, tail_sequence_id = $4, tail_round_start = $5,
    open_calls = $6, last_user_seq = $7, tail_joinable = $8, tail_item_type = $9,
    updated_at = now(),
    -- Popping a turn of the instructions prefix (then every turn is one) shortens it.
    pinned_seq = least(pinned_seq, $2 - 1),
    pinned_chars = CASE WHEN pinned_seq >= $2 THEN pinned_chars - $3 ELSE pinned_chars END
WHERE actor_key = $10 AND id = $1
"""


def _tail_after_pop(key: int, ref: int, last: int) -> turns.Tail:
    """The session's tail once ``last`` is its newest turn: its round replayed through the
    protocol (a round starts where no call is open, so it replays from an empty tail)."""
    import json

    from aidb_memory_server import turns

    if last < 1:
        return turns.Tail()
    tail = db.execute(_TAIL_TURN, ("bigint", "bigint", "bigint"), (ref, last, key))[0]
    round_start = int(tail["round_start"])
    batch = [
        turns.Turn(
            r["role"],
            r["content"],
            r["kind"],
            r["name"],
            None if r["tool_calls"] is None else json.loads(r["tool_calls"]),
            r["tool_call_id"],
            {},
            0,
            None,
            None if r["item"] is None else json.loads(r["item"]),
            r["item_format"] or "chat",
        )
        for r in db.execute(
            _ROUND, ("bigint", "bigint", "bigint", "bigint"), (ref, round_start, last, key)
        )
    ]
    sequence_ids = [tail["sequence_id"]] * len(batch)
    after = turns.next_tail("session_pop", batch, turns.Tail(), sequence_ids, [round_start])
    return turns.Tail(
        tail["sequence_id"], round_start, after.open_calls, after.joinable, after.last_type
    )


def _hold_compaction_lock(namespace_id: int, actor: str, sid: str, key: int) -> Any:
    """The session's compaction lock row, locked (no row: none, or no session). A compaction in
    flight holds it: tried again every 50 ms for POP_WAIT_S, or the caller's ``lock_timeout``
    when shorter, then 55P03. Each failed try is PL/Python's own subtransaction: nothing stays."""
    args = (namespace_id, actor, sid, key)
    deadline: float | None = None
    while True:
        try:
            return db.execute(_COMPACTION_LOCK, _LOCK_SESSION_TYPES, args)
        except plpy.SPIError as e:
            if e.sqlstate != LOCK_NOT_AVAILABLE:
                raise
        now = time.monotonic()
        if deadline is None:
            limit = float(db.execute(_LOCK_TIMEOUT_S)[0]["s"])
            deadline = now + (min(limit, POP_WAIT_S) if limit > 0 else POP_WAIT_S)
        if now >= deadline:
            raise ApiError(
                LOCK_NOT_AVAILABLE,
                f"aidb_memory.session_pop: session {quote(sid)} is being compacted",
                hint="a read is summarizing its history with a model (or another transaction "
                "popping from it is still open); retry in a few seconds",
            )
        # pg_sleep, not time.sleep: a cancel or statement_timeout ends the wait.
        db.execute(_SLEEP, ("float8",), (min(_POP_RETRY_S, deadline - now),))


def session_pop(
    namespace_name: str | None, actor_id: str | None, session_id: str | None
) -> str | None:
    """Remove and return the newest turn (NULL when empty); a summary covering it goes too."""
    fn = "session_pop"
    ns, actor = namespace(fn, namespace_name, actor_id, writing=True)
    sid = identifier(fn, "session_id", session_id, ns.config["max_identifier_chars"])
    assert sid is not None
    # First the compaction lock: it waits (boundedly) for a compaction of this session in
    # flight, which must not summarize a popped turn; then the session row.
    key = keys.actor_key(ns.name, actor)
    args = (ns.id, actor, sid, key)
    held = _hold_compaction_lock(*args)
    if not held.nrows():
        held = db.execute(_CREATE_COMPACTION_LOCK, _LOCK_SESSION_TYPES, args)
    rows = db.execute(_LOCK_SESSION, _LOCK_SESSION_TYPES, args)
    if not rows.nrows():
        if held.nrows():  # deleted while we waited: its deletion skipped the row we held
            db.execute(_DROP_LOCK_ROW, ("bigint", "bigint"), (held[0]["session_ref"], key))
        return None
    if int(rows[0]["next_seq"]) <= 1:
        return None
    s = rows[0]
    if s["closed"]:
        raise ApiError(
            OBJECT_NOT_IN_PREREQUISITE_STATE,
            f"aidb_memory.session_pop: session {quote(sid)} is closed",
            hint="a closed session keeps its history as it was handed off",
        )
    ref, seq = int(s["id"]), int(s["next_seq"]) - 1
    popped = db.execute(_POP, ("bigint", "bigint", "bigint"), (ref, seq, key))[0]
    after = _tail_after_pop(key, ref, seq - 1)
    round_start = after.round_start
    # A summary never covers the newest round, which the next add may extend: one that covers
    # the popped turn or the round that is now the newest goes.
    drop_from = seq if round_start is None else min(seq, round_start)
    db.execute(_DROP_COVERING, ("bigint", "bigint", "bigint"), (ref, drop_from, key))
    last_user = s["last_user_seq"]
    if last_user is not None and int(last_user) >= seq:
        last_user = db.execute(_LAST_USER, ("bigint", "bigint"), (ref, key))[0]["seq"]
    db.execute(
        _SET_TAIL,
        (
            *("bigint", "bigint", "bigint", "text", "bigint", "text[]", "bigint", "boolean"),
            *("text", "bigint"),
        ),
        (
            ref,
            seq,
            popped["chars"],
            after.sequence_id,
            round_start,
            after.open_calls,
            last_user,
            after.joinable,
            after.last_type,
            key,
        ),
    )
    return str(popped["item"])


# --- session_list, session_delete --------------------------------------------------------------

_LIST = """
SELECT session_id, agent_id, to_json(started_at) #>> '{}' AS started_at,
       to_json(closed_at) #>> '{}' AS closed_at, next_seq - 1 AS turn_count, total_chars,
       to_json(updated_at) #>> '{}' AS updated_at
FROM aidb_memory.session
WHERE actor_key = $6 AND namespace_id = $1 AND actor_id = $2
  AND ($3::text IS NULL OR agent_id = $3)
  AND ($4 OR closed_at IS NULL)
ORDER BY updated_at DESC, id DESC
LIMIT $5
"""
LIST_MAX = 1000


def session_list(
    namespace_name: str | None,
    actor_id: str | None,
    agent_id: str | None,
    include_closed: bool | None,
    limit: int | None,
) -> list[dict[str, Any]]:
    """An actor's sessions, newest activity first: index rows, never transcripts."""
    fn = "session_list"
    ns, actor = namespace(fn, namespace_name, actor_id, writing=False)
    agent = identifier(fn, "agent_id", agent_id, ns.config["max_identifier_chars"], optional=True)
    n = 50 if limit is None else limit
    if not 1 <= n <= LIST_MAX:
        raise invalid(fn, "limit", f"must be between 1 and {LIST_MAX}")
    return [
        dict(r)
        for r in db.execute(
            _LIST,
            ("bigint", "text", "text", "boolean", "int", "bigint"),
            (
                ns.id,
                actor,
                agent,
                True if include_closed is None else include_closed,
                n,
                keys.actor_key(ns.name, actor),
            ),
        )
    ]


_DELETE = """
WITH s AS (
    DELETE FROM aidb_memory.session
    WHERE actor_key = $7 AND namespace_id = $1 AND actor_id = $2 AND session_id = $3
    RETURNING id, next_seq - 1 AS turns
), a AS (
    INSERT INTO aidb_memory.audit_log (by_role, action, namespace, subject_hash, counts, reason)
    SELECT session_user, 'session_delete', $4, $5,
           jsonb_build_object('sessions', count(*), 'turns', coalesce(sum(turns), 0)), $6
    FROM s HAVING count(*) > 0
)
SELECT coalesce(sum(turns), 0)::bigint AS turns FROM s
"""


_AUDIT_KEY = "SELECT key FROM aidb_memory.audit_key"


def subject_hash(*parts: str) -> str:
    """What the audit log keeps instead of ids (erasure must not leave them behind): an HMAC
    under the database's own random key, so a guessed id cannot be confirmed without it."""
    import hashlib
    import hmac

    key = db.execute(_AUDIT_KEY)[0]["key"]
    return hmac.new(key.encode(), "\0".join(parts).encode(), hashlib.sha256).hexdigest()


def session_delete(
    namespace_name: str | None, actor_id: str | None, session_id: str | None, reason: str | None
) -> int:
    """Delete a session with its turns and summaries; the reason goes to the audit log."""
    fn = "session_delete"
    ns, actor = namespace(fn, namespace_name, actor_id, writing=False)
    sid = identifier(fn, "session_id", session_id, ns.config["max_identifier_chars"])
    if reason is None:
        raise required(fn, "reason")
    if not reason.strip():
        raise invalid(fn, "reason", "must not be empty", hint="say why, for the audit log")
    assert sid is not None
    rows = db.execute(
        _DELETE,
        ("bigint", "text", "text", "text", "text", "text", "bigint"),
        (
            ns.id,
            actor,
            sid,
            ns.name,
            subject_hash(ns.name, actor, sid),
            reason,
            keys.actor_key(ns.name, actor),
        ),
    )
    return int(rows[0]["turns"])


# --- session_messages' conversions ---------------------------------------------------------------


def session_convert(items_json: str | None, format_name: str | None) -> str:
    """A read's items (the read statement's) in ``format_name``: chat messages or a Responses
    input list (``items.to_chat`` / ``items.to_responses``). The rows come from our own query."""
    import json

    from aidb_memory_server import items

    rows = [
        {
            "role": r.get("role"),
            "content": r.get("content"),
            "kind": r.get("kind"),
            "name": r.get("name"),
            "tool_calls": r.get("tool_calls"),
            "tool_call_id": r.get("tool_call_id"),
            "item": r.get("item"),
            "shape": r.get("format") or "chat",
        }
        for r in json.loads(items_json or "[]")
    ]
    converted = items.to_responses(rows) if format_name == "responses" else items.to_chat(rows)
    return json.dumps(converted, ensure_ascii=False)
