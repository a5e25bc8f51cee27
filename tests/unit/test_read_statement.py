"""session_get and session_messages each run the read statement themselves (issue 14: no PL/pgSQL
layer between them and the window query), so sql/30_sessions.sql holds it twice: the copies must
stay the same statement; each plans first, naming itself for errors."""

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
    body = _body(SQL.read_text(), function)
    # The plan, in a statement of its own before the read statement, names the caller.
    assert body.count(f"session_read_plan($1, $2, $3, $4, $5, $6, $7, '{function}')") == 1
    return copies[0].strip().removeprefix("RETURN QUERY").strip().removesuffix(";")


def test_session_get_and_session_messages_run_the_same_read_statement() -> None:
    assert _statement("session_get") == _statement("session_messages")
