"""The migration engine against a real server: install, upgrade, drift, ``sql``, uninstall.

Every check goes through the ``aidb-memory`` command in a separate process, as a user runs it,
and compares catalog snapshots taken with plain SQL.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pglast
import pytest

from aidb_memory import __version__
from aidb_memory.connection import CliError
from aidb_memory.install.installer import Package, install, uninstall
from aidb_memory.install.migrations import load_migrations
from aidb_memory.install.script import INSTALL_LOCK_KEY
from aidb_memory.install.sources import SourceTree
from aidb_memory.throwaway import ThrowawayServer
from conftest import Database, _create_database, _drop_database, psql, run_cli

ROLES = ("aidb_users", "aidb_admins", "aidb_workers")
INSTALLER_TABLES = {"schema_migrations", "runtime_modules", "runtime_settings"}

# Each query returns rows that do not depend on OIDs, so two databases can be compared.
_SNAPSHOT_QUERIES = {
    "schema": """
        SELECT n.nspname, pg_get_userbyid(n.nspowner), n.nspacl::text,
               obj_description(n.oid, 'pg_namespace')
        FROM pg_namespace n WHERE n.nspname = 'aidb_memory'""",
    "functions": """
        SELECT p.oid::regprocedure::text, p.prokind,
               CASE WHEN p.prokind <> 'a' THEN pg_get_functiondef(p.oid) END,
               p.proacl::text, p.prosecdef, p.proconfig::text, pg_get_userbyid(p.proowner),
               obj_description(p.oid, 'pg_proc')
        FROM pg_proc p WHERE p.pronamespace::regnamespace::text = 'aidb_memory'""",
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.relacl::text, pg_get_userbyid(c.relowner),
               CASE WHEN c.relkind IN ('v', 'm') THEN pg_get_viewdef(c.oid) END,
               CASE WHEN c.relkind = 'i' THEN pg_get_indexdef(c.oid) END,
               obj_description(c.oid, 'pg_class')
        FROM pg_class c WHERE c.relnamespace::regnamespace::text = 'aidb_memory'""",
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               a.attidentity, a.attgenerated, pg_get_expr(d.adbin, d.adrelid), a.attacl::text,
               col_description(c.oid, a.attnum)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace::regnamespace::text = 'aidb_memory'
          AND a.attnum > 0 AND NOT a.attisdropped""",
    "constraints": """
        SELECT c.conrelid::regclass::text, c.contypid::regtype::text, c.conname,
               pg_get_constraintdef(c.oid)
        FROM pg_constraint c WHERE c.connamespace::regnamespace::text = 'aidb_memory'""",
    "triggers": """
        SELECT t.tgrelid::regclass::text, t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace::regnamespace::text = 'aidb_memory' AND NOT t.tgisinternal""",
    "types": """
        SELECT t.typname, t.typtype, t.typacl::text FROM pg_type t
        WHERE t.typnamespace::regnamespace::text = 'aidb_memory'""",
    "extensions": "SELECT extname, extversion FROM pg_extension",
    "default_acls": """
        SELECT defaclrole::regrole::text, defaclobjtype, defaclacl::text FROM pg_default_acl""",
    "role_dependencies": """
        SELECT d.classid::regclass::text, d.refobjid::regrole::text, d.deptype
        FROM pg_shdepend d
        WHERE d.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())""",
}

_INSTALLER_ROWS = {
    "schema_migrations": """
        SELECT name, checksum, package_version FROM aidb_memory.schema_migrations""",
    "runtime_modules": "SELECT name, is_package, source FROM aidb_memory.runtime_modules",
    # server_pythonpath is recorded by `deps`, not by install: leave it out of comparisons.
    "runtime_settings": """
        SELECT key, value FROM aidb_memory.runtime_settings WHERE key <> 'server_pythonpath'""",
}

# What an install that changes nothing leaves as it was, down to row versions and timestamps.
_EXACT_ROWS = {
    "schema_migrations": """
        SELECT name, checksum, applied_at, xmin::text FROM aidb_memory.schema_migrations""",
    "runtime_modules": "SELECT name, xmin::text FROM aidb_memory.runtime_modules",
    "runtime_settings": """
        SELECT key, value, updated_at, xmin::text FROM aidb_memory.runtime_settings""",
    "function_versions": """
        SELECT oid::regprocedure::text, xmin::text FROM pg_proc
        WHERE pronamespace::regnamespace::text = 'aidb_memory'""",
    "relation_versions": """
        SELECT relname, xmin::text FROM pg_class
        WHERE relnamespace::regnamespace::text = 'aidb_memory'""",
}


def _rows(db: Database, queries: dict[str, str]) -> dict[str, list[tuple[Any, ...]]]:
    out: dict[str, list[tuple[Any, ...]]] = {}
    with db.connect() as conn:
        for key, query in queries.items():
            out[key] = sorted(conn.execute(query).fetchall(), key=repr)
    return out


def snapshot(db: Database) -> dict[str, list[tuple[Any, ...]]]:
    """Everything of ours in the catalog, plus the installer's tables, comparable across dbs."""
    out = _rows(db, _SNAPSHOT_QUERIES)
    if db.value("SELECT to_regclass('aidb_memory.schema_migrations') IS NOT NULL"):
        out.update(_rows(db, _INSTALLER_ROWS))
    return out


