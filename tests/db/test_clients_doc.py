"""docs/clients.md runs: every ``python`` block, section (``##``) by section, in order, in one
fresh database per section.

Each section gets the namespace ``helpdesk`` (made by an admin), ``DATABASE_URL`` connecting
as ``app_user`` (in ``aidb_users``) and, first on ``PATH``, an ``aidb-memory`` command that runs
this checkout's package (for examples that start it as a subprocess, as a host would); its blocks
run in one shared namespace of variables, as one script would. A section for another client adds
its blocks in a language below: ``python`` runs here; a language without a runner fails the test
(so every example is run), except those of ``NOT_RUN``.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import APP_USER, REPO, Database

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


def run_python(code: str, scope: dict[str, Any], title: str, index: int) -> None:
    exec(compile(code, f"<docs/clients.md: {title}, block {index}>", "exec"), scope)


RUNNERS: dict[str, Callable[[str, dict[str, Any], str, int], None]] = {"python": run_python}


def test_the_page_has_sections_with_examples() -> None:
    found = sections()
    assert "Python client" in found
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
    title: str, db: Database, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    db.sql("SELECT aidb_memory.init('helpdesk')")
    monkeypatch.setenv("DATABASE_URL", db.dsn(APP_USER))
    command_on_path(tmp_path, monkeypatch)
    scope: dict[str, Any] = {"__name__": "__clients_doc__"}
    for index, (language, code) in enumerate(sections()[title]):
        if language in NOT_RUN:
            continue
        RUNNERS[language](code, scope, title, index)
