"""``aidb-memory doctor``: is this server ready for aidb_memory, and if not, what to do."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import psycopg

from aidb_memory.connection import is_superuser, server_major
from aidb_memory.installer import Package, compare, read_state

Connection = psycopg.Connection[tuple[Any, ...]]

# Runs inside the server (in a transaction that is rolled back) and reports as a NOTICE.
_PROBE = r"""
DO $probe$
import json, sys
info = {"python": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable}
path = None
if plpy.execute("SELECT to_regclass('aidb_memory.runtime_settings') IS NOT NULL AS ok")[0]["ok"]:
    rows = plpy.execute("SELECT value FROM aidb_memory.runtime_settings WHERE key = 'server_pythonpath'")
    path = rows[0]["value"] if rows.nrows() else None
info["server_pythonpath"] = path
if path and path not in sys.path:
    sys.path.insert(0, path)
try:
    import openai
    info["openai"] = getattr(openai, "__version__", "unknown")
    info["openai_file"] = getattr(openai, "__file__", None)
except Exception as e:
    info["openai_error"] = "%s: %s" % (type(e).__name__, e)
plpy.notice("aidb_memory_probe:" + json.dumps(info))
$probe$ LANGUAGE plpython3u
"""


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report."""

    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        status = "ok" if self.ok else "missing"
        fix = f"\n{'':21}fix: {self.fix}" if self.fix and not self.ok else ""
        return f"{status:8} {self.name:11} {self.detail}{fix}"


def probe_server_python(conn: Connection) -> dict[str, Any]:
    """Run the probe in a rolled-back transaction and return what the server's Python said."""
    found: dict[str, Any] = {}

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        message = diag.message_primary or ""
        if message.startswith("aidb_memory_probe:"):
            found.update(json.loads(message.split(":", 1)[1]))

    conn.add_notice_handler(on_notice)
    try:
        with conn.transaction(force_rollback=True):
            conn.execute("CREATE EXTENSION IF NOT EXISTS plpython3u")
            conn.execute(_PROBE.encode())
    finally:
        conn.remove_notice_handler(on_notice)
    return found


def run(conn: Connection) -> list[Check]:
    """Every check, in the order a person would fix them."""
    major = server_major(conn)
    version = conn.execute("SHOW server_version").fetchone()
    checks = [Check("server", True, f"PostgreSQL {version[0] if version else major}")]
    available = conn.execute(
        "SELECT default_version, installed_version FROM pg_catalog.pg_available_extensions "
        "WHERE name = 'plpython3u'"
    ).fetchone()
    package = f"apt-get install postgresql-plpython3-{major} (on the database host)"
    if not available:
        checks.append(Check("plpython3u", False, "not available in this server", package))
        return checks
    where = "installed" if available[1] else "available (install creates it)"
    checks.append(Check("plpython3u", True, f"{where}, version {available[0]}"))
    if not is_superuser(conn):
        checks.append(
            Check("python", False, "cannot look inside the server without a superuser",
                  "run doctor with a superuser connection")
        )
        return checks
    info = probe_server_python(conn)
    checks.append(Check("python", True, f"the server runs Python {info.get('python')}"))
    if "openai" in info:
        checks.append(Check("openai", True, f"imports in the server (version {info['openai']})"))
    else:
        path = info.get("server_pythonpath") or "none recorded"
        checks.append(
            Check(
                "openai",
                False,
                f"does not import in the server ({info.get('openai_error')}; package directory: {path})",
                "aidb-memory deps (run on the database host as a user who can write the directory)",
            )
        )
    state = read_state(conn)
    if not state.installed:
        checks.append(Check("aidb_memory", False, "not installed in this database", "aidb-memory install"))
    else:
        report = compare(state, Package.load())
        detail = f"version {state.version}, {len(report.applied)} migrations applied"
        if report.pending:
            detail += f", {len(report.pending)} pending"
        checks.append(
            Check("aidb_memory", not report.problems and not report.pending, detail,
                  "aidb-memory install" if report.pending else "aidb-memory verify")
        )
    return checks
