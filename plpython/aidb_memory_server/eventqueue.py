"""The extraction queue (SPEC §5): claiming events with a lease, working one, retrying with
backoff, and the event's status.

Every ``add`` records an event. ``process_events`` (sql/70_worker.sql, a procedure so that it can
commit per event) claims one with :func:`event_claim` (``FOR UPDATE SKIP LOCKED``: several
workers never take the same event) and commits, so the claim and its lease are visible; then
:func:`event_process` works it in a transaction of its own that keeps the event row locked
(another worker skips it even once the lease is over) and commits. A worker that dies leaves the
event ``processing`` with a lease in the past: the next claim takes it over, and since the work
was one transaction, nothing of the first attempt remains.

Every claim counts as an attempt (``attempts`` is incremented and committed before the work), so
an attempt that ends without a result (cancelled, timed out, its backend killed or crashed) still
counts: the claim takes over a lapsed lease only while attempts are left, and otherwise marks
the event ``failed`` saying so. Without that, an event that crashes its backend would restart the
cluster once per lease, forever. A cancelled attempt (57014, e.g. statement_timeout) is recorded
at once by ``process_events`` (:func:`event_interrupted`), with the same backoff as any failure.

An event is known by its actor_key and id (its primary key, issue 15): the claim returns both
and every later step looks the event up by both, so that each touches the one actor's rows. A
worker may be given a range of keys (``process_events(key_min => .., key_max => ..)``): it then
claims only events whose actor_key is in it, and workers with disjoint ranges share the queue
without scanning one another's events; without a range a claim looks at every key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import plpy

from aidb_memory_server import (
    access,
    db,
    endpoints,
    extraction,
    keys,
    llm,
    reconciliation,
    turns,
    validation,
    verbatim,
)
from aidb_memory_server.errors import UNDEFINED_OBJECT, ApiError, invalid, required

QUERY_CANCELED = "57014"
BACKOFF_MAX_S = 3600.0
ERROR_CHARS = 500
# Texts per embedding request (verbatim extraction may store many pieces of one event).
EMBED_BATCH = 256

# The oldest claimable events: accepted and due, or processing with a lapsed lease (its attempt
# ended without a result). Compaction tasks first (issue 13): a read is about to need their
# summary, while extraction has no one waiting for it. A claim reads candidates without locking
# them, over every key (the default) or over the key range a worker was given (issue 15), then
# locks one by its key (_LOCK_CANDIDATE, SKIP LOCKED: several workers never take the same event):
# a distributed PostgreSQL (Citus) locks rows only in a statement on one shard.
_CLAIMABLE = """
    (q.status = 'accepted' AND (q.next_attempt_at IS NULL OR q.next_attempt_at <= now()))
    OR (q.status = 'processing' AND q.lease_until < now())"""
CANDIDATES = 16
_CANDIDATES_COMPACTION = f"""
-- spans actors: queue claim without a key range (a read; the claim locks one event by its key)
SELECT q.actor_key, q.id FROM aidb_memory.event q
WHERE q.kind = 'compaction' AND ({_CLAIMABLE})
ORDER BY q.id
LIMIT {CANDIDATES}
"""
_CANDIDATES = f"""
-- spans actors: queue claim without a key range (a read; the claim locks one event by its key)
SELECT q.actor_key, q.id FROM aidb_memory.event q
WHERE {_CLAIMABLE}
ORDER BY q.id
LIMIT {CANDIDATES}
"""
_CANDIDATES_COMPACTION_IN_RANGE = f"""
SELECT q.actor_key, q.id FROM aidb_memory.event q
WHERE q.actor_key BETWEEN $1 AND $2 AND q.kind = 'compaction' AND ({_CLAIMABLE})
ORDER BY q.id
LIMIT {CANDIDATES}
"""
_CANDIDATES_IN_RANGE = f"""
SELECT q.actor_key, q.id FROM aidb_memory.event q
WHERE q.actor_key BETWEEN $1 AND $2 AND ({_CLAIMABLE})
ORDER BY q.id
LIMIT {CANDIDATES}
"""
# A candidate, locked if no other worker holds it and still claimable once locked (FOR UPDATE
# reads the row's latest version): another claim may have taken it since it was read.
_LOCK_CANDIDATE = f"""
SELECT q.actor_key, q.id, q.kind, q.status, q.attempts, q.last_error, q.namespace_id
FROM aidb_memory.event q
WHERE q.actor_key = $1 AND q.id = $2 AND ({_CLAIMABLE})
FOR UPDATE SKIP LOCKED
"""
# The claim is an attempt: counted here and committed by process_events before the work.
_CLAIM = """
UPDATE aidb_memory.event
SET status = 'processing', attempts = attempts + 1, last_error = COALESCE($4, last_error),
    lease_until = now() + make_interval(secs => $3)
