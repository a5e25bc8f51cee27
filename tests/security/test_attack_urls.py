"""Issue 9, item 10: model URLs stay with admins.

A failing model call's text comes partly from the HTTP client, which puts the request URL in it
(httpx: "Server error '500 ...' for url 'http://...'"). The model here has a base_url with
userinfo and a query string, as a row from before create_model refused them (or a superuser's
hand edit) can have: the worst URL there is to leak. An application role (app_user) must see
neither it nor any part of it, only the model's name; admins (model_check, doctor, model_calls)
see the URL with its userinfo and query string redacted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from conftest import ADMIN_USER, APP_USER, WORKER_USER, Database, run_cli
from fake_openai import FakeOpenAI, Reply, serve

NS = "urls"
USERINFO = "leakuser:leakpass"
QUERY = "token=leakquery"


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with serve() as server:
        server.default = lambda _request: Reply(status=500)
        yield server


def _leaky_url(fake: FakeOpenAI) -> str:
    return f"http://{USERINFO}@127.0.0.1:{fake.port}/v1?{QUERY}"


def _register(db: Database, name: str, fake: FakeOpenAI, model: str) -> None:
    opts = {"model": model, "base_url": fake.base_url, "max_retries": 0, "timeout_s": 5}
    db.sql("SELECT aidb_memory.create_model(%s, 'openai', %s::jsonb)", (name, json.dumps(opts)))
    # create_model refuses such a URL; an older row or a superuser's edit has it.
    db.sql(
        "UPDATE aidb_memory.model "
        "SET options = options || jsonb_build_object('base_url', %s::text) WHERE name = %s",
        (_leaky_url(fake), name),
    )


def _assert_no_url(text: str, fake: FakeOpenAI) -> None:
    for part in (USERINFO, "leakuser", QUERY, "leakquery", "127.0.0.1", str(fake.port), "http"):
        assert part not in text, f"{part!r} in {text!r}"


def _assert_redacted(text: str, fake: FakeOpenAI) -> None:
    for part in ("leakuser", "leakpass", "leakquery"):
        assert part not in text, f"{part!r} in {text!r}"


@pytest.fixture
def leaky(db: Database, fake: FakeOpenAI) -> None:
    _register(db, "leaky", fake, "fake-chat")
    _register(db, "leaky_emb", fake, "fake-embedding")
    db.sql(
        "SELECT aidb_memory.init(%s, %s::jsonb)",
        (NS, json.dumps({"llm": "leaky", "embedding": "leaky_emb"})),
    )


def test_an_event_that_failed_names_the_model_not_its_url(
    db: Database, fake: FakeOpenAI, leaky: None
) -> None:
    turns = json.dumps([{"role": "user", "content": "I like green tea."}])
    event = db.value("SELECT aidb_memory.add(%s, 'alice', %s::jsonb)", (NS, turns), user=APP_USER)
    with db.connect(WORKER_USER) as conn:
        conn.execute("CALL aidb_memory.process_events(backoff_s => 0)")
    assert fake.requests, "the model was called and failed"
    status = db.value("SELECT aidb_memory.status(%s, 'alice', %s)", (NS, event), user=APP_USER)
    assert status["last_error"] == 'HTTP 500 (model "leaky")'
    _assert_no_url(json.dumps(status), fake)


def test_searchs_warning_names_the_model_not_its_url(
    db: Database, fake: FakeOpenAI, leaky: None
) -> None:
    db.sql(
        """INSERT INTO aidb_memory.memory
               (actor_key, namespace_id, actor_id, content, content_hash, embedding,
                embedding_model, lexemes)
           SELECT aidb_memory.actor_key(name, 'alice'), id, 'alice', 'Alice likes green tea',
                  md5('Alice likes green tea'),
                  ARRAY[1, 0]::real[], 'leaky_emb', to_tsvector('english', 'Alice likes green tea')
           FROM aidb_memory.namespace WHERE name = %s""",
        (NS,),
    )
    notices: list[str] = []
    with db.connect(APP_USER) as conn:
        conn.add_notice_handler(
            lambda d: notices.append(
                " ".join(str(x) for x in (d.message_primary, d.message_detail, d.message_hint))
            )
        )
        rows = conn.execute(
            "SELECT content FROM aidb_memory.search(%s, 'alice', 'green tea')", (NS,)
        ).fetchall()
    assert rows == [("Alice likes green tea",)]
    assert fake.requests, "the embedding model was called and failed"
    (warning,) = notices
    assert warning.startswith(
        'aidb_memory.search: the embedding model "leaky_emb" failed (error: HTTP 500)'
    )
    _assert_no_url(warning, fake)


def test_a_reads_warnings_are_codes(db: Database, fake: FakeOpenAI, leaky: None) -> None:
    turns = json.dumps([{"role": "user", "content": "x" * 400}] * 4)
    with db.connect(APP_USER) as conn:
        conn.execute("SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's')", (NS, turns))
        notices: list[str] = []
        conn.add_notice_handler(lambda d: notices.append(str(d.message_primary)))
        row = conn.execute(
            "SELECT items, warnings FROM aidb_memory.session_get(%s, 'alice', 's', "
            "limit_chars => 1000)",
            (NS,),
        ).fetchone()
    assert row is not None and row[1] == ["compaction_call_failed"]
    _assert_no_url(json.dumps(row[1]) + json.dumps(notices), fake)


def test_admins_see_the_url_redacted(db: Database, fake: FakeOpenAI, leaky: None) -> None:
    check = db.value("SELECT aidb_memory.model_check('leaky')", user=ADMIN_USER)
    assert check["ok"] is False
    error = check["error"]
    assert error.startswith("HTTP 500: ")
    # The endpoint stays readable for the admin who must fix it; what it hides does not.
    assert f"127.0.0.1:{fake.port}" in error and "[redacted]" in error
    _assert_redacted(error, fake)
    for (text,) in db.sql("SELECT error FROM aidb_memory.model_calls", user=ADMIN_USER):
        _assert_redacted(text, fake)
    result = run_cli("doctor", dsn=db.dsn(ADMIN_USER))
    out = result.stdout + result.stderr
    assert re.search(r"failed\s+model\s+leaky \(openai fake-chat\): HTTP 500", out), out
    _assert_redacted(out, fake)
