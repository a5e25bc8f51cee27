"""The cool-down after a failed compaction call (issue 13, item 3).

After a model call of a session's compaction fails, that model is not called again for that
session for ``compaction_cooldown_s`` (default 60): over-budget reads inside it return
``compaction_call_failed`` at once, without a request to the model and without waiting on it.
After it, the next over-budget read calls the model again; a stored summary clears it; 0 disables
it. The model is the fake OpenAI-compatible server (tests/fake_openai.py), whose request log
counts the calls.

No timing is asserted tightly: "at once" is a bound far below the failing call's own duration.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from conftest import APP_USER, Database
from fake_openai import FakeOpenAI, Reply

NS = "cooling"
SLOW_FAILURE_S = 3.0  # the failing call: a 500 after this long


def _setup(db: Database, fake: FakeOpenAI, **config: Any) -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\', %s::jsonb)', (NS, json.dumps(config)))


def _long_session(conn: psycopg.Connection[Any], session: str = "s") -> None:
    for i in range(1, 11):  # 20 turns of 100 chars: over a budget of 1,000
        turns = [
            {"role": "user", "content": f"question {i:04d} ".ljust(100, "q")},
            {"role": "assistant", "content": f"answer {i:04d} ".ljust(100, "a")},
        ]
        conn.execute(
            "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, %s)", (NS, json.dumps(turns), session)
        )


def _read(conn: psycopg.Connection[Any], session: str = "s") -> tuple[int, list[str]]:
    row = conn.execute(
        "SELECT compacted_entries, warnings FROM aidb_memory.session_get("
        "%s, 'alice', %s, limit_chars => 1000)",
        (NS, session),
    ).fetchone()
    assert row is not None
    return int(row[0]), list(row[1])


def _timed_read(conn: psycopg.Connection[Any], session: str = "s") -> tuple[float, Any]:
    started = time.monotonic()
    result = _read(conn, session)
    return time.monotonic() - started, result


@pytest.fixture
def app(db: Database) -> Iterator[psycopg.Connection[Any]]:
    with db.connect(APP_USER) as conn:
        yield conn


def _failing(fake: FakeOpenAI) -> None:
    fake.default = lambda req: Reply(status=500, delay=SLOW_FAILURE_S)


def test_a_read_within_the_cool_down_calls_no_model_and_does_not_wait(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _setup(db, fake)
    _long_session(app)
    _failing(fake)
    elapsed, result = _timed_read(app)
    assert result == (0, ["compaction_call_failed"])
    assert elapsed >= SLOW_FAILURE_S, "the first read waited on the failing model"
    assert len(fake.calls()) == 1
    # From another connection (another backend) too: the failure is in the database.
    with db.connect(APP_USER) as other:
        for conn in (app, other):
            elapsed, result = _timed_read(conn)
            assert result == (0, ["compaction_call_failed"])
            assert elapsed < SLOW_FAILURE_S / 2, "answered at once, not after a model call"
    assert len(fake.calls()) == 1, "no request to the model inside the cool-down"
    assert db.sql(
        "SELECT model_name, purpose, outcome FROM aidb_memory.model_usage ORDER BY id"
    ) == [("chat", "compaction", "error")]
    # Another session of the namespace is not cooled down by this one's failure.
    _long_session(app, "t")
    fake.default = lambda req: Reply(content="S" * 200)
    assert _read(app, "t") == (15, [])
    assert len(fake.calls()) == 2


def test_after_the_cool_down_the_model_is_called_again_and_a_success_clears_it(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _setup(db, fake, compaction_cooldown_s=1)
    _long_session(app)
    fake.queue(Reply(status=500))
    assert _read(app) == (0, ["compaction_call_failed"])
    assert _read(app) == (0, ["compaction_call_failed"])
    assert len(fake.calls()) == 1, "the second read was inside the 1 s cool-down"
    assert db.value("SELECT count(*) FROM aidb_memory.compaction_failure") == 1
    time.sleep(1.2)
    fake.queue(Reply(content="S" * 200))
    assert _read(app) == (15, [])
    assert len(fake.calls()) == 2, "called again after the cool-down"
    assert db.value("SELECT count(*) FROM aidb_memory.compaction_failure") == 0, "cleared"


def test_a_timeout_and_an_unusable_answer_start_the_cool_down_too(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _setup(db, fake, llm_timeout_s=1)
    _long_session(app, "slow")
    _long_session(app, "blank")
    fake.queue(Reply(content="too late", delay=3), Reply(content="   "))
    assert _read(app, "slow") == (0, ["compaction_call_failed"])
    assert _read(app, "blank") == (0, ["compaction_call_failed"])
    assert _read(app, "slow") == (0, ["compaction_call_failed"])
    assert _read(app, "blank") == (0, ["compaction_call_failed"])
    assert len(fake.calls()) == 2


def test_another_model_is_not_cooled_down(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    """The cool-down is per (session, model): a namespace switched to another model tries it."""
    _setup(db, fake)
    opts = {"model": "other-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('other', 'openai', %s::jsonb)", (json.dumps(opts),))
    _long_session(app)
    fake.queue(Reply(status=500), Reply(content="S" * 200))
    assert _read(app) == (0, ["compaction_call_failed"])
    db.sql('SELECT aidb_memory.namespace_update(%s, model_spec => \'{"llm": "other"}\')', (NS,))
    assert _read(app) == (15, [])
    assert [r.body["model"] for r in fake.calls()] == ["fake-chat", "other-chat"]


def test_cool_down_zero_calls_the_model_on_every_read(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _setup(db, fake, compaction_cooldown_s=0)
    _long_session(app)
    fake.default = lambda req: Reply(status=500)
    for _ in range(3):
        assert _read(app) == (0, ["compaction_call_failed"])
    assert len(fake.calls()) == 3
    assert db.value("SELECT count(*) FROM aidb_memory.compaction_failure") == 0


def test_a_rolled_back_read_leaves_no_cool_down_and_a_deleted_session_takes_its_own(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    """The cool-down lives in the read's transaction, like the call's usage row."""
    _setup(db, fake)
    _long_session(app)
    fake.default = lambda req: Reply(status=500)
    with db.connect(APP_USER, autocommit=False) as conn:
        assert _read(conn) == (0, ["compaction_call_failed"])
        conn.rollback()
    assert db.value("SELECT count(*) FROM aidb_memory.compaction_failure") == 0
    assert _read(app) == (0, ["compaction_call_failed"])
    assert len(fake.calls()) == 2
    assert db.value("SELECT count(*) FROM aidb_memory.compaction_failure") == 1
    app.execute("SELECT aidb_memory.session_delete(%s, 'alice', 's', 'cool-down test')", (NS,))
    assert db.value("SELECT count(*) FROM aidb_memory.compaction_failure") == 0


@pytest.mark.parametrize("value", [-1, 86_401, 1.5, "60", True])
def test_the_cool_down_is_validated(db: Database, value: Any) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="compaction_cooldown_s"):
        db.sql(
            "SELECT aidb_memory.init(%s, '{}', %s::jsonb)",
            (NS, json.dumps({"compaction_cooldown_s": value})),
        )


def _still_due(conn: psycopg.Connection[Any], ref: int, model: str, cooldown_s: int = 60) -> Any:
    """compactor.still_due, called in this backend (the package is loaded by a first call)."""
    conn.execute("SELECT aidb_memory.session_list(%s, 'alice')", (NS,))
    key = conn.execute("SELECT aidb_memory.actor_key(%s, 'alice')", (NS,)).fetchone()
    assert key is not None
    conn.execute(
        f"""
        DO LANGUAGE plpython3u $$
        from aidb_memory_server import compactor
        config = {{"compaction_cooldown_s": {cooldown_s}}}
        answer = compactor.still_due({key[0]}, {ref}, {model!r}, config)
        plpy.execute("SELECT set_config('test.still_due', %s, false)" % plpy.quote_literal(
            answer or "due"))
        $$
        """
    )
    row = conn.execute("SELECT current_setting('test.still_due')").fetchone()
    assert row is not None
    return row[0]


def test_still_due_is_what_a_queued_compaction_asks_before_its_call(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    """The check a compaction decided earlier (a task) makes under the lock before calling."""
    _setup(db, fake)
    _long_session(app)
    ref = db.value("SELECT id FROM aidb_memory.session WHERE session_id = 's'")
    with db.connect() as su:
        assert _still_due(su, ref, "chat") == "due"
        fake.queue(Reply(status=500))
        assert _read(app) == (0, ["compaction_call_failed"])
        assert _still_due(su, ref, "chat") == "compaction_call_failed"
        assert _still_due(su, ref, "other") == "due", "another model is not cooled down"
        assert _still_due(su, ref, "chat", cooldown_s=0) == "due"
        su.execute("BEGIN READ ONLY")
        assert _still_due(su, ref, "chat") == "compaction_read_only"
        su.execute("ROLLBACK")
        app.execute("SELECT aidb_memory.session_delete(%s, 'alice', 's', 'still_due test')", (NS,))
        assert _still_due(su, ref, "chat") == "compaction_busy", "the session is gone"