WHERE actor_key = $1 AND id = $2
"""
# The event, locked for the whole attempt, with its namespace. FOR UPDATE waits rather than
# skips: another worker's claim may hold the row for an instant (it locked the row version it
# saw before finding it no longer claimable); a worker that took over after a lapsed lease holds
# it for its whole attempt, and then the status is no longer 'processing'. actor_key is in the
# row: reconciliation.apply writes the actor's memories under it.
_EVENT = """
SELECT e.actor_key, e.id, e.namespace_id, e.actor_id, e.agent_id, e.session_id,
       e.turns::text AS turns, e.attempts, n.config::text AS config,
       n.model_spec::text AS model_spec, e.kind, e.session_ref, e.budget,
       e.memory_metadata::text AS memory_metadata
FROM aidb_memory.event e
JOIN aidb_memory.namespace n ON n.id = e.namespace_id
WHERE e.actor_key = $1 AND e.id = $2 AND e.status = 'processing'
FOR UPDATE OF e
"""
_TURNS = """
SELECT role, kind, content FROM aidb_memory.turn
WHERE actor_key = $1 AND event_ref = $2 ORDER BY session_ref, seq
"""
_DONE = """
UPDATE aidb_memory.event
SET status = $3, result = $4::jsonb, last_error = NULL, lease_until = NULL,
    next_attempt_at = NULL, processed_at = now()
WHERE actor_key = $1 AND id = $2
"""
_RETRY = """
UPDATE aidb_memory.event
SET status = 'accepted', last_error = $3, lease_until = NULL,
    next_attempt_at = clock_timestamp() + make_interval(secs => $4)
WHERE actor_key = $1 AND id = $2
"""
# No attempt left: failed, with why. The clock, not the transaction start, is when it failed.
_FAILED = """
UPDATE aidb_memory.event
SET status = 'failed', last_error = $3, lease_until = NULL, next_attempt_at = NULL,
    processed_at = clock_timestamp()
