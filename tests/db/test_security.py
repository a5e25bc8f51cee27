"""Security (SPEC §6): roles, privileges, SECURITY DEFINER, and what a session cannot change."""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from aidb_memory import __version__
from conftest import ADMIN_USER, APP_USER, Database
from fake_openai import serve

KNOWN_FUNCTIONS = {"init", "namespace_update", "version", "runtime_info"}
PRIVILEGE_ERROR = "42501"


def _functions(db: Database) -> list[tuple[int, str, str, bool, list[str] | None, str | None]]:
    """(oid, name, kind, security definer, proconfig, comment) of every function of the schema."""
    return db.sql(
        """SELECT p.oid::int, p.proname, p.prokind, p.prosecdef, p.proconfig,
                  obj_description(p.oid, 'pg_proc')
           FROM pg_proc p WHERE p.pronamespace = 'aidb_memory'::regnamespace
           ORDER BY p.oid"""
    )


def _tables(db: Database) -> list[str]:
    rows = db.sql(
        """SELECT c.relname FROM pg_class c
           WHERE c.relnamespace = 'aidb_memory'::regnamespace AND c.relkind IN ('r', 'p')
           ORDER BY c.relname"""
    )
    return [r[0] for r in rows]


def _denied(db: Database, query: str | pgsql.Composable, user: str, params: Any = None) -> str:
    """Run ``query`` as ``user``; it must fail with 42501. Returns the message."""
    with db.connect(user) as conn, pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    assert info.value.sqlstate == PRIVILEGE_ERROR, f"{query!r} as {user}: {info.value}"
    return info.value.diag.message_primary or ""


# --- roles ---------------------------------------------------------------------------------


def test_app_user_can_read_the_version_and_the_namespaces_view(db: Database) -> None:
    assert db.value("SELECT aidb_memory.version()", user=APP_USER) == db.value(
        "SELECT value FROM aidb_memory.runtime_settings WHERE key = 'version'"
    )
    names = db.sql("SELECT name FROM aidb_memory.namespaces", user=APP_USER)
    assert ("pg_agents",) in names


@pytest.mark.parametrize(
    "query",
    [
        "SELECT aidb_memory.init('x')",
        "SELECT aidb_memory.init('pg_agents')",
        "SELECT * FROM aidb_memory.namespace_update('pg_agents', NULL, NULL, 'INACTIVE')",
        "SELECT aidb_memory.runtime_info()",
    ],
)
def test_app_user_cannot_call_admin_functions(db: Database, query: str) -> None:
    before = db.sql("SELECT to_jsonb(n)::text FROM aidb_memory.namespace n ORDER BY id")
    message = _denied(db, query, APP_USER)
    assert message.startswith("permission denied for function")
    assert db.sql("SELECT to_jsonb(n)::text FROM aidb_memory.namespace n ORDER BY id") == before


def test_admin_user_can_create_and_change_namespaces(db: Database) -> None:
    ident = db.value("SELECT aidb_memory.init('admins_own')", user=ADMIN_USER)
    row = db.sql(
        "SELECT id, state FROM aidb_memory.namespace_update('admins_own', NULL, NULL, 'INACTIVE')",
        user=ADMIN_USER,
    )
    assert row == [(ident, "INACTIVE")]
    assert db.value("SELECT aidb_memory.version()", user=ADMIN_USER)


@pytest.mark.parametrize("user", [APP_USER, ADMIN_USER])
def test_api_roles_have_no_privilege_on_any_table(db: Database, user: str) -> None:
    tables = _tables(db)
    assert {"namespace", "runtime_modules", "runtime_settings", "schema_migrations"} <= set(tables)
    for table in tables:
        name = pgsql.Identifier("aidb_memory", table)
        _denied(db, pgsql.SQL("SELECT * FROM {} LIMIT 1").format(name), user)
        _denied(db, pgsql.SQL("SELECT count(*) FROM {}").format(name), user)
        _denied(db, pgsql.SQL("INSERT INTO {} DEFAULT VALUES").format(name), user)
        _denied(db, pgsql.SQL("UPDATE {} SET {} = {}").format(name, *_any_column(db, table)), user)
        _denied(db, pgsql.SQL("DELETE FROM {}").format(name), user)
        _denied(db, pgsql.SQL("TRUNCATE {}").format(name), user)


