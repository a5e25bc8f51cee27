"""Scene: aidb_memory installed into the database demo, as `aidb-memory install` does; with a
model endpoint, the server's Python given the openai package, as `aidb-memory deps` does."""

from __future__ import annotations

import os
import subprocess

import psycopg

from aidb_memory.connection import CliError, first_line
from aidb_memory.demo.context import Context
from aidb_memory.demo.page import INDENT, Connection
from aidb_memory.install.installer import Package, install
from aidb_memory.ops.deps import SERVER_MODULE, default_target, make_readable, pip_command
from aidb_memory.ops.doctor import probe_server_python
from aidb_memory.throwaway import ThrowawayServer


def scene(ctx: Context) -> None:
    page, admin = ctx.page, ctx.admin
    page.heading("Install aidb_memory into the database demo")
    said: list[str] = []
    install(admin, Package.load(), say=said.append)
    admin.autocommit = True
    migrations = sum(line.startswith("migration ") for line in said)
    page.say(
        f"""
        What `aidb-memory install` does, in one transaction: {migrations} migrations
        applied, the server-side code stored, {said[-1]}.
        """
    )
    page.run(admin, "SELECT aidb_memory.version();")
    if ctx.endpoint is not None:
        page.say(
            f"""
            A model endpoint is configured, so the server's Python needs the
            {SERVER_MODULE} package, which `aidb-memory deps` installs:
            """
        )
        page.say(server_packages(admin, ctx.server))


def server_packages(admin: Connection, server: ThrowawayServer) -> str:
    """Make ``openai`` importable by the server's Python, as ``aidb-memory deps`` does (into the
    throwaway server's directory, unless a ``deps`` directory already exists on this host).
    Returns a sentence saying how it went; never raises."""
    try:
        info = probe_server_python(admin, SERVER_MODULE)
        if "module_version" in info:
            return f"{SERVER_MODULE} {info['module_version']} already imports in the server."
        version = ".".join(str(info.get("python", "")).split(".")[:2])
        directory = default_target(version)
        where = f"{directory}, where `aidb-memory deps` installed it"
        if not (directory / SERVER_MODULE / "__init__.py").is_file():
            directory = server.workdir / "site-packages"
            where = f"{directory}, removed with the server"
            print(
                f"{INDENT}(installing {SERVER_MODULE} for the server's Python {version}; "
                "this takes a little while)",
                flush=True,
            )
            env = {**os.environ, "PIP_ROOT_USER_ACTION": "ignore"}
            pip = subprocess.run(
                pip_command(None, version, directory),
                capture_output=True,
                text=True,
                env=env,
                check=False,
                timeout=900,
            )
            if pip.returncode != 0:
                lines = [ln for ln in pip.stderr.splitlines() if ln.strip()]
                reason = lines[-1].strip() if lines else f"exit {pip.returncode}"
                return f"pip could not install {SERVER_MODULE} for the server: {reason}."
            make_readable(directory)
        with admin.transaction():
            admin.execute(
                "INSERT INTO aidb_memory.runtime_settings (key, value) "
                "VALUES ('server_pythonpath', %s) "
                "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                (str(directory),),
            )
            info = probe_server_python(admin, SERVER_MODULE)
            if "module_version" not in info:
                raise CliError(str(info.get("module_error") or "it does not import"))
        return f"The server's Python imports {SERVER_MODULE} {info['module_version']} from {where}."
    except (psycopg.Error, CliError, OSError, subprocess.SubprocessError) as e:
        return f"{SERVER_MODULE} does not import in the server ({first_line(e)})."
