"""Metrics (issue 36): the figures are for admins and workers only, an application cannot read
nor forge them, and no sample carries an actor id or content, whatever the actor ids, the turns
and the model's errors hold.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest

from conftest import ADMIN_USER, APP_USER, NO_GRANT_USER, WORKER_USER, Database
from fake_openai import FakeOpenAI, Reply, Request, serve

NS = "metered_ns"
ACTOR = "victim-7f3a@example.com"
SESSION = "session-c41d"
CONTENT = "my card number is 4111-1111-1111-1111"
ERROR_TEXT = "upstream said 4111-1111-1111-1111"
COUNTERS = (
    "metric_event",
    "metric_model_call",
    "metric_model_latency",
    "metric_compaction",
    "metric_worker",
)


def _answer(request: Request) -> Reply:
    """The model fails with the content in its error text (a provider echoing the prompt)."""
    return Reply(status=500, raw=json.dumps({"error": {"message": ERROR_TEXT}}))


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with serve() as server:
        server.default = _answer
        yield server


@pytest.mark.parametrize("user", [APP_USER, NO_GRANT_USER])
def test_an_application_cannot_read_the_metrics(
    db: Database, attack_roles: dict[str, str], user: str
) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        db.sql("SELECT * FROM aidb_memory.metrics()", user=user)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        db.sql("SELECT * FROM aidb_memory.metrics(1000)", user=user)


def test_the_internal_functions_behind_them_are_the_workers_only(db: Database) -> None:
    """event_brief names another actor's event and namespace; event_batch_finished would let an
    application fake a live worker for the no-batch alert."""
    for call in (
        "SELECT aidb_memory.event_brief(0, 0)",
        "SELECT aidb_memory.event_batch_finished()",
    ):
        for user in (APP_USER, ADMIN_USER):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.sql(call, user=user)


@pytest.mark.parametrize("table", COUNTERS)
def test_no_role_of_ours_reads_or_forges_a_counter(db: Database, table: str) -> None:
    for user in (APP_USER, ADMIN_USER, WORKER_USER):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            db.sql(f"SELECT * FROM aidb_memory.{table}", user=user)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            db.sql(f"DELETE FROM aidb_memory.{table}", user=user)


def test_no_sample_nor_logged_event_carries_an_actor_or_content(
    db: Database, fake: FakeOpenAI
) -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\')', (NS,))
    turns = json.dumps([{"role": "user", "content": CONTENT}])
    db.sql(
        "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s)", (NS, ACTOR, turns, SESSION), user=APP_USER
    )
    with db.connect(WORKER_USER) as conn:
        row = conn.execute(
            "CALL aidb_memory.process_events(max_attempts => 2, backoff_s => 0)"
        ).fetchone()
        assert row is not None and (row[1], row[2]) == (1, 1)
        by_kind = json.dumps(row[3])
        samples = json.dumps(
            conn.execute("SELECT metric, labels, value FROM aidb_memory.metrics()").fetchall()
        )
    assert "aidb_memory_events_failed_total" in samples and NS in samples
    assert db.value(
        "SELECT count(*) FROM aidb_memory.model_usage WHERE error LIKE %s", (f"%{ERROR_TEXT}%",)
    )
    for secret in (ACTOR, SESSION, CONTENT, ERROR_TEXT, "4111", "victim"):
        assert secret not in samples
        assert secret not in by_kind
