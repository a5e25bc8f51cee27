"""Issue 9, item 11: ``fallback_model`` can be fenced.

The attacker is an application role (app_user, aidb_users) of one tenant's namespace, which
names no model of its own. Without a fence (the default, as in AIDB) any registered model may
be a read's fallback_model, spending that model's key; an admin fences a namespace with the
config key ``allowed_fallback_models``. A fenced-out model reads like an unknown one, and every
call a fallback makes is recorded against the calling namespace in model_usage.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from conftest import ADMIN_USER, APP_USER, Database
from fake_openai import FakeOpenAI, Reply, serve

NS = "tenant"


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with serve() as server:
        server.default = lambda _request: Reply(content="A short summary.")
        yield server


@pytest.fixture
def models(db: Database, fake: FakeOpenAI) -> None:
    # "premium" stands for a model with a costly key (whether it has one changes nothing here).
    opts = {"model": "fake-chat", "base_url": fake.base_url}
    db.sql("SELECT aidb_memory.create_model('premium', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql("SELECT aidb_memory.create_model('cheap', 'builtin', '{\"kind\": \"extractive\"}')")
    db.sql("SELECT aidb_memory.init(%s)", (NS,), user=ADMIN_USER)


def _fence(db: Database, allowed: Any) -> None:
    db.sql(
        "SELECT * FROM aidb_memory.namespace_update(%s, config => %s::jsonb)",
        (NS, json.dumps({"allowed_fallback_models": allowed})),
        user=ADMIN_USER,
    )


def _read(db: Database, session: str, fallback: str) -> tuple[list[Any], list[str]]:
    """A budgeted read as the application of a session over budget (1,600 chars in 1,000)."""
    turns = json.dumps([{"role": "user", "content": f"{i} " + "x" * 398} for i in range(4)])
    with db.connect(APP_USER) as conn:
        conn.execute("SELECT aidb_memory.add(%s, 'alice', %s::jsonb, %s)", (NS, turns, session))
        row = conn.execute(
            "SELECT items, warnings FROM aidb_memory.session_get(%s, 'alice', %s, "
            "limit_chars => 1000, fallback_model => %s)",
            (NS, session, fallback),
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def _usage(db: Database) -> list[tuple[Any, ...]]:
    return db.sql(
        "SELECT u.model_name, n.name, u.purpose FROM aidb_memory.model_usage u "
        "LEFT JOIN aidb_memory.namespace n ON n.id = u.namespace_id ORDER BY u.id"
    )


def test_by_default_any_model_may_be_the_fallback_and_its_use_is_the_namespaces(
    db: Database, fake: FakeOpenAI, models: None
) -> None:
    items, warnings = _read(db, "s1", "premium")
    assert warnings == [] and items[0]["kind"] == "summary"
    assert len(fake.calls()) == 1
    assert _usage(db) == [("premium", NS, "compaction")]


def test_a_fenced_out_fallback_reads_as_unavailable(
    db: Database, fake: FakeOpenAI, models: None
) -> None:
    _fence(db, ["cheap"])
    items, warnings = _read(db, "s1", "premium")
    assert warnings == ["compaction_model_unavailable"]
    assert items and all(i["kind"] != "summary" for i in items), "the read still succeeds"
    assert fake.requests == [], "the premium key was not spent"
    # The same answer as for a model that does not exist: nothing tells the two apart.
    assert _read(db, "s2", "no_such_model")[1] == ["compaction_model_unavailable"]
    # An allowed fallback works, and is recorded against the namespace.
    items, warnings = _read(db, "s3", "cheap")
    assert warnings == [] and items[0]["kind"] == "summary"
    assert _usage(db) == [("cheap", NS, "compaction")]


def test_an_empty_list_allows_no_fallback_and_null_lifts_the_fence(
    db: Database, fake: FakeOpenAI, models: None
) -> None:
    _fence(db, [])
    assert _read(db, "s1", "cheap")[1] == ["compaction_model_unavailable"]
    assert _read(db, "s2", "premium")[1] == ["compaction_model_unavailable"]
    assert fake.requests == [] and _usage(db) == []
    _fence(db, None)
    assert db.value("SELECT config FROM aidb_memory.namespaces WHERE name = %s", (NS,)) == {}
    assert _read(db, "s3", "premium")[1] == []


def test_the_namespaces_own_model_is_not_fenced(
    db: Database, fake: FakeOpenAI, models: None
) -> None:
    db.sql(
        'SELECT * FROM aidb_memory.namespace_update(%s, \'{"llm": "premium"}\', '
        "'{\"allowed_fallback_models\": []}')",
        (NS,),
        user=ADMIN_USER,
    )
    assert _read(db, "s1", "cheap")[1] == []
    assert _usage(db) == [("premium", NS, "compaction")], "the namespace's model, not the fallback"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("cheap", "must be a list of at most 100 model names"),
        ([1], "must hold only model names (non-empty strings)"),
        ([""], "must hold only model names (non-empty strings)"),
        (["x"] * 101, "must be a list of at most 100 model names"),
    ],
)
def test_the_fence_is_validated(db: Database, models: None, value: Any, message: str) -> None:
    for query, params in (
        ("SELECT aidb_memory.init('other', '{}', %s::jsonb)", ()),
        ("SELECT * FROM aidb_memory.namespace_update(%s, config => %s::jsonb)", (NS,)),
    ):
        with pytest.raises(psycopg.Error) as info:
            db.sql(
                query, (*params, json.dumps({"allowed_fallback_models": value})), user=ADMIN_USER
            )
        assert info.value.sqlstate == "22023"
        assert info.value.diag.message_primary.endswith(f"config.allowed_fallback_models {message}")


def test_an_application_cannot_lift_the_fence(db: Database, models: None) -> None:
    _fence(db, ["cheap"])
    with pytest.raises(psycopg.Error) as info:
        db.sql(
            "SELECT * FROM aidb_memory.namespace_update(%s, config => "
            "'{\"allowed_fallback_models\": null}')",
            (NS,),
            user=APP_USER,
        )
    assert info.value.sqlstate == "42501"
