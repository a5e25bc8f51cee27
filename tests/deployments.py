"""Deployment shapes for the tests (issue 10 items 8 and 12): a streaming standby of a throwaway
server, and PgBouncer in transaction pooling mode in front of one.

Both run on loopback in a temporary directory and are stopped, and their directory removed,
whatever happens (context managers). ``postgres``, ``pg_basebackup`` and ``pgbouncer`` refuse to
run as root, so as root they run as the unprivileged ``postgres`` OS user through ``setpriv``
(which execs in place: the pid we hold is the server's, so we can signal it), with a minimal
environment, as :mod:`aidb_memory.throwaway` does for the primary.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import psycopg

from aidb_memory.throwaway import SERVER_USER, ThrowawayServer

STARTUP_S = 60.0  # bound for a server to accept connections, and for a standby to catch up
STOP_S = 30.0


def free_port() -> int:
    """A loopback TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user() -> str | None:
    return SERVER_USER if os.geteuid() == 0 else None


def _command(program: str | Path, *args: str) -> list[str]:
    """``program args``, as the unprivileged server user when we are root."""
    user = _as_server_user()
    drop = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups"] if user else []
    return [*drop, str(program), *args]


def _env() -> dict[str, str]:
    """A minimal environment: nothing of ours (PYTHONPATH, a venv, PG*) leaks into a server."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    user = _as_server_user()
    if user:
        env["HOME"] = pwd.getpwnam(user).pw_dir
    return env


def _workdir(prefix: str) -> Path:
    """A temporary directory the server user owns (it writes sockets and data there)."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    directory.chmod(0o755)
    user = _as_server_user()
    if user:
        pw = pwd.getpwnam(user)
        os.chown(directory, pw.pw_uid, pw.pw_gid)
    return directory


def _stop(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Ask ``process`` to stop with ``sig``; kill it if it has not stopped within STOP_S."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_S)


def _log_tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-3000:]
    except OSError:
        return "(no log)"


class Standby:
    """A hot standby streaming from ``primary``: ``pg_basebackup -R``, then ``postgres``."""

    def __init__(self, primary: ThrowawayServer) -> None:
        self.primary = primary
        self.workdir = _workdir("aidb-memory-standby-")
        self.data = self.workdir / "data"
        self.sockets = self.workdir / "sockets"
        self.log = self.workdir / "standby.log"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        backup = subprocess.run(
            _command(
                self.primary.bindir / "pg_basebackup",
                *("-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres"),
                *("-D", str(self.data), "-R", "-X", "stream", "-c", "fast", "--no-sync"),
            ),
            env=_env(),
            capture_output=True,
            text=True,
            timeout=STARTUP_S * 2,
            check=False,
        )
        assert backup.returncode == 0, f"pg_basebackup failed: {backup.stderr}"
        subprocess.run(_command("mkdir", "-m", "0700", str(self.sockets)), check=True)
        self._log = self.log.open("wb")
        self.process = subprocess.Popen(
            _command(
                self.primary.bindir / "postgres",
                *("-D", str(self.data), "-p", str(self.port), "-h", "127.0.0.1"),
                *("-k", str(self.sockets), "-F", "-c", "logging_collector=off"),
                *("-c", "hot_standby=on", "-c", "max_connections=200"),
            ),
            env=_env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + STARTUP_S
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"the standby exited: {_log_tail(self.log)}")
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2) as conn:
                    if conn.execute("SELECT pg_catalog.pg_is_in_recovery()").fetchone() == (True,):
                        return
            except psycopg.OperationalError:
                pass  # still starting up (or not yet consistent): poll again
            if time.monotonic() > deadline:
                raise AssertionError(f"the standby did not start: {_log_tail(self.log)}")
            time.sleep(0.1)

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user={user}"

    def catch_up(self) -> None:
        """Wait until the standby has replayed everything the primary has written so far.

        The primary runs with synchronous_commit=off, so its last commit record may still be in
        WAL buffers: the insert position (not the write position) is the one that covers it."""
        with psycopg.connect(self.primary.dsn(), autocommit=True) as conn:
            row = conn.execute("SELECT pg_catalog.pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        target = row[0]
        deadline = time.monotonic() + STARTUP_S
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            while True:
                done = conn.execute(
                    "SELECT pg_catalog.pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)
                ).fetchone()
                if done == (True,):
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"the standby did not replay up to {target}")
                time.sleep(0.05)

    def stop(self) -> None:
        try:
            if self.process is not None:
                _stop(self.process, signal.SIGINT)  # fast shutdown
        finally:
            if self._log is not None:
                self._log.close()
            shutil.rmtree(self.workdir, ignore_errors=True)


@contextmanager
def standby_of(primary: ThrowawayServer) -> Iterator[Standby]:
    """A running hot standby of ``primary``, stopped and removed on exit."""
    standby = Standby(primary)
    try:
        standby.start()
        yield standby
    finally:
        standby.stop()


def replication_primary() -> ThrowawayServer:
    """A throwaway server a standby can stream from (PostgreSQL 15's defaults already allow it:
    wal_level=replica, max_wal_senders=10, and initdb's pg_hba trusts replication on loopback;
    we say so explicitly so that a changed default fails here, not in pg_basebackup)."""
    return ThrowawayServer(postgres_args="-c wal_level=replica -c max_wal_senders=4")


PGBOUNCER = Path(shutil.which("pgbouncer") or "/usr/sbin/pgbouncer")


