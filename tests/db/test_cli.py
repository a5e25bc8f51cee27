"""The ``aidb-memory`` command against the throwaway server (SPEC §7): where it connects, exit
codes, one-line errors, ``status`` and ``verify``."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import CompletedProcess

import psycopg
import pytest

from aidb_memory import __version__, cli, connection
from aidb_memory.install.installer import Package
from aidb_memory.throwaway import ThrowawayServer
from conftest import APP_USER, Database, run_cli

MIGRATIONS = [m.name for m in Package.load().migrations]


def status_json(result: CompletedProcess[str]) -> dict[str, object]:
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


def assert_one_line_failure(result: CompletedProcess[str]) -> str:
    """Exit 1, exactly one line on stderr, no traceback; returns that line."""
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("aidb-memory: ")
    return lines[0]


def free_port() -> int:
    """A local port where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- where the connection comes from -------------------------------------------------------


def test_connects_with_dsn_option(db: Database) -> None:
    assert status_json(run_cli("status", "--json", dsn=db.dsn()))["installed_version"] == (
        __version__
    )


def test_connects_with_database_url_keyword_form(db: Database) -> None:
    result = run_cli("status", "--json", env={"DATABASE_URL": db.dsn()})
    assert status_json(result)["installed_version"] == __version__


def test_connects_with_database_url_uri_form(db: Database, pg_server: ThrowawayServer) -> None:
    url = f"postgresql://postgres@127.0.0.1:{pg_server.port}/{db.name}"
    result = run_cli("status", "--json", env={"DATABASE_URL": url})
    assert status_json(result)["installed_version"] == __version__


def pg_variables(server: ThrowawayServer, database: str, user: str = "postgres") -> dict[str, str]:
    return {
        "PGHOST": "127.0.0.1",
        "PGPORT": str(server.port),
        "PGDATABASE": database,
        "PGUSER": user,
    }


def test_connects_with_pg_variables(db: Database, pg_server: ThrowawayServer) -> None:
    result = run_cli("status", "--json", env=pg_variables(pg_server, db.name))
    assert status_json(result)["installed_version"] == __version__


def test_dsn_option_wins_over_database_url(
    db: Database, empty_db: Database, pg_server: ThrowawayServer
) -> None:
    result = run_cli(
        "status",
        "--json",
        dsn=empty_db.dsn(),
        env={"DATABASE_URL": db.dsn(), **pg_variables(pg_server, db.name)},
    )
    assert status_json(result)["installed_version"] is None


def test_database_url_wins_over_pg_variables(
    db: Database, empty_db: Database, pg_server: ThrowawayServer
) -> None:
    result = run_cli(
        "status",
        "--json",
        env={"DATABASE_URL": db.dsn(), **pg_variables(pg_server, empty_db.name)},
    )
    assert status_json(result)["installed_version"] == __version__
    # ...and the other way round, so the two databases really are told apart.
    result = run_cli(
        "status",
        "--json",
        env={"DATABASE_URL": empty_db.dsn(), **pg_variables(pg_server, db.name)},
    )
    assert status_json(result)["installed_version"] is None


def test_error_names_the_target_taken_from_pg_variables() -> None:
    port = free_port()
    result = run_cli(
        "status",
        env={"PGHOST": "127.0.0.1", "PGPORT": str(port), "PGDATABASE": "x", "PGUSER": "y"},
    )
    line = assert_one_line_failure(result)
    assert f"database x as y on 127.0.0.1:{port}" in line


# --- exit codes -----------------------------------------------------------------------------


@pytest.mark.parametrize("args", [(), ("bogus",), ("status", "--bogus"), ("install", "--nope")])
def test_usage_errors_exit_2(args: tuple[str, ...], db: Database) -> None:
    result = run_cli(*args, env={"DATABASE_URL": db.dsn()})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "usage: aidb-memory" in result.stderr
    assert "Traceback" not in result.stderr


def test_success_exits_0_and_failure_exits_1(db: Database, empty_db: Database) -> None:
    assert run_cli("verify", dsn=db.dsn()).returncode == 0
    assert run_cli("verify", dsn=empty_db.dsn()).returncode == 1


