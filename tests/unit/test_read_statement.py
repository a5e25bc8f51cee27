"""session_get and session_messages each run the read statement themselves (issue 14: no PL/pgSQL
layer between them and the window query), so sql/30_sessions.sql holds it twice: the copies must
stay the same statement, but for the name of the function that errors name."""

from __future__ import annotations

import re
from pathlib import Path

SQL = Path(__file__).resolve().parents[2] / "sql" / "30_sessions.sql"
COPY = re.compile(r"-- BEGIN read statement\n(.*?)\n *-- END read statement", re.S)


def _body(text: str, function: str) -> str:
    start = text.index(f"CREATE OR REPLACE FUNCTION aidb_memory.{function}(")
    return text[start : text.index("\n$$;", start)]


def _statement(function: str) -> str:
    copies = COPY.findall(_body(SQL.read_text(), function))
    assert len(copies) == 1, function
    statement = copies[0].strip().removeprefix("RETURN QUERY").strip().removesuffix(";")
    assert statement.count(f"'{function}'") == 1, "the caller that errors name"
    return statement.replace(f"'{function}'", "'<caller>'")


def test_session_get_and_session_messages_run_the_same_read_statement() -> None:
    assert _statement("session_get") == _statement("session_messages")
