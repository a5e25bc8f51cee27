"""docs/clients.md runs: every ``python`` block, section (``##``) by section, in order, in one
fresh database per section.

Each section gets the namespace ``helpdesk`` (made by an admin), ``DATABASE_URL`` connecting
as ``app_user`` (in ``aidb_users``), and ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` pointing at a
fake OpenAI server (tests/fake_openai.py; ``OPENAI_AGENTS_DISABLE_TRACING`` too, so that no
trace is sent anywhere); its blocks run in one shared namespace of variables, as one
script would. A section for another client adds its blocks in a language below: ``python`` runs
here; a language without a runner fails the test (so every example is run), except those of
``NOT_RUN``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import APP_USER, REPO, Database
from fake_openai import FakeOpenAI

DOC = REPO / "docs" / "clients.md"
# Install commands and outputs are shown, not run.
NOT_RUN = {"sh", "text"}
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


@pytest.mark.parametrize("title", sorted(sections()))
def test_section_runs(
    title: str, db: Database, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    db.sql("SELECT aidb_memory.init('helpdesk')")
    monkeypatch.setenv("DATABASE_URL", db.dsn(APP_USER))
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    scope: dict[str, Any] = {"__name__": "__clients_doc__"}
    for index, (language, code) in enumerate(sections()[title]):
        if language in NOT_RUN:
            continue
        RUNNERS[language](code, scope, title, index)
