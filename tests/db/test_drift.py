"""Drift: every hand change of an installed database is seen by ``verify``; ``install`` repairs
what the package's code part makes and refuses, naming the object, what only a migration makes.
After an install that succeeded, ``verify`` says ok and the catalog is what install makes."""

from __future__ import annotations

import subprocess

from conftest import Database, run_cli

MODULE = "aidb_memory_server.introspection"
EXTRA = "is not part of this package; `aidb-memory install` drops it"


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def fails(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    return result.stderr


def _functions(db: Database) -> list[str]:
    return sorted(
        r[0]
        for r in db.sql(
            "SELECT oid::regprocedure::text FROM pg_proc "
            "WHERE pronamespace = 'aidb_memory'::regnamespace"
        )
    )


def test_an_edited_module_source_is_drift_and_install_restores_it(db: Database) -> None:
    original = db.value("SELECT source FROM aidb_memory.runtime_modules WHERE name = %s", (MODULE,))
    db.sql(
        "UPDATE aidb_memory.runtime_modules SET source = replace(source, 'def ', 'def  ') "
        "WHERE name = %s",
        (MODULE,),
    )

    assert f"server-side module {MODULE} differs" in fails(run_cli("verify", dsn=db.dsn()))
    out = ok(run_cli("install", dsn=db.dsn()))

    assert "code is up to date" not in out
    assert "stored" in out
    assert (
        db.value("SELECT source FROM aidb_memory.runtime_modules WHERE name = %s", (MODULE,))
        == original
    )
    ok(run_cli("verify", dsn=db.dsn()))


def test_a_module_added_by_hand_is_drift_and_install_removes_it(db: Database) -> None:
    db.sql(
        "INSERT INTO aidb_memory.runtime_modules (name, is_package, source) "
        "VALUES ('aidb_memory_server.planted', false, 'X = 1')"
    )

    assert "aidb_memory_server.planted" in fails(run_cli("verify", dsn=db.dsn()))
    ok(run_cli("install", dsn=db.dsn()))

    assert not db.sql(
        "SELECT 1 FROM aidb_memory.runtime_modules WHERE name = 'aidb_memory_server.planted'"
    )
    ok(run_cli("verify", dsn=db.dsn()))


def test_extra_functions_and_views_are_drift_and_install_drops_them(db: Database) -> None:
    expected = _functions(db)
    db.sql("CREATE FUNCTION aidb_memory.extra(n int) RETURNS int LANGUAGE sql AS 'SELECT n'")
    db.sql("CREATE VIEW aidb_memory.extra_view AS SELECT aidb_memory.extra(1) AS one")
    db.sql(
        "CREATE TRIGGER extra_trigger AFTER INSERT ON aidb_memory.memory "
        "FOR EACH STATEMENT EXECUTE FUNCTION aidb_memory.memory_words_added()"
    )

    err = fails(run_cli("verify", dsn=db.dsn()))
    assert f"function aidb_memory.extra(integer) {EXTRA}" in err
    assert f"view aidb_memory.extra_view {EXTRA}" in err
    assert f"trigger extra_trigger on aidb_memory.memory {EXTRA}" in err
    out = ok(run_cli("install", dsn=db.dsn()))

    assert "dropped function aidb_memory.extra(integer)" in out
    assert "dropped view aidb_memory.extra_view" in out
    assert "dropped trigger extra_trigger on aidb_memory.memory" in out
    assert _functions(db) == expected
    assert db.value("SELECT to_regclass('aidb_memory.extra_view')") is None
    ok(run_cli("verify", dsn=db.dsn()))


def test_an_edited_function_is_restored(db: Database) -> None:
    body = "SELECT 'hacked'::text"
    db.sql(
        "CREATE OR REPLACE FUNCTION aidb_memory.version() RETURNS text LANGUAGE sql STABLE "
        f"SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $${body}$$"
    )

    assert "function aidb_memory.version() changed by hand" in fails(
        run_cli("verify", dsn=db.dsn())
    )
    ok(run_cli("install", dsn=db.dsn()))

    assert db.value("SELECT aidb_memory.version()") != "hacked"
    ok(run_cli("verify", dsn=db.dsn()))


def test_disabled_triggers_are_drift_and_install_enables_them(db: Database) -> None:
    db.sql("ALTER TABLE aidb_memory.memory DISABLE TRIGGER ALL")

    err = fails(run_cli("verify", dsn=db.dsn()))
    assert "trigger memory_words_added on aidb_memory.memory is disabled" in err
    assert "foreign key triggers of aidb_memory.memory are not all enabled" in err
    out = ok(run_cli("install", dsn=db.dsn()))

    assert "enabled the triggers of aidb_memory.memory" in out
    assert db.sql(
        "SELECT DISTINCT tgenabled::text FROM pg_trigger "
        "WHERE tgrelid = 'aidb_memory.memory'::regclass"
    ) == [("O",)]
    ok(run_cli("verify", dsn=db.dsn()))


def _migration_index(db: Database) -> tuple[str, str]:
    """A non-unique index that a migration created: (name, definition)."""
    row = db.sql(
        "SELECT c.relname, pg_get_indexdef(c.oid) FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relnamespace = 'aidb_memory'::regnamespace AND NOT i.indisunique "
        "ORDER BY c.relname LIMIT 1"
    )
    assert row
    return row[0][0], row[0][1]


def test_a_dropped_index_is_named_by_verify_and_install_refuses(db: Database) -> None:
    name, definition = _migration_index(db)
    db.sql(f"DROP INDEX aidb_memory.{name}")

    assert f"index aidb_memory.{name} is missing" in fails(run_cli("verify", dsn=db.dsn()))
    err = fails(run_cli("install", dsn=db.dsn()))

    assert f"index aidb_memory.{name} is missing" in err
    assert "hint:" in err and "migrations/" in err
    assert db.value("SELECT to_regclass(%s)", (f"aidb_memory.{name}",)) is None
    # Still drift after the refused install; recreated as the migration made it, all is well.
    fails(run_cli("verify", dsn=db.dsn()))
    db.sql(definition)
    ok(run_cli("verify", dsn=db.dsn()))
    assert "code is up to date" in ok(run_cli("install", dsn=db.dsn()))


def test_a_dropped_constraint_and_an_extra_index_are_named(db: Database) -> None:
    constraint = db.sql(
        "SELECT conname, conrelid::regclass::text FROM pg_constraint "
        "WHERE connamespace = 'aidb_memory'::regnamespace AND contype = 'c' "
        "ORDER BY conname LIMIT 1"
    )[0]
    db.sql(f"ALTER TABLE {constraint[1]} DROP CONSTRAINT {constraint[0]}")
    db.sql("CREATE INDEX extra_idx ON aidb_memory.memory (created_at)")

    err = fails(run_cli("verify", dsn=db.dsn()))
    assert f"constraint {constraint[0]} on {constraint[1]} is missing" in err
    assert "index aidb_memory.extra_idx is not part of aidb_memory" in err
    err = fails(run_cli("install", dsn=db.dsn()))
    assert f"constraint {constraint[0]} on {constraint[1]} is missing" in err
    assert "index aidb_memory.extra_idx is not part of aidb_memory" in err


def test_status_and_verify_show_the_package_version(db: Database) -> None:
    from aidb_memory import __version__

    assert __version__ != "0.1.0"
    assert db.value("SELECT aidb_memory.version()") == __version__
    assert f"version {__version__}" in ok(run_cli("verify", dsn=db.dsn()))
    out = ok(run_cli("status", dsn=db.dsn()))
    assert f"package version:   {__version__}" in out
    assert f"installed version: {__version__}" in out


def test_every_function_and_view_of_sql_is_recognised_as_the_packages(db: Database) -> None:
    """Install keeps exactly these (it drops the others): each must resolve to an installed
    object, or install would drop it and re-create it on every run."""
    from aidb_memory import catalog
    from aidb_memory.installer import Package

    bundle = Package.load().bundle
    defined = catalog.defined_objects(s for f in bundle.sql_files for s in f.statements)
    functions, views = defined.functions, defined.views
    resolved = db.value(
        "SELECT count(DISTINCT pg_catalog.to_regprocedure(f)) FROM unnest(%s::text[]) AS f",
        (functions,),
    )
    assert resolved == len(functions) == len(_functions(db))
    assert db.value(
        "SELECT count(DISTINCT pg_catalog.to_regclass(v)) FROM unnest(%s::text[]) AS v", (views,)
    ) == len(views)