def exact_state(db: Database) -> dict[str, list[tuple[Any, ...]]]:
    return {**snapshot(db), **_rows(db, _EXACT_ROWS)}


def schema_exists(db: Database) -> bool:
    return bool(
        db.value("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'aidb_memory')")
    )


def up_to_date(db: Database, source: Path | None = None) -> Database:
    """Install or upgrade to ``source`` (default: this package) in-process, without the CLI.

    On a clone of the template this is normally a no-op; but the template was installed when the
    test run started, files may have changed since, and the tests compare a database with the
    package as it is now.
    """
    package = Package.load(SourceTree(source) if source else None)
    with db.connect(autocommit=False) as conn:
        install(conn, package, say=lambda _line: None)
        conn.commit()
    return db


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def fails(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    return result.stderr


def sql_objects(package: Package, kind: str) -> set[str]:
    """Names of the functions or views that sql/ defines, read from the package itself."""
    names = set()
    for f in package.bundle.sql_files:
        for raw in pglast.parse_sql(";\n".join(f.statements)):
            stmt = raw.stmt
            if kind == "function" and type(stmt).__name__ == "CreateFunctionStmt":
                names.add(stmt.funcname[-1].sval)
            if kind == "view" and type(stmt).__name__ == "ViewStmt":
                names.add(stmt.view.relname)
    return names


@pytest.fixture
def other_empty_db(pg_server: ThrowawayServer, template_db: Database) -> Iterator[Database]:
    """A second empty database, to compare with ``empty_db``."""
    database = _create_database(pg_server, "template0")
    try:
        yield database
    finally:
        _drop_database(database)


# --- 1. install, reinstall, dry run ---------------------------------------------------------


def test_install_on_an_empty_database_creates_everything(empty_db: Database) -> None:
    package = Package.load()
    out = ok(run_cli("install", dsn=empty_db.dsn()))

    for m in package.migrations:
        assert f"migration {m.name} applied" in out
    for f in package.bundle.sql_files:
        assert f"applied sql/{f.name}" in out
    assert f"stored {len(package.bundle.modules)} server-side modules" in out
    assert f"installed version {__version__}" in out
    assert "created extension plpython3u" in out

    assert empty_db.value("SELECT aidb_memory.version()") == __version__
    applied = dict(empty_db.sql("SELECT name, checksum FROM aidb_memory.schema_migrations"))
    assert applied == {m.name: m.checksum for m in package.migrations}
    modules = {r[0] for r in empty_db.sql("SELECT name FROM aidb_memory.runtime_modules")}
    assert modules == {m.name for m in package.bundle.modules}
    settings = dict(empty_db.sql("SELECT key, value FROM aidb_memory.runtime_settings"))
    assert settings["generation"] == package.bundle.generation
    assert settings["code_checksum"] == package.bundle.checksum
    assert settings["created_plpython3u"] == "true"

    functions = {
        r[0]
        for r in empty_db.sql(
            "SELECT proname FROM pg_proc WHERE pronamespace::regnamespace::text = 'aidb_memory'"
        )
    }
    assert functions == sql_objects(package, "function")
    relations = dict(
        empty_db.sql(
            "SELECT relname, relkind::text FROM pg_class "
            "WHERE relnamespace::regnamespace::text = 'aidb_memory' AND relkind IN ('r', 'v')"
        )
    )
    assert {n for n, k in relations.items() if k == "v"} == sql_objects(package, "view")
    assert INSTALLER_TABLES | {"namespace"} <= {n for n, k in relations.items() if k == "r"}
    # The first migration's data change ran.
    assert (
        empty_db.value("SELECT count(*) FROM aidb_memory.namespace WHERE name = 'pg_agents'") == 1
    )
    ok(run_cli("verify", dsn=empty_db.dsn()))


def test_a_second_install_changes_nothing_and_says_so(empty_db: Database) -> None:
    package = Package.load()
    ok(run_cli("install", dsn=empty_db.dsn()))
    before = exact_state(empty_db)

    out = ok(run_cli("install", dsn=empty_db.dsn()))

    assert exact_state(empty_db) == before
    for m in package.migrations:
        assert f"migration {m.name} skipped (already applied)" in out
        assert f"migration {m.name} applied" not in out
    assert (
        f"code is up to date (version {__version__}, generation {package.bundle.generation})" in out
    )
    assert "applied sql/" not in out
    assert "stored" not in out
    assert "installed version" not in out


def test_dry_run_on_an_empty_database_changes_nothing(empty_db: Database) -> None:
    package = Package.load()
    before = snapshot(empty_db)

    out = ok(run_cli("install", "--dry-run", dsn=empty_db.dsn()))

    assert "dry run: nothing will be changed" in out
    assert "would create schema aidb_memory" in out
    for m in package.migrations:
        assert f"would apply migration {m.name}" in out
    for f in package.bundle.sql_files:
        assert f"would apply sql/{f.name}" in out
    assert not schema_exists(empty_db)
    assert snapshot(empty_db) == before
    assert not empty_db.value(
        "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'plpython3u')"
    )


def test_dry_run_on_an_installed_database_says_up_to_date(db: Database) -> None:
    up_to_date(db)
    before = exact_state(db)
    out = ok(run_cli("install", "--dry-run", dsn=db.dsn()))
    assert "migration 0001_namespaces skipped (already applied)" in out
    assert "code is up to date" in out
    assert "would" not in out.replace("nothing will be changed", "")
    assert exact_state(db) == before


def test_dry_run_lists_a_pending_migration_without_applying_it(
    db: Database, source_tree: Path
) -> None:
    (source_tree / "migrations" / "0999_add_column.sql").write_text(
        "ALTER TABLE aidb_memory.namespace ADD COLUMN description text NOT NULL DEFAULT '';\n"
    )
    up_to_date(db)
    before = exact_state(db)
    out = ok(run_cli("install", "--dry-run", "--source", str(source_tree), dsn=db.dsn()))
    assert "would apply migration 0999_add_column" in out
    assert "migration 0001_namespaces skipped (already applied)" in out
    assert exact_state(db) == before


def test_install_and_uninstall_never_discard_a_callers_transaction(empty_db: Database) -> None:
    with empty_db.connect(autocommit=False) as conn:
        conn.execute("CREATE TABLE public.mine (a int)")
        with pytest.raises(CliError, match="transaction of its own"):
            install(conn, Package.load(), say=lambda _line: None)
        with pytest.raises(CliError, match="transaction of its own"):
            uninstall(conn, say=lambda _line: None)
        conn.commit()
    assert empty_db.value("SELECT to_regclass('public.mine') IS NOT NULL")
    assert not schema_exists(empty_db)


# --- 2. concurrent installs -----------------------------------------------------------------


def _start_cli(*args: str, dsn: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "DATABASE_URL"}
    return subprocess.Popen(
        [sys.executable, "-m", "aidb_memory", *args, "--dsn", dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _waiting_for_install_lock(db: Database) -> int:
    key = INSTALL_LOCK_KEY
    return int(
        db.value(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE d.datname = current_database() AND l.locktype = 'advisory' AND NOT l.granted "
            "AND l.classid::bigint = %s AND l.objid::bigint = %s AND l.objsubid = 1",
            ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
        )
    )


@pytest.mark.parametrize("isolation", ["default", "serializable"])
def test_two_installs_at_the_same_moment_leave_the_state_of_one(
    empty_db: Database, other_empty_db: Database, isolation: str
) -> None:
    ok(run_cli("install", dsn=other_empty_db.dsn()))
    expected = snapshot(other_empty_db)

    dsn = empty_db.dsn()
    if isolation != "default":  # a server or role may make every transaction serializable
        dsn += f" options='-c default_transaction_isolation={isolation}'"
    # Hold the installers' lock until both processes wait for it, so that they really race.
    with empty_db.connect(autocommit=False) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (INSTALL_LOCK_KEY,))
        procs = [_start_cli("install", dsn=dsn) for _ in range(2)]
        try:
            deadline = time.monotonic() + 60
            while _waiting_for_install_lock(empty_db) < 2:
                exited = [p.returncode for p in procs if p.poll() is not None]
                assert not exited, f"an installer exited before taking the lock: {exited}"
                assert time.monotonic() < deadline, "the installers never waited for the lock"
                time.sleep(0.05)
        finally:
            holder.rollback()
        results = [p.communicate(timeout=120) for p in procs]

    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, out + err
    outputs = sorted(out for out, _ in results)
    assert "migration 0001_namespaces applied" in outputs[0] + outputs[1]
    assert sum("migration 0001_namespaces applied" in o for o in outputs) == 1
    assert sum("code is up to date" in o for o in outputs) == 1
    assert snapshot(empty_db) == expected


# --- 3. upgrade and edited migrations -------------------------------------------------------


ADD_COLUMN = (
    "ALTER TABLE aidb_memory.namespace ADD COLUMN description text NOT NULL DEFAULT 'none';\n"
)


def test_a_new_migration_is_applied_by_the_next_install_and_data_survives(
    db: Database, source_tree: Path
) -> None:
    up_to_date(db, source_tree)
    db.sql("INSERT INTO aidb_memory.namespace (name, config) VALUES ('support', '{\"k\": 1}')")
    before = db.sql(
        "SELECT id, name, model_spec, config, state, created_at FROM aidb_memory.namespace"
    )
    (source_tree / "migrations" / "0999_add_column.sql").write_text(ADD_COLUMN)
    source = ("--source", str(source_tree))

    out = ok(run_cli("install", *source, dsn=db.dsn()))

    assert "migration 0001_namespaces skipped (already applied)" in out
    assert "migration 0999_add_column applied" in out
    assert (
        db.sql("SELECT id, name, model_spec, config, state, created_at FROM aidb_memory.namespace")
        == before
    )
    assert (
        db.value("SELECT description FROM aidb_memory.namespace WHERE name = 'support'") == "none"
    )
    new = load_migrations(source_tree / "migrations")[-1]
    assert db.sql(
        "SELECT checksum, package_version FROM aidb_memory.schema_migrations WHERE name = %s",
        (new.name,),
    ) == [(new.checksum, __version__)]
    ok(run_cli("verify", *source, dsn=db.dsn()))
    # The package without that migration sees a database newer than itself.
    assert "0999_add_column is applied but unknown" in fails(run_cli("verify", dsn=db.dsn()))
    assert "0999_add_column is applied in this database but unknown" in fails(
        run_cli("install", dsn=db.dsn())
    )
    # Applied once: the next install skips it.
    assert "migration 0999_add_column skipped (already applied)" in ok(
        run_cli("install", *source, dsn=db.dsn())
    )


def _edited(text: str, old: str, new: str) -> str:
    assert old in text, f"the test expects {old!r} in the migration"
    return text.replace(old, new)


@pytest.mark.parametrize(
    ("migration", "edit"),
    [
        ("0999_add_column", lambda t: _edited(t, "'none'", "'nothing'")),  # a constant
        ("0999_add_column", lambda t: _edited(t, "description text", "description varchar")),
        ("0001_namespaces", lambda t: _edited(t, "'pg_agents'", "'pg_agents2'")),
        ("0001_namespaces", lambda t: _edited(t, "updated_at", "modified_at")),  # a column
    ],
)
def test_editing_an_applied_migration_fails_verify_and_install(
    db: Database, source_tree: Path, migration: str, edit: Any
) -> None:
    source = ("--source", str(source_tree))
    path = source_tree / "migrations" / f"{migration}.sql"
    if migration == "0999_add_column":
        path.write_text(ADD_COLUMN)
    up_to_date(db, source_tree)  # applies 0999_add_column too
    before = exact_state(db)
    path.write_text(edit(path.read_text()))

    message = f"migration {migration}.sql was edited after it was applied"
    assert message in fails(run_cli("verify", *source, dsn=db.dsn()))
    assert message in fails(run_cli("install", *source, dsn=db.dsn()))
    if migration == "0001_namespaces":  # the dry run checks in Python, not in SQL
        assert message in fails(run_cli("install", "--dry-run", *source, dsn=db.dsn()))
    assert exact_state(db) == before


def _reformat_0001(text: str) -> str:
    """Same statements: other comments, keyword case and whitespace."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("--")]
    out = "/* reformatted\n   by hand */\n\n" + "\n".join(lines) + "\n\n-- the end\n"
    out = _edited(out, "CREATE TABLE", "create   table")
    out = _edited(out, "INSERT INTO", "insert\n    into")
    out = _edited(out, "NOT NULL", "not  null")
    out = _edited(out, "DEFAULT", "default")
    assert out != text
    return out


@pytest.mark.parametrize(
    ("migration", "reformat"),
    [
        (
            "0999_add_column",
            lambda _t: (
                "-- say why\nalter   table aidb_memory.namespace\n"
                "    add column description TEXT not null default 'none'  -- trailing\n;"
            ),
        ),
        ("0001_namespaces", _reformat_0001),
    ],
)
def test_reformatting_an_applied_migration_is_not_drift(
    db: Database, source_tree: Path, migration: str, reformat: Any
) -> None:
    source = ("--source", str(source_tree))
    path = source_tree / "migrations" / f"{migration}.sql"
    if migration == "0999_add_column":
        path.write_text(ADD_COLUMN)
    up_to_date(db, source_tree)  # applies 0999_add_column too
    before = exact_state(db)
    path.write_text(reformat(path.read_text()))

    ok(run_cli("verify", *source, dsn=db.dsn()))
    out = ok(run_cli("install", *source, dsn=db.dsn()))
    assert f"migration {migration} skipped (already applied)" in out
    assert exact_state(db) == before


def test_changed_server_code_is_reinstalled_with_a_new_generation(
    db: Database, source_tree: Path
) -> None:
    up_to_date(db, source_tree)
    old = Package.load(SourceTree(source_tree))
    module = source_tree / "plpython" / "aidb_memory_server" / "introspection.py"
    module.write_text(module.read_text() + "\n# a change\n")
    new = Package.load(SourceTree(source_tree))
    assert new.bundle.generation != old.bundle.generation
    source = ("--source", str(source_tree))

    assert "installed code is version" in fails(run_cli("verify", *source, dsn=db.dsn()))
    out = ok(run_cli("install", *source, dsn=db.dsn()))

    assert (
        f"stored {len(new.bundle.modules)} server-side modules (generation {new.bundle.generation})"
        in out
    )
    assert db.value(
        "SELECT source FROM aidb_memory.runtime_modules WHERE name = %s",
        ("aidb_memory_server.introspection",),
    ).endswith("# a change\n")
    stubs = [
        r[0]
        for r in db.sql(
            "SELECT prosrc FROM pg_proc WHERE pronamespace::regnamespace::text = 'aidb_memory' "
            "AND prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpython3u')"
        )
    ]
    assert stubs
    assert all(new.bundle.generation in s and old.bundle.generation not in s for s in stubs)
    ok(run_cli("verify", *source, dsn=db.dsn()))
    fails(run_cli("verify", dsn=db.dsn()))


def test_a_hand_edit_is_drift_and_install_restores_it(db: Database) -> None:
    up_to_date(db)
    expected = snapshot(db)
    db.sql("GRANT EXECUTE ON FUNCTION aidb_memory.init(text, jsonb, jsonb) TO PUBLIC")

    assert "changed by hand" in fails(run_cli("verify", dsn=db.dsn()))
    out = ok(run_cli("install", dsn=db.dsn()))

    assert "installed version" in out
    assert snapshot(db) == expected
    ok(run_cli("verify", dsn=db.dsn()))


# --- 5. `aidb-memory sql` through psql --------------------------------------------------------


def test_psql_of_the_sql_script_reaches_the_same_state_as_install(
    empty_db: Database, other_empty_db: Database
) -> None:
    script = ok(run_cli("sql"))
    result = psql(empty_db.dsn(), "-q", "-f", "-", input=script)
    assert result.returncode == 0, result.stdout + result.stderr
    ok(run_cli("install", dsn=other_empty_db.dsn()))

    via_psql = snapshot(empty_db)
    assert via_psql == snapshot(other_empty_db)
    assert via_psql["schema_migrations"]
    assert via_psql["functions"]
    ok(run_cli("verify", dsn=empty_db.dsn()))
    # The script is an upgrade script too: run again, it changes nothing.
    before = exact_state(empty_db)
    result = psql(empty_db.dsn(), "-q", "-f", "-", input=script)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "code is up to date" in result.stderr
    assert exact_state(empty_db) == before


def test_the_sql_script_stops_at_the_first_error_and_changes_nothing(
    db: Database, source_tree: Path
) -> None:
    up_to_date(db, source_tree)
    path = source_tree / "migrations" / "0001_namespaces.sql"
    path.write_text(_edited(path.read_text(), "'pg_agents'", "'pg_agents2'"))
    before = exact_state(db)
    script = ok(run_cli("sql", "--source", str(source_tree)))
    result = psql(db.dsn(), "-q", "-f", "-", input=script)
    assert result.returncode != 0
    assert "0001_namespaces.sql was edited" in result.stderr
    assert exact_state(db) == before


# --- 6. uninstall ---------------------------------------------------------------------------


def test_uninstall_without_yes_refuses_and_changes_nothing(empty_db: Database) -> None:
    up_to_date(empty_db)
    before = exact_state(empty_db)
    assert "--yes" in fails(run_cli("uninstall", dsn=empty_db.dsn()))
    assert exact_state(empty_db) == before


def test_uninstall_leaves_nothing_of_ours(empty_db: Database) -> None:
    before_install = snapshot(empty_db)
    up_to_date(empty_db)

    out = ok(run_cli("uninstall", "--yes", dsn=empty_db.dsn()))

    assert "dropped schema aidb_memory" in out
    assert "dropped extension plpython3u" in out
    # Roles are cluster-wide and the template database still uses them.
    for role in ROLES:
        assert f"kept role {role}" in out
    assert not schema_exists(empty_db)
    assert (
        empty_db.value(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'aidb_memory'"
        )
        == 0
    )
    assert (
        empty_db.value(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'aidb_memory'"
        )
        == 0
    )
    assert (
        empty_db.value(
            "SELECT count(*) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
            "WHERE n.nspname = 'aidb_memory'"
        )
        == 0
    )
    assert empty_db.value("SELECT count(*) FROM pg_default_acl") == 0
    assert empty_db.value("SELECT count(*) FROM pg_extension WHERE extname = 'plpython3u'") == 0
    assert (
        empty_db.value(
            "SELECT count(*) FROM pg_shdepend d JOIN pg_roles r ON r.oid = d.refobjid "
            "WHERE d.dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND r.rolname = ANY(%s)",
            (list(ROLES),),
        )
        == 0
    )
    assert snapshot(empty_db) == before_install
    assert "not installed" in fails(run_cli("verify", dsn=empty_db.dsn()))
    # And it can be installed again.
    assert "migration 0001_namespaces applied" in ok(run_cli("install", dsn=empty_db.dsn()))


def test_uninstall_keeps_a_plpython3u_that_install_did_not_create(empty_db: Database) -> None:
    empty_db.sql("CREATE EXTENSION plpython3u")
    out = ok(run_cli("install", dsn=empty_db.dsn()))
    assert "created extension plpython3u" not in out
    assert (
        empty_db.value(
            "SELECT count(*) FROM aidb_memory.runtime_settings WHERE key = 'created_plpython3u'"
        )
        == 0
    )

    out = ok(run_cli("uninstall", "--yes", dsn=empty_db.dsn()))

    assert "plpython3u" not in out
    assert not schema_exists(empty_db)
    assert empty_db.value("SELECT count(*) FROM pg_extension WHERE extname = 'plpython3u'") == 1


def test_uninstall_keeps_plpython3u_while_another_schema_uses_it(empty_db: Database) -> None:
    up_to_date(empty_db)
    empty_db.sql("CREATE FUNCTION public.mine() RETURNS int LANGUAGE plpython3u AS $$ return 1 $$")

    out = ok(run_cli("uninstall", "--yes", dsn=empty_db.dsn()))

    assert "kept extension plpython3u" in out
    assert not schema_exists(empty_db)
    assert empty_db.value("SELECT public.mine()") == 1
