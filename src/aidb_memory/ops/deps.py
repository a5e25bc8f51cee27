"""``aidb-memory deps``: the server's own third-party Python packages (SPEC §7, §8).

PL/Python runs the interpreter PostgreSQL was built against (Debian: /usr/bin/python3), not the
one running this CLI, so packages with compiled parts must be built for that interpreter. The
directory is recorded in ``aidb_memory.runtime_settings``, which only a superuser can change; the
server never takes it from a setting a session could ``SET``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from aidb_memory.connection import CliError, require_superuser
from aidb_memory.install.installer import read_state
from aidb_memory.ops.doctor import probe_server_python

Connection = psycopg.Connection[tuple[Any, ...]]

SERVER_REQUIREMENTS = ("openai>=1.60,<4", "jsonschema>=4.18,<5")
# What must import in the server once the requirements are installed.
SERVER_MODULE = "openai"


def default_target(python_version: str) -> Path:
    """Where the packages go unless ``--target`` says otherwise."""
    return Path("/var/lib/aidb_memory") / f"python{python_version}"


def pip_command(python: str | None, server_python: str, target: Path) -> list[str]:
    """The pip invocation that installs the requirements for the server's interpreter."""
    install = ["-m", "pip", "install", "--upgrade", "--target", str(target)]
    if python:
        return [python, *install, *SERVER_REQUIREMENTS]
    # No interpreter given: let this CLI's pip fetch wheels built for the server's Python.
    from packaging import tags

    command = [sys.executable, *install, "--only-binary=:all:", "--implementation", "cp"]
    command += ["--python-version", server_python]
    for platform in list(dict.fromkeys(tags.platform_tags()))[:40]:
        command += ["--platform", platform]
    return command + list(SERVER_REQUIREMENTS)


def _run(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [python, *args], capture_output=True, text=True, check=False, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise CliError(
            f"aidb-memory: cannot run --python {python}: {reason}; "
            "pass the server's interpreter (Debian: /usr/bin/python3)"
        ) from None


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def python_version_of(python: str) -> str:
    """``major.minor`` of an interpreter, e.g. ``3.11``."""
    out = _run(python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])")
    version = out.stdout.strip()
    if out.returncode != 0 or not re.fullmatch(r"\d+\.\d+", version):
        reason = _last_line(out.stderr) or f"exit {out.returncode}, output {version!r}"
        raise CliError(f"aidb-memory: --python {python} is not a working Python: {reason}")
    return version


def require_pip(python: str) -> None:
    """Refuse with the fix when the interpreter cannot run pip."""
    out = _run(python, "-m", "pip", "--version")
    if out.returncode == 0:
        return
    if "No module named pip" in out.stderr + out.stdout:
        raise CliError(
            f"aidb-memory: {python} has no pip (No module named pip); install it "
            "(Debian: apt-get install python3-pip), or omit --python to fetch wheels for the "
            "server's Python with this CLI's pip"
        )
    reason = _last_line(out.stderr) or f"exit {out.returncode}"
    raise CliError(f"aidb-memory: `{python} -m pip` does not run: {reason}")


def make_readable(directory: Path) -> None:
    """The server runs as another OS user: every file world-readable, none writable by others.

    The server imports and runs this code, so nobody but the owner may change it.
    """
    for root, dirs, files in os.walk(directory):
        os.chmod(root, 0o755)
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
        for f in files:
            p = os.path.join(root, f)
            os.chmod(p, (os.stat(p).st_mode | 0o444) & ~0o022)


def _record_and_check(conn: Connection, directory: Path) -> str:
    """Record the directory, and keep it only if the server's Python imports from it."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO aidb_memory.runtime_settings (key, value) "
            "VALUES ('server_pythonpath', %s) "
            "ON CONFLICT (key) DO UPDATE "
            "SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at",
            (str(directory),),
        )
        info = probe_server_python(conn, SERVER_MODULE)
        where = str(info.get("module_file") or "")
        if "module_version" not in info or not where.startswith(str(directory) + os.sep):
            reason = info.get("module_error") or f"it comes from {where or 'elsewhere'}"
            raise CliError(
                f"aidb-memory: installed into {directory}, but the server's Python cannot import "
                f"{SERVER_MODULE} from there ({reason}); run deps on the database host and make "
                f"{directory} and every directory above it readable by the server's OS user; "
                "nothing was recorded"
            )
        return str(info["module_version"])


def run(conn: Connection, *, python: str | None, target: Path | None, say: Any) -> Path:
    """Install the packages and record the directory; returns the directory."""
    require_superuser(conn, "deps")
    if not read_state(conn).installed:
        raise CliError(
            "aidb-memory: aidb_memory is not installed in this database; "
            "run `aidb-memory install` first"
        )
    info = probe_server_python(conn, SERVER_MODULE)
    server_version = ".".join(str(info.get("python", "")).split(".")[:2])
    if not server_version:
        raise CliError("aidb-memory: could not learn the server's Python version")
    if python:
        version = python_version_of(python)
        if version != server_version:
            raise CliError(
                f"aidb-memory: --python {python} is Python {version} but the server runs "
                f"Python {server_version}; packages with compiled parts only work for the same "
                "version: pass the server's interpreter (Debian: /usr/bin/python3)"
            )
        require_pip(python)
    directory = (target or default_target(server_version)).resolve()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(
            f"aidb-memory: cannot create {directory}: {e.strerror or e}; "
            "pass --target a directory you can write and the server can read"
        ) from None
    wanted = ", ".join(SERVER_REQUIREMENTS)
    say(f"installing {wanted} for the server's Python {server_version} into {directory}")
    # deps is meant to run as root (it writes under /var/lib): pip need not warn about that.
    env = {**os.environ, "PIP_ROOT_USER_ACTION": os.environ.get("PIP_ROOT_USER_ACTION", "ignore")}
    command = pip_command(python, server_version, directory)
    result = subprocess.run(command, check=False, env=env)
    if result.returncode != 0:
        raise CliError(f"aidb-memory: pip failed (exit {result.returncode}); nothing was recorded")
    make_readable(directory)
    version = _record_and_check(conn, directory)
    say(f"{SERVER_MODULE} {version} imports in the server from {directory}")
    say(f"recorded {directory} as the server's package directory (new connections use it)")
    return directory
