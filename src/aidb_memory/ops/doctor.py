"""``aidb-memory doctor``: is this server ready for aidb_memory, and if not, what to do."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql as pgsql

from aidb_memory.connection import (
    CliError,
    first_line,
    is_superuser,
    plpython_availability,
    plpython_package,
)
from aidb_memory.install import trust
from aidb_memory.install.installer import Package, compare, read_state

Connection = psycopg.Connection[tuple[Any, ...]]

# The third-party module the server-side code needs (installed by ``aidb-memory deps``).
SERVER_MODULE = "openai"

# Runs inside the server (in a transaction that is rolled back) and reports as a NOTICE.
# It adds the recorded package directory to sys.path the way the installed runtime does.
_PROBE = r"""
DO $probe$
import importlib, json, sys
module = __MODULE__
info = {"python": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable}
path = None
# Only a table a superuser owns: one created after doctor's schema check by someone else could be
# a view running their code, or name their directory (aidb_memory.install.trust).
if plpy.execute(
    "SELECT COALESCE((SELECT c.relkind OPERATOR(pg_catalog.=) 'r'::pg_catalog.\"char\""
    " AND r.rolsuper FROM pg_catalog.pg_class c JOIN pg_catalog.pg_roles r"
    " ON r.oid OPERATOR(pg_catalog.=) c.relowner WHERE c.oid OPERATOR(pg_catalog.=)"
    " pg_catalog.to_regclass('aidb_memory.runtime_settings')), false) AS ok"
)[0]["ok"]:
    rows = plpy.execute(
        "SELECT value FROM aidb_memory.runtime_settings WHERE key = 'server_pythonpath'"
    )
    path = rows[0]["value"] if rows.nrows() else None
info["server_pythonpath"] = path
if path and path not in sys.path:
    sys.path.insert(0, path)
importlib.invalidate_caches()
info["module"] = module
# Forget an earlier import in this backend: the answer must come from the path as it is now.
for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
    del sys.modules[name]
try:
    imported = importlib.import_module(module)
    info["module_version"] = str(getattr(imported, "__version__", "unknown"))
    info["module_file"] = getattr(imported, "__file__", None)
except Exception as e:
    info["module_error"] = "%s: %s" % (type(e).__name__, e)