WHERE actor_key = $1 AND id = $2
"""
_REMAINING = """
-- spans actors: the queue's backlog over every key (monitoring)
SELECT count(*) AS n FROM aidb_memory.event
WHERE status = 'accepted' OR (status = 'processing' AND lease_until < now())
"""


def event_claim(
    lease_s: int | None,
    max_attempts: int | None,
    key_min: int | None = None,
    key_max: int | None = None,
) -> list[dict[str, Any]]:
    """Claim the oldest claimable event for ``lease_s`` seconds: one row (actor_key, event_id,
    kind), or none. With ``key_min`` and ``key_max`` (inclusive; both or neither), only an event
    whose actor_key is in that range.

    An event with no attempt left (its last attempt ended without a result, or an earlier run
    allowed more attempts) is marked failed instead, and the next one is looked at."""
    lease = 300 if lease_s is None else lease_s
    if not 1 <= lease <= 86_400:
        raise invalid("process_events", "lease_s", "must be between 1 and 86400")
    limit, _ = _retry_policy(max_attempts, None)
    if key_min is None and key_max is None:
        first, then = _CANDIDATES_COMPACTION, _CANDIDATES
        types: tuple[str, ...] = ()
        args: tuple[int, ...] = ()
    elif key_min is None or key_max is None:
        raise invalid(
            "process_events",
            "key_min and key_max",
            "must both be given or both be NULL",
            hint="both NULL: every key; both given: the keys from key_min to key_max",
        )
    elif key_min > key_max:
        raise invalid("process_events", "key_min", "must not be greater than key_max")
    else:
        first, then = _CANDIDATES_COMPACTION_IN_RANGE, _CANDIDATES_IN_RANGE
        types, args = ("bigint", "bigint"), (key_min, key_max)
    while True:
        event = _lock_one(first, types, args) or _lock_one(then, types, args)
        if event is None:
            return []
        key, event_id, attempts = int(event["actor_key"]), int(event["id"]), int(event["attempts"])
        unfinished = event["status"] == "processing"
        note = unfinished_attempt(attempts) if unfinished else None
        if attempts >= limit:
            why = note or exhausted(attempts, limit, event["last_error"])
            db.execute(_FAILED, ("bigint", "bigint", "text"), (key, event_id, why))
            _count(event, "failed")
            continue
        db.execute(
            _CLAIM, ("bigint", "bigint", "float8", "text"), (key, event_id, float(lease), note)
        )
        return [{"actor_key": key, "event_id": event_id, "kind": event["kind"]}]


def _lock_one(candidates: str, types: tuple[str, ...], args: tuple[int, ...]) -> Any:
    """The first of the oldest claimable events that this claim could lock, or None: none is
    claimable, or other workers hold every candidate (they are claiming them at this moment)."""
    for c in db.execute(candidates, types, args):
        locked = db.execute(
            _LOCK_CANDIDATE, ("bigint", "bigint"), (int(c["actor_key"]), int(c["id"]))
        )
        if locked.nrows():
            return locked[0]
    return None


def unfinished_attempt(attempt: int) -> str:
    """last_error of an attempt whose lease lapsed: it never recorded an outcome."""
    return f"attempt {attempt} ended without a result (cancelled, timed out or the backend crashed)"


def exhausted(attempts: int, limit: int, last_error: str | None) -> str:
    """last_error of an event that already had max_attempts attempts when it came due."""
    why = f"no attempt left: {attempts} made, max_attempts is {limit}"
    return f"{why}; last error: {last_error}"[:ERROR_CHARS] if last_error else why


def event_remaining() -> int:
    """Events waiting for a worker (accepted, or processing with a lapsed lease)."""
    return int(db.execute(_REMAINING)[0]["n"])


def backoff_s(attempts: int, base_s: float) -> float:
    """How long a failed event waits before its next attempt: doubling, capped at an hour."""
    return float(min(BACKOFF_MAX_S, base_s * (2 ** max(0, attempts - 1))))


def _retry_policy(max_attempts: int | None, base_backoff_s: float | None) -> tuple[int, float]:
    """process_events' max_attempts and backoff_s, defaulted and checked (22023)."""
    limit = 5 if max_attempts is None else max_attempts
    if not 1 <= limit <= 100:
        raise invalid("process_events", "max_attempts", "must be between 1 and 100")
    base = 10.0 if base_backoff_s is None else float(base_backoff_s)
    if not 0 <= base <= BACKOFF_MAX_S:
        raise invalid("process_events", "backoff_s", f"must be between 0 and {BACKOFF_MAX_S:g}")
    return limit, base


