"""The installed schema against the rules Citus sets for distributed and reference tables
(docs/scaling.md, "The rules it follows"; issue 15).

These catalog checks hold the schema to Citus's rules without a cluster
(tests/db/test_citus_cluster.py runs ``install --citus`` and the API on a real one): each rule is
checked on the installed schema, and each check is shown to fail on a table or constraint built
to break it (in a transaction that is rolled back). ``install --citus`` itself runs against a
stand-in for Citus's functions and catalog (the calls it makes, their order, the foreign keys
around them, idempotence), and is refused on a database without the citus extension.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from aidb_memory.connection import CliError
from aidb_memory.install import citus
from aidb_memory.install.citus import Catalog
from aidb_memory.throwaway import ThrowawayServer
from conftest import Database, run_cli

# Rules the schema still breaks; each needs a change of the schema (reported with issue 15).
# strict: once the schema follows the rule, the test fails until the mark goes.
KNOWN: dict[str, str] = {}


def _catalog(db: Database) -> Catalog:
    with db.connect() as conn:
        return citus.read_catalog(conn)


def test_every_table_is_of_a_known_kind(db: Database) -> None:
    """The per-actor tables (those with actor_key) are the list the statements distribute by it,
    and no table is left out of the statements."""
    cat = _catalog(db)
    assert citus.classification(cat) == []
    assert sorted(cat.per_actor) == sorted(citus.PER_ACTOR_TABLES)
    assert sorted(s.table for s in citus.statements()) == cat.tables


@pytest.mark.parametrize(
    "rule",
    [
        pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=KNOWN[r])) if r in KNOWN else r
        for r in citus.RULES
    ],
)
def test_installed_schema_follows(db: Database, rule: str) -> None:
    assert citus.RULES[rule](_catalog(db)) == []


def test_triggers_on_per_actor_tables_are_listed(db: Database) -> None:
    """Every trigger is looked at against the Citus rules for triggers: a new one fails here."""
    cat = _catalog(db)
    found = sorted((t, n) for t, n, _row in cat.triggers)
    assert found == sorted(citus.PER_ACTOR_TRIGGERS)


def test_statements_follow_the_installed_foreign_keys(db: Database) -> None:
    """A referenced table is distributed before every table that references it."""
    order = [s.table for s in citus.statements()]
    fks = [fk for fk in _catalog(db).foreign_keys if fk.table != fk.references]
    assert fks
    for fk in fks:
        assert order.index(fk.references) < order.index(fk.table), fk.name


# Each rule fails on something built to break it: (rule, DDL, a line the rule must report).
BROKEN = [
    (
        "key_not_null",
        "CREATE TABLE aidb_memory.scratch (actor_key integer PRIMARY KEY)",
        "scratch.actor_key is integer, not bigint",
    ),
    (
        "key_not_null",
        "CREATE TABLE aidb_memory.scratch (actor_key bigint, id bigint PRIMARY KEY)",
        "scratch.actor_key may be NULL",
    ),
    (
        "no_identity",
        "ALTER TABLE aidb_memory.turn ADD COLUMN scratch bigint GENERATED ALWAYS AS IDENTITY",
        "turn.scratch is an identity column",
    ),
    (
        "no_identity",
        "CREATE SEQUENCE aidb_memory.scratch_seq AS integer",
        "sequence scratch_seq is integer, not bigint",
    ),
    (
        "unique_has_key",
        "CREATE UNIQUE INDEX scratch_idx ON aidb_memory.memory (public_id) WHERE valid_to IS NULL",
        "partial unique index scratch_idx on memory (public_id) lacks actor_key",
    ),
    (
        "unique_has_key",
        "ALTER TABLE aidb_memory.event ADD CONSTRAINT scratch_key UNIQUE (public_id)",
        "unique index scratch_key on event (public_id) lacks actor_key",
    ),
    (
        "unique_has_key",
        "CREATE UNIQUE INDEX scratch_idx ON aidb_memory.model_usage (at)",
        "unique index scratch_idx on model_usage (at) lacks id",
    ),
    (
        "fk_between_actors",
        "ALTER TABLE aidb_memory.summary ADD CONSTRAINT scratch_fk FOREIGN KEY "
        "(actor_key, session_ref) REFERENCES aidb_memory.session (id, actor_key)",
        "foreign key scratch_fk (summary -> session) does not pair actor_key with actor_key",
    ),
    (
        "fk_between_actors",
        "ALTER TABLE aidb_memory.model ADD COLUMN k bigint, ADD COLUMN s bigint, "
        "ADD CONSTRAINT scratch_fk FOREIGN KEY (k, s) "
        "REFERENCES aidb_memory.session (actor_key, id)",
        "foreign key scratch_fk goes from model, which is not per actor, to session",
    ),
    (
        "fk_between_actors",
        "ALTER TABLE aidb_memory.event ADD COLUMN u bigint, ADD CONSTRAINT scratch_fk "
        "FOREIGN KEY (u) REFERENCES aidb_memory.model_usage (id)",
        "foreign key scratch_fk goes from event to model_usage, which is not a reference table",
    ),
    (
        "fk_actions",
        "ALTER TABLE aidb_memory.summary ADD CONSTRAINT scratch_fk FOREIGN KEY "
        "(actor_key, session_ref) REFERENCES aidb_memory.session (actor_key, id) ON UPDATE CASCADE",
        "foreign key scratch_fk on summary: ON UPDATE CASCADE",
    ),
    (
        "fk_actions",
        "ALTER TABLE aidb_memory.summary ADD CONSTRAINT scratch_fk FOREIGN KEY "
        "(actor_key, session_ref) REFERENCES aidb_memory.session (actor_key, id) "
        "ON DELETE SET DEFAULT (session_ref)",
        "foreign key scratch_fk on summary: ON DELETE SET DEFAULT",
    ),
    (
        "set_null_keeps_key",
        "ALTER TABLE aidb_memory.summary ADD CONSTRAINT scratch_fk FOREIGN KEY "
        "(actor_key, session_ref) REFERENCES aidb_memory.session (actor_key, id) "
        "ON DELETE SET NULL",
        "foreign key scratch_fk on summary sets actor_key on delete",
    ),
    (
        "set_null_keeps_key",
        "ALTER TABLE aidb_memory.summary ADD CONSTRAINT scratch_fk FOREIGN KEY "
        "(actor_key, session_ref) REFERENCES aidb_memory.session (actor_key, id) "
        "ON DELETE SET NULL (actor_key)",
        "foreign key scratch_fk on summary sets actor_key on delete",
    ),
    (
        "row_triggers_only",
        "CREATE TRIGGER scratch_t AFTER INSERT ON aidb_memory.turn FOR EACH STATEMENT "
        "EXECUTE FUNCTION aidb_memory.compaction_locks_removed()",
        "trigger scratch_t on turn is a statement trigger",
    ),
    (
        "row_triggers_only",
        "CREATE TRIGGER scratch_t AFTER INSERT ON aidb_memory.namespace FOR EACH ROW "
        "EXECUTE FUNCTION aidb_memory.compaction_locks_removed()",
        "trigger scratch_t on namespace, which is not per actor",
    ),
    (
        "has_primary_key",
        "ALTER TABLE aidb_memory.audit_key DROP CONSTRAINT audit_key_pkey",
        "audit_key has no primary key",
    ),
    (
        "classification",
        "CREATE TABLE aidb_memory.scratch (actor_key bigint PRIMARY KEY)",
        "table scratch has actor_key but is not per actor here",
    ),
    (
        "classification",
        "CREATE TABLE aidb_memory.scratch (id bigint PRIMARY KEY)",
        "table scratch is of no kind known here",
    ),
    (
        "classification",
        "ALTER TABLE aidb_memory.compaction_ahead DROP COLUMN actor_key CASCADE",
        "table compaction_ahead is per actor here but has no actor_key",
    ),
]


def test_every_rule_is_broken_below() -> None:
    assert {rule for rule, _ddl, _line in BROKEN} == {*citus.RULES, "classification"}


@pytest.mark.parametrize(("rule", "ddl", "line"), BROKEN)
def test_check_catches(db: Database, rule: str, ddl: str, line: str) -> None:
    check = citus.classification if rule == "classification" else citus.RULES[rule]
    with db.connect(autocommit=False) as conn:
        before = check(citus.read_catalog(conn))
        conn.execute(ddl.encode())
        after = check(citus.read_catalog(conn))
        conn.rollback()
    assert line not in before
    assert line in after, after


# --- install --citus against a stand-in for Citus ---------------------------------------------

# Citus's functions and pg_dist_partition, as far as install --citus uses them: each call is
# recorded with the number of foreign keys its table is in at that moment.
FAKE_CITUS = """
SET allow_system_table_mods = on;
CREATE TABLE pg_catalog.pg_dist_partition (
    logicalrelid regclass, partmethod "char", partkey text, repmodel "char");