# --- one clear line for each way of not getting in -----------------------------------------


def test_refused_connection(pg_server: ThrowawayServer) -> None:
    port = free_port()
    line = assert_one_line_failure(run_cli("status", dsn=f"host=127.0.0.1 port={port}"))
    assert "connection refused" in line
    assert f"127.0.0.1:{port}" in line
    assert "is PostgreSQL running there?" in line


def test_unknown_database(pg_server: ThrowawayServer) -> None:
    line = assert_one_line_failure(run_cli("status", dsn=pg_server.dsn("no_such_db")))
    assert 'database "no_such_db" does not exist' in line
    assert "create it, or name another database" in line


PW_ROLE = "cli_pw_user"
PASSWORD = "Corr3ct-Horse-pw"


def _wait_until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    """The server reloads pg_hba.conf asynchronously: wait (bounded) until ``check()``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("the server did not reload pg_hba.conf in time")
        time.sleep(0.05)


@pytest.fixture
def password_role(pg_server: ThrowawayServer, db: Database) -> Iterator[str]:
    """A role that must authenticate with a password (scram) from 127.0.0.1.

    The throwaway server trusts everyone, so one line goes at the top of its pg_hba.conf for this
    role only; the file is rewritten in place (owner and mode unchanged) and restored afterwards.
    """
    with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
        row = admin.execute("SHOW hba_file").fetchone()
        assert row
        hba = Path(row[0])
        admin.execute(f"CREATE ROLE {PW_ROLE} LOGIN PASSWORD '{PASSWORD}'")
    original = hba.read_text()

    def password_required() -> bool:
        try:
            psycopg.connect(db.dsn(PW_ROLE)).close()
        except psycopg.OperationalError as e:
            return "no password supplied" in str(e)
        return False

    try:
        with hba.open("w") as f:
            f.write(f"host all {PW_ROLE} 127.0.0.1/32 scram-sha-256\n{original}")
        with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_reload_conf()")
        _wait_until(password_required)
        yield PW_ROLE
    finally:
        with hba.open("w") as f:
            f.write(original)
        with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_reload_conf()")
            _wait_until(lambda: not password_required())
            admin.execute(f"DROP ROLE {PW_ROLE}")


def test_password_role_gets_in_with_its_password(password_role: str, db: Database) -> None:
    # The control for the failures below: with its password the role gets in, from each source.
    for dsn, env in [
        (f"{db.dsn(password_role)} password={PASSWORD}", {}),
        (None, {"DATABASE_URL": db.dsn(password_role), "PGPASSWORD": PASSWORD}),
    ]:
        result = run_cli("doctor", dsn=dsn, env=env)
        assert "ok       plpython3u" in result.stdout, result.stdout + result.stderr
        assert PASSWORD not in result.stdout + result.stderr


@pytest.mark.parametrize("how", ["keyword", "uri", "pgpassword"])
def test_wrong_password(
    password_role: str, db: Database, pg_server: ThrowawayServer, how: str
) -> None:
    wrong = "Wr0ng-Secret-9x"
    env = {"PGPASSFILE": "/nonexistent"}
    if how == "keyword":
        dsn = f"{db.dsn(password_role)} password={wrong}"
    elif how == "uri":
        dsn = f"postgresql://{password_role}:{wrong}@127.0.0.1:{pg_server.port}/{db.name}"
    else:
        dsn = db.dsn(password_role)
        env["PGPASSWORD"] = wrong
    result = run_cli("status", dsn=dsn, env=env)
    line = assert_one_line_failure(result)
    assert line.startswith(f"aidb-memory: authentication failed for database {db.name} as ")
    assert "password authentication failed" in line
    assert "PGPASSWORD" in line  # what to do
    assert wrong not in result.stdout + result.stderr


def test_missing_password(password_role: str, db: Database) -> None:
    result = run_cli("status", dsn=db.dsn(password_role), env={"PGPASSFILE": "/nonexistent"})
    line = assert_one_line_failure(result)
    assert line.startswith("aidb-memory: authentication failed")
    assert "no password supplied" in line
    assert "PGPASSWORD" in line


def test_install_as_non_superuser(db: Database) -> None:
    line = assert_one_line_failure(run_cli("install", dsn=db.dsn(APP_USER)))
    assert "install needs a superuser" in line
    assert f"connected as {APP_USER}" in line
    assert "connect as a superuser" in line


def test_status_as_non_superuser_is_one_line(db: Database) -> None:
    line = assert_one_line_failure(run_cli("status", dsn=db.dsn(APP_USER)))
    assert "permission denied" in line
    assert "connect as a superuser" in line


def test_server_without_plpython(
    empty_db: Database, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """This cluster has plpython3u (Debian's package is installed server-wide) and a test cannot
    remove it, so the CLI runs in-process with the extension it looks for renamed to one that no
    server has: every query then sees a server without plpython3u."""
    monkeypatch.setattr(connection, "PLPYTHON_EXTENSION", "plpython3u_not_in_this_server")
    major = int(empty_db.value("SHOW server_version_num")) // 10000
    code = cli.main(["install", "--dsn", empty_db.dsn()])
    out, err = capfd.readouterr()
    assert code == 1
    assert "Traceback" not in out + err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("aidb-memory: the server has no plpython3u")
    assert f"apt-get install postgresql-plpython3-{major}" in lines[0]
    assert empty_db.value("SELECT to_regnamespace('aidb_memory') IS NULL") is True


# --- status -------------------------------------------------------------------------------


def test_status_json_installed(db: Database) -> None:
    data = status_json(run_cli("status", "--json", dsn=db.dsn()))
    assert {"installed_version", "package_version", "applied", "pending", "drift"} <= set(data)
    assert data["installed_version"] == __version__
    assert data["package_version"] == __version__
    assert data["applied"] == MIGRATIONS
    assert data["pending"] == []
    assert data["drift"] == []


def test_status_json_empty(empty_db: Database) -> None:
    data = status_json(run_cli("status", "--json", dsn=empty_db.dsn()))
    assert data["installed_version"] is None
    assert data["package_version"] == __version__
    assert data["applied"] == []
    assert data["pending"] == MIGRATIONS
    assert data["drift"] == []


def test_status_text_installed(db: Database) -> None:
    result = run_cli("status", dsn=db.dsn())
    assert result.returncode == 0, result.stderr
    assert f"installed version: {__version__}" in result.stdout
    assert f"applied migrations ({len(MIGRATIONS)}): {', '.join(MIGRATIONS)}" in result.stdout
    assert "pending migrations (0): none" in result.stdout
    assert "drift: none" in result.stdout


def test_status_text_empty(empty_db: Database) -> None:
    result = run_cli("status", dsn=empty_db.dsn())
    assert result.returncode == 0, result.stderr
    assert "installed version: not installed" in result.stdout
    assert f"pending migrations ({len(MIGRATIONS)}): {', '.join(MIGRATIONS)}" in result.stdout


# --- verify --------------------------------------------------------------------------------


def test_verify_installed(db: Database) -> None:
    result = run_cli("verify", dsn=db.dsn())
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"ok: version {__version__}")


def test_verify_catches_a_function_replaced_by_hand_and_install_repairs_it(db: Database) -> None:
    db.sql(
        "CREATE OR REPLACE FUNCTION aidb_memory.version() RETURNS text LANGUAGE sql "
        "STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$ SELECT 'hacked' $$"
    )
    assert db.value("SELECT aidb_memory.version()") == "hacked"

    result = run_cli("verify", dsn=db.dsn())
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "changed by hand" in result.stderr
    assert status_json(run_cli("status", "--json", dsn=db.dsn()))["drift"] != []

    install = run_cli("install", dsn=db.dsn())
    assert install.returncode == 0, install.stdout + install.stderr
    assert db.value("SELECT aidb_memory.version()") == __version__
    result = run_cli("verify", dsn=db.dsn())
    assert result.returncode == 0, result.stdout + result.stderr


def test_verify_on_an_empty_database(empty_db: Database) -> None:
    line = assert_one_line_failure(run_cli("verify", dsn=empty_db.dsn()))
    assert "aidb_memory is not installed in this database" in line
    assert "aidb-memory install" in line
