"""Every command whose standard output is closed (``aidb-memory install | head -1``) ends
quietly: no traceback, exit 141 (128 + SIGPIPE), and the command's work done as a whole."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from aidb_memory import __version__
from aidb_memory.cli import EXIT_CLOSED_PIPE
from conftest import Database


def _run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run the command with standard output a pipe whose reader is already gone: every write
    fails with EPIPE, as after `head -1` exits (but without depending on when it exits)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "DATABASE_URL"}
    try:
        return subprocess.run(
            [sys.executable, "-m", "aidb_memory", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=env,
            timeout=300,
            check=False,
        )
    finally:
        os.close(write_end)


def test_sql_into_a_closed_pipe_exits_quietly() -> None:
    result = _run_into_closed_pipe("sql")
    assert result.stderr == b""
    assert result.returncode == EXIT_CLOSED_PIPE


def test_install_into_a_closed_pipe_exits_quietly_and_installs(empty_db: Database) -> None:
    result = _run_into_closed_pipe("install", "--dsn", empty_db.dsn())
    assert result.stderr == b""
    assert result.returncode == EXIT_CLOSED_PIPE
    assert empty_db.value("SELECT aidb_memory.version()") == __version__


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["verify"], ["install"]])
def test_other_commands_into_a_closed_pipe_exit_quietly(db: Database, command: list[str]) -> None:
    result = _run_into_closed_pipe(*command, "--dsn", db.dsn())
    assert result.stderr == b""
    assert result.returncode == EXIT_CLOSED_PIPE
