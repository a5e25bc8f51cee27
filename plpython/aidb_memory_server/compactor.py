"""Compaction in the read path (SPEC §3): the database side of ``compaction``.

``session_get`` and ``session_messages`` (sql/30_sessions.sql) call :func:`session_compact` only
when their plan says the read is over budget and a summary could help. It never fails the read
and never waits: it returns the warning that says why no summary was written, or nothing when one
was.

- The session's compaction lock row (migration 0007_locks), locked ``FOR UPDATE SKIP LOCKED``
  to the end of the transaction: a second reader gets ``compaction_busy`` at once and returns
  the history as it was. Only our code can lock that row (no role has any privilege on the
  table), unlike an advisory lock, whose keys any connected role could hold to keep every read
  of the session busy.
- A transaction that cannot write (READ ONLY, a hot standby) stops first: ``compaction_read_only``,
  no model call whose summary could not be stored.
- A failed model call starts a cool-down for that (session, model): a row of
  ``compaction_failure`` (migration 0012_compaction_cooldown), written where the call's usage row
  is (outside any savepoint of ours, so it stays whatever the read does next, and other backends
  see it once the read's transaction commits). For ``compaction_cooldown_s`` after it, a compaction
  of that session that would call that model returns ``compaction_call_failed`` at once: no call,
  no lock taken, no wait on a failing endpoint. A stored summary clears the session's rows.
- The state is read again under the lock (another backend may have compacted meanwhile).
- The cut is chosen in SQL over the char offsets (``_CUT``), and only the turns to summarize are
  read, at most ``compaction_max_input_chars`` of them (a larger round: its head and tail), so a
  compaction costs the same on a session of any length.
- The model is called outside any savepoint, so its usage row stays whatever happens next; the
  summary is written only if the turns it covers are still there as they were read.
  ``session_pop`` takes the same lock (waiting at most a few seconds, then 55P03; before it locks
  the session row, which the summary's foreign key needs), so it never removes a turn being
  summarized. ``add`` never touches this row: it never waits for a compaction.
- Every database statement runs in its own subtransaction (PL/Python's), so a database error
  becomes a warning and leaves nothing behind.
- A cancelled statement is the one failure that is not turned into a warning: it ends the read.
- Every statement is single-key (issue 15, docs/scaling.md): it filters on ``actor_key``, which
  :func:`session_compact` computes from the namespace name and the actor (``keys.actor_key``);
  each function that takes a ``session_ref`` takes the actor's ``key`` right before it. So a
  distributed database routes every statement to the one shard that holds the actor.
"""

from __future__ import annotations

import json

import plpy

from aidb_memory_server import compaction, db, keys, sessions, validation
from aidb_memory_server.compaction import Source

# llm is imported where a model is called, endpoints where an error is redacted, typing only by
# the type checker: a read that returns before a model call loads none of them
# (docs/architecture.md, "Loading the code").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from aidb_memory_server import llm

QUERY_CANCELED = "57014"