def _any_column(db: Database, table: str) -> tuple[pgsql.Identifier, pgsql.Identifier]:
    column = db.value(
        """SELECT attname FROM pg_attribute
           WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped
             AND attidentity = '' ORDER BY attnum LIMIT 1""",
        (f"aidb_memory.{table}",),
    )
    return pgsql.Identifier(column), pgsql.Identifier(column)


@pytest.mark.parametrize("user", [APP_USER, ADMIN_USER])
def test_api_roles_cannot_use_the_schemas_sequences(db: Database, user: str) -> None:
    sequences = db.sql(
        "SELECT c.oid::regclass::text FROM pg_class c "
        "WHERE c.relnamespace = 'aidb_memory'::regnamespace AND c.relkind = 'S'"
    )
    assert sequences, "namespace.id has one"
    for (seq,) in sequences:
        _denied(db, "SELECT nextval(%s::regclass)", user, (seq,))


def test_app_user_cannot_write_the_code_or_the_settings(db: Database) -> None:
    before = db.sql(
        "SELECT (SELECT string_agg(name || source, '' ORDER BY name) "
        "FROM aidb_memory.runtime_modules), "
        "(SELECT string_agg(key || value, '' ORDER BY key) FROM aidb_memory.runtime_settings)"
    )
    attempts = [
        "INSERT INTO aidb_memory.runtime_settings (key, value) "
        "VALUES ('server_pythonpath', '/tmp/evil')",
        "UPDATE aidb_memory.runtime_settings SET value = '/tmp/evil' "
        "WHERE key = 'server_pythonpath'",
        "UPDATE aidb_memory.runtime_modules SET source = 'raise SystemExit'",
        "INSERT INTO aidb_memory.runtime_modules (name, is_package, source) "
        "VALUES ('aidb_memory_server.evil', false, 'import os')",
        "DELETE FROM aidb_memory.runtime_modules",
    ]
    for user in (APP_USER, ADMIN_USER):
        for attempt in attempts:
            _denied(db, attempt, user)
    after = db.sql(
        "SELECT (SELECT string_agg(name || source, '' ORDER BY name) "
        "FROM aidb_memory.runtime_modules), "
        "(SELECT string_agg(key || value, '' ORDER BY key) FROM aidb_memory.runtime_settings)"
    )
    assert after == before


# --- every function ------------------------------------------------------------------------


def test_every_function_is_security_definer_with_a_fixed_search_path_and_a_comment(
    db: Database,
) -> None:
    functions = _functions(db)
    assert {f[1] for f in functions} >= KNOWN_FUNCTIONS
    for _oid, name, kind, secdef, config, comment in functions:
        if kind == "p" and not secdef:
            # The worker's loop commits, which PostgreSQL allows only in a SECURITY INVOKER
            # procedure without SET: it has no rights of its own (see the next tests).
            assert config is None, (name, config)
            assert comment and comment.strip(), f"{name} has no COMMENT"
            continue
        assert secdef, f"{name} is not SECURITY DEFINER"
        assert config is not None and "search_path=pg_catalog, pg_temp" in config, (name, config)
        assert comment and comment.strip(), f"{name} has no COMMENT"


def test_every_function_is_owned_by_a_superuser(db: Database) -> None:
    owners = db.sql(
        """SELECT p.proname, r.rolsuper FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner
           WHERE p.pronamespace = 'aidb_memory'::regnamespace"""
    )
    assert owners and all(superuser for _, superuser in owners), owners


def test_public_has_no_execute_on_any_function(db: Database) -> None:
    functions = _functions(db)
    granted = db.sql(
        """SELECT p.proname FROM pg_proc p
           WHERE p.pronamespace = 'aidb_memory'::regnamespace
             AND has_function_privilege('public', p.oid, 'EXECUTE')"""
    )
    assert len(functions) >= len(KNOWN_FUNCTIONS)
    assert granted == []


