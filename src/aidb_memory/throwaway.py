"""A throwaway PostgreSQL server for the demo and the tests (SPEC §8).

``initdb`` and ``postgres`` refuse to run as root, so when we are root the server runs as the
unprivileged ``postgres`` OS user through small wrappers that drop privileges with ``setpriv``
(which keeps the pid, so testing.postgresql can still signal it). Either way the server gets an
explicit, minimal environment: nothing of ours (PYTHONPATH, a venv) leaks into its Python.
"""

from __future__ import annotations

import glob
import os
import pwd
import shlex
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import testing.postgresql

SERVER_USER = "postgres"


def find_bindir() -> Path:
    """PostgreSQL bin directory: ``$PG_BINDIR``, else the newest Debian one with plpython3u."""
    if os.environ.get("PG_BINDIR"):
        return Path(os.environ["PG_BINDIR"])
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda p: int(Path(p).parts[-3]),
        reverse=True,
    )
    for postgres in candidates:
        version_dir = Path(postgres).parent.parent
        if (version_dir / "lib" / "plpython3.so").exists():
            return version_dir / "bin"
    if candidates:
        return Path(candidates[0]).parent
    raise RuntimeError(
        "PostgreSQL server binaries not found; install them: "
        "apt-get install postgresql-15 postgresql-plpython3-15 postgresql-contrib"
    )


def _wrapper(path: Path, program: Path, env: dict[str, str], as_user: str | None) -> None:
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    drop = f"setpriv --reuid={as_user} --regid={as_user} --init-groups " if as_user else ""
    path.write_text(
        f'#!/bin/sh\nexec env -i {assignments} {drop}{shlex.quote(str(program))} "$@"\n'
    )
    path.chmod(0o755)


class _Postgresql(testing.postgresql.Postgresql):  # type: ignore[misc]
    """testing.postgresql, with the data directory handed to the server's OS user."""

    owner: tuple[int, int] | None = None

    def initialize_database(self) -> None:
        if self.owner:
            for root, dirs, files in os.walk(self.base_dir):
                os.chown(root, *self.owner)
                for name in dirs + files:
                    os.chown(os.path.join(root, name), *self.owner)
        super().initialize_database()


class ThrowawayServer:
    """One PostgreSQL server in a temporary directory, removed on :meth:`stop`."""

    def __init__(self, extra_env: dict[str, str] | None = None, postgres_args: str = "") -> None:
        bindir = find_bindir()
        self.bindir = bindir
        self.workdir = Path(tempfile.mkdtemp(prefix="aidb-memory-pg-"))
        self.workdir.chmod(0o755)
        as_user = SERVER_USER if os.geteuid() == 0 else None
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", **(extra_env or {})}
        if as_user:
            env["HOME"] = pwd.getpwnam(as_user).pw_dir
        wrappers = self.workdir / "bin"
        wrappers.mkdir()
        for program in ("initdb", "postgres"):
            _wrapper(wrappers / program, bindir / program, env, as_user)
        base = self.workdir / "server"
        base.mkdir()
        _Postgresql.owner = None
        if as_user:
            pw = pwd.getpwnam(as_user)
            _Postgresql.owner = (pw.pw_uid, pw.pw_gid)
        args = (
            "-h 127.0.0.1 -F -c logging_collector=off -c fsync=off -c full_page_writes=off "
            "-c synchronous_commit=off -c max_connections=200 " + postgres_args
        )
        self._pg = _Postgresql(
            base_dir=str(base),
            initdb=str(wrappers / "initdb"),
            postgres=str(wrappers / "postgres"),
            initdb_args="-U postgres -A trust -E UTF8 --locale=C.UTF-8 --no-sync",
            postgres_args=args,
        )

    @property
    def port(self) -> int:
        return int(self._pg.settings["port"])

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """A libpq connection string for one database of this server."""
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user={user}"

    def restart(self) -> None:
        """Stop the server (fast shutdown: sessions are ended) and start it again, same port
        and data: what a client sees across a server restart."""
        self._pg.terminate(signal.SIGINT)
        self._pg.start()

    def stop(self) -> None:
        """Stop the server and remove everything it wrote."""
        try:
            self._pg.stop()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> ThrowawayServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