# The session by the actor's key ($1: keys.actor_key of the namespace name and the actor,
# computed in Python and passed, so that this and every later statement goes to the actor's one
# shard), with its namespace (a reference table). With it, whether this transaction can write at
# all (a READ ONLY transaction, a default_transaction_read_only session, a hot standby): a
# summary that cannot be stored must not be paid for.
_SESSION = """
SELECT n.id, n.config::text AS config, n.model_spec->>'llm' AS llm, s.id AS ref,
       s.pinned_chars,
       pg_catalog.current_setting('transaction_read_only') = 'on'
       OR pg_catalog.pg_is_in_recovery() AS read_only
FROM aidb_memory.namespace n
JOIN aidb_memory.session s
  ON s.actor_key = $1 AND s.namespace_id = n.id AND s.actor_id = $3 AND s.session_id = $4
WHERE n.name = $2
"""
# Never waits: a row locked by another compaction (or by a session_pop) is skipped.
_TRY_LOCK = """
SELECT session_ref FROM aidb_memory.compaction_lock WHERE actor_key = $1 AND session_ref = $2
FOR UPDATE SKIP LOCKED
"""
# Skipped, or missing: a session that an older release created while 0007_locks was being
# installed has no row. Inserting it holds it; a row that exists (held by another) is a conflict.
_CREATE_LOCK = """
INSERT INTO aidb_memory.compaction_lock (actor_key, session_ref) VALUES ($1, $2)
ON CONFLICT (actor_key, session_ref) DO NOTHING
RETURNING session_ref
"""
_DROP_ORPHAN = """
DELETE FROM aidb_memory.compaction_lock
WHERE actor_key = $1 AND session_ref = $2
  AND NOT EXISTS (SELECT 1 FROM aidb_memory.session WHERE actor_key = $1 AND id = $2)
"""
# The lateral subquery filters on the key itself ($1): Citus routes a correlated key to every
# shard.
_STATE = """
SELECT s.next_seq, s.total_chars, s.tail_round_start, cardinality(s.open_calls) > 0 AS open,
       s.pinned_seq, s.pinned_chars,
       coalesce(m.to_seq, 0) AS covered_seq, coalesce(m.to_offset, 0) AS covered_offset,
       coalesce(m.chars, 0) AS newest_chars
FROM aidb_memory.session s
LEFT JOIN LATERAL (
    SELECT x.to_seq, x.to_offset, x.chars FROM aidb_memory.summary x
    WHERE x.actor_key = $1 AND x.session_ref = s.id ORDER BY x.to_seq DESC LIMIT 1
) m ON true
WHERE s.actor_key = $1 AND s.id = $2
"""
# The cut (compaction.choose_cut's rule, in SQL over the char offsets, so that a read never loads
# the history it does not summarize). A cut before turn b is allowed when b starts a round
# (rounds are contiguous: place_in_rounds gives round_start in seq order), b is past the first
# unsummarized turn ($3 = the covered offset, $4 = the covered seq) and b is at or before the
# newest round ($5), which a later add may extend. Of the allowed cuts: the first whose chars
# before it reach three quarters ($6), within the input cap ($7); else the last within the cap;
# else the first at all (a round larger than the cap). Each arm is one range of
# turn_offset_idx that stops at its first match: at most the cap's turns are visited.
_CUT = """
SELECT coalesce(
    (SELECT t.seq FROM aidb_memory.turn t
     WHERE t.actor_key = $1 AND t.session_ref = $2
       AND t.char_offset >= $6 AND t.char_offset <= $7
       AND t.char_offset > $3 AND t.seq > $4 AND t.seq <= $5 AND t.round_start = t.seq
     ORDER BY t.char_offset, t.seq LIMIT 1),
    (SELECT t.seq FROM aidb_memory.turn t
     WHERE t.actor_key = $1 AND t.session_ref = $2
       AND t.char_offset > $3 AND t.char_offset <= $7
       AND t.seq > $4 AND t.seq <= $5 AND t.round_start = t.seq
     ORDER BY t.char_offset DESC, t.seq DESC LIMIT 1),
    (SELECT t.seq FROM aidb_memory.turn t
     WHERE t.actor_key = $1 AND t.session_ref = $2 AND t.char_offset > $3
       AND t.seq > $4 AND t.seq <= $5 AND t.round_start = t.seq
     ORDER BY t.char_offset, t.seq LIMIT 1)
) AS next_round
"""
_CUT_TYPES = ("bigint", "bigint", "bigint", "bigint", "bigint", "bigint", "bigint")
# The turns to summarize when they fit in the input cap.
_SOURCES = """
SELECT seq, role, content, name, tool_calls::text AS tool_calls, tool_call_id, char_offset, chars,
       xmin::text AS version, item::text AS item, item_format
FROM aidb_memory.turn
WHERE actor_key = $1 AND session_ref = $2 AND seq > $3 AND seq <= $4
ORDER BY seq
"""
_SOURCES_TYPES = ("bigint", "bigint", "bigint", "bigint")
# A round larger than the cap: only its head (chars before $5) and its tail (chars from $6), the
# texts clipped in SQL, so that neither the backend's Python nor the request ever holds more than
# the cap. Three index ranges: the head, the tail, and the one turn that may reach into the tail
# from before it. A clipped turn's tool calls are left out (their JSON is not clipped).
_CLIPPED_SOURCES = """
WITH r AS (
    SELECT t.seq FROM aidb_memory.turn t
    WHERE t.actor_key = $1 AND t.session_ref = $2
      AND t.seq > $3 AND t.seq <= $4 AND t.char_offset < $5
    UNION
    SELECT t.seq FROM aidb_memory.turn t
    WHERE t.actor_key = $1 AND t.session_ref = $2
      AND t.seq > $3 AND t.seq <= $4 AND t.char_offset >= $6
    UNION
    (SELECT t.seq FROM aidb_memory.turn t
     WHERE t.actor_key = $1 AND t.session_ref = $2
       AND t.seq > $3 AND t.seq <= $4 AND t.char_offset < $6
     ORDER BY t.char_offset DESC, t.seq DESC LIMIT 1)
)
SELECT t.seq, t.role, t.name, t.tool_call_id, t.char_offset, t.chars, t.xmin::text AS version,
       CASE WHEN t.char_offset + t.chars <= $5 OR t.char_offset >= $6 THEN t.tool_calls::text END
           AS tool_calls,
       CASE WHEN t.char_offset + t.chars <= $5 OR t.char_offset >= $6 THEN t.item::text END
           AS item,
       t.item_format,
       CASE WHEN t.char_offset + t.chars <= $5 OR t.char_offset >= $6 THEN t.content
            WHEN t.char_offset < $5 AND t.char_offset + t.chars > $6
                THEN pg_catalog.left(t.content, ($5 - t.char_offset)::int) || ' […] '
                     || pg_catalog.right(t.content, (t.char_offset + t.chars - $6)::int)
            WHEN t.char_offset < $5
                THEN pg_catalog.left(t.content, ($5 - t.char_offset)::int) || ' […]'
            ELSE '[…] ' || pg_catalog.right(t.content, (t.char_offset + t.chars - $6)::int)
       END AS content
FROM r JOIN aidb_memory.turn t ON t.actor_key = $1 AND t.session_ref = $2 AND t.seq = r.seq
WHERE t.char_offset < $5 OR t.char_offset + t.chars > $6
ORDER BY t.seq
"""
_CLIPPED_TYPES = ("bigint", "bigint", "bigint", "bigint", "bigint", "bigint")
# Written only if the covered turns are still those that were read (the last one is the same row
# version: session_pop waits for this backend's compaction lock, so this is a second line of
# defence) and the newest round starts after them.
_STORE = """
INSERT INTO aidb_memory.summary
    (actor_key, session_ref, from_seq, to_seq, turn_count, content, chars, model, from_offset,
     to_offset)
SELECT $1, $2, $3, $4, $4 - $3 + 1, $5, $6, $7, $8, $9
FROM aidb_memory.session s
WHERE s.actor_key = $1 AND s.id = $2 AND s.tail_round_start > $4
  AND EXISTS (SELECT 1 FROM aidb_memory.turn t
              WHERE t.actor_key = $1 AND t.session_ref = $2 AND t.seq = $4
                AND t.xmin::text = $10)
  AND NOT EXISTS (SELECT 1 FROM aidb_memory.summary x
                  WHERE x.actor_key = $1 AND x.session_ref = $2 AND x.to_seq >= $3)
"""
_STORE_TYPES = ("bigint",) * 4 + ("text", "int", "text", "bigint", "bigint", "text")
# The cool-down (migration 0012_compaction_cooldown): clock_timestamp, not now(), so that a long
# transaction neither starts nor ends one early.
_COOLING = """
SELECT 1 FROM aidb_memory.compaction_failure
WHERE actor_key = $1 AND session_ref = $2 AND model_name = $3
  AND failed_at > pg_catalog.clock_timestamp() - pg_catalog.make_interval(secs => $4)
"""
# Only for a session that is still there: a deleted one's row would never be removed.
_FAILED = """
INSERT INTO aidb_memory.compaction_failure (actor_key, session_ref, model_name, failed_at)
SELECT $1, $2, $3, pg_catalog.clock_timestamp()
WHERE EXISTS (SELECT 1 FROM aidb_memory.session WHERE actor_key = $1 AND id = $2)
ON CONFLICT (actor_key, session_ref, model_name) DO UPDATE SET failed_at = excluded.failed_at
"""
_RECOVERED = """
DELETE FROM aidb_memory.compaction_failure WHERE actor_key = $1 AND session_ref = $2
"""
_EXISTS = """
SELECT pg_catalog.current_setting('transaction_read_only') = 'on'
       OR pg_catalog.pg_is_in_recovery() AS read_only,
       EXISTS (SELECT 1 FROM aidb_memory.session WHERE actor_key = $1 AND id = $2) AS found
"""


