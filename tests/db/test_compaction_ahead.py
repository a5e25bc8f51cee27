"""Compaction ahead of reads (issue 13 acceptance 1 and 6): add queues a compaction task once a
session passes the ahead threshold of the budget its reads use, and the worker writes the summary
a read would have written, so that the next read calls no model.

The model is the fake OpenAI-compatible server (tests/fake_openai.py): its request log counts the
calls and shows what each was sent. Turns are 100 chars, the budget 1,000: the first read over
budget compacts inline (and records the budget), and the ahead threshold is then two thirds of
the budget past the newest summary.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from conftest import ADMIN_USER, APP_USER, WORKER_USER, Database, run_cli
from fake_openai import FakeOpenAI, Reply, Request

NS = "ahead"
BUDGET = 1000
SUMMARY = "S" * 200
PROCESS = (
    "CALL aidb_memory.process_events(max_events => 100, lease_s => 60, "
    "max_attempts => %s::int, backoff_s => %s::real)"
)


def _setup(db: Database, fake: FakeOpenAI, **config: Any) -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    cfg = {"extraction": False, "llm_timeout_s": 5, **config}
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\', %s::jsonb)', (NS, json.dumps(cfg)))


@pytest.fixture
def app(db: Database) -> Iterator[psycopg.Connection[Any]]:
    with db.connect(APP_USER) as conn:
        yield conn


def _exchange(i: int) -> list[dict[str, Any]]:
    """A user turn and an assistant turn of exactly 100 chars each."""
    return [
        {"role": "user", "content": f"question {i:04d} ".ljust(100, "q")},
        {"role": "assistant", "content": f"answer {i:04d} ".ljust(100, "a")},
    ]


def _add(conn: psycopg.Connection[Any], turns: list[dict[str, Any]], session: str = "s") -> None:
    conn.execute(
        "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, %s)", (NS, json.dumps(turns), session)
    )


def _get(
    conn: psycopg.Connection[Any], session: str = "s"
) -> tuple[list[dict[str, Any]], list[str]]:
    row = conn.execute(
        "SELECT items, warnings FROM aidb_memory.session_get(%s, 'alice', %s, limit_chars => %s)",
        (NS, session, BUDGET),
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def _work(db: Database, max_attempts: int = 5, backoff_s: float = 0.0) -> tuple[Any, ...]:
    with db.connect(WORKER_USER) as conn:
        row = conn.execute(PROCESS, (max_attempts, backoff_s)).fetchone()
    assert row is not None
    return tuple(row)


def _tasks(db: Database) -> list[dict[str, Any]]:
    rows = db.sql(
        "SELECT e.status, s.session_id, e.budget, e.attempts, e.last_error, e.result "
        "FROM aidb_memory.event e LEFT JOIN aidb_memory.session s ON s.id = e.session_ref "
        "WHERE e.kind = 'compaction' ORDER BY e.id"
    )
    keys = ("status", "session", "budget", "attempts", "last_error", "result")
    return [dict(zip(keys, r, strict=True)) for r in rows]


def _purposes(db: Database) -> list[str]:
    return [r[0] for r in db.sql("SELECT purpose FROM aidb_memory.model_usage ORDER BY id")]


def _summaries(db: Database, session: str) -> list[tuple[Any, ...]]:
    return db.sql(
        "SELECT m.from_seq, m.to_seq, m.turn_count, m.chars, m.model, m.from_offset, m.to_offset, "
        "m.content FROM aidb_memory.summary m JOIN aidb_memory.session s ON s.id = m.session_ref "
        "WHERE s.session_id = %s ORDER BY m.from_seq",
        (session,),
    )


def _compacted_once(app: psycopg.Connection[Any], fake: FakeOpenAI, session: str = "s") -> None:
    """10 exchanges (2,000 chars), then a read over budget that compacts inline: turns 1-15
    (1,500 chars) become a summary of 200 chars, and the session's budget is recorded. The
    ahead threshold is then 1,500 + 666 chars."""
    for i in range(1, 11):
        _add(app, _exchange(i), session)
    fake.queue(Reply(content=SUMMARY))
    _items, warnings = _get(app, session)
    assert warnings == []


def test_add_past_the_threshold_queues_one_task(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _setup(db, fake)
    for i in range(1, 11):
        _add(app, _exchange(i))
    assert _tasks(db) == [], "no read has told the budget yet"
    fake.queue(Reply(content=SUMMARY))
    _get(app)
    assert _purposes(db) == ["compaction"], "the first compaction is the read's"
    assert _tasks(db) == [], "2,000 chars: 500 unsummarized, under two thirds of 1,000"
    _add(app, _exchange(11))  # 700 unsummarized
    _add(app, _exchange(12))
    _add(app, _exchange(13))
    assert [(t["status"], t["session"], t["budget"]) for t in _tasks(db)] == [
        ("accepted", "s", BUDGET)
    ], "one pending task per session, however many adds pass the threshold"
    assert len(fake.calls()) == 1, "add never calls a model"


def test_the_worker_writes_the_summary_a_read_would_have_written(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    """Two identical sessions, both over budget after one add: the worker compacts one, a read
    compacts the other inline (no worker ran: the fallback). Same cut, same prompt, same
    summary; then the worker drops the other's task without a model call, and the next read
    of the first calls no model."""
    _setup(db, fake)
    _compacted_once(app, fake, "a")
    _compacted_once(app, fake, "b")
    for session in ("a", "b"):
        _add(app, _exchange(11) + _exchange(12), session)  # 900 unsummarized: a read compacts
    assert [(t["status"], t["session"]) for t in _tasks(db)] == [
        ("accepted", "a"),
        ("accepted", "b"),
    ]
    fake.queue(Reply(content="T" * 150))
    _items, warnings = _get(app, "b")  # inline: the worker has not run
    assert warnings == []
    fake.queue(Reply(content="T" * 150))
    outcome = _work(db)
    assert outcome[:3] == (2, 0, 0)
    assert outcome[3]["compaction"] == {"summarized": 1, "dropped": 1, "failed": 0, "retried": 0}
    assert outcome[3]["extraction"] == {"processed": 0, "failed": 0, "retried": 0}
    inline, ahead = fake.calls()[2:]
    assert ahead.body["messages"] == inline.body["messages"], "the same prompt"
    assert _summaries(db, "a") == _summaries(db, "b")
    # Three quarters of 900 unsummarized chars past turn 15: turns 16-22.
    assert _summaries(db, "a")[1][:4] == (16, 22, 7, 150)
    assert _purposes(db) == ["compaction", "compaction", "compaction", "compaction_ahead"]
    a_task, b_task = _tasks(db)
    assert a_task["status"] == "processed" and a_task["attempts"] == 1
    assert a_task["result"]["summary"] == {"from_seq": 16, "to_seq": 22, "chars": 150}
    assert a_task["result"]["warnings"] == [] and a_task["result"]["model"] == "chat"
    assert b_task["status"] == "skipped"
    assert b_task["result"]["dropped"] == "not_due", "b was compacted by its read meanwhile"
    before = len(fake.calls())
    items, warnings = _get(app, "a")
    assert warnings == [] and len(fake.calls()) == before, "the read found its summary ready"
    assert [i["kind"] for i in items[:2]] == ["summary", "summary"]
    assert [i["seq"] for i in items[2:]] == [23, 24]


def test_a_task_for_a_deleted_or_popped_session_is_dropped_without_a_model_call(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _setup(db, fake)
    _compacted_once(app, fake, "gone")
    _compacted_once(app, fake, "popped")
    for session in ("gone", "popped"):
        _add(app, _exchange(11), session)  # 700 unsummarized: past two thirds
    assert [t["status"] for t in _tasks(db)] == ["accepted", "accepted"]
    app.execute("SELECT aidb_memory.session_delete(%s, 'alice', 'gone', 'test')", (NS,))
    for _ in range(2):  # back to 500 unsummarized
        app.execute("SELECT aidb_memory.session_pop(%s, 'alice', 'popped')", (NS,))
    before = len(fake.calls())
    outcome = _work(db)
    assert outcome[3]["compaction"] == {"summarized": 0, "dropped": 2, "failed": 0, "retried": 0}
    assert len(fake.calls()) == before, "no model call for a summary nobody needs"
    gone, popped = db.sql(
        "SELECT status, result->>'dropped' FROM aidb_memory.event WHERE kind = 'compaction' "
        "ORDER BY id"
    )
    assert gone == ("skipped", "session_deleted")
    assert popped == ("skipped", "not_due")
    assert _purposes(db) == ["compaction", "compaction"]


def test_a_failing_model_follows_backoff_and_max_attempts_and_reads_still_compact(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _setup(db, fake, compaction_cooldown_s=0)  # every attempt calls (the cool-down: below)
    _compacted_once(app, fake)
    _add(app, _exchange(11))
    fake.queue(Reply(status=500))
    outcome = _work(db, max_attempts=2, backoff_s=3600)
    assert outcome[:3] == (0, 0, 1)
    assert outcome[3]["compaction"]["retried"] == 1
    (task,) = _tasks(db)
    assert (task["status"], task["attempts"]) == ("accepted", 1)
    assert task["last_error"] == "compaction_call_failed"
    due = db.value(
        "SELECT next_attempt_at > now() + interval '59 minutes' FROM aidb_memory.event "
        "WHERE kind = 'compaction'"
    )
    assert due is True, "due again after the backoff"
    assert _work(db, max_attempts=2)[:3] == (0, 0, 0), "not due yet"
    db.sql("UPDATE aidb_memory.event SET next_attempt_at = now() WHERE kind = 'compaction'")
    fake.queue(Reply(status=500))
    outcome = _work(db, max_attempts=2)
    assert outcome[:3] == (0, 1, 0)
    assert outcome[3]["compaction"]["failed"] == 1
    (task,) = _tasks(db)
    assert (task["status"], task["attempts"]) == ("failed", 2)
    assert _purposes(db) == ["compaction", "compaction_ahead", "compaction_ahead"]
    # The read is the fallback: over budget after one more exchange, it compacts inline.
    _add(app, _exchange(12))
    fake.queue(Reply(content="T" * 150))
    _items, warnings = _get(app)
    assert warnings == []
    assert _purposes(db)[-1] == "compaction"
    # A failed task does not block the next one, and events_retry leaves tasks alone.
    assert db.value("SELECT aidb_memory.events_retry(%s)", (NS,), user=ADMIN_USER) == 0


def test_a_task_inside_the_cool_down_is_dropped_without_a_call(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _setup(db, fake)  # compaction_cooldown_s: the default, 60 s
    _compacted_once(app, fake)
    _add(app, _exchange(11))
    fake.queue(Reply(status=500))
    first = _work(db, max_attempts=3, backoff_s=3600)
    assert first[3]["compaction"]["retried"] == 1, first
    before = len(fake.calls())
    db.sql("UPDATE aidb_memory.event SET next_attempt_at = now() WHERE kind = 'compaction'")
    outcome = _work(db, max_attempts=3)
    assert outcome[3]["compaction"]["dropped"] == 1, outcome
    assert len(fake.calls()) == before, "the failing model is not called again so soon"
    (task,) = _tasks(db)
    assert task["status"] == "skipped"
    assert (
        db.value("SELECT result->>'dropped' FROM aidb_memory.event WHERE kind = 'compaction'")
        == "cooling_down"
    )


def test_compaction_ahead_off_queues_nothing(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _setup(db, fake, compaction_ahead=False)
    _compacted_once(app, fake)
    _add(app, _exchange(11) + _exchange(12))
    assert _tasks(db) == []


def _route(request: Request) -> Reply:
    """Extraction asks for structured output; compaction for text."""
    if "response_format" in request.body:
        return Reply(content=json.dumps({"operations": []}))
    return Reply(content="T" * 150)


def test_extraction_events_keep_working_beside_tasks_and_the_cli_shows_both(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _setup(db, fake, extraction=True)
    _compacted_once(app, fake)
    _add(app, _exchange(11) + _exchange(12))
    fake.default = _route
    events = db.sql("SELECT kind, status FROM aidb_memory.events ORDER BY event_id")
    assert events == [("extraction", "accepted")] * 11 + [("compaction", "accepted")]
    listed = run_cli("events", "list", "--namespace", NS, dsn=db.dsn(WORKER_USER))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [
        "namespace  kind        accepted  processing  processed  failed  skipped",
        "ahead      extraction        11           0          0       0        0",
        "ahead      compaction         1           0          0       0        0",
    ]
    task_id = db.value("SELECT public_id::text FROM aidb_memory.event WHERE kind = 'compaction'")
    status = db.value("SELECT aidb_memory.status(%s, 'alice', %s)", (NS, task_id), user=APP_USER)
    assert (status["kind"], status["status"]) == ("compaction", "accepted")
    result = run_cli("worker", "--once", dsn=db.dsn(WORKER_USER))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("worker: stopped; processed 12, failed 0")
    assert result.stdout.splitlines()[-1].endswith(
        "; extraction: processed 11, failed 0, retried 0; "
        "compaction: summarized 1, dropped 0, failed 0, retried 0; expiry: expired 0"
    )
    # The task was claimed first: a read is waiting for it, nobody for extraction.
    assert _purposes(db)[:3] == ["compaction", "compaction_ahead", "extraction"]
    extraction = db.sql("SELECT DISTINCT status FROM aidb_memory.events WHERE kind = 'extraction'")
    assert extraction == [("processed",)]
    status = db.value("SELECT aidb_memory.status(%s, 'alice', %s)", (NS, task_id), user=APP_USER)
    assert (status["kind"], status["status"]) == ("compaction", "processed")
    assert status["result"]["summary"] == {"from_seq": 16, "to_seq": 22, "chars": 150}
    listed = run_cli("events", "list", "--json", "--namespace", NS, dsn=db.dsn(ADMIN_USER))
    assert json.loads(listed.stdout) == {
        NS: {"extraction": {"processed": 11}, "compaction": {"processed": 1}}
    }


def test_a_repeatable_read_reader_is_not_failed_by_what_the_worker_recorded(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    """The worker records the session's next threshold after its snapshot: the reader's
    compaction lock row was never updated (the threshold has a table of its own), so locking it
    raises no serialization failure, neither in the read nor in session_pop."""
    _setup(db, fake)
    _compacted_once(app, fake)
    _add(app, _exchange(11) + _exchange(12))
    with db.connect(APP_USER, autocommit=False) as rr:
        rr.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        rr.execute("SELECT 1")  # its snapshot: before the worker's summary
        fake.queue(Reply(content="T" * 150))
        assert _work(db)[3]["compaction"]["summarized"] == 1
        _items, warnings = _get(rr)
        # Over budget in its snapshot, it compacts; its summary cannot be stored beside the
        # worker's, which is a failed compaction, never a failed read.
        assert warnings == ["compaction_call_failed"]
        popped = rr.execute("SELECT aidb_memory.session_pop(%s, 'alice', 's')", (NS,)).fetchone()
        assert popped is not None and popped[0]["content"].startswith("answer 0012")
        rr.rollback()
