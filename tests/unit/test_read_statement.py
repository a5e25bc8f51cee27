"""session_get and session_messages each run the read statement themselves (issue 14: no layer
between them and the window query), and sql/30_sessions.sql writes it once (issue 28): in
session_get, in parts between ``-- BEGIN read_head`` ... ``-- END read_tail``; session_messages
holds ``@read_head@`` ..., which loading the file replaces with them. Each plans first, naming
itself for errors, and runs the statement without the summaries' subquery when no summary has
room, and with limit_items' window only for limit_items (issue 33)."""

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
    messages = _body(text, "session_messages")
    ends = {
        "read_items": "                ) AS f\n",
        "read_rounds": "                ORDER BY t.char_offset, t.seq\n",
    }
    for window in ("read_items", "read_rounds"):
        for summaries in ("read_summaries", "read_no_summaries"):
            uses = (
                f"        @read_head@\n        @{window}@\n        @read_range@\n{ends[window]}"
                f"        @read_end@\n        @{summaries}@\n        @read_tail@\n"
            )
            assert messages.count(uses) == 1, (window, summaries)


def test_session_get_and_session_messages_run_it_after_their_own_plan() -> None:
    text = expand_fragments(SESSIONS, SESSIONS.read_text(), sql_fragments(SQL_DIR))
    for function in ("session_get", "session_messages"):
        body = _body(text, function)
        # Four times: with the summaries' subquery and without it when none has room, each
        # with limit_items' window and with the rounds' cut (an index probe, no window), which
        # reads the same bounds (read_range) once more.
        assert body.count(WINDOW) == 4 + 2
        assert body.count("ORDER BY t.char_offset, t.seq LIMIT 1) AS cut,\n") == 2
        assert body.count("FROM aidb_memory.summary AS s\n") == 2
        assert body.count("OVER (ORDER BY t.char_offset DESC, t.seq DESC) AS floor") == 2
        assert body.count("ORDER BY t.char_offset, t.seq\n") == 2
        assert body.count("IF plan.summary_room >= 0 AND plan.by_items THEN") == 1
        # The plan, in a statement of its own before the read statement, names the caller.
        assert body.count(f"session_read_plan($1, $2, $3, $4, $5, $6, $7, '{function}')") == 1
    # session_messages takes the items alone: its plan leaves the other columns out.
    assert _body(text, "session_messages").count("SELECT r.items INTO history FROM (\n") == 4