def session_compact(
    namespace_name: str,
    actor_id: str,
    session_id: str,
    limit_chars: int,
    fallback_model: str | None,
) -> list[str]:
    """Summarize the oldest unsummarized turns of a session; the warnings of the attempt
    (empty when a summary was written or none is needed any more). The read's plan has
    validated the arguments."""
    key = keys.actor_key(namespace_name, actor_id)
    found = db.execute(
        _SESSION,
        ("bigint", "text", "text", "text"),
        (key, namespace_name, actor_id, session_id),
    )
    if not found.nrows():
        return []  # deleted since the plan was made
    ns = found[0]
    namespace_id = int(ns["id"])
    session_ref = int(ns["ref"])
    pinned_chars = int(ns["pinned_chars"])
    config = validation.effective_config(json.loads(ns["config"]))
    budget = limit_chars  # what the worker compacts ahead for (_remember)
    if config["pin_instructions"]:
        # The pinned instructions are returned beside every budgeted read and never summarized:
        # the budget that compaction works with is what they leave (as in the read's plan).
        limit_chars -= pinned_chars
        if limit_chars <= 0:
            return []
    target = compaction.target_chars(limit_chars)
    if target < config["compaction_min_target_chars"]:
        return ["compaction_budget_too_small"]
    # The namespace's own model; fallback_model only when it names none (a namespace that names
    # a model never silently uses another).
    name = ns["llm"] if ns["llm"] is not None else fallback_model
    if name is None:
        return ["compaction_model_unavailable"]
    # A fallback outside the namespace's allowed_fallback_models (when an admin set one) reads
    # as an unknown model: an application cannot spend the key of a model it was not given.
    if ns["llm"] is None and not validation.fallback_allowed(config, name):
        return ["compaction_model_unavailable"]
    if ns["read_only"]:
        return ["compaction_read_only"]  # nowhere to store a summary: no model call
    if cooling_down(key, session_ref, name, config):
        return ["compaction_call_failed"]  # failed a moment ago: not again, and not waited on
    from aidb_memory_server import llm

    try:
        model = llm.load("session_get", name)
    except Exception:
        return ["compaction_model_unavailable"]
    if llm.key_refusal(model) is not None:
        return ["compaction_model_unavailable"]  # its key may not go to its endpoint
    if (
        not db.execute(_TRY_LOCK, ("bigint", "bigint"), (key, session_ref)).nrows()
        and not db.execute(_CREATE_LOCK, ("bigint", "bigint"), (key, session_ref)).nrows()
    ):
        return ["compaction_busy"]
    try:
        warnings = _compact(namespace_id, config, key, session_ref, limit_chars, target, model)
    except plpy.SPIError as e:
        if e.sqlstate == QUERY_CANCELED:
            raise  # a cancel (or statement_timeout) ends the read, as it ends any statement
        _log(e)
        warnings = ["compaction_call_failed"]
    except Exception as e:
        _log(e)
        warnings = ["compaction_call_failed"]
    _remember(key, session_ref, budget, limit_chars, config, pinned_chars)
    if warnings:
        _drop_lock_if_deleted(key, session_ref)
    return warnings


