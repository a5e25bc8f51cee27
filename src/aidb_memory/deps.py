"""``aidb-memory deps``: the server's own third-party Python packages (SPEC §7, §8).

PL/Python runs the interpreter PostgreSQL was built against (Debian: /usr/bin/python3), not the
one running this CLI, so packages with compiled parts must be built for that interpreter. The
directory is recorded in ``aidb_memory.runtime_settings``, which only a superuser can change; the
server never takes it from a setting a session could ``SET``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from aidb_memory.connection import CliError, require_superuser
from aidb_memory.doctor import probe_server_python
from aidb_memory.installer import read_state

Connection = psycopg.Connection[tuple[Any, ...]]

SERVER_REQUIREMENTS = ("openai>=1.60,<4",)


def default_target(python_version: str) -> Path:
    """Where the packages go unless ``--target`` says otherwise."""
    return Path("/var/lib/aidb_memory") / f"python{python_version}"


def pip_command(python: str | None, server_python: str, target: Path) -> list[str]:
    """The pip invocation that installs the requirements for the server's interpreter."""
    if python:
        return [python, "-m", "pip", "install", "--upgrade", "--target", str(target), *SERVER_REQUIREMENTS]
    # No interpreter given: let this CLI's pip fetch wheels built for the server's Python.
    from packaging import tags

    command = [
        sys.executable, "-m", "pip", "install", "--upgrade", "--target", str(target),
        "--only-binary=:all:", "--implementation", "cp", "--python-version", server_python,
    ]
    for platform in list(dict.fromkeys(tags.platform_tags()))[:40]:
        command += ["--platform", platform]
    return command + list(SERVER_REQUIREMENTS)


def _python_version_of(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True, check=False,
    )
    if out.returncode != 0:
        raise CliError(f"aidb-memory: cannot run {python}: {out.stderr.strip() or out.returncode}")
    return out.stdout.strip()


def make_readable(directory: Path) -> None:
    """The server runs as another OS user: every file must be world-readable."""
    for root, dirs, files in os.walk(directory):
        os.chmod(root, 0o755)
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
        for f in files:
            p = os.path.join(root, f)
            os.chmod(p, os.stat(p).st_mode | 0o444)


def run(conn: Connection, *, python: str | None, target: Path | None, say: Any) -> Path:
    """Install the packages and record the directory; returns the directory."""
    require_superuser(conn, "deps")
    if not read_state(conn).installed:
        raise CliError("aidb-memory: aidb_memory is not installed in this database; run `aidb-memory install` first")
    info = probe_server_python(conn)
    server_version = ".".join(str(info.get("python", "")).split(".")[:2])
    if not server_version:
        raise CliError("aidb-memory: could not learn the server's Python version")
    if python and _python_version_of(python) != server_version:
        raise CliError(
            f"aidb-memory: {python} is Python {_python_version_of(python)} but the server runs "
            f"Python {server_version}; pass the server's interpreter (Debian: /usr/bin/python3)"
        )
    directory = (target or default_target(server_version)).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    say(f"installing {', '.join(SERVER_REQUIREMENTS)} for the server's Python {server_version} into {directory}")
    result = subprocess.run(pip_command(python, server_version, directory), check=False)
    if result.returncode != 0:
        raise CliError(f"aidb-memory: pip failed (exit {result.returncode}); nothing was recorded")
    make_readable(directory)
    with conn.transaction():
        conn.execute(
            "INSERT INTO aidb_memory.runtime_settings (key, value) VALUES ('server_pythonpath', %s) "
            "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()",
            (str(directory),),
        )
    say(f"recorded {directory} as the server's package directory (new connections use it)")
    return directory
