"""Models and secrets (SPEC §2, §6; issue 4 acceptance 7): admin-only, secrets never shown."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from conftest import ADMIN_USER, APP_USER, Database

SECRET = "sk-test-Zq8vN3kL0pR7sW2xY5aB"
BUILTIN = '{"kind": "extractive"}'
OPENAI = {"model": "gpt-4o-mini", "base_url": "https://api.example.test/v1"}


def _error(db: Database, query: str, params: Any = None, user: str = ADMIN_USER) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        db.sql(query, params, user=user)
    return info.value


def _text(e: psycopg.Error) -> str:
    d = e.diag
    return " ".join(
        str(x) for x in (d.message_primary, d.message_detail, d.message_hint, d.context)
    )


def _models(db: Database) -> list[tuple[Any, ...]]:
    return db.sql("SELECT name, provider, options FROM aidb_memory.models ORDER BY name")


# --- admins --------------------------------------------------------------------------------


def test_admin_creates_replaces_and_drops_a_model_with_the_same_id(db: Database) -> None:
    first = db.value(
        "SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)",
        (json.dumps(OPENAI),),
        user=ADMIN_USER,
    )
    assert isinstance(first, int)
    created = db.sql("SELECT created_at, updated_at FROM aidb_memory.model WHERE id = %s", (first,))
    again = db.value(
        "SELECT aidb_memory.create_model('chat', 'builtin', %s::jsonb)", (BUILTIN,), user=ADMIN_USER
    )
    assert again == first, "replacing keeps the id"
    assert db.sql("SELECT name, provider, options FROM aidb_memory.models", user=ADMIN_USER) == [
        ("chat", "builtin", {"kind": "extractive"})
    ]
    (created_at, updated_at) = db.sql(
        "SELECT created_at, updated_at FROM aidb_memory.model WHERE id = %s", (first,)
    )[0]
    assert created_at == created[0][0] and updated_at > created[0][1]
    same = db.value(
        "SELECT aidb_memory.create_model('chat', 'builtin', %s::jsonb)", (BUILTIN,), user=ADMIN_USER
    )
    assert same == first
    other = db.value(
        "SELECT aidb_memory.create_model('other', 'builtin', %s::jsonb)",
        (BUILTIN,),
        user=ADMIN_USER,
    )
    assert other != first
    db.sql("SELECT aidb_memory.drop_model('chat')", user=ADMIN_USER)
    assert [r[0] for r in _models(db)] == ["other"]
    e = _error(db, "SELECT aidb_memory.drop_model('chat')")
    assert e.sqlstate == "42704"
    assert e.diag.message_primary == 'aidb_memory.drop_model: model "chat" does not exist'


def test_models_view_has_exactly_these_columns(db: Database) -> None:
    columns = db.sql(
        """SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
           WHERE attrelid = 'aidb_memory.models'::regclass AND attnum > 0 AND NOT attisdropped
           ORDER BY attnum"""
    )
    assert columns == [
        ("name", "text"),
        ("provider", "text"),
        ("options", "jsonb"),
        ("created_at", "timestamp with time zone"),
        ("updated_at", "timestamp with time zone"),
    ]


def test_a_model_with_a_stored_secret_and_dropping_secrets(db: Database) -> None:
    stored = db.sql(
        "SELECT aidb_memory.set_secret('openai', %s, ARRAY[%s])",
        (SECRET, OPENAI["base_url"]),
        user=ADMIN_USER,
    )
    assert stored == [("",)], "returns void, not the value"
    options = {**OPENAI, "api_key_secret": "openai", "timeout_s": 20, "max_retries": 2}
    db.sql(
        "SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)",
        (json.dumps(options),),
        user=ADMIN_USER,
    )
    assert _models(db) == [("chat", "openai", options)]
    assert db.value("SELECT value FROM aidb_memory.secret WHERE name = 'openai'") == SECRET
    db.sql("SELECT aidb_memory.set_secret('openai', 'sk-rotated')", user=ADMIN_USER)
    assert db.value("SELECT value FROM aidb_memory.secret WHERE name = 'openai'") == "sk-rotated"
    assert db.value("SELECT count(*) FROM aidb_memory.secret") == 1

    e = _error(db, "SELECT aidb_memory.drop_secret('openai')")
    assert e.sqlstate == "55000"
    assert e.diag.message_primary == (
        'aidb_memory.drop_secret: secret "openai" is the api_key_secret of models: chat'
    )
    db.sql(
        "SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)",
        (json.dumps({**OPENAI, "api_key_env": "OPENAI_API_KEY"}),),
        user=ADMIN_USER,
    )
    db.sql("SELECT aidb_memory.drop_secret('openai')", user=ADMIN_USER)
    assert db.value("SELECT count(*) FROM aidb_memory.secret") == 0
    e = _error(db, "SELECT aidb_memory.drop_secret('openai')")
    assert (e.sqlstate, e.diag.message_primary) == (
        "42704",
        'aidb_memory.drop_secret: secret "openai" does not exist',
    )


def test_an_unknown_secret_is_42704_and_stores_nothing(db: Database) -> None:
    e = _error(
        db,
        "SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)",
        (json.dumps({**OPENAI, "api_key_secret": "nope"}),),
    )
    assert e.sqlstate == "42704"
    assert e.diag.message_primary == (
        'aidb_memory.create_model: options.api_key_secret names no stored secret "nope"'
    )
    assert e.diag.message_hint == "store it first with aidb_memory.set_secret"
    assert _models(db) == []


@pytest.mark.parametrize(
    ("args", "sqlstate", "message"),
    [
        (("m", "openai", '{"model": "x", "api_key": "k"}'), "22023", "options.api_key is refused"),
        (("m", "openai", '{"base_url": "http://h"}'), "22023", "options.model is required"),
        (("m", "local", BUILTIN), "22023", "provider must be one of: openai, builtin"),
        (("m", None, BUILTIN), "22004", "provider must not be NULL"),
        ((None, "builtin", BUILTIN), "22004", "name must not be NULL"),
        (("m", "builtin", "[]"), "22023", "options must be a JSON object"),
        (("m", "builtin", None), "22023", "options.kind must be one of: extractive"),
    ],
)
def test_bad_create_model_arguments(
    db: Database, args: tuple[Any, ...], sqlstate: str, message: str
) -> None:
    e = _error(db, "SELECT aidb_memory.create_model(%s, %s, %s::jsonb)", args)
    assert e.sqlstate == sqlstate
    assert e.diag.message_primary == f"aidb_memory.create_model: {message}" or (
        (e.diag.message_primary or "").startswith(f"aidb_memory.create_model: {message}")
    )
    assert _models(db) == []


# --- model_spec names registered models ----------------------------------------------------


def test_init_and_namespace_update_refuse_an_unregistered_model(db: Database) -> None:
    e = _error(db, """SELECT aidb_memory.init('ns', '{"llm": "ghost"}')""")
    assert e.sqlstate == "42704"
    assert e.diag.message_primary == (
        'aidb_memory.init: model_spec.llm names no registered model "ghost"'
    )
    assert e.diag.message_hint == "register it with aidb_memory.create_model"
    assert db.value("SELECT count(*) FROM aidb_memory.namespaces WHERE name = 'ns'") == 0

    db.sql("SELECT aidb_memory.create_model('real', 'builtin', %s::jsonb)", (BUILTIN,))
    db.sql("""SELECT aidb_memory.init('ns', '{"llm": "real"}')""", user=ADMIN_USER)
    e = _error(db, """SELECT * FROM aidb_memory.namespace_update('ns', '{"embedding": "ghost"}')""")
    assert e.sqlstate == "42704"
    assert e.diag.message_primary == (
        'aidb_memory.namespace_update: model_spec.embedding names no registered model "ghost"'
    )
    assert db.value("SELECT model_spec FROM aidb_memory.namespaces WHERE name = 'ns'") == {
        "llm": "real"
    }
    db.sql(
        """SELECT * FROM aidb_memory.namespace_update('ns', '{"embedding": "real"}')""",
        user=ADMIN_USER,
    )
    e = _error(db, "SELECT aidb_memory.drop_model('real')")
    assert e.sqlstate == "55000"
    assert e.diag.message_primary == (
        'aidb_memory.drop_model: model "real" is in the model_spec of namespaces: ns'
    )
    db.sql(
        """SELECT * FROM aidb_memory.namespace_update('ns', '{"llm": null, "embedding": null}')""",
        user=ADMIN_USER,
    )
    db.sql("SELECT aidb_memory.drop_model('real')", user=ADMIN_USER)


# --- aidb_users ----------------------------------------------------------------------------

_ADMIN_CALLS = [
    "SELECT aidb_memory.create_model('m', 'builtin', '{\"kind\": \"extractive\"}')",
    "SELECT aidb_memory.drop_model('kept')",
    "SELECT aidb_memory.set_secret('s', 'sk-app-user-value')",
    "SELECT aidb_memory.set_secret('kept', 'sk-app-user-value')",
    "SELECT aidb_memory.drop_secret('kept')",
]


@pytest.mark.parametrize("query", _ADMIN_CALLS)
def test_app_user_cannot_call_model_or_secret_functions(db: Database, query: str) -> None:
    db.sql("SELECT aidb_memory.set_secret('kept', %s)", (SECRET,))
    db.sql("SELECT aidb_memory.create_model('kept', 'builtin', %s::jsonb)", (BUILTIN,))
    before = db.sql(
        "SELECT (SELECT json_agg(m ORDER BY id)::text FROM aidb_memory.model m), "
        "(SELECT json_agg(s ORDER BY id)::text FROM aidb_memory.secret s)"
    )
    e = _error(db, query, user=APP_USER)
    assert e.sqlstate == "42501", e
    assert e.diag.message_primary and "permission denied for function" in e.diag.message_primary
    assert SECRET not in _text(e)
    after = db.sql(
        "SELECT (SELECT json_agg(m ORDER BY id)::text FROM aidb_memory.model m), "
        "(SELECT json_agg(s ORDER BY id)::text FROM aidb_memory.secret s)"
    )
    assert after == before


@pytest.mark.parametrize(
    "relation",
    ["aidb_memory.model", "aidb_memory.secret", "aidb_memory.model_usage", "aidb_memory.models"],
)
def test_app_user_cannot_read_models_secrets_or_usage(db: Database, relation: str) -> None:
    e = _error(db, f"SELECT * FROM {relation}", user=APP_USER)
    assert e.sqlstate == "42501"


@pytest.mark.parametrize("relation", ["aidb_memory.secret", "aidb_memory.model_usage"])
def test_only_a_superuser_reads_the_secret_and_usage_tables(db: Database, relation: str) -> None:
    e = _error(db, f"SELECT * FROM {relation}", user=ADMIN_USER)
    assert e.sqlstate == "42501"
    grants = db.sql(
        """SELECT grantee FROM information_schema.role_table_grants
           WHERE table_schema = 'aidb_memory' AND table_name = %s""",
        (relation.split(".")[1],),
    )
    owners = {r[0] for r in db.sql("SELECT rolname FROM pg_roles WHERE rolsuper")}
    assert {g[0] for g in grants} <= owners


def test_admin_reads_the_models_view(db: Database) -> None:
    db.sql("SELECT aidb_memory.create_model('kept', 'builtin', %s::jsonb)", (BUILTIN,))
    assert db.sql("SELECT name FROM aidb_memory.models", user=ADMIN_USER) == [("kept",)]


# --- a secret's value is never shown -------------------------------------------------------


def test_a_secret_value_never_appears_in_a_message_a_view_or_the_catalog(db: Database) -> None:
    notices: list[str] = []
    seen: list[str] = []
    with db.connect(ADMIN_USER) as conn:
        conn.add_notice_handler(
            lambda d: notices.append(f"{d.message_primary} {d.message_detail} {d.message_hint}")
        )
        conn.execute("SET client_min_messages = debug5")
        conn.execute(
            "SELECT aidb_memory.set_secret('key', %s, ARRAY[%s])", (SECRET, OPENAI["base_url"])
        )
        conn.execute("SELECT aidb_memory.set_secret('key', %s)", (SECRET,))  # a replace
        for bad in (
            ("key", SECRET + "\n"),
            ("key", " " + SECRET),
            ("key", SECRET * 1000),
            ("key", SECRET + "\x01"),
            ("bad\nname", SECRET),
            (None, SECRET),
        ):
            with pytest.raises(psycopg.Error) as info:
                conn.execute("SELECT aidb_memory.set_secret(%s, %s)", bad)
            seen.append(_text(info.value))
        for options in (
            {**OPENAI, "api_key": SECRET},
            {**OPENAI, "base_url": f"https://u:{SECRET}@h/v1"},
            {**OPENAI, "base_url": f"https://h/v1?key={SECRET}"},
            {**OPENAI, "timeout_s": SECRET},
            {**OPENAI, "api_key_env": SECRET},
        ):
            with pytest.raises(psycopg.Error) as info:
                conn.execute(
                    "SELECT aidb_memory.create_model('m', 'openai', %s::jsonb)",
                    (json.dumps(options),),
                )
            seen.append(_text(info.value))
        conn.execute(
            "SELECT aidb_memory.create_model('m', 'openai', %s::jsonb)",
            (json.dumps({**OPENAI, "api_key_secret": "key"}),),
        )
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT aidb_memory.drop_secret('key')")
        seen.append(_text(info.value))
        seen.append(
            json.dumps(conn.execute("SELECT * FROM aidb_memory.models").fetchall(), default=str)
        )
    assert len(seen) == 13
    for text in seen + notices:
        assert SECRET not in text, text
    catalog = db.value(
        """SELECT string_agg(concat_ws(' ', p.prosrc, array_to_string(p.proconfig, ' '),
                                       obj_description(p.oid, 'pg_proc')), ' ')
           FROM pg_proc p WHERE p.pronamespace = 'aidb_memory'::regnamespace"""
    )
    assert catalog and SECRET not in catalog
    comments = db.value("SELECT string_agg(description, ' ') FROM pg_description")
    assert SECRET not in comments
    views = db.value(
        "SELECT string_agg(definition, ' ') FROM pg_views WHERE schemaname = 'aidb_memory'"
    )
    assert SECRET not in views
    assert db.value("SELECT value FROM aidb_memory.secret WHERE name = 'key'") == SECRET
