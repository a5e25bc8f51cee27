"""Namespaces (SPEC §2): init, the namespaces view, namespace_update, validation errors."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from aidb_memory.install.installer import Package, install
from aidb_memory.throwaway import ThrowawayServer
from conftest import ADMIN_USER, Database, _create_database, _drop_database

TIMEOUT_S = 30


def _error(db: Database, query: str, params: Any = None, user: str = ADMIN_USER) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        db.sql(query, params, user=user)
    return info.value


def _stored(db: Database) -> list[tuple[Any, ...]]:
    """Everything the namespace table holds, in a comparable form."""
    return db.sql("SELECT to_jsonb(n)::text FROM aidb_memory.namespace n ORDER BY id")


def _row(db: Database, name: str) -> dict[str, Any]:
    row = db.value("SELECT to_jsonb(n) FROM aidb_memory.namespaces n WHERE name = %s", (name,))
    assert row is not None, f"namespace {name} not found"
    return dict(row)


def _register(db: Database, *names: str) -> None:
    """Register builtin models under ``names``: a model_spec may only name registered models."""
    for name in names:
        db.sql(
            "SELECT aidb_memory.create_model(%s, 'builtin', '{\"kind\": \"extractive\"}')",
            (name,),
            user=ADMIN_USER,
        )


# --- init ----------------------------------------------------------------------------------


def test_init_twice_returns_the_same_id_and_changes_nothing(db: Database) -> None:
    _register(db, "m1", "m2")
    first = db.value(
        "SELECT aidb_memory.init('support', '{\"llm\": \"m1\"}', '{\"max_turn_chars\": 50}')",
        user=ADMIN_USER,
    )
    assert isinstance(first, int)
    before = _row(db, "support")
    notices: list[str] = []
    with db.connect(ADMIN_USER) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        same = conn.execute(
            "SELECT aidb_memory.init('support', '{\"llm\": \"m1\"}', '{\"max_turn_chars\": 50}')"
        ).fetchone()
        assert same == (first,)
        assert notices == [], "an identical repeat is silent"
        other = conn.execute(
            "SELECT aidb_memory.init('support', '{\"llm\": \"m2\"}', '{\"extraction\": false}')"
        ).fetchone()
        assert other == (first,)
    assert len(notices) == 1
    assert notices[0].startswith('aidb_memory.init: namespace "support" already exists')
    assert "namespace_update" in notices[0]
    assert _row(db, "support") == before
    assert db.value("SELECT count(*) FROM aidb_memory.namespaces WHERE name = 'support'") == 1


def test_init_stores_normalised_values_and_returns_a_new_id_per_name(db: Database) -> None:
    _register(db, "m")
    a = db.value("SELECT aidb_memory.init('a')", user=ADMIN_USER)
    b = db.value(
        "SELECT aidb_memory.init('b', %s::jsonb, %s::jsonb)",
        ('{"llm": "m", "embedding": null}', '{"llm_timeout_s": 5, "max_turn_chars": null}'),
        user=ADMIN_USER,
    )
    assert a != b
    row = _row(db, "b")
    assert row["id"] == b
    assert row["model_spec"] == {"llm": "m"}
    assert row["config"] == {"llm_timeout_s": 5}, "a null config key means its default"
    assert row["state"] == "ACTIVE"
    assert _row(db, "a")["model_spec"] == {} and _row(db, "a")["config"] == {}


def test_init_with_null_model_spec_and_config_reads_them_as_empty(db: Database) -> None:
    ident = db.value("SELECT aidb_memory.init('n', NULL, NULL)", user=ADMIN_USER)
    row = _row(db, "n")
    assert (row["id"], row["model_spec"], row["config"]) == (ident, {}, {})


def test_pg_agents_exists_after_install_with_no_model(db: Database) -> None:
    row = _row(db, "pg_agents")
    assert row["model_spec"] == {}
    assert row["config"] == {}
    assert row["state"] == "ACTIVE"
    assert db.value("SELECT aidb_memory.init('pg_agents')", user=ADMIN_USER) == row["id"]


def test_namespaces_view_has_exactly_these_columns(db: Database) -> None:
    columns = db.sql(
        """SELECT attname, format_type(atttypid, atttypmod)
           FROM pg_attribute
           WHERE attrelid = 'aidb_memory.namespaces'::regclass AND attnum > 0
                 AND NOT attisdropped
           ORDER BY attnum"""
    )
    assert columns == [
        ("id", "bigint"),
        ("name", "text"),
        ("model_spec", "jsonb"),
        ("config", "jsonb"),
        ("state", "text"),
        ("created_at", "timestamp with time zone"),
        ("updated_at", "timestamp with time zone"),
        ("granted_roles", "text[]"),
    ]


# --- namespace_update ----------------------------------------------------------------------


def _update(db: Database, *args: Any) -> dict[str, Any]:
    with db.connect(ADMIN_USER) as conn:
        cur = conn.execute(
            "SELECT to_jsonb(u) FROM aidb_memory.namespace_update(%s, %s::jsonb, %s::jsonb, %s) u",
            args,
        )
        rows = cur.fetchall()
    assert len(rows) == 1
    return dict(rows[0][0])


def test_namespace_update_merges_and_null_resets_a_key(db: Database) -> None:
    _register(db, "a", "e")
    db.sql(
        "SELECT aidb_memory.init('m', '{\"llm\": \"a\"}', "
        '\'{"max_turn_chars": 10, "extraction": false}\')',
        user=ADMIN_USER,
    )
    created = _row(db, "m")

    merged = _update(db, "m", '{"embedding": "e"}', '{"max_turn_chars": 20}', None)
    assert merged["model_spec"] == {"llm": "a", "embedding": "e"}
    assert merged["config"] == {"max_turn_chars": 20, "extraction": False}
    assert merged["state"] == "ACTIVE"
    stored = {k: v for k, v in _row(db, "m").items() if k != "granted_roles"}
    assert merged == stored, "the returned row is the stored row"
    assert merged["created_at"] == created["created_at"]
    assert merged["updated_at"] > created["updated_at"]

    reset = _update(db, "m", '{"llm": null}', '{"extraction": null}', None)
    assert reset["model_spec"] == {"embedding": "e"}
    assert reset["config"] == {"max_turn_chars": 20}

    untouched = _update(db, "m", None, None, None)
    assert (untouched["model_spec"], untouched["config"]) == (
        {"embedding": "e"},
        {"max_turn_chars": 20},
    )


def test_namespace_update_changes_state_both_ways(db: Database) -> None:
    db.sql("SELECT aidb_memory.init('s')", user=ADMIN_USER)
    assert _update(db, "s", None, None, "INACTIVE")["state"] == "INACTIVE"
    assert _row(db, "s")["state"] == "INACTIVE"
    assert _update(db, "s", None, None, None)["state"] == "INACTIVE", "NULL leaves state alone"
    assert _update(db, "s", None, None, "active")["state"] == "ACTIVE"
    assert _row(db, "s")["state"] == "ACTIVE"


@pytest.mark.parametrize(
    ("datestyle", "timezone"),
    [("Postgres, MDY", "Asia/Kolkata"), ("SQL, DMY", "America/St_Johns"), ("ISO", "UTC")],
)
def test_namespace_update_returns_exact_timestamps_whatever_the_datestyle(
    db: Database, datestyle: str, timezone: str
) -> None:
    db.sql("SELECT aidb_memory.init('t')", user=ADMIN_USER)
    with db.connect(ADMIN_USER) as conn:
        conn.execute(f"SET datestyle = '{datestyle}'")
        conn.execute(f"SET timezone = '{timezone}'")
        # Compared in SQL (a client cannot parse every DateStyle either), in a later statement
        # than the update so that the view shows the updated row.
        conn.execute(
            "CREATE TEMP TABLE returned AS "
            "SELECT * FROM aidb_memory.namespace_update('t', NULL, NULL, 'INACTIVE')"
        )
        row = conn.execute(
            """SELECT (r.created_at - n.created_at)::text, (r.updated_at - n.updated_at)::text,
                      n.state
               FROM returned r JOIN aidb_memory.namespaces n USING (id)"""
        ).fetchone()
    assert row == ("00:00:00", "00:00:00", "INACTIVE")


def test_namespace_update_of_an_unknown_namespace_is_42704(db: Database) -> None:
    before = _stored(db)
    e = _error(db, "SELECT * FROM aidb_memory.namespace_update('nope', NULL, NULL, 'INACTIVE')")
    assert e.sqlstate == "42704"
    assert e.diag.message_primary == (
        'aidb_memory.namespace_update: namespace "nope" does not exist'
    )
    assert e.diag.message_hint and "aidb_memory.init" in e.diag.message_hint
    assert _stored(db) == before


# --- validation errors ---------------------------------------------------------------------

_INIT = "SELECT aidb_memory.init(%s, %s::jsonb, %s::jsonb)"
_UPDATE = "SELECT * FROM aidb_memory.namespace_update(%s, %s::jsonb, %s::jsonb, %s)"

_CASES: list[tuple[str, tuple[Any, ...], str, str]] = [
    # (query, params, sqlstate, message)
    (_INIT, (None, "{}", "{}"), "22004", "aidb_memory.init: name must not be NULL"),
    (_INIT, ("", "{}", "{}"), "22023", "aidb_memory.init: name must be non-empty"),
    (_INIT, (" x", "{}", "{}"), "22023", "aidb_memory.init: name must be non-empty"),
    (_INIT, ("x" * 129, "{}", "{}"), "22023", "aidb_memory.init: name is longer than 128"),
    (_INIT, ("a\x01b", "{}", "{}"), "22023", "aidb_memory.init: name must not contain control"),
    (_INIT, ("a\nb", "{}", "{}"), "22023", "aidb_memory.init: name must not contain control"),
    (_INIT, ("ab\n", "{}", "{}"), "22023", "aidb_memory.init: name must not contain control"),
    (_INIT, ("a\x85b", "{}", "{}"), "22023", "aidb_memory.init: name must not contain control"),
    (_INIT, ("a\u2028b", "{}", "{}"), "22023", "aidb_memory.init: name must not contain contr"),
    (_INIT, ("x", "[]", "{}"), "22023", "aidb_memory.init: model_spec must be a JSON object"),
    (_INIT, ("x", '"gpt"', "{}"), "22023", "aidb_memory.init: model_spec must be a JSON object"),
    (_INIT, ("x", "null", "{}"), "22023", "aidb_memory.init: model_spec must be a JSON object"),
    (_INIT, ("x", "{}", "[1]"), "22023", "aidb_memory.init: config must be a JSON object"),
    (_INIT, ("x", "{}", "3"), "22023", "aidb_memory.init: config must be a JSON object"),
    (_INIT, ("x", '{"chat": "m"}', "{}"), "22023", "aidb_memory.init: model_spec.chat is not a"),
    (_INIT, ("x", '{"llm": 5}', "{}"), "22023", "aidb_memory.init: model_spec.llm must be"),
    (_INIT, ("x", '{"llm": ""}', "{}"), "22023", "aidb_memory.init: model_spec.llm must be"),
    (
        _INIT,
        ("x", "{}", '{"max_turn_chrs": 1}'),
        "22023",
        "aidb_memory.init: config.max_turn_chrs is not a known key",
    ),
    (
        _INIT,
        ("x", "{}", '{"max_turn_chars": "5"}'),
        "22023",
        "aidb_memory.init: config.max_turn_chars must be an integer",
    ),
    (
        _INIT,
        ("x", "{}", '{"max_turn_chars": 2.5}'),
        "22023",
        "aidb_memory.init: config.max_turn_chars must be an integer",
    ),
    (
        _INIT,
        ("x", "{}", '{"max_turn_chars": 0}'),
        "22023",
        "aidb_memory.init: config.max_turn_chars must be between",
    ),
    (
        _INIT,
        ("x", "{}", '{"extraction": "yes"}'),
        "22023",
        "aidb_memory.init: config.extraction must be true or false",
    ),
    (
        _INIT,
        ("x", "{}", '{"actor_binding": "root"}'),
        "22023",
        "aidb_memory.init: config.actor_binding must be one of",
    ),
    (
        _UPDATE,
        (None, None, None, None),
        "22004",
        "aidb_memory.namespace_update: name must not be NULL",
    ),
    (
        _UPDATE,
        ("pg_agents", "[]", None, None),
        "22023",
        "aidb_memory.namespace_update: model_spec must be a JSON object",
    ),
    (
        _UPDATE,
        ("pg_agents", '{"embedding": 3}', None, None),
        "22023",
        "aidb_memory.namespace_update: model_spec.embedding must be",
    ),
    (
        _UPDATE,
        ("pg_agents", None, '"x"', None),
        "22023",
        "aidb_memory.namespace_update: config must be a JSON object",
    ),
    (
        _UPDATE,
        ("pg_agents", None, '{"max_turn_chrs": 5}', None),
        "22023",
        "aidb_memory.namespace_update: config.max_turn_chrs is not a known key",
    ),
    (
        _UPDATE,
        ("pg_agents", None, '{"max_turn_chrs": null}', None),
        "22023",
        "aidb_memory.namespace_update: config.max_turn_chrs is not a known key",
    ),
    (
        _UPDATE,
        ("pg_agents", None, '{"llm_timeout_s": true}', None),
        "22023",
        "aidb_memory.namespace_update: config.llm_timeout_s must be an integer",
    ),
    (
        _UPDATE,
        ("pg_agents", None, '{"text_search_config": "English"}', None),
        "22023",
        "aidb_memory.namespace_update: config.text_search_config must be the name of a text "
        "search configuration in pg_catalog",
    ),
    (
        _INIT,
        ("x", "{}", '{"text_search_config": "klingon"}'),
        "22023",
        "aidb_memory.init: config.text_search_config names no text search configuration of "
        'pg_catalog ("klingon")',
    ),
    (
        _UPDATE,
        ("pg_agents", None, '{"text_search_config": "public.english"}', None),
        "22023",
        "aidb_memory.namespace_update: config.text_search_config must be the name",
    ),
    (
        _UPDATE,
        ("pg_agents", None, None, "DELETED"),
        "22023",
        "aidb_memory.namespace_update: state must be ACTIVE or INACTIVE",
    ),
    (
        _UPDATE,
        ("pg_agents", '{"llm": "ok"}', '{"extraction": "no"}', "INACTIVE"),
        "22023",
        "aidb_memory.namespace_update: config.extraction must be true or false",
    ),
]


@pytest.fixture(scope="module")
def unchanged_db(pg_server: ThrowawayServer, template_db: Database) -> Iterator[Database]:
    """One database for the error cases: each checks that it leaves the database unchanged."""
    database = _create_database(pg_server, template_db.name)
    try:
        yield database
    finally:
        _drop_database(database)


@pytest.mark.parametrize(("query", "params", "sqlstate", "message"), _CASES)
def test_bad_arguments_are_clean_sql_errors_and_store_nothing(
    unchanged_db: Database, query: str, params: tuple[Any, ...], sqlstate: str, message: str
) -> None:
    db = unchanged_db
    before = _stored(db)
    assert before, "pg_agents at least"
    e = _error(db, query, params)
    assert e.sqlstate == sqlstate, e
    primary = e.diag.message_primary or ""
    assert primary.startswith(message), primary
    assert "\n" not in primary
    assert "Traceback" not in primary
    assert _stored(db) == before


def test_unknown_config_key_hint_lists_the_known_keys(db: Database) -> None:
    e = _error(db, _INIT, ("x", "{}", '{"max_turn_chrs": 1}'))
    assert e.diag.message_hint is not None
    assert "max_turn_chars" in e.diag.message_hint


# --- concurrency ---------------------------------------------------------------------------


def _wait_for_lock_waiters(db: Database, count: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        waiting = db.value(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        if waiting == count:
            return
        time.sleep(0.05)
    raise AssertionError(f"expected {count} sessions waiting on a lock")


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_concurrent_init_of_a_new_name_returns_one_id(db: Database, outcome: str) -> None:
    """Several sessions create the same name while a first one has not committed yet."""
    workers = 5
    results: list[int] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            with db.connect(ADMIN_USER) as conn:
                row = conn.execute("SELECT aidb_memory.init('race')").fetchone()
                assert row is not None
                results.append(row[0])
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    with db.connect(ADMIN_USER, autocommit=False) as first:
        row = first.execute("SELECT aidb_memory.init('race')").fetchone()
        assert row is not None
        first_id = row[0]
        threads = [threading.Thread(target=call) for _ in range(workers)]
        for t in threads:
            t.start()
        _wait_for_lock_waiters(db, workers)
        if outcome == "commit":
            first.commit()
        else:
            first.rollback()
        for t in threads:
            t.join(TIMEOUT_S)
    assert errors == []
    assert len(results) == workers
    assert len(set(results)) == 1
    stored = db.sql("SELECT id FROM aidb_memory.namespaces WHERE name = 'race'")
    assert stored == [(results[0],)]
    if outcome == "commit":
        assert results[0] == first_id


def test_simultaneous_init_from_many_connections_returns_one_id(db: Database) -> None:
    workers = 8
    barrier = threading.Barrier(workers)
    results: list[int] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            with db.connect(ADMIN_USER) as conn:
                conn.execute("SELECT aidb_memory.version()")  # connected and warmed up
                barrier.wait(TIMEOUT_S)
                row = conn.execute(
                    "SELECT aidb_memory.init('together', '{}', '{\"extraction\": false}')"
                ).fetchone()
                assert row is not None
                results.append(row[0])
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S * 2)
    assert errors == []
    assert len(results) == workers and len(set(results)) == 1
    stored = db.sql("SELECT id, config FROM aidb_memory.namespaces WHERE name = 'together'")
    assert stored == [(results[0], {"extraction": False})]


def test_json_round_trip_keeps_unicode_and_large_values(db: Database) -> None:
    spec = {"llm": "modèle-名前"}
    _register(db, "modèle-名前")
    cfg = {"max_turn_chars": 10_000_000, "actor_binding": "session_user"}
    db.sql(
        "SELECT aidb_memory.init('ü', %s::jsonb, %s::jsonb)",
        (json.dumps(spec), json.dumps(cfg)),
        user=ADMIN_USER,
    )
    row = _row(db, "ü")
    assert (row["model_spec"], row["config"]) == (spec, cfg)


def _multixact_versions(db: Database) -> list[tuple[Any, ...]]:
    """The namespace table's row versions whose xmax is a MultiXact (pageinspect: a dead version
    stays on its page, unseen by SELECT, until a vacuum)."""
    return db.sql(
        """
        SELECT p.blkno, i.lp, i.t_xmax::text
        FROM generate_series(0, pg_relation_size('aidb_memory.namespace')
                                / current_setting('block_size')::int - 1) AS p(blkno),
             heap_page_items(get_raw_page('aidb_memory.namespace', p.blkno::int)) AS i
        WHERE i.t_infomask & 4096 <> 0  -- HEAP_XMAX_IS_MULTI
        """
    )


def test_admin_changes_leave_no_multixact_in_the_namespace_rows(db: Database) -> None:
    # Every call of every actor reads its namespace's row; a version of it whose xmax is a
    # MultiXact is resolved again by each of those reads until a vacuum (which a table of a few
    # rows rarely gets): ~10 us of each add (bench/README.md, issue 35). Each statement of the
    # Python code is a subtransaction of its own, and a row locked by one and written by another
    # leaves one behind.
    db.sql("CREATE EXTENSION IF NOT EXISTS pageinspect")
    db.sql("CREATE ROLE mx_tenant IN ROLE aidb_users")
    try:
        db.sql("SELECT aidb_memory.init('mx', '{}', '{\"extraction\": false}')", user=ADMIN_USER)
        before = _multixact_versions(db)
        db.sql("SELECT aidb_memory.namespace_grant('mx', 'mx_tenant')", user=ADMIN_USER)
        db.sql("SELECT aidb_memory.namespace_grant('mx', 'mx_tenant')", user=ADMIN_USER)
        db.sql(
            "SELECT aidb_memory.namespace_update('mx', NULL, '{\"max_turns_per_add\": 9}')",
            user=ADMIN_USER,
        )
        db.sql("SELECT aidb_memory.namespace_revoke('mx', 'mx_tenant')", user=ADMIN_USER)
        assert _multixact_versions(db) == before
        row = _row(db, "mx")
        assert row["config"]["max_turns_per_add"] == 9
        assert (
            db.value(
                "SELECT (restricted, grant_role_ids, grant_role_names)::text "
                "FROM aidb_memory.namespace WHERE name = 'mx'"
            )
            == "(f,{},{})"
        )
    finally:
        db.sql("DROP ROLE mx_tenant")  # roles are the cluster's; the database is the test's


def test_a_changed_namespace_row_is_vacuumed_soon(server_pylib: Path, template_db: object) -> None:
    # Migration 0030: the namespace table is vacuumed after any change, so that the row version a
    # change leaves behind is not visited by every call for long (autovacuum's default thresholds
    # wait for 50 dead rows). A server of its own, which looks for work every second.
    server = ThrowawayServer(postgres_args="-c autovacuum_naptime=1")
    try:
        with psycopg.connect(server.dsn()) as setup:
            install(setup, Package.load(), say=lambda _line: None)
            setup.commit()
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute(
                "INSERT INTO aidb_memory.runtime_settings (key, value) "
                "VALUES ('server_pythonpath', %s) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(server_pylib),),
            )
            conn.execute("SELECT aidb_memory.init('av', '{}', '{\"extraction\": false}')")
            conn.execute("VACUUM aidb_memory.namespace")
            conn.execute(
                "SELECT aidb_memory.namespace_update('av', NULL, '{\"max_turns_per_add\": 9}')"
            )
            changed = conn.execute("SELECT clock_timestamp()").fetchone()
            vacuumed = (
                "SELECT coalesce(last_autovacuum > %s, false) FROM pg_catalog.pg_stat_user_tables "
                "WHERE relid = 'aidb_memory.namespace'::regclass"
            )
            deadline = time.monotonic() + TIMEOUT_S
            while conn.execute(vacuumed, changed).fetchone() != (True,):
                assert time.monotonic() < deadline, "no vacuum of the namespace table"
                time.sleep(0.2)
    finally:
        server.stop()
