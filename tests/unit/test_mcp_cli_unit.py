"""``aidb-memory mcp`` without a database: the mcp package is imported only when the
subcommand runs, and its absence is one line naming the extra."""

from __future__ import annotations

import subprocess
import sys

from aidb_memory import cli
from conftest import REPO


def test_the_cli_does_not_import_mcp_until_the_subcommand_runs() -> None:
    code = (
        "import sys\n"
        "from aidb_memory import cli\n"
        "cli.build_parser().parse_args(['mcp', '--namespace', 'n', '--actor', 'a'])\n"
        "assert 'aidb_memory.integrations.mcp_server' not in sys.modules\n"
        "assert 'mcp' not in sys.modules and 'pydantic' not in sys.modules, 'imported'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": str(REPO / "src")},
    )
    assert result.returncode == 0, result.stderr


def test_without_the_mcp_extra_it_says_which_extra() -> None:
    # mcp missing: a None entry in sys.modules makes its import fail.
    code = (
        "import sys; sys.modules['mcp'] = None; from aidb_memory.cli import main; "
        "sys.exit(main(['mcp', '--namespace', 'n', '--actor', 'a', '--dsn', 'host=/nonexistent']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": str(REPO / "src")},
    )
    assert result.returncode == 1
    assert result.stderr == cli.MCP_EXTRA_MISSING + "\n"
    assert "pip install 'aidb-memory[mcp]'" in cli.MCP_EXTRA_MISSING
