"""session_get and session_messages each run the read statement themselves (issue 14: no layer
between them and the window query), and sql/30_sessions.sql writes it once (issue 28): in
session_get, in parts between ``-- BEGIN read_head`` ... ``-- END read_tail``; session_messages
holds ``@read_head@`` ..., which loading the file replaces with them. Each plans first, naming
itself for errors, and runs the statement without the summaries' subquery when no summary has
room (issue 33)."""

from __future__ import annotations

from pathlib import Path

from aidb_memory.install.codebundle import expand_fragments, sql_fragments

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
SESSIONS = SQL_DIR / "30_sessions.sql"
WINDOW = "FROM aidb_memory.turn AS t\n"


def _body(text: str, function: str) -> str:
    start = text.index(f"CREATE OR REPLACE FUNCTION aidb_memory.{function}(")
    return text[start : text.index("\n$$;", start)]


def test_the_read_statement_is_written_once() -> None:
    written = [
        path.name
        for path in sorted(SQL_DIR.glob("*.sql"))
        for _ in range(path.read_text().count(WINDOW))
    ]
    assert written == ["30_sessions.sql"]
    text = SESSIONS.read_text()
    assert WINDOW in _body(text, "session_get")
    assert "\n        @read_head@\n        @read_summaries@\n        @read_tail@\n" in _body(
        text, "session_messages"
    )


def test_session_get_and_session_messages_run_it_after_their_own_plan() -> None:
    text = expand_fragments(SESSIONS, SESSIONS.read_text(), sql_fragments(SQL_DIR))
    for function in ("session_get", "session_messages"):
        body = _body(text, function)
        # Twice: with the summaries' subquery, and without it when none has room.
        assert body.count(WINDOW) == 2
        assert body.count("FROM aidb_memory.summary AS s\n") == 1
        assert body.count("IF plan.summary_room >= 0 THEN") == 1
        # The plan, in a statement of its own before the read statement, names the caller.
        assert body.count(f"session_read_plan($1, $2, $3, $4, $5, $6, $7, '{function}')") == 1
    # session_messages takes the items alone: its plan leaves the other columns out.
    assert _body(text, "session_messages").count("SELECT r.items INTO history FROM (\n") == 2
