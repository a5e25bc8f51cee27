"""Connecting to the database the CLI works on, with one-line errors (SPEC §7)."""

from __future__ import annotations

import getpass
import os
import re

import psycopg
from psycopg import conninfo

# The procedural language aidb_memory's functions are written in. A module constant so that the
# "server without plpython3u" path can be exercised on a server that has it (tests).
PLPYTHON_EXTENSION = "plpython3u"

Connection = psycopg.Connection[tuple[object, ...]]


class CliError(Exception):
    """A failure to report as one line on stderr with exit status 1."""


def resolve_dsn(dsn: str | None) -> str:
    """``--dsn``, else ``DATABASE_URL``, else the empty string (libpq reads ``PG*``)."""
    if dsn:
        return dsn
    return os.environ.get("DATABASE_URL", "")


def describe(dsn: str) -> str:
    """Where a DSN points, as libpq would resolve it, never with its password."""
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "the server"
    host = str(params.get("host") or os.environ.get("PGHOST") or "the local socket")
    port = str(params.get("port") or os.environ.get("PGPORT") or "5432")
    user = str(params.get("user") or os.environ.get("PGUSER") or _os_user())
    # libpq's default database is the user name.
    db = str(params.get("dbname") or os.environ.get("PGDATABASE") or user)
    return f"database {db} as {user} on {host}:{port}"


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "(default user)"


_PASSWORD_IN_KEYWORDS = re.compile(r"\bpassword\s*=\s*", re.IGNORECASE)
_PASSWORD_IN_URI = re.compile(r"^[a-z]+://[^:/@?#]*:([^@]*)@", re.IGNORECASE)


def redact(text: str, dsn: str) -> str:
    """``text`` with every quoted fragment of ``dsn``'s password replaced by ``***``.

    libpq's parse errors quote the part of a malformed connection string they choke on, and that
    part may be (a piece of) the password.
    """
    secrets = []
    match = _PASSWORD_IN_KEYWORDS.search(dsn)
    if match:
        secrets.append(dsn[match.end() :])
    uri = _PASSWORD_IN_URI.match(dsn)
    if uri:
        secrets.append(uri.group(1))
    if not secrets:
        return text

    def hide(quoted: re.Match[str]) -> str:
        fragment = quoted.group(1)
        if len(fragment) > 1 and any(fragment in s for s in secrets):
            return '"***"'
        return quoted.group(0)

    text = re.sub(r'"([^"]*)"', hide, text)
    for secret in secrets:
        if len(secret) > 3 and secret in text:
            text = text.replace(secret, "***")
    return text


def connection_reason(message: str) -> str:
    """The part of a libpq connection failure that says what went wrong, on one line."""
    lines = [ln for ln in message.splitlines() if ln.strip() and not ln[:1].isspace()]
    line = (lines[-1] if lines else message).strip()
    line = re.sub(r"^- host: .*?: (?=connection )", "", line)  # psycopg's multi-attempt list
    line = re.sub(r"^.*\bfailed: ", "", line)  # "connection to server at ... failed: "
    line = re.sub(r"^(connection is bad|connection failed): ", "", line)
    line = re.sub(r"^(FATAL|ERROR):\s+", "", line)
    return line.strip() or "unknown error"


# Every statement the CLI sends runs as a superuser, usually in a database whose owner may have
# set `ALTER DATABASE ... SET search_path = public, pg_catalog` and put functions or operators in
# public that look like pg_catalog's. Startup options take precedence over database and role
# settings, so from the first statement on nothing resolves to another role's objects.
PINNED_OPTION = "-c search_path=pg_catalog,pg_temp"


def pinned_options(dsn: str) -> str:
    """The libpq ``options`` for ``dsn``: the user's own (from the DSN, else PGOPTIONS), then
    the pinned search_path, which wins because it comes last."""
    try:
        given = conninfo.conninfo_to_dict(dsn).get("options")
    except psycopg.ProgrammingError:
        given = None  # psycopg.connect reports the malformed DSN
    if given is None:
        given = os.environ.get("PGOPTIONS")
    return f"{given} {PINNED_OPTION}" if given else PINNED_OPTION


