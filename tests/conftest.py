"""The test harness (SPEC §8): one throwaway PostgreSQL per run, one fresh database per test.

The server starts once (as the ``postgres`` OS user when the tests run as root). A template
database gets aidb_memory installed by our own installer, the server's Python packages by our own
``deps`` command, and every test that needs a database gets a clone of that template, so tests
are independent and fast. Roles are cluster-wide: ``app_user`` (only in ``aidb_users``) and
``admin_user`` (in ``aidb_admins``) exist for the whole run.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from aidb_memory.install.installer import Package, install
from aidb_memory.throwaway import ThrowawayServer
from fake_openai import FakeOpenAI, serve

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = "aidb_template"
# The same, installed with embeddings kept as real[] (install --without-pgvector): the path of a
# server without pgvector, which the suite runs whether or not this one has it (issue 27).
REAL_TEMPLATE = "aidb_template_real"
PGVECTOR_MISSING = (
    "pgvector is not installed in this PostgreSQL (../shared/pgvector/build.sh builds it): "
    "the pgvector path is not tested"
)
APP_USER = "app_user"
ADMIN_USER = "admin_user"
WORKER_USER = "worker_user"
# The attackers of tests/security/ (cluster-wide, created once per run by ``attack_roles``).
NO_GRANT_USER = "nogrant_user"  # may connect, member of nothing
OWNER_USER = "dbowner_user"  # owns the databases of ``owned_db``; not a superuser
CREATEROLE_USER = "createrole_user"  # CREATEROLE, member of nothing
_counter = itertools.count()


class SqlDatabase:
    """A database reached by its dsn, with helpers to run SQL as different roles: one of the
    throwaway server (Database) or of a Citus cluster (test_citus_cluster.Node)."""

    def dsn(self, user: str = "postgres") -> str:
        raise NotImplementedError

    def connect(self, user: str = "postgres", autocommit: bool = True) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn(user), autocommit=autocommit)

    def sql(self, query: str, params: Any = None, user: str = "postgres") -> list[tuple[Any, ...]]:
        """Run one statement in its own connection and return its rows (if any)."""
        with self.connect(user) as conn:
            cur = conn.execute(query, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def value(self, query: str, params: Any = None, user: str = "postgres") -> Any:
        rows = self.sql(query, params, user)
        return rows[0][0] if rows else None


class Database(SqlDatabase):
    """One database of the throwaway server."""

    def __init__(self, server: ThrowawayServer, name: str) -> None:
        self.server = server
        self.name = name

    def dsn(self, user: str = "postgres") -> str:
        return self.server.dsn(self.name, user)


def chat_namespace(db: SqlDatabase, base_url: str, ns: str) -> None:
    """Namespace ``ns`` whose model is the fake OpenAI-compatible server at ``base_url``, with
    no client retries (one model_usage row per attempt)."""
    opts = {"model": "fake-chat", "base_url": base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\')', (ns,))


def queue_extraction(db: SqlDatabase, ns: str, text: str, actor: str = "alice") -> str:
    """An application's add of one user turn to session 's' (an extraction event for the
    worker); the event's public id."""
    return str(
        db.value(
            "SELECT aidb_memory.add(%s, %s, %s::jsonb, 's')",
            (ns, actor, json.dumps([{"role": "user", "content": text}])),
            user=APP_USER,
        )
    )


def pending_events(db: SqlDatabase, ns: str, n: int, actors: int = 10) -> None:
    """A new namespace ``ns`` with a backlog of ``n`` accepted extraction events of ``actors``
    actors, written directly (no add, no turns): what metrics() and status count."""
    db.sql("SELECT aidb_memory.init(%s, '{}')", (ns,))
    db.sql(
        """
        INSERT INTO aidb_memory.event (actor_key, namespace_id, actor_id, turn_count, status)
        SELECT aidb_memory.actor_key(n.name, 'a' || (i %% %(actors)s)), n.id,
               'a' || (i %% %(actors)s), 1, 'accepted'
        FROM pg_catalog.generate_series(1, %(n)s) AS i, aidb_memory.namespace AS n
        WHERE n.name = %(ns)s
        """,
        {"ns": ns, "n": n, "actors": actors},
    )


