"""session_get and session_messages read through one function, session_read (issue 28): the read
statement (the plan, the window, the summaries) has one definition in sql/, and each API function
names itself for its errors."""

from __future__ import annotations

from pathlib import Path

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
SESSIONS = SQL_DIR / "30_sessions.sql"


def _body(text: str, function: str) -> str:
    start = text.index(f"CREATE OR REPLACE FUNCTION aidb_memory.{function}(")
    return text[start : text.index("\n$$;", start)]


def test_the_read_statement_stands_once() -> None:
    windows = [
        path.name
        for path in sorted(SQL_DIR.glob("*.sql"))
        for _ in range(path.read_text().count("FROM aidb_memory.turn AS t\n"))
    ]
    assert windows == ["30_sessions.sql"]
    assert "FROM aidb_memory.turn AS t\n" in _body(SESSIONS.read_text(), "session_read")


def test_session_get_and_session_messages_read_through_session_read() -> None:
    text = SESSIONS.read_text()
    for function in ("session_get", "session_messages"):
        call = f"aidb_memory.session_read($1, $2, $3, $4, $5, $6, $7, '{function}')"
        body = _body(text, function)
        assert body.count(call) == 1
        assert "aidb_memory.session_read_plan(" not in body
