"""The counters behind ``aidb_memory.metrics()`` (issue 36; migration 0031_metrics).

Each is bumped by the code that makes what it counts, in the same transaction: an event's outcome
(eventqueue), a model call's usage row (llm), a summary (compactor). None is on ``add`` or a
read's hot path: a read bumps one only when it called a model. A row holds one label set and one
*slot*, the backend's pid modulo :data:`SLOTS`, so that workers finishing events at the same time
rarely wait on one row; ``metrics()`` sums the slots.

A bump runs in a subtransaction and never fails its caller: under REPEATABLE READ (an
application's read that compacted inline) an upsert of a row that another backend bumped after
the snapshot raises 40001, and the read, the event or the usage row must not be lost for a
counter. Such a failure is logged and the count is lost; a cancel still ends the statement.
"""

from __future__ import annotations

import os

import plpy

from aidb_memory_server import db

SLOTS = 8
# The upper bounds (seconds) of the model call duration histogram's buckets, as Prometheus'
# defaults stretched to model calls (a call of minutes is a timeout in the making); a last one,
# +Inf, takes the rest. sql/72_metrics.sql writes the same bounds as its `le` labels.
BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
QUERY_CANCELED = "57014"

_EVENT = """
INSERT INTO aidb_memory.metric_event AS m (kind, outcome, namespace_id, slot, events)
VALUES ($1, $2, $3, $4, 1)
ON CONFLICT (kind, outcome, namespace_id, slot) DO UPDATE SET events = m.events + 1
"""
_MODEL_CALL = """
INSERT INTO aidb_memory.metric_model_call AS m
    (model_name, purpose, outcome, namespace_id, slot, calls)
VALUES ($1, $2, $3, $4, $5, 1)
ON CONFLICT (model_name, purpose, outcome, namespace_id, slot) DO UPDATE SET calls = m.calls + 1
"""
# buckets: $7 has a 1 at the call's bucket (a new row); an existing row adds 1 at $8.
_MODEL_LATENCY = """
INSERT INTO aidb_memory.metric_model_latency AS m
    (model_name, purpose, slot, calls, tokens_in, tokens_out, duration_ms, buckets)
VALUES ($1, $2, $3, 1, $4, $5, $6, $7)
ON CONFLICT (model_name, purpose, slot) DO UPDATE
SET calls = m.calls + 1, tokens_in = m.tokens_in + excluded.tokens_in,
    tokens_out = m.tokens_out + excluded.tokens_out,
    duration_ms = m.duration_ms + excluded.duration_ms,
    buckets[$8] = m.buckets[$8] + 1
"""
_MODEL_LATENCY_TYPES = ("text", "text", "smallint", "bigint", "bigint", "bigint", "bigint[]", "int")
_COMPACTION = """
INSERT INTO aidb_memory.metric_compaction AS m (mode, namespace_id, slot, summaries)
VALUES ($1, $2, $3, 1)
ON CONFLICT (mode, namespace_id, slot) DO UPDATE SET summaries = m.summaries + 1
"""


def slot() -> int:
    """This backend's slot: its pid (PL/Python runs in the backend's own process) modulo
    :data:`SLOTS`. Two workers share a slot only when their pids do."""
    return os.getpid() % SLOTS


def bucket(latency_ms: int | None) -> int:
    """The histogram bucket (1-based, as the ``buckets`` array) of a call of ``latency_ms``: the
    first whose upper bound it does not exceed (Prometheus' ``le``: a call of exactly 0.5 s is in
    the 0.5 bucket); ``len(BUCKETS_S) + 1`` (+Inf) past the last. An unknown latency counts 0."""
    ms = max(0, latency_ms or 0)
    for i, bound in enumerate(BUCKETS_S, start=1):
        if ms <= round(bound * 1000):
            return i
    return len(BUCKETS_S) + 1


def _bump(*statements: tuple[str, tuple[str, ...], tuple[object, ...]]) -> None:
    """Run counter upserts (sql, types, params), all or none, in a subtransaction; a failure is
    logged, never raised (a cancel is: it ends the statement, as anywhere)."""
    try:
        with plpy.subtransaction():
            for sql, types, params in statements:
                db.execute(sql, types, params)
    except plpy.SPIError as e:
        if e.sqlstate == QUERY_CANCELED:
            raise
        plpy.log(f"aidb_memory: a metrics counter was not bumped (SQLSTATE {e.sqlstate})")


def event(kind: str, outcome: str, namespace_id: int) -> None:
    """Count an event's outcome: processed, skipped, failed (for good) or retry."""
    _bump((_EVENT, ("text", "text", "bigint", "smallint"), (kind, outcome, namespace_id, slot())))


def model_call(
    model_name: str,
    purpose: str,
    outcome: str,
    namespace_id: int | None,
    tokens_in: int | None,
    tokens_out: int | None,
    latency_ms: int | None,
) -> None:
    """Count a model call as its usage row records it (namespace None: 0; tokens None: 0): its
    outcome and namespace, and its latency and tokens."""
    at = bucket(latency_ms)
    first = [0] * (len(BUCKETS_S) + 1)
    first[at - 1] = 1
    here = slot()
    _bump(
        (
            _MODEL_CALL,
            ("text", "text", "text", "bigint", "smallint"),
            (model_name, purpose, outcome, namespace_id or 0, here),
        ),
        (
            _MODEL_LATENCY,
            _MODEL_LATENCY_TYPES,
            (
                model_name,
                purpose,
                here,
                tokens_in or 0,
                tokens_out or 0,
                max(0, latency_ms or 0),
                first,
                at,
            ),
        ),
    )


def compaction(mode: str, namespace_id: int) -> None:
    """Count a summary written: ``ahead`` (the worker's task) or ``inline`` (a read)."""
    _bump((_COMPACTION, ("text", "bigint", "smallint"), (mode, namespace_id, slot())))