def event_process(
    key: int, event_id: int, max_attempts: int | None, base_backoff_s: float | None
) -> str:
    """Work one claimed event (its actor_key and id, as event_claim returned them): 'processed',
    'skipped', 'retry', 'failed', or 'lost' (another worker holds it)."""
    limit, base = _retry_policy(max_attempts, base_backoff_s)
    rows = db.execute(_EVENT, ("bigint", "bigint"), (key, event_id))
    if not rows.nrows():
        return "lost"
    event = rows[0]
    if event["kind"] == "compaction":
        return _compaction_task(event, limit, base)
    if event["kind"] == "embedding":
        return embedding_task(event, limit, base)
    config = validation.effective_config(json.loads(event["config"]))
    spec = json.loads(event["model_spec"])
    model_name = spec.get("llm")
    configured = config["extraction_mode"]
    if not config["extraction"]:
        return _finish(event, "skipped", {"reason": "extraction is off"})
    if configured == "model" and model_name is None:
        return _finish(event, "skipped", {"reason": 'extraction_mode is "model" and no llm is set'})
    model = None
    if model_name is not None and configured in ("auto", "model"):
        try:
            model = llm.load("process_events", model_name)
        except Exception:
            return _fail(event, limit, base, f'model "{model_name}" is not registered')
        if model.provider == "builtin" and configured == "model":
            reason = 'the builtin extractive model cannot extract facts (extraction_mode "model")'
            return _finish(event, "skipped", {"reason": reason})
    how = verbatim.mode(configured, model is not None and model.provider != "builtin")
    if how != "model":
        return _verbatim(event, config, spec, how == "verbatim_all", limit, base)
    assert model is not None
    said, left_out = extraction.bounded(_turns(event), config["extraction_max_input_chars"])
    if not said:
        return _finish(event, "processed", reconciliation.EMPTY_RESULT)
    existing = reconciliation.related(
        int(event["namespace_id"]), event["actor_id"], said, int(event["actor_key"])
    )
    refs = {f"m{i + 1}": m for i, m in enumerate(existing)}
    messages = extraction.prompt(
        said,
        [extraction.Existing(ref, m.content) for ref, m in refs.items()],
        _today(),
        left_out,
    )
    result = llm.complete(
        model,
        messages,
        purpose="extraction",
        namespace_id=int(event["namespace_id"]),
        timeout_s=config["llm_timeout_s"],
        response_format=extraction.response_format(),
    )
    if not result.ok:
        # last_error is the application's (status): the model's name, never its URL.
        why = result.public_error or result.outcome
        return _fail(event, limit, base, f'{why} (model "{model.name}")')
    try:
        operations = extraction.parse(result.text, set(refs))
    except extraction.Malformed as e:
        return _fail(event, limit, base, f"malformed answer: {e}")
    texts = sorted({op.text for op in operations if op.text})
    return _embed_and_store(
        event,
        config,
        spec,
        texts,
        limit,
        base,
        lambda vectors: reconciliation.apply(
            event, operations, refs, vectors, spec.get("embedding")
        ),
    )


def _embed(
    event: Any, config: dict[str, Any], spec: dict[str, Any], texts: Sequence[str]
) -> dict[str, list[float]] | str:
    """The vectors of ``texts`` by the namespace's ``model_spec.embedding`` ({} without one), or
    why embedding failed (the attempt's error)."""
    if not spec.get("embedding") or not texts:
        return {}
    found: list[list[float]] = []
    try:
        embedder = llm.load("process_events", spec["embedding"])
        for start in range(0, len(texts), EMBED_BATCH):
            found += llm.embed(
                embedder,
                texts[start : start + EMBED_BATCH],
                namespace_id=int(event["namespace_id"]),
                timeout_s=config["llm_timeout_s"],
            )
    except llm.EmbeddingError as e:
        return f'embedding failed: {e.public} (model "{spec["embedding"]}")'
    except Exception:
        return f'embedding model "{spec["embedding"]}" is missing'
    return dict(zip(texts, found, strict=True))


def _verbatim(
    event: Any,
    config: dict[str, Any],
    spec: dict[str, Any],
    all_roles: bool,
    limit: int,
    base: float,
) -> str:
    """Verbatim extraction (issue 26): no model call; the event's user turns (and with
    ``all_roles`` the assistant's) cut into pieces of at most memory_max_chars, each stored as a
    memory of the event, exact duplicates merged; embedded with model_spec.embedding."""
    texts = [
        piece
        for role, kind, text in _said(event)
        if verbatim.spoken(role, kind, all_roles)
        for piece in verbatim.pieces(text, config["memory_max_chars"])
    ]
    if not texts:
        return _finish(event, "processed", reconciliation.EMPTY_RESULT)
    return _embed_and_store(
        event,
        config,
        spec,
        sorted(set(texts)),
        limit,
        base,
        lambda vectors: reconciliation.add_verbatim(event, texts, vectors, spec.get("embedding")),
    )


def _embed_and_store(
    event: Any,
    config: dict[str, Any],
    spec: dict[str, Any],
    texts: Sequence[str],
    limit: int,
    base: float,
    store: Callable[[dict[str, list[float]]], dict[str, Any]],
) -> str:
    """Embed ``texts`` (_embed), then ``store`` the event's memories with their vectors
    (_reconcile); a failed embedding is a failed attempt, before anything is stored."""
    vectors = _embed(event, config, spec, texts)
    if isinstance(vectors, str):
        return _fail(event, limit, base, vectors)
    return _reconcile(event, limit, base, lambda: store(vectors))