def still_due(key: int, session_ref: int, model_name: str, config: dict[str, Any]) -> str | None:
    """Whether a compaction of session ``session_ref`` (of the actor whose key is ``key``) may
    call ``model_name`` now: ``None``, or the warning that says why not. For a compaction that
    was decided earlier (a queued task, :func:`compact_ahead`), asked before its model is
    loaded: the transaction can store a summary (``compaction_read_only``), the session still
    exists (``compaction_busy``: deleted meanwhile) and the model is not in its cool-down for
    this session (``compaction_call_failed``). Whether the session still needs a summary (a pop
    or another compaction since) is decided by :func:`_compact` from the state it reads under
    the lock."""
    row = db.execute(_EXISTS, ("bigint", "bigint"), (key, session_ref))[0]
    if row["read_only"]:
        return "compaction_read_only"
    if not row["found"]:
        return "compaction_busy"
    if cooling_down(key, session_ref, model_name, config):
        return "compaction_call_failed"
    return None


def cooling_down(key: int, session_ref: int, model_name: str, config: dict[str, Any]) -> bool:
    """Whether a compaction call of ``model_name`` for this session failed less than the
    namespace's ``compaction_cooldown_s`` ago (always false when that is 0). As of the caller's
    snapshot: a failure committed after a REPEATABLE READ transaction began is not seen."""
    seconds = int(config["compaction_cooldown_s"])
    if seconds <= 0:
        return False
    cooling = db.execute(
        _COOLING, ("bigint", "bigint", "text", "int"), (key, session_ref, model_name, seconds)
    )
    return bool(cooling.nrows())


