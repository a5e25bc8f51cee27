"""Issue 9, item 8: secrets are bound to where they may be sent.

The attacker is an admin (aidb_admins, not a superuser) who may register models but was never
given the production key. The fake OpenAI server plays their listener: it records every request
with its headers, so "the key never arrives" is checked where it would arrive.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from aidb_memory.install.migrations import parse_statements
from conftest import ADMIN_USER, REPO, Database
from fake_openai import FakeOpenAI, Reply, serve

PROD_KEY = "sk-prod-Vt5Lr8Qm2Wz6Nc1X"


@pytest.fixture
def listener() -> Iterator[FakeOpenAI]:
    with serve() as server:
        yield server


def _fails(db: Database, query: str, params: Any = None, user: str = ADMIN_USER) -> Any:
    with pytest.raises(psycopg.Error) as info:
        db.sql(query, params, user=user)
    return info.value


def _create(db: Database, name: str, user: str = ADMIN_USER, **options: Any) -> Any:
    opts = {"model": "fake-chat", "max_retries": 0, "timeout_s": 5, **options}
    return db.value(
        "SELECT aidb_memory.create_model(%s, 'openai', %s::jsonb)",
        (name, json.dumps(opts)),
        user=user,
    )


def _seen_anywhere(listener: FakeOpenAI, value: str) -> bool:
    return any(value in json.dumps([r.headers, r.body, r.path]) for r in listener.requests)


def test_an_admin_cannot_send_the_production_key_to_their_own_listener(
    db: Database, listener: FakeOpenAI
) -> None:
    # The superuser stores the production key for OpenAI (two arguments: OpenAI's endpoint).
    db.sql("SELECT aidb_memory.set_secret('prod_key', %s)", (PROD_KEY,))
    # The admin points a model at their listener with that key: refused, with a hint.
    e = _fails(
        db,
        "SELECT aidb_memory.create_model('mine', 'openai', %s::jsonb)",
        (json.dumps({"model": "m", "base_url": listener.base_url, "api_key_secret": "prod_key"}),),
    )
    assert e.sqlstate == "42501"
    assert e.diag.message_primary == (
        f'aidb_memory.create_model: the secret "prod_key" may not be sent to '
        f"http://127.0.0.1:{listener.port}"
    )
    assert "set_secret" in (e.diag.message_hint or "")
    # A model registered before the binding existed (or a hand edit) is refused at use time:
    # model_check is 42501 and nothing leaves the server.
    _create(db, "legit", api_key_secret="prod_key")
    db.sql(
        "UPDATE aidb_memory.model SET options = options || %s::jsonb WHERE name = 'legit'",
        (json.dumps({"base_url": listener.base_url}),),
    )
    e = _fails(db, "SELECT aidb_memory.model_check('legit')")
    assert e.sqlstate == "42501"
    assert 'the secret "prod_key" may not be sent to' in e.diag.message_primary
    # Nor through a namespace's compaction or extraction.
    db.sql("SELECT aidb_memory.init('ns', '{\"llm\": \"legit\"}')", user=ADMIN_USER)
    turns = json.dumps([{"role": "user", "content": "x" * 400}] * 4)
    db.sql("SELECT aidb_memory.add('ns', 'a', %s::jsonb, 's')", (turns,), user=ADMIN_USER)
    warnings = db.value(
        "SELECT warnings FROM aidb_memory.session_get('ns', 'a', 's', limit_chars => 1000)",
        user=ADMIN_USER,
    )
    assert warnings == ["compaction_model_unavailable"]
    with db.connect("worker_user") as conn:
        conn.execute("CALL aidb_memory.process_events(backoff_s => 0)")
    assert listener.requests == []
    assert not _seen_anywhere(listener, PROD_KEY)
    # What the admin can read says where the key may go, never the key.
    assert db.sql("SELECT name, endpoints FROM aidb_memory.secrets", user=ADMIN_USER) == [
        ("prod_key", ["https://api.openai.com:443"])
    ]
    calls = db.sql("SELECT outcome, error FROM aidb_memory.model_calls", user=ADMIN_USER)
    assert calls and all(PROD_KEY not in str(row) for row in calls)


def test_the_binding_cannot_be_moved_without_the_key(db: Database, listener: FakeOpenAI) -> None:
    db.sql("SELECT aidb_memory.set_secret('prod_key', %s)", (PROD_KEY,))
    # Rebinding needs a value: the admin can only bind a value they know, which replaces the key.
    e = _fails(
        db,
        "SELECT aidb_memory.set_secret('prod_key', NULL, ARRAY[%s])",
        (listener.base_url,),
    )
    assert e.sqlstate == "22004"
    # Narrowing the endpoints under a model that uses the secret is refused.
    db.sql(
        "SELECT aidb_memory.set_secret('team_key', %s, ARRAY['https://api.openai.com', %s])",
        (PROD_KEY, listener.base_url),
    )
    _create(db, "team", base_url=listener.base_url, api_key_secret="team_key")
    # NULL endpoints keep them: a rotation succeeds ...
    db.sql("SELECT aidb_memory.set_secret('team_key', %s)", ("sk-rotated",))
    assert db.value("SELECT endpoints FROM aidb_memory.secrets WHERE name = 'team_key'") == [
        f"http://127.0.0.1:{listener.port}",
        "https://api.openai.com:443",
    ]
    e = _fails(
        db,
        "SELECT aidb_memory.set_secret('team_key', %s, ARRAY['https://api.openai.com'])",
        (PROD_KEY,),
        user="postgres",
    )
    assert e.sqlstate == "55000"  # ... a narrowing that would cut off "team" does not
    assert "team" in e.diag.message_primary and PROD_KEY not in str(e)


def test_api_key_env_names_only_key_variables(db: Database, listener: FakeOpenAI) -> None:
    e = _fails(
        db,
        "SELECT aidb_memory.create_model('s3', 'openai', %s::jsonb)",
        (
            json.dumps(
                {"model": "m", "base_url": listener.base_url, "api_key_env": "BACKUP_S3_SECRET"}
            ),
        ),
    )
    assert e.sqlstate == "42501"
    assert e.diag.message_primary == (
        "aidb_memory.create_model: options.api_key_env BACKUP_S3_SECRET is not an allowed key "
        "variable (allowed: *_API_KEY)"
    )
    assert "runtime_settings" in (e.diag.message_hint or "")
    # HOME is set in every server: a model hand-edited to read it is refused at use time, and
    # the variable's value never leaves the server.
    _create(db, "home", base_url=listener.base_url)
    db.sql(
        'UPDATE aidb_memory.model SET options = options || \'{"api_key_env": "HOME"}\' '
        "WHERE name = 'home'"
    )
    e = _fails(db, "SELECT aidb_memory.model_check('home')")
    assert e.sqlstate == "42501"
    assert listener.requests == []
    # A session cannot widen the allow-list: it is no setting a session could SET ...
    with db.connect(ADMIN_USER) as conn:
        conn.execute("SET aidb_memory.api_key_env_pattern = '*'")
        with pytest.raises(psycopg.Error) as info:
            conn.execute(
                "SELECT aidb_memory.create_model('home2', 'openai', %s::jsonb)",
                (json.dumps({"model": "m", "api_key_env": "HOME"}),),
            )
        assert info.value.sqlstate == "42501"
        # ... nor a row an admin could write.
        with pytest.raises(psycopg.Error) as info:
            conn.execute(
                "INSERT INTO aidb_memory.runtime_settings (key, value) "
                "VALUES ('api_key_env_pattern', '*')"
            )
        assert info.value.sqlstate == "42501"
    # A superuser can.
    db.sql(
        "INSERT INTO aidb_memory.runtime_settings (key, value) "
        "VALUES ('api_key_env_pattern', '*_API_KEY, HOME')"
    )
    assert _create(db, "home2", api_key_env="HOME") > 0


def test_a_key_bound_to_its_endpoint_still_works(db: Database, listener: FakeOpenAI) -> None:
    # Any URL of the endpoint will do: only scheme, host and port count, normalized.
    url = f"HTTP://127.0.0.1:{listener.port}/some/other/path"
    db.sql("SELECT aidb_memory.set_secret('local_key', %s, ARRAY[%s])", (PROD_KEY, url))
    assert db.sql("SELECT endpoints FROM aidb_memory.secrets", user=ADMIN_USER) == [
        ([f"http://127.0.0.1:{listener.port}"],)
    ]
    _create(db, "local", base_url=listener.base_url, api_key_secret="local_key")
    listener.queue(Reply(content="OK"))
    result = db.value("SELECT aidb_memory.model_check('local')", user=ADMIN_USER)
    assert result["ok"] is True, result
    (request,) = listener.calls()
    assert request.headers["authorization"] == f"Bearer {PROD_KEY}"
    # The same host on another port is another endpoint.
    e = _fails(
        db,
        "SELECT aidb_memory.create_model('other', 'openai', %s::jsonb)",
        (
            json.dumps(
                {"model": "m", "base_url": "http://127.0.0.1:1/v1", "api_key_secret": "local_key"}
            ),
        ),
    )
    assert e.sqlstate == "42501"
    # A malformed endpoint is 22023, naming the element, never echoing the value.
    e = _fails(
        db, "SELECT aidb_memory.set_secret('x', %s, ARRAY['ftp://h'])", (PROD_KEY,), "postgres"
    )
    assert e.sqlstate == "22023" and e.diag.message_primary.startswith(
        "aidb_memory.set_secret: endpoints[1] "
    )
    assert PROD_KEY not in str(e)


def _migration_update() -> str:
    path = REPO / "migrations" / "0008_secret_endpoints.sql"
    (update,) = [s for _, s in parse_statements(path, path.read_text()) if s.startswith("UPDATE")]
    return update


@pytest.mark.parametrize(
    ("base_urls", "expected"),
    [
        ([None], ["https://api.openai.com:443"]),
        ([], ["https://api.openai.com:443"]),
        (["http://Vllm-Host:8000/v1"], ["http://vllm-host:8000"]),
        (
            ["https://my.openai.azure.com/openai/v1/", "http://[::1]/v1"],
            ["http://[::1]:80", "https://my.openai.azure.com:443"],
        ),
        (["http://h:0080/v1", "http://h/v1", "http://h.:80/x"], ["http://h:80"]),
    ],
)
def test_an_upgrade_binds_existing_secrets_to_the_models_that_use_them(
    db: Database, base_urls: list[str | None], expected: list[str]
) -> None:
    """migrations/0008 on secrets stored before it: the endpoints of their models today."""
    db.sql("SELECT aidb_memory.set_secret('old', %s)", (PROD_KEY,))
    for i, url in enumerate(base_urls):
        options = {"model": "m", "api_key_secret": "old"} | ({"base_url": url} if url else {})
        db.sql(
            "INSERT INTO aidb_memory.model (name, provider, options) VALUES (%s, 'openai', %s)",
            (f"m{i}", json.dumps(options)),
        )
    db.sql("UPDATE aidb_memory.secret SET endpoints = NULL")
    db.sql(_migration_update())
    assert db.value("SELECT endpoints FROM aidb_memory.secret") == expected
    # The same normalization as the server's code: every model may still use its key
    # (registering it again runs the same check as a call, without calling).
    for i, url in enumerate(base_urls):
        options = {"model": "m", "api_key_secret": "old"} | ({"base_url": url} if url else {})
        assert _create(db, f"m{i}", **options) > 0