def run_cli(
    *args: str, dsn: str | None = None, env: dict[str, str] | None = None, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``aidb-memory`` as a user would, in a separate process."""
    full_env = {
        k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "DATABASE_URL"
    }
    full_env.update(env or {})
    command = [sys.executable, "-m", "aidb_memory", *args]
    if dsn is not None:
        command += ["--dsn", dsn]
    return subprocess.run(
        command, capture_output=True, text=True, env=full_env, input=input, timeout=300, check=False
    )


def psql(dsn: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run psql against ``dsn`` with ON_ERROR_STOP."""
    return subprocess.run(
        ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", dsn, *args],
        capture_output=True,
        text=True,
        input=input,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="session")
def pg_server() -> Iterator[ThrowawayServer]:
    server = ThrowawayServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def server_pylib(pg_server: ThrowawayServer) -> Iterator[Path]:
    """A directory the server's Python can import openai from, built once per run by ``deps``."""
    directory = Path(tempfile.mkdtemp(prefix="aidb-memory-pylib-"))
    directory.chmod(0o755)
    try:
        yield directory / "site-packages"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(pg_server: ThrowawayServer, server_pylib: Path) -> Database:
    """The installed template that every ``db`` is cloned from."""
    with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {TEMPLATE}")
    template = Database(pg_server, TEMPLATE)
    with template.connect(autocommit=False) as conn:
        install(conn, Package.load(), say=lambda _line: None)
        conn.commit()
    result = run_cli("deps", "--target", str(server_pylib), dsn=template.dsn())
    assert result.returncode == 0, result.stdout + result.stderr
    with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {APP_USER} LOGIN IN ROLE aidb_users")
        admin.execute(f"CREATE ROLE {ADMIN_USER} LOGIN IN ROLE aidb_admins")
        admin.execute(f"CREATE ROLE {WORKER_USER} LOGIN IN ROLE aidb_workers")
        admin.execute(f"ALTER DATABASE {TEMPLATE} WITH ALLOW_CONNECTIONS false")
    return template


def _create_database(server: ThrowawayServer, template: str) -> Database:
    name = f"t{os.getpid()}_{next(_counter)}"
    with psycopg.connect(server.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE {template} STRATEGY FILE_COPY")
    return Database(server, name)


def _drop_database(db: Database) -> None:
    with psycopg.connect(db.server.dsn(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db.name} WITH (FORCE)")


def pgvector_available(server: ThrowawayServer) -> bool:
    """Whether the server can create the vector extension (pgvector)."""
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'"
        ).fetchone()
    return bool(row and row[0])


@pytest.fixture(scope="session")
def real_template_db(template_db: Database, server_pylib: Path) -> Database:
    """A template like ``template_db`` whose embeddings stay real[] (install without pgvector),
    with the same server-side package directory (``deps`` recorded it there)."""
    server = template_db.server
    with psycopg.connect(server.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {REAL_TEMPLATE}")
    template = Database(server, REAL_TEMPLATE)
    with template.connect(autocommit=False) as conn:
        install(conn, Package.load(), say=lambda _line: None, pgvector=False)
        conn.commit()
    template.sql(
        "INSERT INTO aidb_memory.runtime_settings (key, value) VALUES ('server_pythonpath', %s)",
        (str(server_pylib.resolve()),),
    )
    with psycopg.connect(server.dsn(), autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {REAL_TEMPLATE} WITH ALLOW_CONNECTIONS false")
    return template


@pytest.fixture
def real_db(pg_server: ThrowawayServer, real_template_db: Database) -> Iterator[Database]:
    """A fresh database with aidb_memory installed and embeddings stored as real[]."""
    database = _create_database(pg_server, real_template_db.name)
    try:
        yield database
    finally:
        _drop_database(database)


@pytest.fixture(params=["pgvector", "real[]"])
def vector_db(request: pytest.FixtureRequest, pg_server: ThrowawayServer) -> Iterator[Database]:
    """A fresh database of each storage of embeddings (issue 27): pgvector (skipped, with the
    reason, where the server does not have it) and real[]."""
    if request.param == "pgvector":
        if not pgvector_available(pg_server):
            pytest.skip(PGVECTOR_MISSING)
        yield request.getfixturevalue("db")
    else:
        yield request.getfixturevalue("real_db")


@pytest.fixture
def db(pg_server: ThrowawayServer, template_db: Database) -> Iterator[Database]:
    """A fresh database with aidb_memory installed (a clone of the template)."""
    database = _create_database(pg_server, template_db.name)
    try:
        yield database
    finally:
        _drop_database(database)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    """A fake OpenAI-compatible server for one test (tests/fake_openai.py); a module that wants
    other default answers defines its own ``fake``."""
    with serve() as server:
        yield server


@pytest.fixture(scope="session")
def attack_roles(template_db: Database) -> dict[str, str]:
    """The roles an attacker may have, besides app_user, admin_user and worker_user."""
    with psycopg.connect(template_db.server.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {NO_GRANT_USER} LOGIN")
        admin.execute(f"CREATE ROLE {OWNER_USER} LOGIN")
        admin.execute(f"CREATE ROLE {CREATEROLE_USER} LOGIN CREATEROLE")
    return {"no_grant": NO_GRANT_USER, "owner": OWNER_USER, "createrole": CREATEROLE_USER}


@pytest.fixture
def owned_db(
    pg_server: ThrowawayServer, template_db: Database, attack_roles: dict[str, str]
) -> Iterator[Database]:
    """Like ``db`` (aidb_memory installed), but owned by a role that is not a superuser, which
    therefore owns schema public too (PostgreSQL 15: pg_database_owner)."""
    name = f"t{os.getpid()}_{next(_counter)}"
    with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
        admin.execute(
            f"CREATE DATABASE {name} OWNER {OWNER_USER} TEMPLATE {template_db.name} "
            "STRATEGY FILE_COPY"
        )
    database = Database(pg_server, name)
    try:
        yield database
    finally:
        _drop_database(database)


@pytest.fixture
def owned_empty_db(
    pg_server: ThrowawayServer, template_db: Database, attack_roles: dict[str, str]
) -> Iterator[Database]:
    """A database with nothing of ours in it, owned by a role that is not a superuser."""
    name = f"t{os.getpid()}_{next(_counter)}"
    with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
        admin.execute(
            f"CREATE DATABASE {name} OWNER {OWNER_USER} TEMPLATE template0 STRATEGY FILE_COPY"
        )
    database = Database(pg_server, name)
    try:
        yield database
    finally:
        _drop_database(database)


@pytest.fixture
def empty_db(pg_server: ThrowawayServer, template_db: Database) -> Iterator[Database]:
    """A fresh database with nothing of ours in it (the roles exist: they are cluster-wide)."""
    database = _create_database(pg_server, "template0")
    try:
        yield database
    finally:
        _drop_database(database)


@pytest.fixture
def source_tree(tmp_path: Path) -> Path:
    """A copy of the package's sql/, migrations/ and plpython/ that a test may edit."""
    root = tmp_path / "source"
    for name in ("sql", "migrations", "plpython"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    return root
