"""The extraction queue and reconciliation (SPEC §5; issue 5 acceptance 1-3).

Workers are sessions that CALL aidb_memory.process_events as an aidb_workers member; the model is
the fake OpenAI-compatible server, whose request log shows which events were extracted and how
many times.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from conftest import APP_USER, WORKER_USER, Database
from fake_openai import FakeOpenAI, Reply, Request

NS = "mem"
PROCESS = (
    "CALL aidb_memory.process_events(max_events => %s::int, lease_s => %s::int, "
    "backoff_s => %s::real)"
)


@pytest.fixture
def ns(db: Database, fake: FakeOpenAI) -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\', \'{"llm_timeout_s": 5}\')', (NS,))


def ops(*operations: dict[str, Any]) -> str:
    return json.dumps({"operations": [{"target": None, "text": None, **o} for o in operations]})


def add(op: str, text: str | None = None, target: str | None = None) -> dict[str, Any]:
    return {"op": op, "text": text, "target": target}


def _add(db: Database, actor: str, text: str, session: str | None = "s") -> str:
    return str(
        db.value(
            "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s)",
            (NS, actor, json.dumps([{"role": "user", "content": text}]), session),
            user=APP_USER,
        )
    )


def _work(
    db: Database, max_events: int = 100, lease_s: int = 60, backoff_s: float = 0.0
) -> tuple[int, int, int]:
    with db.connect(WORKER_USER) as conn:
        row = conn.execute(PROCESS, (max_events, lease_s, backoff_s)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def _status(db: Database, actor: str, event_id: str) -> dict[str, Any]:
    value = db.value("SELECT aidb_memory.status(%s, %s, %s)", (NS, actor, event_id), user=APP_USER)
    assert isinstance(value, dict)
    return value


def _memories(db: Database, actor: str = "alice") -> list[tuple[Any, ...]]:
    return db.sql(
        "SELECT content, valid_to IS NULL AS current FROM aidb_memory.memory "
        "WHERE actor_id = %s ORDER BY id",
        (actor,),
    )


def _sent(request: Request) -> str:
    return str(request.body["messages"][-1]["content"])


def test_an_event_becomes_a_memory_with_its_history(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    event = _add(db, "alice", "I only drink green tea, never coffee.")
    assert _status(db, "alice", event)["status"] == "accepted"
    fake.queue(Reply(content=ops(add("add", "Alice drinks only green tea."))))
    assert _work(db) == (1, 0, 0)
    (request,) = fake.calls()
    assert request.body["response_format"]["type"] == "json_schema"
    assert "I only drink green tea" in _sent(request)
    assert _memories(db) == [("Alice drinks only green tea.", True)]
    status = _status(db, "alice", event)
    assert status["status"] == "processed" and status["attempts"] == 1
    assert status["result"]["added"] == 1 and len(status["result"]["memories"]) == 1
    history = db.sql(
        "SELECT h.operation, h.new_content, e.public_id::text FROM aidb_memory.memory_history h "
        "JOIN aidb_memory.event e ON e.id = h.event_id"
    )
    assert history == [("add", "Alice drinks only green tea.", event)]
    assert _work(db) == (0, 0, 0), "nothing left"


def test_the_same_fact_in_three_events_is_stored_once(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    for text in ("I live in Lyon.", "Lyon is where I live.", "As I said, I live in Lyon!"):
        _add(db, "alice", text)
    fake.queue(
        Reply(content=ops(add("add", "Alice lives in Lyon."))),
        Reply(content=ops(add("add", "alice lives in lyon"))),  # exact after normalization
        Reply(content=ops(add("add", "Alice now lives in Lyon."))),  # near duplicate (0.83)
    )
    assert _work(db) == (3, 0, 0)
    assert _memories(db) == [("Alice lives in Lyon.", True)]
    # The model was shown the memory it already had.
    assert "Alice lives in Lyon." in _sent(fake.calls()[1])


def test_a_contradicting_fact_supersedes_the_old_one(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    _add(db, "alice", "My favourite colour is blue.")
    fake.queue(Reply(content=ops(add("add", "Alice's favourite colour is blue."))))
    _work(db)
    _add(db, "alice", "Actually my favourite colour is now green.")
    fake.queue(Reply(content=ops(add("update", "Alice's favourite colour is green.", "m1"))))
    assert _work(db) == (1, 0, 0)
    assert _memories(db) == [
        ("Alice's favourite colour is blue.", False),
        ("Alice's favourite colour is green.", True),
    ]
    old, new = db.sql("SELECT id, superseded_by FROM aidb_memory.memory ORDER BY id")
    assert old[1] == new[0] and new[1] is None
    ops_seen = db.sql("SELECT operation, old_content FROM aidb_memory.memory_history ORDER BY id")
    assert [o[0] for o in ops_seen] == ["add", "add", "supersede"]
    assert ops_seen[2][1] == "Alice's favourite colour is blue."


def test_invalidate_ends_a_memory_without_replacing_it(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    _add(db, "alice", "I have a dog called Rex.")
    fake.queue(Reply(content=ops(add("add", "Alice has a dog called Rex."))))
    _work(db)
    _add(db, "alice", "Rex died last year.")
    fake.queue(Reply(content=ops(add("invalidate", target="m1"))))
    _work(db)
    assert _memories(db) == [("Alice has a dog called Rex.", False)]


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (Reply(status=500), "HTTP 500"),
        (Reply(content="this is not JSON"), "malformed answer"),
        (Reply(content=json.dumps({"operations": [{"op": "add"}]})), "malformed answer"),
        (Reply(content=ops(add("update", "x", "m9"))), "malformed answer"),
    ],
    ids=["http-500", "not-json", "schema-violation", "unknown-target"],
)
def test_failures_are_retried_with_backoff_then_failed(
    db: Database, fake: FakeOpenAI, ns: None, reply: Reply, error: str
) -> None:
    event = _add(db, "alice", "Remember that I am allergic to peanuts.")
    fake.default = lambda _request: reply
    assert _work(db, backoff_s=30) == (0, 0, 1)
    status = _status(db, "alice", event)
    assert status["status"] == "accepted" and status["attempts"] == 1
    assert error in status["last_error"]
    assert status["next_attempt_at"] is not None
    assert _work(db, backoff_s=30) == (0, 0, 0), "not due before its backoff"
    db.sql("UPDATE aidb_memory.event SET next_attempt_at = now()")
    with db.connect(WORKER_USER) as conn:
        conn.execute(
            "CALL aidb_memory.process_events(max_attempts => 2, backoff_s => 0)"
        ).fetchone()
    status = _status(db, "alice", event)
    assert status["status"] == "failed" and status["attempts"] == 2
    assert error in status["last_error"]
    assert _memories(db) == [], "a malformed answer never reaches the tables"
    # Sessions and reads are unaffected.
    items = db.value(
        "SELECT items FROM aidb_memory.session_get(%s, 'alice', 's')", (NS,), user=APP_USER
    )
    assert [i["content"] for i in items] == ["Remember that I am allergic to peanuts."]


def test_four_workers_process_200_events_exactly_once(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    for i in range(200):
        _add(db, f"actor{i % 7}", f"fact number {i:03d} is worth keeping.", session=f"s{i % 11}")

    def answer(request: Request) -> Reply:
        marker = re.search(r"fact number (\d{3})", _sent(request))
        assert marker is not None
        return Reply(content=ops(add("add", f"Fact {marker.group(1)} holds.")))

    fake.default = answer
    totals: list[tuple[int, int, int]] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            totals.append(_work(db, max_events=1000))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sum(t[0] for t in totals) == 200
    markers = Counter(re.findall(r"fact number (\d{3})", " ".join(map(_sent, fake.calls()))))
    assert len(markers) == 200 and set(markers.values()) == {1}, "each event extracted once"
    assert db.value("SELECT count(*) FROM aidb_memory.memory") == 200
    assert db.value("SELECT count(*) FROM aidb_memory.event WHERE status <> 'processed'") == 0


def test_a_killed_worker_leaves_its_event_to_be_retried_after_the_lease(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    event = _add(db, "alice", "My passport number ends in 1234.")
    fake.default = lambda _r: Reply(content=ops(add("add", "Alice's passport ends in 1234.")))
    fake.queue(Reply(content=ops(add("add", "Alice's passport ends in 1234.")), delay=30))
    pid: dict[str, int] = {}

    def doomed() -> None:
        with db.connect(WORKER_USER) as conn:
            pid["pid"] = conn.info.backend_pid
            with contextlib.suppress(psycopg.Error):  # its backend is terminated
                conn.execute(PROCESS, (10, 30, 0))

    thread = threading.Thread(target=doomed)
    thread.start()
    _wait_for(lambda: bool(fake.calls()))
    assert db.value("SELECT pg_terminate_backend(%s)", (pid["pid"],)) is True
    thread.join(10)
    status = _status(db, "alice", event)
    assert status["status"] == "processing" and status["attempts"] == 1
    assert _memories(db) == [] and db.value("SELECT count(*) FROM aidb_memory.memory_history") == 0
    assert _work(db) == (0, 0, 0), "the 30 s lease still holds"
    # The lease runs out (moved into the past rather than waited for).
    db.sql("UPDATE aidb_memory.event SET lease_until = now() - interval '1 second'")
    assert _work(db) == (1, 0, 0)
    status = _status(db, "alice", event)
    assert status["status"] == "processed" and status["attempts"] == 2
    assert _memories(db) == [("Alice's passport ends in 1234.", True)]


def test_two_concurrent_events_with_the_same_new_fact_make_one_memory(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    _add(db, "alice", "I am vegetarian.", session="a")
    _add(db, "alice", "Did I say I am vegetarian?", session="b")
    # Both extractions are in flight at once; both propose the fact.
    fake.default = lambda _r: Reply(content=ops(add("add", "Alice is vegetarian.")), delay=1)
    threads = [threading.Thread(target=_work, args=(db, 1)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(fake.calls()) == 2
    assert _memories(db) == [("Alice is vegetarian.", True)]


@pytest.mark.parametrize("config", [{"extraction_mode": "model"}, {"extraction": False}])
def test_no_model_or_extraction_off_is_skipped_and_never_queued(
    db: Database, config: dict[str, Any]
) -> None:
    # Without a model, extraction_mode "model" skips (the default, auto, extracts verbatim:
    # tests/db/test_verbatim_extraction.py); extraction off skips whatever the mode.
    db.sql("SELECT aidb_memory.init(%s, '{}', %s::jsonb)", (NS, json.dumps(config)))
    event = _add(db, "alice", "hello")
    assert _status(db, "alice", event)["status"] == "skipped"
    assert _work(db) == (0, 0, 0)


def test_status_of_another_actors_event_is_null(db: Database, ns: None) -> None:
    event = _add(db, "alice", "secret")
    assert db.value("SELECT aidb_memory.status(%s, 'bob', %s)", (NS, event), user=APP_USER) is None


def test_an_app_user_cannot_run_the_worker(db: Database, ns: None) -> None:
    with db.connect(APP_USER) as conn, pytest.raises(psycopg.Error) as info:
        conn.execute("CALL aidb_memory.process_events()")
    assert info.value.sqlstate == "42501"


def _wait_for(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_with_an_embedding_model_new_memories_are_embedded_and_found_by_meaning(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    opts = {"model": "fake-embed", "base_url": fake.base_url}
    db.sql("SELECT aidb_memory.create_model('embed', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql(
        'SELECT aidb_memory.namespace_update(%s, \'{"llm": "chat", "embedding": "embed"}\')',
        (NS,),
    )
    _add(db, "alice", "I keep bees in my garden.")
    fake.queue(
        Reply(content=ops(add("add", "Alice keeps bees."))),
        Reply(embedding=[1.0, 0.0, 0.0]),  # the new memory
        Reply(embedding=[0.9, 0.1, 0.0]),  # the query below: near it in meaning only
    )
    assert _work(db) == (1, 0, 0)
    assert db.sql("SELECT embedding::real[], embedding_model FROM aidb_memory.memory") == [
        ([1.0, 0.0, 0.0], "embed")
    ]
    rows = db.sql(
        "SELECT content FROM aidb_memory.search(%s, 'alice', 'apiculture hobby')",
        (NS,),
        user=APP_USER,
    )
    assert rows == [("Alice keeps bees.",)]


def test_a_failed_embedding_call_is_retried_and_stores_nothing(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    opts = {"model": "fake-embed", "base_url": fake.base_url}
    db.sql("SELECT aidb_memory.create_model('embed', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql(
        'SELECT aidb_memory.namespace_update(%s, \'{"llm": "chat", "embedding": "embed"}\')',
        (NS,),
    )
    event = _add(db, "alice", "I keep bees in my garden.")
    fake.queue(Reply(content=ops(add("add", "Alice keeps bees."))), Reply(status=500))
    assert _work(db, backoff_s=60) == (0, 0, 1)
    assert "embedding failed" in _status(db, "alice", event)["last_error"]
    assert _memories(db) == []
