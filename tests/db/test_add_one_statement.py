"""``add``'s one-statement path (issue 14): the same rows as the general path, and never a stale
namespace.

A backend that has read a namespace before validates the next batch against that row's config
and writes in one statement that checks the row is still that version (adding._FAST_STORE). Each
test here makes the same adds through one connection (the one-statement path from its second
add on) and through a new connection per add (always the general path), and compares what they
wrote; or changes the namespace between two adds of one connection.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from conftest import APP_USER, Database

NS = "fast"
ADD = "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, %s)"
TURNS = """
SELECT t.seq, t.round_start, t.char_offset, t.chars, t.role, t.content, t.kind, t.name,
       t.tool_calls, t.tool_call_id, t.meta, t.item, t.item_format, e.status, e.turn_count,
       e.agent_id
FROM aidb_memory.turn t
JOIN aidb_memory.session s ON s.id = t.session_ref
JOIN aidb_memory.event e ON e.id = t.event_ref
WHERE s.session_id = %s ORDER BY seq
"""
SESSION = """
SELECT next_seq, total_chars, tail_sequence_id, tail_round_start, open_calls, last_user_seq,
       pinned_seq, pinned_chars, tail_joinable, tail_item_type
FROM aidb_memory.session WHERE session_id = %s
"""


def _reasoning(i: int) -> dict[str, Any]:
    return {"type": "reasoning", "id": f"rs_{i}", "summary": []}


def _call(i: int) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{i}",
        "call_id": f"call_{i}",
        "name": "lookup",
        "arguments": "{}",
    }


def _output(i: int) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": f"call_{i}", "output": "found"}


def _message(i: int) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{i}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": f"answer {i}", "annotations": []}],
    }


# Batches in order, one session each list: the plain exchange of the benchmark, pinned
# instructions, tool calls across adds, sequence ids, and Responses items whose tails (reasoning,
# calls) decide where the next batch's first item goes.
SESSIONS: dict[str, list[list[dict[str, Any]]]] = {
    "plain": [
        [{"role": "user", "content": "q" * 200}, {"role": "assistant", "content": "a" * 600}],
        [{"role": "user", "content": "again"}, {"role": "assistant", "content": "yes"}],
    ],
    "pinned": [
        [{"role": "system", "content": "You are terse."}],
        [{"role": "developer", "content": "Be kind."}, {"role": "user", "content": "hi"}],
        [{"role": "system", "content": "not pinned any more"}],
    ],
    "tools": [
        [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
                ],
            },
        ],
        [{"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
        [{"role": "assistant", "content": "It is sunny.", "name": "bot"}],
        [{"role": "user", "content": "thanks", "meta": {"sequence_id": "r9"}}],
        [{"role": "assistant", "content": "welcome", "meta": {"sequence_id": "r9"}}],
        [{"role": "user", "content": "bye", "meta": {"lang": "en"}}],
    ],
    "responses": [
        [{"role": "user", "content": "find it"}, _reasoning(1)],
        [_call(1)],
        [_output(1), _reasoning(2)],
        [_message(2)],
        [{"role": "user", "content": "and now?"}, _call(3)],
        [_call(4)],
        [_output(3), _output(4), _message(5)],
        [{"role": "user", "content": "ok"}],
    ],
}


@pytest.fixture
def namespace(db: Database) -> Database:
    db.sql(
        "SELECT aidb_memory.init(%s, '{}'::jsonb, %s::jsonb)", (NS, '{"pin_instructions": true}')
    )
    return db


def _written(db: Database, session: str) -> tuple[Any, ...]:
    return (db.sql(TURNS, (session,)), db.sql(SESSION, (session,)))


def test_one_connection_writes_what_new_connections_write(namespace: Database) -> None:
    db = namespace
    with db.connect(APP_USER) as conn:
        conn.execute(ADD, (NS, json.dumps([{"role": "user", "content": "warm"}]), "warm-up"))
        for name, batches in SESSIONS.items():
            for batch in batches:
                conn.execute(ADD, (NS, json.dumps(batch), f"one-{name}"), prepare=True)
    for name, batches in SESSIONS.items():
        for batch in batches:
            with db.connect(APP_USER) as conn:
                conn.execute(ADD, (NS, json.dumps(batch), f"new-{name}"))
    for name in SESSIONS:
        assert _written(db, f"one-{name}") == _written(db, f"new-{name}"), name


def test_refusals_are_the_general_paths(namespace: Database) -> None:
    """A batch the session's tail refuses, and a closed session, on a connection that knows the
    namespace: the general path's errors, and nothing written."""
    db = namespace
    with db.connect(APP_USER) as conn:
        conn.execute(ADD, (NS, json.dumps(SESSIONS["tools"][0]), "s"))
        with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
            conn.execute(ADD, (NS, json.dumps([{"role": "user", "content": "hi"}]), "s"))
        assert "comes before tool call" in str(info.value)
        conn.execute("SELECT * FROM aidb_memory.session_end(%s, 'alice', 's', NULL)", (NS,))
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="is closed"):
            conn.execute(ADD, (NS, json.dumps([{"role": "user", "content": "hi"}]), "s"))
    assert db.value("SELECT next_seq FROM aidb_memory.session WHERE session_id = 's'") == 3


def test_a_changed_namespace_is_seen_by_the_next_add(namespace: Database) -> None:
    db = namespace
    long_turn = json.dumps([{"role": "user", "content": "x" * 150}])
    with db.connect(APP_USER) as conn:
        conn.execute(ADD, (NS, long_turn, "s"))
        db.sql(
            "SELECT * FROM aidb_memory.namespace_update(%s, NULL, %s)",
            (NS, '{"max_turn_chars": 100}'),
        )
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="longer than 100"):
            conn.execute(ADD, (NS, long_turn, "s"))
        db.sql(
            "SELECT * FROM aidb_memory.namespace_update(%s, NULL, %s)",
            (NS, '{"max_turn_chars": 200}'),
        )
        conn.execute(ADD, (NS, long_turn, "s"))  # refused by the old config, accepted by the new
        db.sql("SELECT * FROM aidb_memory.namespace_update(%s, NULL, NULL, 'INACTIVE')", (NS,))
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="INACTIVE"):
            conn.execute(ADD, (NS, long_turn, "s"))
    assert db.value("SELECT next_seq FROM aidb_memory.session WHERE session_id = 's'") == 3


def test_two_versions_of_one_transaction(namespace: Database) -> None:
    """Two updates of the namespace row in one transaction make two versions with one xmin: the
    ctid tells them apart."""
    db = namespace
    turn = json.dumps([{"role": "user", "content": "x" * 80}])
    update = "UPDATE aidb_memory.namespace SET config = config || %s::jsonb WHERE name = %s"
    with db.connect(autocommit=False) as conn:
        conn.execute(update, ('{"max_turn_chars": 100}', NS))
        conn.execute(ADD, (NS, turn, "s"))
        conn.execute(ADD, (NS, turn, "s"))
        conn.execute(update, ('{"max_turn_chars": 50}', NS))
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="longer than 50"):
            conn.execute(ADD, (NS, turn, "s"))
