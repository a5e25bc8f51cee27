"""Connecting to the database the CLI works on, with one-line errors (SPEC §7)."""

from __future__ import annotations

import os

import psycopg
from psycopg import conninfo


class CliError(Exception):
    """A failure to report as one line on stderr with exit status 1."""


def resolve_dsn(dsn: str | None) -> str:
    """``--dsn``, else ``DATABASE_URL``, else the empty string (libpq reads ``PG*``)."""
    if dsn:
        return dsn
    return os.environ.get("DATABASE_URL", "")


def describe(dsn: str) -> str:
    """Where a DSN points, without its password."""
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "the server"
    host = str(params.get("host") or os.environ.get("PGHOST") or "the local socket")
    port = str(params.get("port") or os.environ.get("PGPORT") or "5432")
    db = str(params.get("dbname") or os.environ.get("PGDATABASE") or "(default database)")
    user = str(params.get("user") or os.environ.get("PGUSER") or "(default user)")
    return f"database {db} as {user} on {host}:{port}"


def connect(dsn: str | None, *, autocommit: bool = False) -> psycopg.Connection[tuple[object, ...]]:
    """Open a connection, turning every libpq failure into a :class:`CliError`."""
    resolved = resolve_dsn(dsn)
    try:
        return psycopg.connect(resolved, autocommit=autocommit, connect_timeout=10)
    except psycopg.ProgrammingError as e:  # malformed DSN
        raise CliError(f"aidb-memory: invalid connection string: {first_line(e)}") from e
    except psycopg.OperationalError as e:
        message = str(e)
        where = describe(resolved)
        if "password authentication failed" in message or "authentication failed" in message:
            raise CliError(
                f"aidb-memory: authentication failed for {where}; "
                "check the user and password (PGPASSWORD or ~/.pgpass)"
            ) from e
        if "Connection refused" in message or "No such file or directory" in message:
            raise CliError(
                f"aidb-memory: cannot connect to {where}: connection refused; is PostgreSQL "
                "running there? Set the target with --dsn, DATABASE_URL or PGHOST/PGPORT"
            ) from e
        if "does not exist" in message:
            raise CliError(f"aidb-memory: {where}: {last_line(message)}") from e
        raise CliError(f"aidb-memory: cannot connect to {where}: {last_line(message)}") from e


def first_line(error: BaseException) -> str:
    """The first line of an error message."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def last_line(message: str) -> str:
    """libpq puts the useful part of a connection failure on its last line."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else message


def is_superuser(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    """Whether the connection's role is a superuser."""
    row = conn.execute("SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user").fetchone()
    return bool(row and row[0])


def require_superuser(conn: psycopg.Connection[tuple[object, ...]], action: str) -> None:
    """Refuse with one clear line when the role is not a superuser."""
    if not is_superuser(conn):
        user = conn.execute("SELECT current_user").fetchone()
        name = user[0] if user else "?"
        raise CliError(
            f"aidb-memory: {action} needs a superuser (plpython3u is an untrusted language); "
            f"connected as {name}, which is not one"
        )


def server_major(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    """The server's major version, e.g. 15."""
    return int(conn.info.server_version) // 10000


def require_plpython(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Refuse with the Debian package to install when the server has no plpython3u."""
    row = conn.execute(
        "SELECT 1 FROM pg_catalog.pg_available_extensions WHERE name = 'plpython3u'"
    ).fetchone()
    if not row:
        major = server_major(conn)
        raise CliError(
            "aidb-memory: the server has no plpython3u; install it on the database host "
            f"(Debian/Ubuntu: apt-get install postgresql-plpython3-{major}) and run this again"
        )