def _reconcile(event: Any, limit: int, base: float, write: Callable[[], dict[str, Any]]) -> str:
    """Run ``write`` (the event's changes to its actor's memories) in a subtransaction: a
    database error fails the attempt and leaves nothing of it; a cancel ends the statement."""
    try:
        with plpy.subtransaction():
            summary = write()
    except plpy.SPIError as e:
        if e.sqlstate == QUERY_CANCELED:
            raise
        return _fail(event, limit, base, f"database error: {' '.join(str(e).split())}")
    return _finish(event, "processed", summary)


# An event without a session keeps its said as sent (chat messages or Responses items, which
# add validated under the namespace's limits): these limits only let them through again, to
# get each one's role and text (turns.Turn.content, the text projection).
_NO_LIMITS = turns.Limits(10**9, 10**9, 10**9, 10**12)


def _said(event: Any) -> list[tuple[str, str | None, str]]:
    """The event's turns that have text: (role, kind, text) each, in order. A tool call without
    text says nothing about the user."""
    if event["turns"] is not None:
        batch = turns.validate_batch("add", json.loads(event["turns"]), _NO_LIMITS)
        said = [(t.role, t.kind, t.content) for t in batch]
    else:
        rows = db.execute(_TURNS, ("bigint", "bigint"), (int(event["actor_key"]), int(event["id"])))
        said = [(r["role"], r["kind"], r["content"]) for r in rows]
    return [(role, kind, text) for role, kind, text in said if text and text.strip()]


def _turns(event: Any) -> list[extraction.Turn]:
    return [extraction.Turn(role, text) for role, _, text in _said(event)]


def _today() -> str:
    return str(db.execute("SELECT current_date::text AS d")[0]["d"])


def _finish(event: Any, status: str, result: dict[str, Any]) -> str:
    db.execute(
        _DONE,
        ("bigint", "bigint", "text", "text"),
        (int(event["actor_key"]), int(event["id"]), status, json.dumps(result)),
    )
    _count(event, status)
    return status


def _count(event: Any, outcome: str) -> None:
    """Count the event's outcome for aidb_memory.metrics(), in the transaction of its status
    change (metrics.py: a subtransaction that never fails it)."""
    # Imported here: remember imports this module (queue_embedding), and only the worker counts.
    from aidb_memory_server import metrics

    metrics.event(event["kind"], outcome, int(event["namespace_id"]))


def _fail(event: Any, limit: int, base: float, error: str) -> str:
    # The application reads last_error: no URL of a model endpoint, whatever raised.
    message = " ".join(endpoints.strip_urls(error).split())[:ERROR_CHARS]
    attempts = int(event["attempts"])
    key, event_id = int(event["actor_key"]), int(event["id"])
    outcome = "failed" if attempts >= limit else "retry"
    if outcome == "failed":
        db.execute(_FAILED, ("bigint", "bigint", "text"), (key, event_id, message))
    else:
        db.execute(
            _RETRY,
            ("bigint", "bigint", "text", "float8"),
            (key, event_id, message, backoff_s(attempts, base)),
        )
    _count(event, outcome)
    return outcome


def event_error(
    key: int, event_id: int, max_attempts: int | None, base_backoff_s: float | None, error: str
) -> str:
    """Record an attempt that ended in an unexpected error (a bug, caught by the procedure)."""
    limit, base = _retry_policy(max_attempts, base_backoff_s)
    rows = db.execute(_EVENT, ("bigint", "bigint"), (key, event_id))
    if not rows.nrows():
        return "lost"
    return _fail(rows[0], limit, base, f"internal error: {error}")


def event_interrupted(
    key: int, event_id: int, max_attempts: int | None, base_backoff_s: float | None, error: str
) -> str:
    """Record an attempt that a cancel ended (57014: statement_timeout, pg_cancel_backend):
    it counts like any failed attempt, so the event waits its backoff or, after max_attempts,
    is failed; process_events then re-raises the cancel."""
    limit, base = _retry_policy(max_attempts, base_backoff_s)
    rows = db.execute(_EVENT, ("bigint", "bigint"), (key, event_id))
    if not rows.nrows():
        return "lost"
    attempt = int(rows[0]["attempts"])
    return _fail(rows[0], limit, base, f"attempt {attempt} was cancelled: {error}")


