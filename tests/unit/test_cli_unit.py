"""The CLI without a server: connection-string resolution, error lines, usage errors."""

from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path

import psycopg
import pytest

from aidb_memory import cli
from aidb_memory.connection import (
    PINNED_OPTION,
    CliError,
    connect,
    connection_failure,
    connection_reason,
    describe,
    pinned_options,
    redact,
    resolve_dsn,
)
from aidb_memory.ops import deps
from aidb_memory.ops.doctor import Check

SECRET = "Sup3r-Secret-pw"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No DATABASE_URL and no PG* variable from the environment the tests run in."""
    for key in list(os.environ):
        if key.startswith("PG") or key == "DATABASE_URL":
            monkeypatch.delenv(key)
    return monkeypatch


# --- where the connection comes from -------------------------------------------------------


def test_dsn_option_wins_over_database_url(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("DATABASE_URL", "postgresql://from-env/db")
    assert resolve_dsn("host=from-option") == "host=from-option"


def test_database_url_is_used_without_dsn_option(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("DATABASE_URL", "postgresql://from-env/db")
    clean_env.setenv("PGHOST", "from-pg-variables")
    assert resolve_dsn(None) == "postgresql://from-env/db"
    assert resolve_dsn("") == "postgresql://from-env/db"


def test_without_dsn_or_database_url_libpq_reads_pg_variables(
    clean_env: pytest.MonkeyPatch,
) -> None:
    assert resolve_dsn(None) == ""  # the empty conninfo: libpq fills in PGHOST, PGPORT, ...
    clean_env.setenv("PGHOST", "pg-host")
    clean_env.setenv("PGPORT", "6543")
    clean_env.setenv("PGDATABASE", "pg_db")
    clean_env.setenv("PGUSER", "pg_user")
    assert describe(resolve_dsn(None)) == "database pg_db as pg_user on pg-host:6543"


# --- describe(): where, never the password -------------------------------------------------


def test_describe_keyword_dsn_leaves_out_the_password(clean_env: pytest.MonkeyPatch) -> None:
    text = describe(f"host=db.example port=5433 dbname=app user=alice password={SECRET}")
    assert text == "database app as alice on db.example:5433"
    assert SECRET not in text


def test_describe_uri_leaves_out_the_password(clean_env: pytest.MonkeyPatch) -> None:
    text = describe(f"postgresql://alice:{SECRET}@db.example:5433/app?sslmode=require")
    assert text == "database app as alice on db.example:5433"
    assert SECRET not in text


def test_describe_quoted_password_with_spaces(clean_env: pytest.MonkeyPatch) -> None:
    text = describe("host=h user=bob password='two words' dbname=d")
    assert "two" not in text and "words" not in text


def test_describe_fills_in_libpq_defaults(clean_env: pytest.MonkeyPatch) -> None:
    # libpq: user defaults to the OS user, the database to the user name.
    me = getpass.getuser()
    assert describe("") == f"database {me} as {me} on the local socket:5432"
    assert describe("user=carol") == "database carol as carol on the local socket:5432"


def test_describe_prefers_the_dsn_over_pg_variables(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PGHOST", "env-host")
    clean_env.setenv("PGUSER", "env_user")
    assert (
        describe("host=dsn-host user=dsn_user dbname=x")
        == "database x as dsn_user on dsn-host:5432"
    )
    assert describe("dbname=x") == "database x as env_user on env-host:5432"


def test_describe_of_a_malformed_dsn_says_nothing_from_it() -> None:
    assert describe(f"host=h password={SECRET} 'unterminated") == "the server"


# --- passwords never reach an error line ---------------------------------------------------


@pytest.mark.parametrize(
    "dsn, secret_part",
    [
        ("host=h user=u password=pa sXw0rd dbname=d", "sXw0rd"),  # unquoted space
        ("postgresql://u:pa%zzss@h/d", "pa%zzss"),  # bad percent-encoding in the password
    ],
)
def test_a_malformed_dsn_error_does_not_echo_the_password(
    clean_env: pytest.MonkeyPatch, dsn: str, secret_part: str
) -> None:
    # libpq quotes the token it chokes on; here that token is part of the password.
    with pytest.raises(psycopg.ProgrammingError) as raw:
        psycopg.conninfo.conninfo_to_dict(dsn)
    assert secret_part in str(raw.value)  # so the test means something
    with pytest.raises(CliError) as e:
        connect(dsn)
    message = str(e.value)
    assert message.startswith("aidb-memory: invalid connection string:")
    assert secret_part not in message
    assert "\n" not in message


def test_redact_keeps_messages_without_a_password_intact() -> None:
    message = 'invalid sslmode value: "bogus"'
    assert redact(message, "host=h sslmode=bogus") == message


def test_redact_hides_the_uri_password() -> None:
    assert redact(f"oops {SECRET} here", f"postgresql://u:{SECRET}@h/d") == "oops *** here"


# --- one line that says what is wrong -------------------------------------------------------


@pytest.mark.parametrize(
    "message, reason",
    [
        (
            'connection failed: connection to server at "127.0.0.1", port 1 failed: '
            "Connection refused\n\tIs the server running on that host and accepting TCP/IP "
            "connections?",
            "Connection refused",
        ),
        (
            'connection failed: connection to server at "127.0.0.1", port 5 failed: '
            'FATAL:  password authentication failed for user "bob"',
            'password authentication failed for user "bob"',
        ),
        (
            'connection failed: connection to server at "127.0.0.1", port 5 failed: '
            "fe_sendauth: no password supplied",
            "fe_sendauth: no password supplied",
        ),
        (
            'connection is bad: connection to server on socket "/x/.s.PGSQL.1" failed: '
            "No such file or directory\n\tIs the server running locally and accepting "
            "connections on that socket?",
            "No such file or directory",
        ),
    ],
)
def test_connection_reason_is_the_useful_part(message: str, reason: str) -> None:
    assert connection_reason(message) == reason


def test_missing_password_is_reported_as_an_authentication_failure(
    clean_env: pytest.MonkeyPatch,
) -> None:
    line = connection_failure(
        'connection failed: connection to server at "h", port 5 failed: '
        "fe_sendauth: no password supplied",
        "host=h port=5 user=bob dbname=d",
    )
    assert line.startswith("aidb-memory: authentication failed for database d as bob on h:5")
    assert "PGPASSWORD" in line and "\n" not in line


def test_refused_connection_line_says_what_to_do(clean_env: pytest.MonkeyPatch) -> None:
    line = connection_failure(
        'connection failed: connection to server at "h", port 1 failed: Connection refused\n'
        "\tIs the server running on that host and accepting TCP/IP connections?",
        f"host=h port=1 user=bob dbname=d password={SECRET}",
    )
    assert line == (
        "aidb-memory: cannot connect to database d as bob on h:1: connection refused; is "
        "PostgreSQL running there? Set the target with --dsn, DATABASE_URL or PGHOST/PGPORT"
    )


def test_database_error_from_a_command_is_one_line_with_the_fix() -> None:
    line = cli.database_error(
        "status", psycopg.errors.InsufficientPrivilege("permission denied for table t\nmore")
    )
    assert line.startswith("aidb-memory: status failed: permission denied for table t;")
    assert "superuser" in line and "\n" not in line


# --- usage errors exit 2 --------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv", [[], ["bogus"], ["status", "--bogus"], ["--bogus"], ["deps", "--python"]]
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert "usage: aidb-memory" in capsys.readouterr().err


def test_version_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"aidb-memory {cli.__version__}"


def test_uninstall_without_yes_refuses_before_connecting(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The DSN points nowhere: the refusal must come first, without touching a server.
    assert cli.main(["uninstall", "--dsn", "host=127.0.0.1 port=1"]) == 1
    err = capsys.readouterr().err
    assert "--yes" in err and err.count("\n") == 1


# --- doctor's report lines ------------------------------------------------------------------


def test_check_lines() -> None:
    assert Check("python", True, "the server runs Python 3.11.2").line() == (
        "ok       python      the server runs Python 3.11.2"
    )
    assert Check("openai", False, "does not import", "aidb-memory deps").line() == (
        "missing  openai      does not import\n                     fix: aidb-memory deps"
    )
    assert (
        Check("python", False, "not checked", "be root", skipped=True)
        .line()
        .startswith("skipped  python      not checked\n")
    )


# --- deps without a server ------------------------------------------------------------------


def _fake_python(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


def test_pip_command_with_python_uses_that_interpreter(tmp_path: Path) -> None:
    command = deps.pip_command("/usr/bin/python3", "3.11", tmp_path)
    assert command[:4] == ["/usr/bin/python3", "-m", "pip", "install"]
    assert command[-len(deps.SERVER_REQUIREMENTS) :] == list(deps.SERVER_REQUIREMENTS)
    assert "--target" in command and str(tmp_path) in command


def test_pip_command_without_python_fetches_wheels_for_the_server_version(
    tmp_path: Path,
) -> None:
    command = deps.pip_command(None, "3.11", tmp_path)
    assert command[0] == sys.executable
    assert command[command.index("--python-version") + 1] == "3.11"
    assert "--only-binary=:all:" in command and "--platform" in command


def test_python_version_of_an_interpreter(tmp_path: Path) -> None:
    assert deps.python_version_of(_fake_python(tmp_path, "echo 3.9\n")) == "3.9"


def test_python_version_of_something_that_is_not_python(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="is not a working Python"):
        deps.python_version_of(_fake_python(tmp_path, "echo hello\n"))
    with pytest.raises(CliError, match="cannot run --python /no/such/python: No such file"):
        deps.python_version_of("/no/such/python")


def test_require_pip_names_the_fix_when_pip_is_missing(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, 'echo "$0: No module named pip" >&2\nexit 1\n')
    with pytest.raises(CliError) as e:
        deps.require_pip(python)
    assert "has no pip" in str(e.value)
    assert "apt-get install python3-pip" in str(e.value)
    assert "omit --python" in str(e.value)


def test_require_pip_accepts_an_interpreter_with_pip(tmp_path: Path) -> None:
    deps.require_pip(_fake_python(tmp_path, "echo pip 23.0 from somewhere\n"))


# --- every CLI connection pins the search_path (issue 9) ---------------------------------------


@pytest.mark.parametrize(
    ("dsn", "env", "expected"),
    [
        ("host=h dbname=d", None, PINNED_OPTION),
        ("host=h options='-c work_mem=8MB'", None, f"-c work_mem=8MB {PINNED_OPTION}"),
        ("postgresql://h/d?options=-c%20geqo%3Doff", None, f"-c geqo=off {PINNED_OPTION}"),
        # libpq reads PGOPTIONS only when the DSN has none; passing options replaces it.
        ("host=h", "-c jit=off", f"-c jit=off {PINNED_OPTION}"),
        ("host=h options='-c geqo=off'", "-c jit=off", f"-c geqo=off {PINNED_OPTION}"),
        # The user's own search_path comes first and so loses.
        ("options='-c search_path=public'", None, f"-c search_path=public {PINNED_OPTION}"),
    ],
)
def test_the_search_path_option_is_appended_to_the_users_options(
    clean_env: pytest.MonkeyPatch, dsn: str, env: str | None, expected: str
) -> None:
    if env is not None:
        clean_env.setenv("PGOPTIONS", env)
    assert pinned_options(dsn) == expected
