"""The server's model client (SPEC §2, §4; issue 4 acceptance 6 and 7), through model_check.

The database calls a real fake OpenAI-compatible server on 127.0.0.1 (tests/fake_openai.py).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import psycopg
import pytest

from conftest import ADMIN_USER, APP_USER, Database
from fake_openai import FakeOpenAI, Reply, refused_port

SECRET = "sk-llm-test-Hq7Wm2Pz9Xc4Vb8N"
BUILTIN = '{"kind": "extractive"}'


def _register(db: Database, name: str, base_url: str, **options: Any) -> None:
    opts = {"model": "fake-chat", "base_url": base_url, "max_retries": 0, **options}
    db.sql("SELECT aidb_memory.create_model(%s, 'openai', %s::jsonb)", (name, json.dumps(opts)))


def _check(db: Database, name: str, prompt: str | None = None) -> dict[str, Any]:
    if prompt is None:
        value = db.value("SELECT aidb_memory.model_check(%s)", (name,), user=ADMIN_USER)
    else:
        value = db.value("SELECT aidb_memory.model_check(%s, %s)", (name, prompt), user=ADMIN_USER)
    assert isinstance(value, dict)
    return value


def _usage(db: Database) -> list[tuple[Any, ...]]:
    return db.sql(
        """SELECT model_name, namespace_id, purpose, chars_in, chars_out, tokens_in, tokens_out,
                  latency_ms, outcome, error
           FROM aidb_memory.model_usage ORDER BY id"""
    )


def test_model_check_returns_the_reply_and_records_usage(db: Database, fake: FakeOpenAI) -> None:
    db.sql("SELECT aidb_memory.set_secret('fake_key', %s, ARRAY[%s])", (SECRET, fake.base_url))
    _register(db, "chat", fake.base_url, api_key_secret="fake_key")
    fake.queue(Reply(content="OK, I am here." + "x" * 300))
    result = _check(db, "chat", "Say OK please.")
    assert result["ok"] is True
    assert result["model"] == "chat"
    assert result["error"] is None
    assert result["reply"] == ("OK, I am here." + "x" * 300)[:200]
    assert isinstance(result["latency_ms"], int) and result["latency_ms"] >= 0
    (request,) = fake.calls()
    assert request.body["model"] == "fake-chat"
    assert request.body["messages"] == [{"role": "user", "content": "Say OK please."}]
    assert request.headers["authorization"] == f"Bearer {SECRET}"
    ((model, ns, purpose, chars_in, chars_out, t_in, t_out, latency, outcome, error),) = _usage(db)
    assert (model, ns, purpose, outcome, error) == ("chat", None, "check", "ok", None)
    assert (chars_in, chars_out) == (len("Say OK please."), 314)
    assert t_in is not None and t_in >= 1 and t_out is not None and t_out >= 1
    assert latency is not None and latency >= 0
    assert SECRET not in json.dumps(result)
    assert SECRET not in json.dumps(_usage(db), default=str)


def test_the_default_prompt(db: Database, fake: FakeOpenAI) -> None:
    _register(db, "chat", fake.base_url)
    fake.queue(Reply(content="OK"))
    assert _check(db, "chat")["reply"] == "OK"
    assert fake.calls()[0].body["messages"] == [{"role": "user", "content": "Reply with OK."}]


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (Reply(status=500), "HTTP 500"),
        (Reply(raw="{this is not json"), "malformed"),
        (Reply(raw='{"object": "chat.completion"}'), "malformed"),
    ],
)
def test_failed_calls_are_ok_false_with_an_error_row(
    db: Database, fake: FakeOpenAI, reply: Reply, words: str
) -> None:
    db.sql("SELECT aidb_memory.set_secret('fake_key', %s, ARRAY[%s])", (SECRET, fake.base_url))
    _register(db, "chat", fake.base_url, api_key_secret="fake_key")
    fake.queue(reply)
    result = _check(db, "chat")
    assert result["ok"] is False
    assert result["reply"] is None
    assert words in result["error"], result
    assert SECRET not in json.dumps(result)
    usage = _usage(db)
    assert [(r[2], r[8]) for r in usage] == [("check", "error")]
    assert words in usage[0][9]
    assert SECRET not in json.dumps(usage, default=str)
    assert len(fake.calls()) == 1, "max_retries 0: one call"


def test_connection_refused_is_ok_false(db: Database) -> None:
    url = f"http://127.0.0.1:{refused_port()}/v1"
    db.sql("SELECT aidb_memory.set_secret('fake_key', %s, ARRAY[%s])", (SECRET, url))
    _register(db, "chat", url, api_key_secret="fake_key")
    result = _check(db, "chat")
    assert result["ok"] is False
    assert "connection failed" in result["error"]
    assert SECRET not in json.dumps(result)
    assert [(r[8], r[9] == result["error"]) for r in _usage(db)] == [("error", True)]


def test_bounded_retries_come_from_the_model(db: Database, fake: FakeOpenAI) -> None:
    _register(db, "chat", fake.base_url, max_retries=1)
    fake.queue(Reply(status=500), Reply(status=500), Reply(content="never asked"))
    result = _check(db, "chat")
    assert result["ok"] is False and "HTTP 500" in result["error"]
    assert len(fake.calls()) == 2, "one try and one retry"
    assert [r[8] for r in _usage(db)] == ["error"], "one usage row per model call"


def test_a_slow_answer_times_out(db: Database, fake: FakeOpenAI) -> None:
    _register(db, "chat", fake.base_url, timeout_s=1)
    fake.queue(Reply(content="too late", delay=5))
    started = time.monotonic()
    result = _check(db, "chat")
    elapsed = time.monotonic() - started
    assert result["ok"] is False
    assert "no answer within 1 s" in result["error"]
    assert elapsed < 3.5, elapsed
    assert [r[8] for r in _usage(db)] == ["timeout"]


def test_cancelling_a_slow_call_ends_the_statement_promptly(db: Database, fake: FakeOpenAI) -> None:
    _register(db, "chat", fake.base_url, timeout_s=60)
    fake.queue(Reply(content="much too late", delay=20))
    outcome: dict[str, Any] = {}
    with db.connect(ADMIN_USER) as conn:
        pid = conn.info.backend_pid

        def run() -> None:
            try:
                conn.execute("SELECT aidb_memory.model_check('chat')")
                outcome["result"] = "returned"
            except psycopg.Error as e:
                outcome["error"] = e
            outcome["at"] = time.monotonic()

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 15
        while not fake.calls() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fake.calls(), "the model was called"
        cancelled_at = time.monotonic()
        assert db.value("SELECT pg_cancel_backend(%s)", (pid,)) is True
        thread.join(10)
        assert not thread.is_alive()
        error = outcome.get("error")
        assert isinstance(error, psycopg.Error), outcome
        assert error.sqlstate == "57014"
        assert outcome["at"] - cancelled_at < 2.5
        # The connection is usable afterwards.
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert _usage(db) == [], "the cancelled statement recorded nothing"


def test_a_key_from_the_servers_environment_that_is_missing(db: Database, fake: FakeOpenAI) -> None:
    _register(db, "chat", fake.base_url, api_key_env="AIDB_MEMORY_TEST_NO_SUCH_API_KEY")
    result = _check(db, "chat")
    assert result["ok"] is False
    assert result["error"] == (
        "the environment variable AIDB_MEMORY_TEST_NO_SUCH_API_KEY is not set in the server"
    )
    assert fake.calls() == []
    assert [r[8] for r in _usage(db)] == ["error"]


def test_a_builtin_model_answers_without_openai(db: Database) -> None:
    db.sql("SELECT aidb_memory.create_model('summarizer', 'builtin', %s::jsonb)", (BUILTIN,))
    result = _check(db, "summarizer", "We decided to ship version 2 on Friday.")
    assert result["ok"] is True
    assert result["reply"].startswith("[Extractive summary")
    assert len(result["reply"]) <= 200
    assert [r[8] for r in _usage(db)] == ["ok"]


def test_an_unknown_model_is_42704(db: Database) -> None:
    with pytest.raises(psycopg.Error) as info:
        db.sql("SELECT aidb_memory.model_check('ghost')", user=ADMIN_USER)
    assert info.value.sqlstate == "42704"
    assert (
        info.value.diag.message_primary == 'aidb_memory.model_check: model "ghost" does not exist'
    )
    assert _usage(db) == []


def test_app_user_cannot_call_model_check(db: Database, fake: FakeOpenAI) -> None:
    _register(db, "chat", fake.base_url)
    with pytest.raises(psycopg.Error) as info:
        db.sql("SELECT aidb_memory.model_check('chat')", user=APP_USER)
    assert info.value.sqlstate == "42501"
    assert fake.calls() == []


def test_the_session_path_never_imports_openai(db: Database, fake: FakeOpenAI) -> None:
    db.sql(
        """CREATE FUNCTION public.openai_loaded() RETURNS boolean LANGUAGE plpython3u
           AS $$ import sys; return 'openai' in sys.modules $$"""
    )
    db.sql("GRANT EXECUTE ON FUNCTION public.openai_loaded() TO PUBLIC")
    _register(db, "chat", fake.base_url)
    db.sql("SELECT aidb_memory.init('ns', '{\"llm\": \"chat\"}')")
    with db.connect(APP_USER) as conn:
        conn.execute(
            "SELECT aidb_memory.add('ns', 'alice', %s::jsonb, 's1')",
            (json.dumps([{"role": "user", "content": "hello there"}]),),
        )
        conn.execute("SELECT * FROM aidb_memory.session_get('ns', 'alice', 's1')").fetchall()
        assert conn.execute("SELECT public.openai_loaded()").fetchone() == (False,)
    with db.connect(ADMIN_USER) as conn:
        conn.execute("SELECT aidb_memory.model_check('chat')")
        assert conn.execute("SELECT public.openai_loaded()").fetchone() == (True,), (
            "the probe does see an import"
        )