def record_failure(key: int, session_ref: int, model_name: str, config: dict[str, Any]) -> None:
    """Start the cool-down of ``model_name`` for this session after its compaction call failed
    (an HTTP error, a timeout, an unusable answer). Called outside any savepoint of ours, like
    the call's usage row, so it stays whatever the caller does next; visible to other backends
    when the caller's transaction commits. Never fails the caller: a database error (a
    REPEATABLE READ conflict with another backend's row) is logged, a cancel goes on."""
    if int(config["compaction_cooldown_s"]) <= 0:
        return
    try:
        db.execute(_FAILED, ("bigint", "bigint", "text"), (key, session_ref, model_name))
    except plpy.SPIError as e:
        if e.sqlstate == QUERY_CANCELED:
            raise
        _log(e)


def clear_failures(key: int, session_ref: int) -> None:
    """End the session's cool-downs: a summary was stored, its compaction works again. Never
    fails the caller (the summary is stored): a database error is logged, a cancel goes on."""
    try:
        db.execute(_RECOVERED, ("bigint", "bigint"), (key, session_ref))
    except plpy.SPIError as e:
        if e.sqlstate == QUERY_CANCELED:
            raise
        _log(e)


def _drop_lock_if_deleted(key: int, session_ref: int) -> None:
    # A session deleted while we held its lock row kept that row (the deletion skips a locked
    # one rather than wait for us): it goes now. Never fails the read.
    try:
        with plpy.subtransaction():
            db.execute(_DROP_ORPHAN, ("bigint", "bigint"), (key, session_ref))
    except plpy.SPIError as e:
        if e.sqlstate == QUERY_CANCELED:
            raise
        _log(e)


def _log(e: BaseException) -> None:
    # Never fails the read (SPEC §3): what failed goes to the server log, without content.
    from aidb_memory_server import endpoints

    text = endpoints.redact_urls(" ".join(str(e).split()))[:200]
    plpy.log(f"aidb_memory: compaction failed: {type(e).__name__}: {text}")