# --- retrying failed events -----------------------------------------------------------------

_NAMESPACE_ID = "SELECT id FROM aidb_memory.namespace WHERE name = $1"
# Back in the queue as if just added: due now, attempts from zero; last_error stays until the
# next outcome replaces it. Workers waiting on the channel are woken at commit. Of one actor (by
# its key), or of the whole namespace.
_RETRY_FAILED_OF_ACTOR = """
WITH retried AS (
    UPDATE aidb_memory.event
    SET status = 'accepted', attempts = 0, lease_until = NULL, next_attempt_at = NULL,
        processed_at = NULL, result = NULL
    WHERE actor_key = $1 AND namespace_id = $2 AND actor_id = $3
      AND status = 'failed' AND kind = 'extraction'
      AND ($4::timestamptz IS NULL OR processed_at >= $4)
    RETURNING 1
)
SELECT count(*) AS n,
       CASE WHEN count(*) > 0 THEN pg_notify('aidb_memory_events', '') END AS woke
FROM retried
"""
_RETRY_FAILED = """
-- spans actors: events_retry over a namespace (admins)
WITH retried AS (
    UPDATE aidb_memory.event
    SET status = 'accepted', attempts = 0, lease_until = NULL, next_attempt_at = NULL,
        processed_at = NULL, result = NULL
    WHERE namespace_id = $1 AND status = 'failed' AND kind = 'extraction'
      AND ($2::timestamptz IS NULL OR processed_at >= $2)
    RETURNING 1
)
SELECT count(*) AS n,
       CASE WHEN count(*) > 0 THEN pg_notify('aidb_memory_events', '') END AS woke
FROM retried
"""


def events_retry(namespace: str | None, actor_id: str | None, failed_since: str | None) -> int:
    """Put a namespace's failed events (of one actor, failed since a time) back in the queue
    with attempts reset; how many."""
    fn = "events_retry"
    if namespace is None:
        raise required(fn, "namespace")
    rows = db.execute(_NAMESPACE_ID, ("text",), (namespace,))
    if not rows.nrows():
        raise ApiError(
            UNDEFINED_OBJECT,
            f'aidb_memory.{fn}: namespace "{namespace}" does not exist',
            hint="SELECT name FROM aidb_memory.namespaces lists them",
        )
    ns_id = int(rows[0]["id"])
    if actor_id is None:
        retried = db.execute(_RETRY_FAILED, ("bigint", "timestamptz"), (ns_id, failed_since))
    else:
        retried = db.execute(
            _RETRY_FAILED_OF_ACTOR,
            ("bigint", "bigint", "text", "timestamptz"),
            (keys.actor_key(namespace, actor_id), ns_id, actor_id, failed_since),
        )
    return int(retried[0]["n"])


# --- status ----------------------------------------------------------------------------------

_STATUS = """
SELECT e.public_id::text AS event_id, e.status, e.attempts, e.last_error,
       to_json(e.created_at) #>> '{}' AS created_at,
       to_json(e.processed_at) #>> '{}' AS processed_at,
       to_json(e.next_attempt_at) #>> '{}' AS next_attempt_at,
       e.result::text AS result, e.kind
FROM aidb_memory.event e
WHERE e.actor_key = $1 AND e.namespace_id = $2 AND e.actor_id = $3 AND e.public_id = $4
"""


def status(namespace_name: str | None, actor_id: str | None, event_id: str | None) -> str | None:
    """The event's status and what it produced (NULL for an unknown event or another actor's)."""
    fn = "status"
    ns, actor = access.namespace(fn, namespace_name, actor_id, writing=False)
    if event_id is None:
        raise required(fn, "event_id")
    rows = db.execute(
        _STATUS,
        ("bigint", "bigint", "text", "uuid"),
        (keys.actor_key(ns.name, actor), ns.id, actor, event_id),
    )
    if not rows.nrows():
        return None
    r = dict(rows[0])
    r["result"] = json.loads(r["result"]) if r["result"] else None
    return json.dumps(r)


