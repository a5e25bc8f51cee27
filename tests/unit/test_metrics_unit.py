"""The counters' pure parts (plpython/aidb_memory_server/metrics.py): the histogram bucket of a
call's latency, the slot of a backend, and what a model call's bump sends, outside the database
(``plpy`` and ``db.execute`` stood in for)."""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
_RELOADED = ("aidb_memory_server.db", "aidb_memory_server.metrics")


class _SPIError(Exception):
    sqlstate = "40001"


@pytest.fixture
def metrics(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    plpy = types.ModuleType("plpy")
    plpy.subtransaction = contextlib.nullcontext
    plpy.SPIError = _SPIError
    logged: list[str] = []
    plpy.log = logged.append
    monkeypatch.setitem(sys.modules, "plpy", plpy)
    for name in _RELOADED:
        monkeypatch.delitem(sys.modules, name, raising=False)
    # import_module, not `from aidb_memory_server import ...`: the package keeps its attribute
    # for a module an earlier test imported (with an earlier stand-in plpy).
    importlib.import_module("aidb_memory_server.db")
    metrics = importlib.import_module("aidb_memory_server.metrics")
    db = metrics.db

    executed: list[tuple[str, tuple[Any, ...]]] = []

    def execute(sql: str, types: Any = (), params: Any = ()) -> list[Any]:
        executed.append((sql, tuple(params)))
        return []

    monkeypatch.setattr(db, "execute", execute)
    metrics.executed = executed
    metrics.logged = logged
    yield metrics
    for name in _RELOADED:
        sys.modules.pop(name, None)


def test_a_call_goes_to_the_first_bucket_whose_bound_it_does_not_exceed(metrics: Any) -> None:
    assert metrics.bucket(0) == 1
    assert metrics.bucket(100) == 1, "le is inclusive: 0.1 s is in the 0.1 bucket"
    assert metrics.bucket(101) == 2
    assert metrics.bucket(500) == 3
    assert metrics.bucket(999) == 4
    assert metrics.bucket(2500) == 5
    assert metrics.bucket(120_000) == 10
    assert metrics.bucket(120_001) == 11, "+Inf"
    assert metrics.bucket(None) == 1, "an unknown latency counts 0"
    assert metrics.bucket(-5) == 1
    # Every bound lands in its own bucket, one more ms in the next.
    for i, bound in enumerate(metrics.BUCKETS_S, start=1):
        ms = round(bound * 1000)
        assert (metrics.bucket(ms), metrics.bucket(ms + 1)) == (i, i + 1)


def test_the_bounds_are_the_le_labels_of_the_sql_function(metrics: Any) -> None:
    """sql/72_metrics.sql writes the bounds as `le` labels: the same, in the same order."""
    sql = (REPO / "sql" / "72_metrics.sql").read_text()
    written = re.findall(
        r"\((\d+), '([^']+)'\)", sql.split("bounds (i, le) AS (")[1].split("queue AS (")[0]
    )
    assert [int(i) for i, _ in written] == list(range(1, len(metrics.BUCKETS_S) + 2))
    assert [le for _, le in written][:-1] == [f"{b:g}" for b in metrics.BUCKETS_S]
    assert written[-1][1] == "+Inf"
    migration = (REPO / "migrations" / "0031_metrics.sql").read_text()
    assert f"cardinality(buckets) = {len(metrics.BUCKETS_S) + 1}" in migration


def test_a_slot_is_the_pid_modulo_slots(metrics: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics.os, "getpid", lambda: 8 * 1000 + 3)
    assert metrics.slot() == 3
    assert 0 <= metrics.slot() < metrics.SLOTS


def test_a_model_call_bump_sends_its_bucket_once_and_no_null(metrics: Any) -> None:
    metrics.model_call("m", "extraction", "ok", None, None, 7, 300)
    (call_sql, call), (latency_sql, latency) = metrics.executed
    assert (call_sql, latency_sql) == (metrics._MODEL_CALL, metrics._MODEL_LATENCY)
    name, purpose, outcome, namespace, slot = call
    assert (name, purpose, outcome, namespace) == ("m", "extraction", "ok", 0)
    name, purpose, same_slot, tokens_in, tokens_out, ms, first, at = latency
    assert (name, purpose, same_slot, tokens_in, tokens_out, ms) == (
        "m",
        "extraction",
        slot,
        0,
        7,
        300,
    )
    assert at == 3 and first == [0, 0, 1] + [0] * 8


def test_a_failed_bump_is_logged_and_never_raised(
    metrics: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_a: Any) -> None:
        raise metrics.plpy.SPIError("could not serialize access due to concurrent update")

    monkeypatch.setattr(metrics.db, "execute", refuse)
    metrics.event("extraction", "processed", 1)
    assert metrics.logged == ["aidb_memory: a metrics counter was not bumped (SQLSTATE 40001)"]

    class _Cancel(metrics.plpy.SPIError):
        sqlstate = "57014"

    def cancel(*_a: Any) -> None:
        raise _Cancel("canceling statement due to user request")

    monkeypatch.setattr(metrics.db, "execute", cancel)
    with pytest.raises(_Cancel):
        metrics.compaction("inline", 1)