def _compact(
    namespace_id: int,
    config: dict[str, Any],
    key: int,
    ref: int,
    limit_chars: int,
    target: int,
    model: llm.Model,
    *,
    due: Callable[[int, int, int], bool] = compaction.needed,
    purpose: str = "compaction",
    written: list[dict[str, int]] | None = None,
) -> list[str]:
    # due: whether the state read under the lock still calls for a summary (a read:
    # compaction.needed; the worker: compaction.ahead_due). written: where the summary's range
    # goes once stored.
    state = db.execute(_STATE, ("bigint", "bigint"), (key, ref))
    if not state.nrows():
        # Deleted while we waited for its lock row (the deletion had removed it uncommitted):
        # the row we inserted goes again (session_compact drops it on any warning).
        return ["compaction_busy"]
    s = state[0]
    end_seq = int(s["tail_round_start"]) if s["open"] else int(s["next_seq"])
    end_offset = sessions.offset_of(key, ref, end_seq) if s["open"] else int(s["total_chars"])
    covered_seq, covered_offset = int(s["covered_seq"]), int(s["covered_offset"])
    if config["pin_instructions"] and covered_seq < int(s["pinned_seq"]):
        # Compaction covers only the turns after the instructions prefix.
        covered_seq, covered_offset = int(s["pinned_seq"]), int(s["pinned_chars"])
    if not due(end_offset - covered_offset, int(s["newest_chars"]), limit_chars):
        return []  # another backend compacted while we waited for nothing
    stop_seq = int(s["tail_round_start"])
    cap = int(config["compaction_max_input_chars"])
    total = end_offset - covered_offset
    found = db.execute(
        _CUT,
        _CUT_TYPES,
        (
            key,
            ref,
            covered_offset,
            covered_seq,
            stop_seq,
            covered_offset + compaction.past_share(total),
            covered_offset + cap,
        ),
    )
    if found[0]["next_round"] is None:
        return ["newest_round_over_budget"]  # nothing but the newest round: no summary helps
    next_round = int(found[0]["next_round"])
    cut = next_round - 1
    cut_offset = sessions.offset_of(key, ref, next_round)
    if cut_offset - covered_offset <= cap:
        rows = list(db.execute(_SOURCES, _SOURCES_TYPES, (key, ref, covered_seq, cut)))
    else:  # one round larger than the cap: its head and its tail
        head_end, tail_start = compaction.head_and_tail(covered_offset, cut_offset, cap)
        rows = list(
            db.execute(
                _CLIPPED_SOURCES,
                _CLIPPED_TYPES,
                (key, ref, covered_seq, cut, head_end, tail_start),
            )
        )
    sources = [
        Source(
            int(r["seq"]),
            r["role"],
            r["content"],
            r["name"],
            compaction.tool_calls(r["tool_calls"]),
            r["tool_call_id"],
            None if r["item"] is None else json.loads(r["item"]),
            r["item_format"] or "chat",
        )
        for r in rows
    ]
    text, warning = _summarize(
        model, sources, target, namespace_id, config["llm_timeout_s"], purpose
    )
    if text is None:
        if warning == "compaction_call_failed":
            record_failure(key, ref, model.name, config)
        return [warning] if warning else []
    first, last = rows[0], rows[-1]
    with plpy.subtransaction():  # the savepoint of SPEC §3
        stored = _store(key, ref, first, last, cut, text, model.name)
    if not stored:
        # The session changed under us (a pop, or a compaction committed by another snapshot).
        return ["compaction_busy"]
    clear_failures(key, ref)
    # Counted for aidb_memory.metrics(): the worker's task compacts ahead of reads, a read inline.
    # Imported here, as llm is: only a compaction that called a model gets this far.
    from aidb_memory_server import metrics

    metrics.compaction("ahead" if purpose == "compaction_ahead" else "inline", namespace_id)
    if written is not None:
        written.append({"from_seq": int(first["seq"]), "to_seq": cut, "chars": len(text)})
    if next_round < stop_seq and due(end_offset - cut_offset, len(text), limit_chars):
        # Still catching up (the input cap, or a batch larger than the budget): later reads
        # summarize the rest, one step each.
        return ["compaction_incomplete"]
    return []


def _store(key: int, ref: int, first: Any, last: Any, cut: int, text: str, model_name: str) -> bool:
    stored = db.execute(
        _STORE,
        _STORE_TYPES,
        (
            key,
            ref,
            int(first["seq"]),
            cut,
            text,
            len(text),
            model_name,
            int(first["char_offset"]),
            int(last["char_offset"]) + int(last["chars"]),
            last["version"],
        ),
    )
    return bool(stored.nrows())