def connect(dsn: str | None, *, autocommit: bool = False) -> Connection:
    """Open a connection with the search_path pinned, turning every libpq failure into a
    :class:`CliError`."""
    resolved = resolve_dsn(dsn)
    try:
        return psycopg.connect(
            resolved, autocommit=autocommit, connect_timeout=10, options=pinned_options(resolved)
        )
    except psycopg.ProgrammingError as e:  # malformed DSN
        reason = redact(first_line(e), resolved)
        raise CliError(
            f"aidb-memory: invalid connection string: {reason}; check --dsn or DATABASE_URL "
            "(quote values that contain spaces: password='...')"
        ) from None
    except psycopg.OperationalError as e:
        raise CliError(connection_failure(str(e), resolved)) from None


def connection_failure(message: str, dsn: str) -> str:
    """One line: what is wrong with the connection and what to do about it."""
    where = describe(dsn)
    reason = redact(connection_reason(message), dsn)
    if (
        "authentication failed" in message
        or "no password supplied" in message
        or "password is required" in message
    ):
        return (
            f"aidb-memory: authentication failed for {where} ({reason}); check the user and "
            "password (password in --dsn or DATABASE_URL, PGPASSWORD, or ~/.pgpass)"
        )
    if "Connection refused" in message or "No such file or directory" in message:
        return (
            f"aidb-memory: cannot connect to {where}: connection refused; is PostgreSQL "
            "running there? Set the target with --dsn, DATABASE_URL or PGHOST/PGPORT"
        )
    if re.search(r'database ".*" does not exist', message):
        return (
            f"aidb-memory: cannot connect to {where}: {reason}; create it, or name another "
            "database with --dsn, DATABASE_URL or PGDATABASE"
        )
    if re.search(r'role ".*" does not exist', message):
        return (
            f"aidb-memory: cannot connect to {where}: {reason}; name an existing role with "
            "--dsn, DATABASE_URL or PGUSER"
        )
    return f"aidb-memory: cannot connect to {where}: {reason}"


def first_line(error: BaseException) -> str:
    """The first line of an error message."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def is_superuser(conn: Connection) -> bool:
    """Whether the connection's role is a superuser."""
    row = conn.execute(
        "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) current_user"
    ).fetchone()
    return bool(row and row[0])


def require_superuser(conn: Connection, action: str) -> None:
    """Refuse with one clear line when the role is not a superuser."""
    if not is_superuser(conn):
        user = conn.execute("SELECT current_user").fetchone()
        name = user[0] if user else "?"
        raise CliError(
            f"aidb-memory: {action} needs a superuser (plpython3u is an untrusted language); "
            f"connected as {name}, which is not one: connect as a superuser "
            "(e.g. user=postgres in --dsn, or PGUSER)"
        )


def server_major(conn: Connection) -> int:
    """The server's major version, e.g. 15."""
    return int(conn.info.server_version) // 10000


def plpython_package(conn: Connection) -> str:
    """The Debian/Ubuntu package that provides plpython3u for this server."""
    return f"postgresql-plpython3-{server_major(conn)}"


def plpython_availability(conn: Connection) -> tuple[str, str | None] | None:
    """``(default_version, installed_version)`` of plpython3u, or None if the server lacks it."""
    row = conn.execute(
        "SELECT default_version, installed_version FROM pg_catalog.pg_available_extensions "
        "WHERE name OPERATOR(pg_catalog.=) %s::pg_catalog.name",
        (PLPYTHON_EXTENSION,),
    ).fetchone()
    if not row:
        return None
    return str(row[0]), None if row[1] is None else str(row[1])


def require_plpython(conn: Connection) -> None:
    """Refuse with the Debian package to install when the server has no plpython3u."""
    if plpython_availability(conn) is None:
        raise CliError(
            "aidb-memory: the server has no plpython3u; install it on the database host "
            f"(Debian/Ubuntu: apt-get install {plpython_package(conn)}) and run this again"
        )