@pytest.fixture
def nobody(db: Database) -> Iterator[str]:
    """A fresh LOGIN role with no memberships, allowed to use the schema (not its functions)."""
    role = f"nobody_{uuid.uuid4().hex[:12]}"
    db.sql(pgsql.SQL("CREATE ROLE {} LOGIN").format(pgsql.Identifier(role)).as_string(None))
    db.sql(
        pgsql.SQL("GRANT USAGE ON SCHEMA aidb_memory TO {}")
        .format(pgsql.Identifier(role))
        .as_string(None)
    )
    try:
        yield role
    finally:
        db.sql(pgsql.SQL("DROP OWNED BY {}").format(pgsql.Identifier(role)).as_string(None))
        db.sql(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)).as_string(None))


def test_a_role_with_no_membership_cannot_execute_any_function(db: Database, nobody: str) -> None:
    calls = db.sql(
        """SELECT p.proname, p.prokind,
                  ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) AS t),
                  p.provariadic <> 0
           FROM pg_proc p WHERE p.pronamespace = 'aidb_memory'::regnamespace"""
    )
    assert {c[0] for c in calls} >= KNOWN_FUNCTIONS
    for name, kind, types, variadic in calls:
        args = [pgsql.SQL("NULL::{}").format(pgsql.SQL(t)) for t in types]
        if variadic:
            args[-1] = pgsql.SQL("VARIADIC ") + args[-1]
        call = pgsql.SQL("{}({})").format(
            pgsql.Identifier("aidb_memory", name), pgsql.SQL(", ").join(args)
        )
        query = pgsql.SQL("CALL {}" if kind == "p" else "SELECT {}").format(call)
        message = _denied(db, query, nobody)
        assert message == f"permission denied for function {name}" or message.startswith(
            f"permission denied for procedure {name}"
        ), message
        assert not db.value(
            "SELECT has_function_privilege(%s, %s::regprocedure, 'EXECUTE')",
            (nobody, f"aidb_memory.{name}({', '.join(types)})"),
        )


# --- what a session can SET cannot change the code or the objects we use --------------------


@pytest.fixture
def evil_dir() -> Iterator[tuple[Path, Path]]:
    """A directory of Python modules with side effects, and the directory they write to."""
    root = Path(tempfile.mkdtemp(prefix="aidb-evil-"))
    code, markers = root / "code", root / "markers"
    code.mkdir()
    markers.mkdir()
    payload = (
        "import os\n"
        f"open(os.path.join({str(markers)!r}, __name__ + '-' + str(os.getpid())), 'w').close()\n"
        "raise RuntimeError('evil module imported: ' + __name__)\n"
    )
    (code / "aidb_memory_server").mkdir()
    for relative in (
        "aidb_memory_server/__init__.py",
        "aidb_memory_server/runtime.py",
        "aidb_memory_server/namespaces.py",
        "openai.py",
        "aidb_evil_probe.py",
    ):
        (code / relative).write_text(payload)
    for path in (root, code, code / "aidb_memory_server"):
        path.chmod(0o755)
    for path in code.rglob("*.py"):
        path.chmod(0o644)
    markers.chmod(0o777)  # the server (another OS user) must be able to leave a marker
    try:
        yield code, markers
    finally:
        shutil.rmtree(root, ignore_errors=True)


_PROBE = """
CREATE FUNCTION public.aidb_test_probe() RETURNS text LANGUAGE plpython3u AS $py$
import importlib.util, json, sys
pkg = sys.modules.get("aidb_memory_server")
return json.dumps({
    "path": sys.path,
    "evil_findable": importlib.util.find_spec("aidb_evil_probe") is not None,
    "package_origin": getattr(getattr(pkg, "__spec__", None), "origin", None),
})
$py$;
GRANT EXECUTE ON FUNCTION public.aidb_test_probe() TO PUBLIC;
"""