class PgBouncer:
    """PgBouncer on loopback in front of ``server`` (every database, trust, as the client's
    user), in transaction pooling mode with ``pool_size`` server connections per database and
    user."""

    def __init__(self, server: ThrowawayServer, users: list[str], pool_size: int = 2) -> None:
        if not PGBOUNCER.exists():
            raise AssertionError("pgbouncer is not installed: apt-get install -y pgbouncer")
        self.server = server
        self.workdir = _workdir("aidb-memory-pgbouncer-")
        self.port = free_port()
        self.log = self.workdir / "pgbouncer.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        userlist = self.workdir / "userlist.txt"
        userlist.write_text("".join(f'"{user}" ""\n' for user in users))
        self.ini = self.workdir / "pgbouncer.ini"
        self.ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={server.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {userlist}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\nmin_pool_size = 0\nreserve_pool_size = 0\n"
            "max_client_conn = 100\n"
            "ignore_startup_parameters = extra_float_digits\n"
            "server_check_delay = 0\n"
            "log_connections = 0\nlog_disconnections = 0\n"
        )
        for path in (userlist, self.ini):
            path.chmod(0o644)

    def start(self) -> None:
        self._log = self.log.open("wb")
        self.process = subprocess.Popen(
            _command(PGBOUNCER, str(self.ini)),
            env=_env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + STARTUP_S
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"pgbouncer exited: {_log_tail(self.log)}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                pass  # not listening yet: poll again
            if time.monotonic() > deadline:
                raise AssertionError(f"pgbouncer did not start: {_log_tail(self.log)}")
            time.sleep(0.05)

    def dsn(self, dbname: str, user: str) -> str:
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user={user}"

    def connect(self, dbname: str, user: str, **kwargs: Any) -> psycopg.Connection[Any]:
        """A connection through PgBouncer. PgBouncer 1.18 (Debian 12) cannot carry prepared
        statements across a transaction pool (max_prepared_statements came in 1.21), so psycopg
        must never prepare: prepare_threshold=None."""
        return psycopg.connect(self.dsn(dbname, user), prepare_threshold=None, **kwargs)

    def stop(self) -> None:
        try:
            if self.process is not None:
                _stop(self.process, signal.SIGTERM)  # immediate shutdown
        finally:
            if self._log is not None:
                self._log.close()
            shutil.rmtree(self.workdir, ignore_errors=True)


@contextmanager
def pgbouncer_for(
    server: ThrowawayServer, users: list[str], pool_size: int = 2
) -> Iterator[PgBouncer]:
    """A running PgBouncer in front of ``server``, stopped and removed on exit."""
    bouncer = PgBouncer(server, users, pool_size)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.stop()


# --- Citus ------------------------------------------------------------------------------------

# Every node loads citus; triggers on distributed tables need enable_unsafe_triggers
# (docs/scaling.md, "Triggers"), cluster-wide, as the docs tell users to set it.
# pg_stat_statements beside Citus: a test reads what the statements of a call cost (jit).
CITUS_ARGS = (
    "-c shared_preload_libraries=citus,pg_stat_statements -c citus.enable_unsafe_triggers=on"
)


def citus_available(server: ThrowawayServer) -> bool:
    """Whether the citus extension is installed in ``server``'s PostgreSQL
    (../shared/citus/build.sh installs it)."""
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_catalog.pg_available_extensions WHERE name = 'citus'"
        ).fetchone()
    return row == (1,)


class CitusCluster:
    """A Citus coordinator and ``workers`` workers, each a :class:`ThrowawayServer` on loopback
    (so each runs as the unprivileged server user when we are root) with citus preloaded.

    Citus keeps its metadata per database: :meth:`create_database` makes a database on every
    node, creates the extension in each and adds the workers to the coordinator's metadata."""

    def __init__(self, workers: int = 2) -> None:
        self.coordinator: ThrowawayServer | None = None
        self.workers: list[ThrowawayServer] = []
        try:
            self.coordinator = ThrowawayServer(postgres_args=CITUS_ARGS)
            for _ in range(workers):
                self.workers.append(ThrowawayServer(postgres_args=CITUS_ARGS))
        except BaseException:
            self.stop()
            raise

    @property
    def nodes(self) -> list[ThrowawayServer]:
        assert self.coordinator is not None
        return [self.coordinator, *self.workers]

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """The coordinator's: what an application and the CLI connect to."""
        assert self.coordinator is not None
        return self.coordinator.dsn(dbname, user)

    def create_database(self, name: str) -> None:
        assert self.coordinator is not None
        for node in self.nodes:
            with psycopg.connect(node.dsn(), autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {name}")
            with psycopg.connect(node.dsn(name), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION citus")
        with psycopg.connect(self.dsn(name), autocommit=True) as conn:
            conn.execute(
                "SELECT pg_catalog.citus_set_coordinator_host('127.0.0.1', %s)",
                (self.coordinator.port,),
            )
            for worker in self.workers:
                conn.execute("SELECT pg_catalog.citus_add_node('127.0.0.1', %s)", (worker.port,))

    def drop_database(self, name: str) -> None:
        # The coordinator first: it holds connections to the workers' copies.
        for node in self.nodes:
            with psycopg.connect(node.dsn(), autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        # Every node, whatever happens to one of them.
        for node in [*self.workers, *([self.coordinator] if self.coordinator else [])]:
            with contextlib.suppress(Exception):
                node.stop()


@contextmanager
def citus_cluster(workers: int = 2) -> Iterator[CitusCluster]:
    """A running Citus cluster, stopped and removed on exit."""
    cluster = CitusCluster(workers)
    try:
        yield cluster
    finally:
        cluster.stop()
