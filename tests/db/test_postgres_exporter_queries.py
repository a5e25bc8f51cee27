"""docs/monitoring/postgres_exporter_queries.yml (issue 36 item 2): the custom queries that make a
deployment without our worker process (pg_cron runs process_events) observable through
postgres_exporter.

Each query runs against a database with aidb_memory installed, after real events and model calls
(the fake model server failing some), and returns the columns it declares; together they cover
every family aidb_memory.metrics() returns. Then Debian's postgres_exporter itself runs the file
and its /metrics carries every sample of metrics() under the same name, labels and value as the
worker's exporter would (tests/scrapers.py runs it as the server user when we are root).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from conftest import APP_USER, REPO, WORKER_USER, Database
from fake_openai import FakeOpenAI, Reply, Request, serve
from scrapers import postgres_exporter

QUERIES = REPO / "docs" / "monitoring" / "postgres_exporter_queries.yml"
NS = "mem"
FACT = json.dumps({"operations": [{"op": "add", "text": "A fact.", "target": None}]})
# The SQL types (pg_type.typname) a column of each usage may have.
VALUE_TYPES = {"float8", "float4", "numeric", "int8", "int4", "int2"}


def _answer(request: Request) -> Reply:
    """The model: HTTP 500 for a turn that says FAIL."""
    sent = json.dumps(request.body.get("messages", []))
    return Reply(status=500) if "FAIL" in sent else Reply(content=FACT)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with serve() as server:
        server.default = _answer
        yield server


@pytest.fixture
def busy_db(db: Database, fake: FakeOpenAI) -> Database:
    """A database where every family of metrics() has data: extraction events processed, failed
    and retried, model calls that worked and failed, a summary written inline by a read, and a
    finished process_events call."""
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\')', (NS,))
    turns: list[dict[str, str]] = []
    for i in range(10):
        turns.append({"role": "user", "content": f"question {i} ".ljust(200, "q")})
        turns.append({"role": "assistant", "content": f"answer {i} ".ljust(200, "a")})
    for actor, batch in (("alice", turns), ("bob", [{"role": "user", "content": "FAIL: hi"}])):
        db.sql(
            "SELECT aidb_memory.add(%s, %s, %s::jsonb, 's')",
            (NS, actor, json.dumps(batch)),
            user=APP_USER,
        )
    with db.connect(WORKER_USER) as conn:
        for _ in range(3):  # the failing event: a retry, then failed for good
            conn.execute(
                "CALL aidb_memory.process_events(max_events => 10, max_attempts => 2, "
                "backoff_s => 0)"
            )
    assert db.sql("SELECT status FROM aidb_memory.event ORDER BY id") == [
        ("processed",),
        ("failed",),
    ]
    # A budgeted read of alice's long session writes a summary inline.
    db.sql(
        "SELECT aidb_memory.session_get(%s, 'alice', 's', limit_chars => 1000)",
        (NS,),
        user=APP_USER,
    )
    assert db.value("SELECT count(*) FROM aidb_memory.summary") == 1
    return db


def _queries() -> dict[str, dict[str, Any]]:
    return dict(yaml.safe_load(QUERIES.read_text(encoding="utf-8")))


def _columns(query: dict[str, Any]) -> dict[str, str]:
    """The query's declared columns and their usage (a HISTOGRAM column brings three more)."""
    declared: dict[str, str] = {}
    for entry in query["metrics"]:
        ((name, spec),) = entry.items()
        declared[name] = spec["usage"]
        if spec["usage"] == "HISTOGRAM":
            for suffix in ("_bucket", "_sum", "_count"):
                declared[name + suffix] = "HISTOGRAM_PART"
    return declared


def _exported(name: str, query: dict[str, Any]) -> set[str]:
    """The sample names postgres_exporter makes of a query: <query name>_<column>."""
    names = set()
    for column, usage in _columns(query).items():
        if usage in ("GAUGE", "COUNTER"):
            names.add(f"{name}_{column}")
        elif usage == "HISTOGRAM":
            names |= {f"{name}_{column}{suffix}" for suffix in ("_bucket", "_sum", "_count")}
    return names


def _metrics(db: Database) -> list[tuple[str, dict[str, str], float]]:
    rows = db.sql("SELECT metric, labels, value FROM aidb_memory.metrics()", user=WORKER_USER)
    return [(r[0], r[1], float(r[2])) for r in rows]