CREATE TABLE public.citus_calls (n serial, call text, fks int, settings text);
CREATE FUNCTION public.fks(regclass) RETURNS int LANGUAGE sql AS $$
    SELECT count(*)::int FROM pg_catalog.pg_constraint
    WHERE contype = 'f' AND (conrelid = $1 OR confrelid = $1) $$;
CREATE FUNCTION public.settings() RETURNS text LANGUAGE sql AS $$
    SELECT current_setting('citus.multi_shard_modify_mode', true) || ' '
           || current_setting('citus.enable_unsafe_triggers', true) $$;
CREATE FUNCTION pg_catalog.create_reference_table(regclass) RETURNS void LANGUAGE sql AS $$
    INSERT INTO public.citus_calls (call, fks, settings)
    VALUES (format('reference %s', $1), public.fks($1), public.settings());
    INSERT INTO pg_catalog.pg_dist_partition VALUES ($1, 'n', NULL, 't') $$;
CREATE FUNCTION pg_catalog.create_distributed_table(
    regclass, text, colocate_with text DEFAULT 'default') RETURNS void LANGUAGE sql AS $$
    INSERT INTO public.citus_calls (call, fks, settings)
    VALUES (format('distributed %s %s %s', $1, $2, $3), public.fks($1), public.settings());
    INSERT INTO pg_catalog.pg_dist_partition VALUES ($1, 'h', $2, 's') $$;
