"""The in-database runtime (SPEC §1): code stored in the database, loaded once per connection,
reloaded by open connections after an upgrade, and errors that reach the client as SQL errors."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from aidb_memory.install.codebundle import generation_of, load_modules
from conftest import ADMIN_USER, REPO, Database, run_cli

Connection = psycopg.Connection[Any]

# A PL/Python function of the test's own that looks into the backend it runs in: PL/Python's GD
# and sys.modules are shared by every PL/Python function of one connection.
_PROBE = """
CREATE FUNCTION public.aidb_test_probe() RETURNS text LANGUAGE plpython3u AS $py$
import importlib.util, json, sys
rt = GD.get("aidb_memory.rt")
return json.dumps({
    "runtime_id": id(rt) if rt is not None else None,
    "generation": getattr(rt, "generation", None),
    "modules": sorted(m for m in sys.modules if m.startswith("aidb_memory_server")),
    "extra_findable": "aidb_memory_server" in sys.modules
        and importlib.util.find_spec("aidb_memory_server.probe_extra") is not None,
})
$py$;
GRANT EXECUTE ON FUNCTION public.aidb_test_probe() TO PUBLIC;
"""


def _probe(conn: Connection) -> dict[str, Any]:
    row = conn.execute("SELECT public.aidb_test_probe()").fetchone()
    assert row is not None
    return dict(json.loads(row[0]))


def _info(conn: Connection) -> dict[str, Any]:
    row = conn.execute("SELECT aidb_memory.runtime_info()").fetchone()
    assert row is not None
    return dict(row[0])


def _generation(db: Database) -> str:
    value = db.value("SELECT value FROM aidb_memory.runtime_settings WHERE key = 'generation'")
    assert isinstance(value, str)
    return value


def _edit(source_tree: Path, relative: str, old: str, new: str) -> None:
    path = source_tree / "plpython" / "aidb_memory_server" / relative
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{relative} no longer contains {old!r}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def _install(db: Database, source: Path | None = None) -> str:
    args = ["install", *(["--source", str(source)] if source else [])]
    result = run_cli(*args, dsn=db.dsn())
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _error(conn: Connection, query: str, params: Any = None) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    return info.value


def _upgrade_introspection(source_tree: Path) -> None:
    """A new module, imported by a changed one, and a changed error message."""
    (source_tree / "plpython" / "aidb_memory_server" / "probe_extra.py").write_text(
        'VALUE = "upgraded"\n', encoding="utf-8"
    )
    _edit(
        source_tree,
        "introspection.py",
        '"generation": rt.generation,',
        '"generation": rt.generation, "probe": probe_extra.VALUE,',
    )
    _edit(
        source_tree,
        "introspection.py",
        "from aidb_memory_server import runtime\n",
        "from aidb_memory_server import probe_extra, runtime\n",
    )
    _edit(source_tree, "errors.py", "must not be NULL", "must not be NULL (upgraded)")


# --- the stored code -----------------------------------------------------------------------


def test_the_database_holds_the_repositorys_server_code(db: Database) -> None:
    modules = load_modules(REPO / "plpython")
    stored = db.sql("SELECT name, is_package, source FROM aidb_memory.runtime_modules ORDER BY 1")
    assert stored == sorted((m.name, m.is_package, m.source) for m in modules)
    generation = generation_of(modules)
    assert _generation(db) == generation
    with db.connect() as conn:
        info = _info(conn)
    assert info["generation"] == generation
    assert info["version"] == db.value("SELECT aidb_memory.version()")
    assert info["python"].startswith("3.")


# --- upgrades reach open connections -------------------------------------------------------


def test_an_open_connection_runs_the_new_code_on_its_next_call(
    db: Database, source_tree: Path
) -> None:
    db.sql(_PROBE)
    with db.connect() as old_superuser, db.connect(ADMIN_USER) as old_admin:
        pids = {c.execute("SELECT pg_backend_pid()").fetchone() for c in (old_superuser, old_admin)}
        before = _info(old_superuser)
        assert "probe" not in before
        assert before["generation"] == _generation(db)
        e = _error(old_admin, "SELECT aidb_memory.init(NULL)")
        assert e.diag.message_primary == "aidb_memory.init: name must not be NULL"
        assert _probe(old_superuser)["extra_findable"] is False

        _upgrade_introspection(source_tree)
        _install(db, source_tree)
        upgraded = _generation(db)
        assert upgraded != before["generation"]

        # The same connections, with no reconnect: the next call runs the new code.
        after = _info(old_superuser)
        assert after["probe"] == "upgraded"
        assert after["generation"] == upgraded
        e = _error(old_admin, "SELECT aidb_memory.init(NULL)")
        assert e.sqlstate == "22004"
        assert e.diag.message_primary == "aidb_memory.init: name must not be NULL (upgraded)"
        assert _probe(old_admin)["generation"] == upgraded

        # Back to the repository's code: the module that went away is gone from the backend too.
        _install(db)
        back = _info(old_superuser)
        assert "probe" not in back
        assert back["generation"] == before["generation"]
        probe = _probe(old_superuser)
        assert "aidb_memory_server.probe_extra" not in probe["modules"]
        assert probe["extra_findable"] is False

        assert pids == {
            c.execute("SELECT pg_backend_pid()").fetchone() for c in (old_superuser, old_admin)
        }


def test_an_upgrade_during_an_old_snapshot_does_not_leave_stale_code_behind(
    db: Database, source_tree: Path
) -> None:
    """A REPEATABLE READ transaction that began before an upgrade sees the new functions in the
    catalog but the old code in the tables; the connection must still switch after it."""
    with db.connect() as conn:
        before = _info(conn)
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM aidb_memory.runtime_settings")  # takes the snapshot
        _upgrade_introspection(source_tree)
        _install(db, source_tree)
        # A lock on a relation not yet used in this transaction makes the backend read the
        # catalog changes: from now on it calls the upgraded function definitions.
        conn.execute("SELECT count(*) FROM aidb_memory.namespace")
        during = _info(conn)
        assert during.get("probe") is None, "the old snapshot still holds the old code"
        assert during["generation"] == before["generation"]
        conn.execute("COMMIT")
        after = _info(conn)
    assert after["probe"] == "upgraded"
    assert after["generation"] == _generation(db) != before["generation"]


# --- loaded once per connection ------------------------------------------------------------


def _code_reads(conn: Connection) -> int:
    """Scans of runtime_modules by this backend not yet flushed to the cumulative statistics.

    A backend flushes its pending counts only between transactions, so within one transaction
    the difference between two readings counts the scans made in between.
    """
    row = conn.execute(
        """SELECT coalesce(sum(seq_scan), 0) + coalesce(sum(idx_scan), 0)
           FROM pg_stat_xact_user_tables
           WHERE relid = 'aidb_memory.runtime_modules'::regclass"""
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_code_is_loaded_once_per_connection_not_per_call(db: Database) -> None:
    db.sql(_PROBE)
    with db.connect(autocommit=False) as conn:
        assert _probe(conn)["runtime_id"] is None
        start = _code_reads(conn)
        first = _info(conn)
        assert _code_reads(conn) > start, "the first call loads the code from the table"
        loaded = _probe(conn)
        assert loaded["generation"] == first["generation"]
        conn.commit()

        for transaction in range(2):
            start = _code_reads(conn)
            generations = set()
            for i in range(20):
                name = f"ns{transaction}_{i}"
                conn.execute("SELECT aidb_memory.init(%s)", (name,))
                conn.execute("SELECT * FROM aidb_memory.namespace_update(%s)", (name,))
                generations.add(_info(conn)["generation"])
            assert _code_reads(conn) == start, "later calls, of any function, reuse the code"
            assert generations == {first["generation"]}
            assert _probe(conn)["runtime_id"] == loaded["runtime_id"]
            conn.commit()

    with db.connect(autocommit=False) as other:
        start = _code_reads(other)
        _info(other)
        assert _code_reads(other) > start, "each connection loads the code for itself"


# --- unexpected exceptions -----------------------------------------------------------------


def test_an_unexpected_python_exception_is_a_one_line_xx000(
    db: Database, source_tree: Path
) -> None:
    _edit(
        source_tree,
        "namespaces.py",
        '    fn = "init"\n',
        '    fn = "init"\n'
        '    if name == "boom":\n'
        "        return 1 // 0\n"
        '    if name == "multi":\n'
        '        raise RuntimeError("first line\\nsecond line\\n\\tthird " + "x" * 500)\n'
        '    if name == "plpy":\n'
        "        import plpy\n"
        '        plpy.error("quota exceeded", sqlstate="55000", hint="wait", detail="d")\n'
        '    if name == "prefixed":\n'
        "        import plpy\n"
        '        plpy.error("aidb_memory.init: name is taken", sqlstate="23505")\n',
    )
    _install(db, source_tree)
    before = db.sql("SELECT to_jsonb(n)::text FROM aidb_memory.namespace n ORDER BY id")
    with db.connect(ADMIN_USER) as conn:
        e = _error(conn, "SELECT aidb_memory.init('boom')")
        assert e.sqlstate == "XX000"
        assert e.diag.message_primary == (
            "aidb_memory.init: internal error (ZeroDivisionError: integer division or modulo by "
            "zero)"
        )
        assert e.diag.message_hint and "bug" in e.diag.message_hint

        e = _error(conn, "SELECT aidb_memory.init('multi')")
        assert e.sqlstate == "XX000"
        primary = e.diag.message_primary or ""
        assert primary.startswith(
            "aidb_memory.init: internal error (RuntimeError: first line second line third xxx"
        )
        assert "\n" not in primary and "\t" not in primary
        assert "Traceback" not in primary
        assert len(primary) < 300

        # plpy.error(..., sqlstate=...) in the package is an expected error, not a bug.
        e = _error(conn, "SELECT aidb_memory.init('plpy')")
        assert e.sqlstate == "55000"
        assert e.diag.message_primary == "aidb_memory.init: quota exceeded"
        assert (e.diag.message_hint, e.diag.message_detail) == ("wait", "d")
        e = _error(conn, "SELECT aidb_memory.init('prefixed')")
        assert e.sqlstate == "23505"
        assert e.diag.message_primary == "aidb_memory.init: name is taken"

        # The connection is fine afterwards and the failed calls stored nothing.
        assert conn.execute("SELECT aidb_memory.init('fine')").fetchone() is not None
    after = db.sql("SELECT to_jsonb(n)::text FROM aidb_memory.namespace n ORDER BY id")
    assert after[: len(before)] == before
    assert len(after) == len(before) + 1


def test_the_traceback_of_a_bug_goes_to_the_server_log_only(
    db: Database, source_tree: Path
) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    _edit(
        source_tree,
        "namespaces.py",
        '    fn = "init"\n',
        f'    fn = "init"\n    if name == "boom":\n        raise KeyError("{marker}")\n',
    )
    _install(db, source_tree)
    messages: list[str] = []
    with db.connect(ADMIN_USER) as conn:
        conn.add_notice_handler(
            lambda d: messages.append(f"{d.severity_nonlocalized} {d.message_primary}")
        )
        conn.execute("SET client_min_messages = log")
        conn.execute("DO $$ BEGIN RAISE LOG 'the session receives LOG messages'; END $$")
        e = _error(conn, "SELECT aidb_memory.init('boom')")
        assert e.sqlstate == "XX000"
        # Also when the caller catches the error in a savepoint and carries on.
        conn.execute("BEGIN")
        conn.execute("SAVEPOINT s")
        _error(conn, "SELECT aidb_memory.init('boom')")
        conn.execute("ROLLBACK TO SAVEPOINT s")
        conn.execute("DO $$ BEGIN RAISE LOG 'after the savepoint'; END $$")
        conn.execute("COMMIT")
        assert conn.execute("SHOW client_min_messages").fetchone() == ("log",)
    assert messages == ["LOG the session receives LOG messages", "LOG after the savepoint"]
    logs = list((db.server.workdir / "server").glob("*.log"))
    assert logs, "the throwaway server's log file"
    text = "".join(p.read_text(errors="replace") for p in logs)
    # The first mention of the marker is the last line of the logged traceback.
    at = text.index(f"KeyError: '{marker}'")
    logged = text[text.rindex("LOG:  aidb_memory.init: internal error\n", 0, at) : at]
    assert "Traceback (most recent call last)" in logged
    assert 'File "<aidb_memory.runtime_modules:aidb_memory_server.namespaces>", line' in logged