# --- compaction tasks (issue 13) ---------------------------------------------------------------


def _compaction_task(event: Any, limit: int, base: float) -> str:
    """Work a compaction task (queued by add, compactor.compact_ahead): 'processed' when a
    summary was written, 'skipped' when the task was dropped (no model call), else a failed
    attempt with the queue's backoff and max_attempts."""
    # Imported here: only a worker that meets a compaction task needs it.
    from aidb_memory_server import compactor

    done = compactor.compact_ahead(
        int(event["actor_key"]), int(event["session_ref"]), int(event["budget"])
    )
    if done.status == "failed":
        return _fail(event, limit, base, done.error or "compaction failed")
    return _finish(event, done.status, done.result)


# --- embedding tasks (issue 26: remember's vectors) ----------------------------------------------

# The actor's current memories without a vector, oldest first, a batch at a time (an expired one
# is not worth a model call).
_UNEMBEDDED = """
SELECT id, content FROM aidb_memory.memory
WHERE actor_key = $1 AND namespace_id = $2 AND actor_id = $3 AND valid_to IS NULL
  AND (expires_at IS NULL OR expires_at > statement_timestamp())
  AND embedding IS NULL
ORDER BY id
LIMIT $4
"""
# Only while the memory still says what was embedded: update_memory may have changed it since
# (and queued another task for the new text).
_SET_EMBEDDING = """
UPDATE aidb_memory.memory SET embedding = $3, embedding_model = $4
WHERE actor_key = $1 AND id = $2 AND embedding IS NULL AND content = $5
"""
# The actor's embedding task, unless one already waits to be claimed (migration 0017); a worker
# is woken.
_EMBED_LATER = """
WITH t AS (
    INSERT INTO aidb_memory.event (actor_key, namespace_id, actor_id, turn_count, status, kind)
    VALUES ($1, $2, $3, 0, 'accepted', 'embedding')
    ON CONFLICT (actor_key, namespace_id, actor_id)
        WHERE kind = 'embedding' AND status = 'accepted'
    DO NOTHING
    RETURNING 1
)
SELECT pg_notify('aidb_memory_events', '') AS woke FROM t
"""


def queue_embedding(key: int, namespace_id: int, actor_id: str) -> None:
    """Queue an embedding task for the actor (remembering.remember, and a task whose batch did
    not cover every memory without a vector)."""
    db.execute(_EMBED_LATER, ("bigint", "bigint", "text"), (key, namespace_id, actor_id))


# Memories one embedding task gives a vector (then it queues the next task of the actor).
EMBED_TASK_MEMORIES = 100


def embedding_task(event: Any, limit: int, base: float) -> str:
    """Work an embedding task (queued by remembering.remember): give the actor's current memories
    that have no vector one, by the namespace's embedding model, EMBED_TASK_MEMORIES at a time.
    'skipped' when the namespace no longer has an embedding model; a failed call is a failed
    attempt."""
    spec = json.loads(event["model_spec"])
    model_name = spec.get("embedding")
    if not model_name:
        return _finish(event, "skipped", {"reason": "the namespace has no embedding model"})
    config = validation.effective_config(json.loads(event["config"]))
    ident = (int(event["actor_key"]), int(event["namespace_id"]), event["actor_id"])
    rows = db.execute(
        _UNEMBEDDED, ("bigint", "bigint", "text", "int"), (*ident, EMBED_TASK_MEMORIES)
    )
    memories = [(int(r["id"]), r["content"]) for r in rows]
    vectors = _embed(event, config, spec, sorted({content for _, content in memories}))
    if isinstance(vectors, str):
        return _fail(event, limit, base, vectors)
    for memory_id, content in memories:
        db.execute(
            _SET_EMBEDDING,
            ("bigint", "bigint", "real[]", "text", "text"),
            (ident[0], memory_id, vectors[content], model_name, content),
        )
    if len(memories) == EMBED_TASK_MEMORIES:
        queue_embedding(*ident)
    return _finish(event, "processed", {"embedded": len(memories)})