def _probe(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    row = conn.execute("SELECT public.aidb_test_probe()").fetchone()
    assert row is not None
    return dict(json.loads(row[0]))


def _evil_settings(conn: psycopg.Connection[Any], directory: Path) -> None:
    for setting in (
        "aidb_memory.server_pythonpath",
        "aidb_memory.pythonpath",
        "aidb_memory.python_path",
        "aidb_memory.rt",
    ):
        conn.execute(
            pgsql.SQL("SET {} = {}").format(
                pgsql.Identifier(*setting.split(".")), pgsql.Literal(str(directory))
            )
        )
    conn.execute("SET search_path = evil_schema, public")


def test_session_settings_cannot_choose_where_the_server_imports_from(
    db: Database, evil_dir: tuple[Path, Path]
) -> None:
    code, markers = evil_dir
    db.sql(_PROBE)
    recorded = db.value(
        "SELECT value FROM aidb_memory.runtime_settings WHERE key = 'server_pythonpath'"
    )
    assert recorded, "the harness records the server's package directory with `deps`"
    options = f"-c aidb_memory.server_pythonpath={code} -c aidb_memory.pythonpath={code}"
    db.sql("CREATE SCHEMA evil_schema")
    db.sql("GRANT USAGE ON SCHEMA evil_schema TO PUBLIC")

    with psycopg.connect(db.dsn(APP_USER), autocommit=True, options=options) as app:
        _evil_settings(app, code)
        assert app.execute("SHOW aidb_memory.server_pythonpath").fetchone() == (str(code),)
        assert app.execute("SELECT aidb_memory.version()").fetchone() is not None

    with psycopg.connect(db.dsn(ADMIN_USER), autocommit=True, options=options) as admin:
        _evil_settings(admin, code)
        ident = admin.execute("SELECT aidb_memory.init('evil_test')").fetchone()
        assert ident is not None
        admin.execute("SELECT * FROM aidb_memory.namespace_update('evil_test', NULL, NULL, NULL)")
        info = admin.execute("SELECT aidb_memory.runtime_info()").fetchone()
        assert info is not None
        probe = _probe(admin)

    assert info[0]["server_pythonpath"] == recorded
    assert str(code) not in probe["path"]
    assert recorded in probe["path"]
    assert probe["evil_findable"] is False
    assert probe["package_origin"] == "aidb_memory.runtime_modules:aidb_memory_server"
    assert list(markers.iterdir()) == []


_URL_SETTINGS = (
    "aidb_memory.base_url",
    "aidb_memory.openai_base_url",
    "aidb_memory.model_url",
    "openai.base_url",
    "openai.api_base",
    "aidb.base_url",
)


def test_session_settings_cannot_redirect_a_model_call_or_its_import(
    db: Database, evil_dir: tuple[Path, Path]
) -> None:
    """An aidb_users member who SETs every setting it can think of (import directories, base
    URLs, search_path) and then makes the server call a model: the call goes to the URL the
    admin registered, ``openai`` comes from the recorded directory, the attacker's server is
    never contacted and no module of the attacker's is imported."""
    code, markers = evil_dir
    with serve() as registered, serve() as attacker:
        db.sql(
            "SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)",
            (json.dumps({"model": "fake-chat", "base_url": registered.base_url}),),
        )
        db.sql("SELECT aidb_memory.init('redirect', '{\"llm\": \"chat\"}')")
        db.sql("CREATE SCHEMA evil_schema")
        db.sql("GRANT USAGE ON SCHEMA evil_schema TO PUBLIC")
        urls = " ".join(f"-c {name}={attacker.base_url}" for name in _URL_SETTINGS)
        options = f"-c aidb_memory.server_pythonpath={code} {urls}"
        with psycopg.connect(db.dsn(APP_USER), autocommit=True, options=options) as app:
            _evil_settings(app, code)
            for name in _URL_SETTINGS:
                app.execute(
                    pgsql.SQL("SET {} = {}").format(
                        pgsql.Identifier(*name.split(".")), pgsql.Literal(attacker.base_url)
                    )
                )
            turns = [{"role": "user", "content": "x" * 100} for _ in range(20)]
            app.execute(
                "SELECT aidb_memory.add('redirect', 'mallory', %s::jsonb, 's')",
                (json.dumps(turns),),
            )
            # A fallback_model is a registered name, never a URL.
            row = app.execute(
                "SELECT items, warnings FROM aidb_memory.session_get('redirect', 'mallory', 's',"
                " 1000, %s)",
                (attacker.base_url,),
            ).fetchone()
        assert row is not None
        items, warnings = row
        assert warnings == [] and items[0]["kind"] == "summary"
        assert len(registered.calls()) == 1
        assert attacker.requests == []
    assert list(markers.iterdir()) == [], "the attacker's openai.py was never imported"


def test_a_recorded_directory_is_what_the_server_imports_from(
    db: Database, evil_dir: tuple[Path, Path]
) -> None:
    """The control for the test above: the probe does see a directory that was recorded."""
    code, markers = evil_dir
    db.sql(_PROBE)
    db.sql(
        "UPDATE aidb_memory.runtime_settings SET value = %s WHERE key = 'server_pythonpath'",
        (str(code),),
    )
    with db.connect(ADMIN_USER) as admin:
        admin.execute("SELECT aidb_memory.init('control')")
        probe = _probe(admin)
    assert str(code) in probe["path"]
    assert probe["evil_findable"] is True
    # The package itself still comes from the database, never from that directory.
    assert probe["package_origin"] == "aidb_memory.runtime_modules:aidb_memory_server"
    assert list(markers.iterdir()) == []


def test_search_path_objects_of_the_caller_are_never_used(db: Database) -> None:
    db.sql(
        pgsql.SQL("CREATE SCHEMA evil_schema AUTHORIZATION {}")
        .format(pgsql.Identifier(ADMIN_USER))
        .as_string(None)
    )
    evil_objects = """
        CREATE TABLE evil_schema.runtime_settings (key text, value text);
        INSERT INTO evil_schema.runtime_settings VALUES ('version', 'evil'),
            ('server_pythonpath', '/tmp/evil'), ('generation', 'evil');
        CREATE TABLE evil_schema.runtime_modules (name text, is_package boolean, source text);
        INSERT INTO evil_schema.runtime_modules
            SELECT 'aidb_memory_server.boot', false, 'raise SystemExit';
        CREATE TABLE evil_schema.namespace (id bigint, name text, model_spec jsonb,
            config jsonb, state text, created_at timestamptz, updated_at timestamptz);
        CREATE FUNCTION evil_schema.to_json(timestamptz) RETURNS json LANGUAGE sql
            AS $$ SELECT '"1999-01-01T00:00:00+00:00"'::json $$;
        CREATE FUNCTION evil_schema.clock_timestamp() RETURNS timestamptz LANGUAGE sql
            AS $$ SELECT '1999-01-01'::timestamptz $$;
        CREATE FUNCTION evil_schema.jsonb_typeof(jsonb) RETURNS text LANGUAGE sql
            AS $$ SELECT 'object' $$;
        CREATE TEMP TABLE runtime_settings (key text, value text);
        INSERT INTO pg_temp.runtime_settings VALUES ('version', 'evil');
        CREATE TEMP TABLE namespace (id bigint, name text);
    """
    with db.connect(ADMIN_USER) as admin:
        admin.execute(evil_objects)
        admin.execute("SET search_path = evil_schema, public")
        # The caller's own search path does find its objects ...
        assert (
            admin.execute("SELECT value FROM runtime_settings WHERE key = 'version'").fetchone()[0]
            == "evil"
        )
        # ... but none of ours use them.
        assert admin.execute("SELECT aidb_memory.version()").fetchone() == (__version__,)
        ident = admin.execute("SELECT aidb_memory.init('sp')").fetchone()
        assert ident is not None
        updated = admin.execute(
            "SELECT id, extract(year FROM created_at), extract(year FROM updated_at) "
            "FROM aidb_memory.namespace_update('sp', NULL, NULL, 'INACTIVE')"
        ).fetchone()
        info = admin.execute("SELECT aidb_memory.runtime_info()").fetchone()
        assert info is not None
        assert admin.execute("SELECT count(*) FROM evil_schema.namespace").fetchone() == (0,)
    assert updated is not None and updated[0] == ident[0]
    assert updated[1] > 2000 and updated[2] > 2000
    assert info[0]["server_pythonpath"] != "/tmp/evil"
    assert info[0]["generation"] == db.value(
        "SELECT value FROM aidb_memory.runtime_settings WHERE key = 'generation'"
    )
    assert db.value("SELECT state FROM aidb_memory.namespaces WHERE name = 'sp'") == "INACTIVE"