def _summarize(
    model: llm.Model,
    sources: list[Source],
    target: int,
    namespace_id: int,
    timeout_s: float,
    purpose: str = "compaction",
) -> tuple[str | None, str | None]:
    """(summary, None), or (None, the warning that says why there is none)."""
    from aidb_memory_server import llm

    span = (sources[0].seq, sources[-1].seq)
    if model.provider == "builtin":
        messages = compaction.extractive_sources(sources)
    else:
        messages = compaction.prompt(sources, target)
    answer = ""
    for attempt in range(2):
        if attempt:
            messages = compaction.retry_prompt(messages, answer, target)
        result = llm.complete(
            model,
            messages,
            purpose=purpose,
            namespace_id=namespace_id,
            timeout_s=timeout_s,
            max_chars=target,
            span=span,
        )
        if not result.ok:
            return None, "compaction_call_failed"
        text = compaction.usable(result.text)
        if text is None:
            return None, "compaction_call_failed"
        if len(text) <= target:
            return text, None
        answer = text
    return None, "compaction_summary_overlength"


# --- what the worker compacts ahead for (issue 13) ---------------------------------------------

# The budget of the latest read that compacted (or found compaction due) and the total_chars past
# which the session's unsummarized chars pass the ahead threshold of that budget: what add reads
# (adding._LOCK_FOR_ADD) to queue a task. Only the holder of the session's compaction lock row
# writes them (migration 0014_compaction_ahead), so writers never race.
_REMEMBER = """
INSERT INTO aidb_memory.compaction_ahead AS a (actor_key, session_ref, read_budget, ahead_at)
SELECT $1, $2, $3,
       greatest(coalesce((SELECT x.to_offset FROM aidb_memory.summary AS x
                          WHERE x.actor_key = $1 AND x.session_ref = $2
                          ORDER BY x.to_seq DESC LIMIT 1), 0), $4) + $5
ON CONFLICT (actor_key, session_ref) DO UPDATE
SET read_budget = excluded.read_budget, ahead_at = excluded.ahead_at
WHERE (a.read_budget, a.ahead_at) IS DISTINCT FROM (excluded.read_budget, excluded.ahead_at)
"""


def _remember(
    key: int,
    session_ref: int,
    budget: int,
    room_chars: int,
    config: dict[str, Any],
    pinned_chars: int,
) -> None:
    """Record ``budget`` and the session's next ahead threshold (from its newest summary, as it
    now is) for the session whose compaction lock the caller holds. Never fails the read: a
    failure (e.g. 40001 in a REPEATABLE READ transaction that a worker's update came after) is
    logged, and the threshold stays what it was."""
    floor = pinned_chars if config["pin_instructions"] else 0
    try:
        with plpy.subtransaction():
            db.execute(
                _REMEMBER,
                ("bigint", "bigint", "int", "bigint", "bigint"),
                (key, session_ref, budget, floor, compaction.ahead_chars(room_chars)),
            )
    except plpy.SPIError as e:
        if e.sqlstate == QUERY_CANCELED:
            raise
        _log(e)


# --- compaction ahead of reads: the worker's task (issue 13) -----------------------------------

_SESSION_BY_REF = """
SELECT n.id, n.config::text AS config, n.model_spec->>'llm' AS llm, s.pinned_chars
FROM aidb_memory.session AS s
JOIN aidb_memory.namespace AS n ON n.id = s.namespace_id
WHERE s.actor_key = $1 AND s.id = $2
"""
# Warnings after which the task is an attempt that failed: a later one may succeed (the model
# answers again, the other compaction is over). The others say that no summary can help now.
_RETRYABLE = frozenset(
    {
        "compaction_call_failed",
        "compaction_summary_overlength",
        "compaction_busy",
        "compaction_model_unavailable",
    }
)


class AheadOutcome:
    """What a compaction task did. ``status``: 'processed' (a summary was written), 'skipped'
    (dropped: nothing is due, or no summary can help; no model call was paid for nothing) or
    'failed' (an attempt that failed, retried after backoff up to max_attempts by the queue).
    ``result``: the task's result; ``error``: its last_error when failed."""

    __slots__ = ("error", "result", "status")

    def __init__(self, status: str, result: dict[str, Any], error: str | None = None) -> None:
        self.status = status
        self.result = result
        self.error = error