def test_each_query_returns_the_columns_it_declares(busy_db: Database) -> None:
    queries = _queries()
    assert queries, "no queries"
    with busy_db.connect(WORKER_USER) as conn:
        for name, query in queries.items():
            assert query.get("master") is True, f"{name}: runs in every discovered database"
            declared = _columns(query)
            cur = conn.execute(query["query"])
            assert cur.description is not None
            got = [c.name for c in cur.description]
            assert got == list(declared), f"{name}: columns {got}, declared {list(declared)}"
            rows = cur.fetchall()
            types = {
                c.name: conn.execute(
                    "SELECT typname::text FROM pg_catalog.pg_type WHERE oid = %s", (c.type_code,)
                ).fetchall()[0][0]
                for c in cur.description
            }
            assert rows, f"{name}: no rows"
            for row in rows:
                values = dict(zip(got, row, strict=True))
                for column, usage in declared.items():
                    value = values[column]
                    if usage == "LABEL":
                        assert types[column] == "text" and isinstance(value, str), (name, column)
                    elif usage in ("GAUGE", "COUNTER"):
                        assert types[column] in VALUE_TYPES, (name, column, types[column])
                        assert value is not None and math.isfinite(float(value)), (name, column)
                    elif usage == "HISTOGRAM":
                        bounds, counts = value, values[column + "_bucket"]
                        assert types[column] == "_float8" and types[column + "_bucket"] == "_int8"
                        assert bounds == sorted(bounds) and len(bounds) == len(counts) > 0
                        assert all(math.isfinite(b) for b in bounds), "+Inf is implied"
                        assert counts == sorted(counts), "buckets are cumulative"
                        assert values[column + "_count"] >= counts[-1]
                        assert values[column + "_sum"] >= 0


def test_the_queries_cover_every_family_of_metrics(busy_db: Database) -> None:
    exported = set().union(*(_exported(name, q) for name, q in _queries().items()))
    families = {metric for metric, _, _ in _metrics(busy_db)}
    assert families - exported == set(), "families the queries file leaves out"
    assert exported - families == set(), "names the queries make that metrics() does not have"


def _le(labels: dict[str, str]) -> dict[str, Any]:
    """Labels with ``le`` as a number: "1" and "1.0" are one bucket."""
    return {k: float(v) if k == "le" else v for k, v in labels.items()}


def test_postgres_exporter_exports_every_sample_of_metrics(busy_db: Database) -> None:
    dsn = busy_db.dsn(WORKER_USER) + " sslmode=disable"
    with postgres_exporter(dsn, QUERIES) as exporter:
        text = exporter.metrics()
    families = list(text_string_to_metric_families(text))
    samples = [(s.name, _le(s.labels), s.value) for f in families for s in f.samples]
    types = {f.name: f.type for f in families}
    errors = [v for name, _, v in samples if name == "pg_exporter_last_scrape_error"]
    assert errors == [0.0], text
    expected = _metrics(busy_db)
    assert expected
    missing = []
    for metric, labels, value in expected:
        want = _le(labels)
        # The exporter may add labels of its own (e.g. server): ours must all be there.
        found = [
            v
            for name, got, v in samples
            if name == metric and all(got.get(k) == w for k, w in want.items())
        ]
        if found != [value]:
            missing.append((metric, labels, value, found))
    assert not missing, f"not exported as metrics() has them: {missing}\n{text}"
    # The types the contract gives the families (prometheus_client's parser names a counter's
    # family without its _total).
    assert types["aidb_memory_queue_events"] == "gauge"
    assert types["aidb_memory_queue_latency_seconds"] == "gauge"
    assert types["aidb_memory_events_processed"] == "counter"
    assert types["aidb_memory_model_calls"] == "counter"
    assert types["aidb_memory_model_call_duration_seconds"] == "histogram"
    assert types["aidb_memory_worker_last_batch_timestamp_seconds"] == "gauge"


def test_the_queries_need_a_member_of_aidb_workers(busy_db: Database) -> None:
    """The file's role must be granted aidb_workers (or aidb_admins), as the docs say: an
    application's role is refused."""
    query = next(iter(_queries().values()))["query"]
    with (
        busy_db.connect(APP_USER) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute(query)