plpy.notice("aidb_memory_probe:" + json.dumps(info))
$probe$ LANGUAGE plpython3u
"""


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report (plus a ``fix:`` line when it is not ok)."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    skipped: bool = False
    failure: str = "missing"  # the status word when not ok (``failed`` for a model call)

    def line(self) -> str:
        status = "skipped" if self.skipped else "ok" if self.ok else self.failure
        fix = f"\n{'':21}fix: {self.fix}" if self.fix and not self.ok else ""
        return f"{status:8} {self.name:11} {self.detail}{fix}"


def probe_server_python(conn: Connection, module: str = SERVER_MODULE) -> dict[str, Any]:
    """Run the probe in a rolled-back transaction and return what the server's Python said.

    Needs a superuser (it may create plpython3u, rolled back). Raises :class:`CliError` if the
    server's Python did not answer.
    """
    if not module or not all(part.isidentifier() for part in module.split(".")):
        raise ValueError(f"not a module name: {module!r}")
    found: dict[str, Any] = {}

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        message = diag.message_primary or ""
        if message.startswith("aidb_memory_probe:"):
            found.update(json.loads(message.split(":", 1)[1]))

    conn.add_notice_handler(on_notice)
    try:
        with conn.transaction(force_rollback=True):
            # The answer comes back as a NOTICE: a role or database that raised
            # client_min_messages above it must not silence the probe.
            conn.execute("SET LOCAL client_min_messages = notice")
            # The CLI's connections are pinned already; a library caller's may not be.
            conn.execute("SET LOCAL search_path = pg_catalog, pg_temp")
            conn.execute("CREATE EXTENSION IF NOT EXISTS plpython3u")
            conn.execute(_PROBE.replace("__MODULE__", json.dumps(module)).encode())
    finally:
        conn.remove_notice_handler(on_notice)
    if "python" not in found:
        raise CliError("aidb-memory: the server's Python ran but did not report back")
    return found


def _model_label(name: str, provider: Any, options: Any) -> str:
    """A model as a report line names it: never a key (options hold none), never its URL."""
    opts = options if isinstance(options, dict) else {}
    what = opts.get("model") if provider == "openai" else opts.get("kind")
    return f"{name} ({provider}{f' {what}' if what else ''})"


def check_models(conn: Connection) -> list[Check]:
    """One line per registered model: calls it once with ``aidb_memory.model_check``.

    Reads ``aidb_memory.models`` as the connecting role; a role that may not (not in
    aidb_admins) gets one skipped line. A model that does not answer is a ``failed`` line with
    the error (which the server composes without the key), never an exception."""
    try:
        with conn.transaction():
            models = conn.execute(
                "SELECT name, provider, options FROM aidb_memory.models ORDER BY name"
            ).fetchall()
    except psycopg.errors.InsufficientPrivilege:
        user = conn.execute("SELECT current_user").fetchone()
        return [
            Check(
                "models",
                False,
                f"not checked: {user[0] if user else 'this role'} may not read aidb_memory.models",
                "run doctor as a member of aidb_admins or a superuser",
                skipped=True,
            )
        ]
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        return []  # no aidb_memory here (or one from before models): the install line says so
    if not models:
        return [Check("models", True, "none registered (aidb_memory.create_model adds one)")]
    checks = []
    for name, provider, options in models:
        label = _model_label(name, provider, options)
        try:
            with conn.transaction():  # the call's usage row is kept
                row = conn.execute("SELECT aidb_memory.model_check(%s)", (name,)).fetchone()
            result = row[0] if row and isinstance(row[0], dict) else {}
        except psycopg.Error as e:
            result = {"ok": False, "error": first_line(e)}
        if result.get("ok"):
            checks.append(
                Check("model", True, f"{label}: answered in {result.get('latency_ms')} ms")
            )
            continue
        error = " ".join(str(result.get("error") or "no answer").split())
        quoted = name.replace("'", "''")
        checks.append(
            Check(
                "model",
                False,
                f"{label}: {error}",
                "check its base_url, key and network; "
                f"SELECT aidb_memory.model_check('{quoted}') tries it again",
                failure="failed",
            )
        )
    return checks


# What search's vector signal can do on each storage (issue 27; docs/operations.md, "Vectors").
_WINDOW = "search compares an actor's newest 1,000 memories with the query's vector, no older one"
_PGVECTOR = "every memory is reachable by meaning, compared in the database's C code"


def check_vectors(conn: Connection) -> list[Check]:
    """Which storage of embeddings is in use (pgvector's vector or real[]), what the other would
    change, and, with pgvector, the stored dimensions that have no HNSW index."""
    from aidb_memory.install.script import HNSW_MAX_DIMENSIONS, VECTOR_INDEX

    row = conn.execute(
        "SELECT t.typname::text, n.nspname::text FROM pg_catalog.pg_attribute a "
        "JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid "
        "JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) t.typnamespace "
        "WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('aidb_memory.memory') "
        "AND a.attname OPERATOR(pg_catalog.=) 'embedding'"
    ).fetchone()
    if row is None:
        return []
    ext = conn.execute(
        "SELECT default_version, installed_version FROM pg_catalog.pg_available_extensions "
        "WHERE name OPERATOR(pg_catalog.=) 'vector'"
    ).fetchone()
    if row[0] != "vector":
        if ext is None:
            detail = (
                f"real[] (pgvector is not installed in this server): {_WINDOW}; with pgvector "
                "installed, `aidb-memory install` moves the embeddings to it, and then "
                f"{_PGVECTOR}"
            )
        else:
            detail = (
                f"real[] (installed --without-pgvector): {_WINDOW}; pgvector {ext[0]} is "
                f"available: `aidb-memory install` moves the embeddings to it, and then {_PGVECTOR}"
            )
        return [Check("vectors", True, detail)]
    schema = pgsql.Identifier(row[1])
    stored = conn.execute(
        pgsql.SQL(
            "SELECT coalesce(pg_catalog.array_agg(DISTINCT {}.vector_dims(embedding)), '{{}}') "
            "FROM aidb_memory.memory WHERE embedding IS NOT NULL AND valid_to IS NULL"
        ).format(schema)
    ).fetchone()
    dims = sorted(stored[0]) if stored else []
    indexed = [
        d
        for d in dims
        if conn.execute(
            "SELECT pg_catalog.to_regclass(%s) IS NOT NULL", (f"aidb_memory.{VECTOR_INDEX % d}",)
        ).fetchone()
        == (True,)
    ]
    version = ext[1] if ext else "?"
    detail = (
        f"pgvector {version} (schema {row[1]}): embeddings are vector values; {_PGVECTOR} (an "
        "actor's exactly up to 5,000 of a dimension, through the dimension's HNSW index above); "
        f"HNSW indexes: {', '.join(f'{d} dimensions' for d in indexed) or 'none'}; without "
        f"pgvector, {_WINDOW}"
    )
    missing = [d for d in dims if d not in indexed and d <= HNSW_MAX_DIMENSIONS]
    if missing:
        return [
            Check(
                "vectors",
                False,
                detail + f"; vectors of {', '.join(map(str, missing))} dimensions have no HNSW "
                "index: a large actor's are scanned exactly, slower",
                "aidb-memory install creates the HNSW index of every stored dimension (set "
                "maintenance_work_mem to the index's size first on a large table)",
                failure="partial",
            )
        ]
    return [Check("vectors", True, detail)]


def check_trust(conn: Connection, *, accept_existing_roles: bool = False) -> list[Check]:
    """The schema and roles install would refuse (:mod:`aidb_memory.install.trust`, the same queries
    as the install script). Read from the catalog only, so any role may run them."""
    checks = []
    schema = trust.schema_findings(conn)
    if schema:
        checks.append(
            Check(
                "schema",
                False,
                f"{trust.SCHEMA_WHAT}: {trust.summary(schema)}",
                trust.SCHEMA_HINT,
                failure="refused",
            )
        )
    else:
        checks.append(
            Check("schema", True, "aidb_memory absent, or owned and writable by superusers only")
        )
    roles = trust.role_findings(conn)
    names = ", ".join(trust.ROLES)
    if not roles:
        checks.append(Check("roles", True, f"{names}: absent, or as install left them"))
    elif accept_existing_roles:
        checks.append(
            Check("roles", True, f"accepted (--accept-existing-roles): {trust.summary(roles)}")
        )
    else:
        checks.append(
            Check(
                "roles",
                False,
                f"{trust.ROLE_WHAT}: {trust.summary(roles)}",
                trust.ROLE_HINT,
                failure="refused",
            )
        )
    return checks


def run(conn: Connection, *, accept_existing_roles: bool = False) -> list[Check]:
    """Every check, in the order a person would fix them."""
    version = conn.execute("SHOW server_version").fetchone()
    checks = [Check("server", True, f"PostgreSQL {version[0] if version else '?'}")]
    available = plpython_availability(conn)
    package = f"apt-get install {plpython_package(conn)} (on the database host)"
    if available is None:
        checks.append(Check("plpython3u", False, "not available in this server", package))
        return checks
    where = "installed" if available[1] else "available (install creates it)"
    checks.append(Check("plpython3u", True, f"{where}, version {available[0]}"))
    checks += check_trust(conn, accept_existing_roles=accept_existing_roles)
    if not checks[-2].ok:
        # Everything below reads the schema (the probe, as a superuser, even imports from the
        # directory recorded there): not from one that is anybody's.
        return checks
    if not is_superuser(conn):
        checks.append(
            Check(
                "python",
                False,
                "not checked: the checks inside the server (its Python, "
                f"{SERVER_MODULE}) need a superuser",
                "run doctor as a superuser (e.g. user=postgres in --dsn, or PGUSER)",
                skipped=True,
            )
        )
        return checks + check_models(conn)
    try:
        info = probe_server_python(conn)
    except (psycopg.Error, CliError) as e:
        checks.append(
            Check(
                "python",
                False,
                f"PL/Python does not run in this server: {first_line(e)}",
                f"check the server log; reinstall {plpython_package(conn)} on the database host",
            )
        )
        return checks
    checks.append(Check("python", True, f"the server runs Python {info['python']}"))
    if "module_version" in info:
        checks.append(
            Check(
                SERVER_MODULE,
                True,
                f"imports in the server (version {info['module_version']})",
            )
        )
    else:
        path = info.get("server_pythonpath") or "none recorded"
        checks.append(
            Check(
                SERVER_MODULE,
                False,
                f"does not import in the server ({info.get('module_error')}; "
                f"package directory: {path})",
                "aidb-memory deps (run on the database host as a user who can write the directory)",
            )
        )
    ours = Package.load()
    state = read_state(conn, ours)
    if not state.installed:
        checks.append(
            Check("aidb_memory", False, "not installed in this database", "aidb-memory install")
        )
    else:
        report = compare(state, ours)
        detail = f"version {state.version}, {len(report.applied)} migrations applied"
        if report.pending:
            detail += f", {len(report.pending)} pending"
        if report.problems:
            detail += f", drift: {report.problems[0]}"
        checks.append(
            Check(
                "aidb_memory",
                not report.problems and not report.pending,
                detail,
                "aidb-memory install"
                if report.pending
                else "`aidb-memory verify` lists the drift; `aidb-memory install` repairs it",
            )
        )
        checks += check_vectors(conn)
        checks += check_models(conn)
    return checks