# still_due's answer as the reason a task records for being dropped.
_NOT_DUE_ANY_MORE = {
    "compaction_read_only": "read_only",
    "compaction_busy": "session_deleted",
    "compaction_call_failed": "cooling_down",
}


def _dropped(why: str, warnings: list[str] | None = None) -> AheadOutcome:
    return AheadOutcome("skipped", {"dropped": why, "warnings": warnings or []})


def compact_ahead(key: int, session_ref: int, budget: int) -> AheadOutcome:
    """The worker's compaction task: summarize the session's oldest unsummarized turns for
    reads of ``budget`` chars, exactly as such a read would (the same checks, lock, cut, prompt,
    store and warnings), once its unsummarized chars pass the ahead threshold
    (``compaction.ahead_due``). The state is read again under the session's compaction lock
    (``FOR UPDATE SKIP LOCKED``), so a session deleted, or popped below the threshold, or
    compacted by a read meanwhile is dropped without a model call. The call is recorded in
    model_usage with purpose ``compaction_ahead``."""
    found = db.execute(_SESSION_BY_REF, ("bigint", "bigint"), (key, session_ref))
    if not found.nrows():
        return _dropped("session_deleted")
    ns = found[0]
    config = validation.effective_config(json.loads(ns["config"]))
    if not config["compaction_ahead"]:
        return _dropped("compaction_ahead_off")
    pinned = int(ns["pinned_chars"])
    room = budget - pinned if config["pin_instructions"] else budget
    if room <= 0:
        return _dropped("pinned_instructions_over_budget")
    target = compaction.target_chars(room)
    if target < config["compaction_min_target_chars"]:
        return _dropped("budget_too_small", ["compaction_budget_too_small"])
    # The namespace's own model only: the worker does not know a read's fallback_model.
    name = ns["llm"]
    if name is None:
        return _dropped("no_model", ["compaction_model_unavailable"])
    why_not = still_due(key, session_ref, name, config)
    if why_not is not None:
        # Nowhere to store a summary, the session gone, or its model failed a moment ago: no
        # call; the next add past the threshold queues anew.
        return _dropped(_NOT_DUE_ANY_MORE[why_not], [why_not])
    from aidb_memory_server import llm

    try:
        model = llm.load("process_events", name)
    except Exception:
        return AheadOutcome(
            "failed",
            {"warnings": ["compaction_model_unavailable"]},
            f'compaction_model_unavailable: model "{name}" is not registered',
        )
    if llm.key_refusal(model) is not None:
        return AheadOutcome(
            "failed",
            {"warnings": ["compaction_model_unavailable"]},
            f'compaction_model_unavailable: the key of model "{name}" may not go to its endpoint',
        )
    if (
        not db.execute(_TRY_LOCK, ("bigint", "bigint"), (key, session_ref)).nrows()
        and not db.execute(_CREATE_LOCK, ("bigint", "bigint"), (key, session_ref)).nrows()
    ):
        return AheadOutcome("failed", {"warnings": ["compaction_busy"]}, "compaction_busy")
    written: list[dict[str, int]] = []
    try:
        warnings = _compact(
            int(ns["id"]),
            config,
            key,
            session_ref,
            room,
            target,
            model,
            due=compaction.ahead_due,
            purpose="compaction_ahead",
            written=written,
        )
    except plpy.SPIError as e:
        if e.sqlstate == QUERY_CANCELED:
            raise  # process_events records the cancelled attempt
        _log(e)
        warnings = ["compaction_call_failed"]
    except Exception as e:
        _log(e)
        warnings = ["compaction_call_failed"]
    _remember(key, session_ref, budget, room, config, pinned)
    if warnings:
        _drop_lock_if_deleted(key, session_ref)
    result: dict[str, Any] = {"budget": budget, "warnings": warnings, "model": model.name}
    if written:
        return AheadOutcome("processed", {**result, "summary": written[0]})
    retryable = [w for w in warnings if w in _RETRYABLE]
    if retryable:
        return AheadOutcome("failed", result, ", ".join(retryable))
    # Nothing due any more (a read compacted, a pop), or no summary can help (the newest round).
    return AheadOutcome("skipped", {**result, "dropped": warnings[0] if warnings else "not_due"})
