"""session_messages(format => 'responses') renders summaries, items stored in the Responses shape
and plain messages in SQL (issue 14) and leaves any other list to Python (session_convert,
items.to_responses). Either way the answer is what Python makes of the read's items: each read
below is compared with session_convert of session_get's items for the same limits.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import Database

NS = "responses_sql"

PLAIN = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello", "name": "alice"},
    {"role": "assistant", "content": "Hi."},
    {"role": "user", "content": "How are you?"},
    {"role": "assistant", "content": "Fine.", "name": "bot"},
]
# Items the Agents SDK sends: stored as they came, in the Responses shape.
RESPONSES = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Call the tool."}],
    },
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_paris",
        "name": "weather",
        "arguments": '{"city": "Paris"}',
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "call_paris", "output": "rain, 14C"},
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Rain.", "annotations": []}],
    },
    {"type": "custom_tool_call", "id": "ct_1", "call_id": "cc", "name": "g", "input": "x"},
    {"type": "custom_tool_call_output", "call_id": "cc", "output": "1"},
]
# What Python renders: chat-shaped tool calls and results, an empty assistant, a developer turn.
CHAT_TOOLS = [
    {"role": "developer", "content": "Answer in French."},
    {"role": "user", "content": "Look."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": ""},
    {"role": "assistant", "content": None, "refusal": "No."},
    {"role": "user", "content": [{"type": "text", "text": "Parts."}]},
    {"role": "assistant", "content": "Bien."},
]


def _add(db: Database, sid: str, turns: list[dict[str, Any]]) -> None:
    db.sql("SELECT aidb_memory.add(%s, 'a', %s::jsonb, %s)", (NS, json.dumps(turns), sid))


@pytest.fixture
def sessions(db: Database) -> Database:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    for _ in range(2):
        _add(db, "plain", PLAIN)
        _add(db, "sdk", RESPONSES)
        _add(db, "mixed", PLAIN)
        _add(db, "mixed", RESPONSES)
        _add(db, "tools", PLAIN)
        _add(db, "tools", CHAT_TOOLS)
        _add(db, "tools", RESPONSES)
    # A summary of the first turns of "plain", as compaction stores it.
    db.sql(
        """
        INSERT INTO aidb_memory.summary
            (actor_key, session_ref, from_seq, to_seq, turn_count, content, chars, model,
             from_offset, to_offset)
        SELECT s.actor_key, s.id, 1, 5, 5, 'They greeted each other.', 24, 'm', 0,
               (SELECT t.char_offset + t.chars FROM aidb_memory.turn t
                WHERE t.session_ref = s.id AND t.seq = 5)
        FROM aidb_memory.session s WHERE s.session_id = 'plain'
        """
    )
    db.sql("SELECT * FROM aidb_memory.session_start(%s, 'a', NULL, 'empty')", (NS,))
    return db


@pytest.mark.parametrize("sid", ["plain", "sdk", "mixed", "tools", "empty"])
def test_responses_in_sql_are_what_python_renders(sessions: Database, sid: str) -> None:
    limits: list[tuple[int | None, int | None]] = [(None, None), (60, None), (1000, None)]
    limits += [(None, n) for n in (1, 2, 3, 5, 8, 13, 30)]
    limits += [(80, 4)]
    for limit_chars, limit_items in limits:
        args = (NS, sid, limit_chars, limit_items)
        ours = sessions.value(
            "SELECT aidb_memory.session_messages(%s, 'a', %s, limit_chars => %s, "
            "limit_items => %s, format => 'responses')",
            args,
        )
        python = sessions.value(
            "SELECT aidb_memory.session_convert(r.items, 'responses') "
            "FROM aidb_memory.session_get(%s, 'a', %s, limit_chars => %s, limit_items => %s) r",
            args,
        )
        assert ours == python, (sid, limit_chars, limit_items)
        chat = sessions.value(
            "SELECT aidb_memory.session_messages(%s, 'a', %s, limit_chars => %s, "
            "limit_items => %s)",
            args,
        )
        python_chat = sessions.value(
            "SELECT aidb_memory.session_convert(r.items, 'chat') "
            "FROM aidb_memory.session_get(%s, 'a', %s, limit_chars => %s, limit_items => %s) r",
            args,
        )
        assert chat == python_chat, (sid, limit_chars, limit_items)


def test_the_plain_lists_are_rendered_in_sql(sessions: Database) -> None:
    """The sessions of plain messages and SDK items never reach Python: a backend that read
    them has not loaded the conversion module (docs/architecture.md, Loading the code)."""
    with sessions.connect() as conn:
        for sid in ("plain", "sdk", "mixed"):
            conn.execute(
                "SELECT aidb_memory.session_messages(%s, 'a', %s, format => 'responses')",
                (NS, sid),
            )
        seen: list[str] = []
        conn.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
        conn.execute(
            "DO LANGUAGE plpython3u $$\nimport sys\n"
            "plpy.notice(' '.join(sorted(m for m in sys.modules if m.startswith('aidb'))))$$"
        )
        assert "aidb_memory_server.items" not in seen[-1].split()
        conn.execute(
            "SELECT aidb_memory.session_messages(%s, 'a', 'tools', format => 'responses')", (NS,)
        )
        conn.execute(
            "DO LANGUAGE plpython3u $$\nimport sys\n"
            "plpy.notice(' '.join(sorted(m for m in sys.modules if m.startswith('aidb'))))$$"
        )
        assert "aidb_memory_server.items" in seen[-1].split()