CREATE FUNCTION pg_catalog.column_to_column_name(regclass, text) RETURNS text
    LANGUAGE sql AS $$ SELECT $2 $$;
"""


@pytest.fixture
def fake_citus(db: Database, monkeypatch: pytest.MonkeyPatch) -> Database:
    with db.connect() as conn:
        conn.execute(FAKE_CITUS.encode())
    monkeypatch.setattr(citus, "citus_version", lambda _conn: "13.0 (stand-in)")
    # The schema of migration 0015 breaks rules (KNOWN above) that a real Citus would refuse;
    # the stand-in does not, and what is tested here is what install --citus runs.
    monkeypatch.setattr(citus, "check", lambda _cat: None)
    return db


def _foreign_keys(db: Database) -> set[tuple[Any, ...]]:
    return set(
        db.sql(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) "
            "FROM pg_constraint WHERE contype = 'f' AND connamespace = 'aidb_memory'::regnamespace"
        )
    )


def _expected_calls(tables: list[str] | None = None) -> list[str]:
    out = []
    for s in citus.statements():
        if tables is not None and s.table not in tables:
            continue
        if s.kind == "reference":
            out.append(f"reference aidb_memory.{s.table}")
        else:
            column = citus.KEY if s.kind == "per actor" else citus.BY_ID_COLUMN
            anchored = s.kind == "per actor" and s.table != citus.ANCHOR
            colocate = "aidb_memory.session" if anchored else "none"
            out.append(f"distributed aidb_memory.{s.table} {column} {colocate}")
    return out


# The functions that pin generic plans, which install --citus makes plan each call.
GENERIC_FUNCTIONS = [
    "aidb_memory.get_memory(text,text,uuid,text,boolean)",
    "aidb_memory.get_memory_py(text,text,uuid,text,boolean)",
    "aidb_memory.search(text,text,text,integer,text,text,double precision[],jsonb,integer)",
    "aidb_memory.search_py(text,text,text,integer,text,text,double precision[],jsonb,integer)",
    "aidb_memory.session_get(text,text,text,integer,text,integer,integer)",
    "aidb_memory.session_messages(text,text,text,integer,text,integer,integer,text)",
]
# The functions with add's writes routed to one shard, which install --citus makes run them.
ROUTED_FUNCTIONS = [
    "aidb_memory.add(text,text,jsonb,text,text,text,jsonb)",
    "aidb_memory.add_fast(text,text,jsonb,text,text,text,jsonb)",
]
# The reads that install --citus makes run without a transaction block on the worker.
OWN_SNAPSHOT_FUNCTIONS = [
    "aidb_memory.search(text,text,text,integer,text,text,double precision[],jsonb,integer)",
    "aidb_memory.search_fast(text,text,text,integer,text,text,double precision[],jsonb,integer)",
    "aidb_memory.session_get(text,text,text,integer,text,integer,integer)",
    "aidb_memory.session_messages(text,text,text,integer,text,integer,integer,text)",
]


def test_distribute_runs_the_statements_once(fake_citus: Database) -> None:
    db = fake_citus
    before = _foreign_keys(db)
    said: list[str] = []
    with db.connect(autocommit=False) as conn:
        ran = citus.distribute(conn, say=said.append)
    calls = db.sql("SELECT call, fks, settings FROM public.citus_calls ORDER BY n")
    assert [c for c, _f, _s in calls] == _expected_calls()
    # No table is in a foreign key while Citus takes it; they are all back, unchanged, after.
    assert {f for _c, f, _s in calls} == {0}
    assert {s for _c, _f, s in calls} == {"sequential on"}
    assert _foreign_keys(db) == before
    assert ran[: len(citus.SETTINGS)] == citus.SETTINGS
    assert len([r for r in ran if "DROP CONSTRAINT" in r]) == len(before)
    assert said[0] == "citus: reference table aidb_memory.namespace"
    # Then the functions pinned to generic plans plan each call, every SECURITY DEFINER
    # function runs without JIT, add writes by statements routed to one shard, and the reads
    # run without a transaction block on the worker.
    definers = db.value(
        "SELECT count(*) FROM pg_catalog.pg_proc "
        "WHERE pronamespace = 'aidb_memory'::regnamespace AND prosecdef"
    )
    custom = [f"citus: {f} plans each call ({citus.CUSTOM_PLANS})" for f in GENERIC_FUNCTIONS]
    routed = [
        f"citus: {f} writes by statements on one shard ({citus.SHARD_ROUTED})"
        for f in ROUTED_FUNCTIONS
    ] + [
        f"citus: {f} reads without a transaction block on the worker ({citus.OWN_SNAPSHOTS})"
        for f in OWN_SNAPSHOT_FUNCTIONS
    ]
    assert said[-2 - len(custom) - len(routed) :] == [
        f"citus: {len(before)} foreign keys added again (Citus checked each)",
        *custom,
        f"citus: {definers} functions run without JIT ({citus.NO_JIT})",
        *routed,
    ]
    no_jit = [r for r in ran if r.endswith(f" SET {citus.NO_JIT}")]
    assert len(no_jit) == definers > 50
    asked = [f"ALTER FUNCTION {f} SET {citus.SHARD_ROUTED}" for f in ROUTED_FUNCTIONS] + [
        f"ALTER FUNCTION {f} SET {citus.OWN_SNAPSHOTS}" for f in OWN_SNAPSHOT_FUNCTIONS
    ]
    tail = len(asked) + definers
    assert ran[-len(GENERIC_FUNCTIONS) - tail : -tail] == [
        f"ALTER FUNCTION {f} SET {citus.CUSTOM_PLANS}" for f in GENERIC_FUNCTIONS
    ]
    assert ran[-len(asked) :] == asked
    assert (
        db.value(
            "SELECT count(*) FROM pg_catalog.pg_proc "
            "WHERE pronamespace = 'aidb_memory'::regnamespace "
            "AND prosecdef AND 'jit=off' = ANY (proconfig)"
        )
        == definers
    )
    assert db.sql(
        "SELECT oid::regprocedure::text FROM pg_catalog.pg_proc "
        "WHERE 'aidb_memory.shard_routed=on' = ANY (proconfig) ORDER BY 1"
    ) == [(f,) for f in ROUTED_FUNCTIONS]
    assert db.sql(
        "SELECT oid::regprocedure::text FROM pg_catalog.pg_proc "
        "WHERE 'citus.select_opens_transaction_block=off' = ANY (proconfig) ORDER BY 1"
    ) == [(f,) for f in OWN_SNAPSHOT_FUNCTIONS]
    verify = run_cli("verify", dsn=db.dsn())
    assert verify.returncode == 0, verify.stderr

    # Again: nothing to do, nothing done.
    said.clear()
    with db.connect(autocommit=False) as conn:
        assert citus.distribute(conn, say=said.append) == []
    assert said == ["citus: every table is distributed already (Citus 13.0 (stand-in))"]
    assert db.value("SELECT count(*) FROM public.citus_calls") == len(calls)

    # A table a later migration adds (here: two not distributed yet): only those, and only the
    # foreign keys they are in.
    db.sql(
        "DELETE FROM pg_catalog.pg_dist_partition "
        "WHERE logicalrelid IN ('aidb_memory.memory_history'::regclass, "
        "'aidb_memory.audit_log'::regclass)"
    )
    with db.connect(autocommit=False) as conn:
        ran = citus.distribute(conn, say=said.append)
    new = db.sql("SELECT call FROM public.citus_calls ORDER BY n")[len(calls) :]
    assert [c for (c,) in new] == _expected_calls(["memory_history", "audit_log"])
    assert len([r for r in ran if "DROP CONSTRAINT" in r]) == 3  # memory, event, namespace
    assert _foreign_keys(db) == before


def test_distribute_refuses_a_table_held_another_way(fake_citus: Database) -> None:
    db = fake_citus
    db.sql(
        "INSERT INTO pg_catalog.pg_dist_partition VALUES ('aidb_memory.session', 'n', NULL, 't')"
    )
    with db.connect(autocommit=False) as conn, pytest.raises(CliError) as e:
        citus.distribute(conn, say=lambda _line: None)
    assert str(e.value) == (
        "aidb-memory: install --citus refused: aidb_memory.session is a Citus reference table, "
        "not distributed by actor_key (hint: undistribute_table it, then run install --citus "
        "again; docs/scaling.md)"
    )
    assert db.value("SELECT count(*) FROM public.citus_calls") == 0


def test_real_check_passes_this_schema_and_refuses_a_broken_one(db: Database) -> None:
    """This version's schema follows every rule; one that breaks a rule is refused before any
    call, in one line naming the first problem."""
    with db.connect(autocommit=False) as conn:
        assert citus.violations(citus.read_catalog(conn)) == []
        citus.check(citus.read_catalog(conn))  # no error
        conn.execute(
            "CREATE UNIQUE INDEX scratch_idx ON aidb_memory.summary (session_ref, from_seq)"
        )
        cat = citus.read_catalog(conn)
        conn.rollback()
    problems = citus.violations(cat)
    assert problems
    with pytest.raises(CliError) as e:
        citus.check(cat)
    assert str(e.value).startswith(f"aidb-memory: install --citus refused: {problems[0]}")
    assert "\n" not in str(e.value)


# --- the command ------------------------------------------------------------------------------


@pytest.fixture
def empty_db(pg_server: ThrowawayServer) -> Iterator[Database]:
    name = f"citus_empty_{id(pg_server)}"
    with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield Database(pg_server, name)
    finally:
        with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_install_citus_is_refused_without_citus(empty_db: Database) -> None:
    result = run_cli("install", "--citus", dsn=empty_db.dsn())
    assert result.returncode == 1
    assert result.stderr == citus.NO_CITUS + "\n"
    # Refused before anything was done.
    assert empty_db.value("SELECT to_regnamespace('aidb_memory') IS NULL") is True


def test_install_citus_dry_run_prints_the_statements(empty_db: Database) -> None:
    result = run_cli("install", "--citus", "--dry-run", dsn=empty_db.dsn())
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "citus: warning: the citus extension is not installed in this database" in lines
    would = [ln.removeprefix("citus: would run: ") for ln in lines if "would run" in ln]
    assert would == [s.sql for s in citus.statements()]
    assert empty_db.value("SELECT to_regnamespace('aidb_memory') IS NULL") is True


def test_module_prints_the_statements_and_checks_a_database(db: Database) -> None:
    def module(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "aidb_memory.install.citus", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    printed = module("statements")
    assert printed.returncode == 0
    assert printed.stdout.splitlines() == [s.sql + ";" for s in citus.statements()]
    checked = module("check", db.dsn())
    cat = _catalog(db)
    problems = citus.classification(cat) + citus.violations(cat)
    assert checked.returncode == (1 if problems else 0), checked.stderr
    assert checked.stdout.splitlines() == problems


def test_the_module_path_before_the_move_still_runs() -> None:
    # Operators ran `python -m aidb_memory.citus` before it moved under install/ (issue 28).
    printed = subprocess.run(
        [sys.executable, "-m", "aidb_memory.citus", "statements"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines() == [s.sql + ";" for s in citus.statements()]
