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
    from aidb_memory.install import catalog
    from aidb_memory.install.installer import Package

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


# Issue 23: the signature 0.1.0 gave session_get; today's takes other arguments, so an upgrade
# that kept it left two overloads and session_get(ns, actor, session, budget) was ambiguous.
OLD_SESSION_GET = "aidb_memory.session_get(text,text,text,integer,text,integer)"


def _old_overload(db: Database) -> None:
    db.sql(
        "CREATE FUNCTION aidb_memory.session_get(ns text, actor text, session text, "
        "budget integer DEFAULT NULL, fmt text DEFAULT 'chat', reserve integer DEFAULT 0) "
        "RETURNS TABLE (items jsonb) LANGUAGE sql AS $$SELECT '[]'::jsonb$$"
    )


def _record_catalog(db: Database) -> None:
    """What an install before issue 23 did: record the catalog with what it failed to drop."""
    from aidb_memory.install import catalog

    db.sql(
        "UPDATE aidb_memory.runtime_settings SET value = "
        f"({catalog.lines_query(catalog.CODE)}) WHERE key = 'catalog_code'"
    )


def _session_gets(db: Database) -> list[str]:
    return [f for f in _functions(db) if f.startswith("aidb_memory.session_get(")]


def test_an_older_overload_is_dropped_while_this_versions_functions_do_not_exist_yet(
    db: Database,
) -> None:
    """An upgrade: the installed code is another version's, which lacks functions this one adds
    (to_regprocedure of those is NULL before sql/ makes them) and has an overload this one
    does not define."""
    expected = _functions(db)
    db.sql("DROP FUNCTION aidb_memory.session_pop(text, text, text)")
    db.sql("DROP FUNCTION aidb_memory.session_pop_py(text, text, text)")
    _old_overload(db)
    db.sql("UPDATE aidb_memory.runtime_settings SET value = 'older' WHERE key = 'code_checksum'")

    out = ok(run_cli("install", dsn=db.dsn()))

    assert f"dropped function {OLD_SESSION_GET}, which is not part of this package" in out
    assert _functions(db) == expected
    db.sql("SELECT aidb_memory.init('ns')")
    assert db.sql("SELECT * FROM aidb_memory.session_get('ns', 'dave', 'conv-m', 3000)")
    ok(run_cli("verify", dsn=db.dsn()))


def test_verify_names_an_extra_function_that_install_recorded(db: Database) -> None:
    _old_overload(db)
    _record_catalog(db)

    err = fails(run_cli("verify", dsn=db.dsn()))

    assert f"drift: function {OLD_SESSION_GET} {EXTRA}" in err
    assert "not part of aidb_memory" not in err  # not named twice


def test_install_cleans_what_an_install_before_issue_23_left_and_recorded(db: Database) -> None:
    expected = _functions(db)
    _old_overload(db)
    _record_catalog(db)  # leftovers recorded, the same code checksum: "up to date" before

    out = ok(run_cli("install", dsn=db.dsn()))

    assert "code is up to date" not in out
    assert f"dropped function {OLD_SESSION_GET}" in out
    assert _functions(db) == expected
    assert _session_gets(db) == [f for f in expected if f.startswith("aidb_memory.session_get(")]
    ok(run_cli("verify", dsn=db.dsn()))
    assert "code is up to date" in ok(run_cli("install", dsn=db.dsn()))
