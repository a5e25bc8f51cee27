"""docs/clients.md runs: every ``python`` block, section (``##``) by section, in order, in one
fresh database per section.

Each section gets the namespace ``helpdesk`` (made by an admin), ``DATABASE_URL``, a
``postgresql://`` URL connecting as ``app_user`` (in ``aidb_users``), ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY`` pointing at a fake OpenAI server (tests/fake_openai.py;
``OPENAI_AGENTS_DISABLE_TRACING`` too, so that no trace is sent anywhere) and, first on ``PATH``,
an ``aidb-memory`` command that runs this checkout's package (for examples that start it as a
subprocess, as a host would); its blocks run in one shared namespace of variables, as one script
would. A section for another client adds its blocks in a language below: ``python`` runs here;
``sql`` runs through psql connected to ``DATABASE_URL`` (``-X -q -A -t``, ``ON_ERROR_STOP``), and
a ``text`` block right after it (only blank lines between) is what it must print, as in
docs/reference.md (tests/db/test_docs.py); a language without a runner fails the test (so every
example is run), except those of ``NOT_RUN``.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict
from test_docs import _compare, _stderr_lines

from conftest import APP_USER, REPO, Database, psql
from fake_openai import FakeOpenAI

DOC = REPO / "docs" / "clients.md"
# Install commands, outputs and configuration files are shown, not run.
NOT_RUN = {"sh", "text", "json"}
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def sections(path: Path = DOC) -> dict[str, list[tuple[str, str]]]:
    """The ``##`` sections of the page, each with its fenced blocks as (language, code)."""
    result: dict[str, list[tuple[str, str]]] = {}
    for part in re.split(r"^## ", path.read_text(), flags=re.M)[1:]:
        title, _, body = part.partition("\n")
        result[title.strip()] = [(m.group(1), m.group(2)) for m in _FENCE.finditer(body)]
    return result


def expected_outputs(path: Path = DOC) -> dict[str, dict[int, list[str]]]:
    """Per section, the expected output of each ``sql`` block (by its index among the section's
    blocks) that a ``text`` block directly follows."""
    result: dict[str, dict[int, list[str]]] = {}
    for part in re.split(r"^## ", path.read_text(), flags=re.M)[1:]:
        title, _, body = part.partition("\n")
        outputs = result.setdefault(title.strip(), {})
        matches = list(_FENCE.finditer(body))
        for index, (block, following) in enumerate(pairwise(matches)):
            between = body[block.end() : following.start()]
            if block.group(1) == "sql" and following.group(1) == "text" and not between.strip():
                lines = [line.rstrip() for line in following.group(2).splitlines()]
                while lines and not lines[-1]:
                    lines.pop()
                outputs[index] = lines
    return result


def database_url(dsn: str) -> str:
    """The ``postgresql://`` URL of a libpq key=value DSN (every driver of the page takes one)."""
    params = conninfo_to_dict(dsn)
    return f"postgresql://{params['user']}@{params['host']}:{params['port']}/{params['dbname']}"


def run_python(code: str, scope: dict[str, Any], title: str, index: int) -> None:
    exec(compile(code, f"<docs/clients.md: {title}, block {index}>", "exec"), scope)


def run_sql(code: str, scope: dict[str, Any], title: str, index: int) -> None:
    """Run a ``sql`` block through psql as ``DATABASE_URL``; check what it prints when the page
    says (``scope["__expected__"]``), else that it succeeds without an error or warning."""
    where = f"docs/clients.md: {title}, block {index}"
    expected: list[str] | None = scope.pop("__expected__", None)
    result = psql(
        scope["__database_url__"],
        "-q",
        "-A",
        "-t",
        "-v",
        "VERBOSITY=verbose",
        "-v",
        "SHOW_CONTEXT=never",
        input=code,
    )
    stdout = [line.rstrip() for line in result.stdout.splitlines()]
    messages = _stderr_lines(result.stderr)
    if expected is None:
        assert result.returncode == 0, f"{where}: failed\n{result.stderr}"
        problems = [m for m in messages if m.startswith(("ERROR:", "WARNING:"))]
        assert not problems, f"{where}: printed\n" + "\n".join(problems)
        return
    is_message = ("ERROR:", "HINT:", "DETAIL:", "NOTICE:", "WARNING:")
    expected_messages = [line for line in expected if line.startswith(is_message)]
    expected_rows = [line for line in expected if not line.startswith(is_message)]
    if any(line.startswith("ERROR:") for line in expected_messages):
        assert result.returncode != 0, f"{where}: documented to fail, but succeeded"
    else:
        assert result.returncode == 0, f"{where}: failed\n{result.stderr}"
    _compare("output", expected_rows, stdout, where)
    _compare("messages", expected_messages, messages, where)


RUNNERS: dict[str, Callable[[str, dict[str, Any], str, int], None]] = {
    "python": run_python,
    "sql": run_sql,
}


def test_the_page_has_sections_with_examples() -> None:
    found = sections()
    assert {"Python client", "psql", "psycopg 3", "asyncpg", "SQLAlchemy"} <= set(found)
    # psql's examples say what they print (so a parser that finds no output cannot pass).
    assert len(expected_outputs()["psql"]) >= 4
    for title, blocks in found.items():
        languages = {language for language, _ in blocks}
        assert languages - NOT_RUN, f"section {title!r} has no example that runs"
        unknown = languages - NOT_RUN - set(RUNNERS)
        assert not unknown, f"section {title!r}: no runner for {sorted(unknown)}"


def command_on_path(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Put an ``aidb-memory`` that runs this checkout's package first on ``PATH``."""
    command = directory / "aidb-memory"
    command.write_text(
        f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(REPO / 'src'))} "
        f'exec {shlex.quote(sys.executable)} -m aidb_memory "$@"\n'
    )
    command.chmod(0o755)
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.mark.parametrize("title", sorted(sections()))
def test_section_runs(
    title: str,
    db: Database,
    fake: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    db.sql("SELECT aidb_memory.init('helpdesk')")
    url = database_url(db.dsn(APP_USER))
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    command_on_path(tmp_path, monkeypatch)
    scope: dict[str, Any] = {"__name__": "__clients_doc__", "__database_url__": url}
    outputs = expected_outputs()[title]
    for index, (language, code) in enumerate(sections()[title]):
        if language in NOT_RUN:
            continue
        if index in outputs:
            scope["__expected__"] = outputs[index]
        RUNNERS[language](code, scope, title, index)


def test_sql_blocks_fail_when_they_print_something_else(db: Database) -> None:
    """The ``sql`` runner is no rubber stamp: other rows, an unexpected error and a missing one
    each fail."""
    url = database_url(db.dsn(APP_USER))
    for code, expected in [
        ("SELECT 1;\n", ["2"]),
        ("SELECT 1/0;\n", None),
        ("SELECT 1;\n", ["ERROR:  22012: division by zero"]),
    ]:
        scope: dict[str, Any] = {"__database_url__": url, "__expected__": expected}
        with pytest.raises(AssertionError):
            run_sql(code, scope, "test", 0)
    run_sql(
        "SELECT 1/0;\n",
        {"__database_url__": url, "__expected__": ["ERROR:  22012: division by zero"]},
        "test",
        0,
    )
