"""The client without a server: SQLSTATE → exception, the parsing of add's turn errors, the SQL
it sends (named arguments, only those given), result decoding, and what importing it imports."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from aidb_memory.client import (
    AidbMemoryError,
    ConnectionFailed,
    EventStatus,
    Handoff,
    IdempotencyConflict,
    InvalidArgument,
    InvalidState,
    InvalidTurn,
    NamespaceInactive,
    NamespaceNotFound,
    NotFound,
    PermissionDenied,
    ReadResult,
    SessionClosed,
    TransientError,
    calls,
)
from aidb_memory.client.errors import from_psycopg, make_error
from conftest import REPO

# --- SQLSTATE → exception ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sqlstate", "message", "expected"),
    [
        ("22023", "aidb_memory.add: turns[3].content is required", InvalidTurn),
        (
            "22023",
            "aidb_memory.add: turns must be a JSON array of turns, not an object",
            InvalidArgument,
        ),
        ("22023", "aidb_memory.session_get: limit_chars must be 1..100000000", InvalidArgument),
        ("22004", "aidb_memory.add: turns must not be NULL", InvalidArgument),
        ("22003", "integer out of range", InvalidArgument),
        ("22P02", 'invalid input syntax for type uuid: "x"', InvalidArgument),
        ("42704", 'aidb_memory.add: namespace "x" does not exist', NamespaceNotFound),
        (
            "42704",
            'aidb_memory.init: model_spec.llm names model "m", which is not registered',
            NotFound,
        ),
        ("42501", "permission denied for function add", PermissionDenied),
        (
            "42501",
            'aidb_memory.session_start: actor_id "alice" is not the calling role',
            PermissionDenied,
        ),
        ("23505", 'aidb_memory.add: idempotency_key "k" was already used', IdempotencyConflict),
        ("55000", 'aidb_memory.add: session "conv-1" is closed', SessionClosed),
        ("55000", 'aidb_memory.session_pop: session "c" is closed', SessionClosed),
        ("55000", 'aidb_memory.add: namespace "n" is INACTIVE', NamespaceInactive),
        ("55000", "aidb_memory.search: memories were embedded with another model", InvalidState),
        ("40001", "could not serialize access", TransientError),
        ("40P01", "deadlock detected", TransientError),
        (
            "55P03",
            "aidb_memory.session_pop: canceling statement due to lock timeout",
            TransientError,
        ),
        (
            "57014",
            "aidb_memory.session_get: canceling statement due to statement timeout",
            TransientError,
        ),
        ("08006", "server closed the connection unexpectedly", ConnectionFailed),
        (None, "connection failed", ConnectionFailed),
        ("XX000", "aidb_memory.add: internal error", AidbMemoryError),
    ],
)
def test_sqlstate_to_exception(sqlstate: str | None, message: str, expected: type) -> None:
    error = make_error(sqlstate, message)
    assert type(error) is expected
    assert isinstance(error, AidbMemoryError)
    assert error.sqlstate == sqlstate and error.message == message


def test_the_hierarchy() -> None:
    assert issubclass(InvalidTurn, InvalidArgument)
    assert issubclass(NamespaceNotFound, NotFound)
    assert issubclass(SessionClosed, InvalidState) and issubclass(NamespaceInactive, InvalidState)
    for cls in (
        InvalidArgument,
        NotFound,
        PermissionDenied,
        InvalidState,
        IdempotencyConflict,
        TransientError,
        ConnectionFailed,
    ):
        assert issubclass(cls, AidbMemoryError)


@pytest.mark.parametrize(
    ("message", "index", "path", "field"),
    [
        ("aidb_memory.add: turns[3].content is required (only ...)", 3, ".content", "content"),
        ("aidb_memory.add: turns[1].sequnce_id is not a known key", 1, ".sequnce_id", "sequnce_id"),
        ("aidb_memory.add: turns[0].meta is nested deeper than 100 levels", 0, ".meta", "meta"),
        (
            'aidb_memory.add: turns[12].tool_call_id "call_9" does not answer',
            12,
            ".tool_call_id",
            "tool_call_id",
        ),
        ('aidb_memory.add: turns[1] comes before tool call "call_2" has its result', 1, "", None),
        (
            "aidb_memory.add: turns[2].content[1].image_url.url must be a string",
            2,
            ".content[1].image_url.url",
            "content",
        ),
    ],
)
def test_invalid_turn_parsing(message: str, index: int, path: str, field: str | None) -> None:
    error = make_error("22023", message, hint="h")
    assert isinstance(error, InvalidTurn)
    assert (error.index, error.path, error.field, error.function, error.hint) == (
        index,
        path,
        field,
        "add",
        "h",
    )


def test_from_psycopg_keeps_the_diagnostics() -> None:
    diag = SimpleNamespace(
        message_primary='aidb_memory.add: session "c" is closed',
        message_hint="start a new session for new turns",
        message_detail="closed at noon",
    )

    class Fake(psycopg.errors.ObjectNotInPrerequisiteState):
        sqlstate = "55000"

        @property
        def diag(self) -> Any:  # type: ignore[override]
            return diag

    pgerror = Fake("ERROR: ...")
    error = from_psycopg(pgerror)
    assert isinstance(error, SessionClosed)
    assert (error.hint, error.detail, error.pgerror) == (
        diag.message_hint,
        "closed at noon",
        pgerror,
    )
    assert str(error) == (
        '55000: aidb_memory.add: session "c" is closed\nHINT:  start a new session for new turns'
    )
    lost = from_psycopg(psycopg.OperationalError("connection refused"))
    assert isinstance(lost, ConnectionFailed) and lost.sqlstate is None
    assert lost.message == "connection refused"


# --- the SQL sent -------------------------------------------------------------------------------


def _text(call: calls.Call[Any]) -> str:
    return call.query.as_string(None)


def test_named_arguments_and_only_those_given() -> None:
    call = calls.session_get("ns", "alice", "c", None, None, None, None)
    assert _text(call) == (
        'SELECT "items", "overflow_chars", "compacted_entries", "warnings" FROM '
        'aidb_memory.session_get("namespace" => %s::text, "actor_id" => %s::text, '
        '"session_id" => %s::text)'
    )
    assert call.params == ("ns", "alice", "c")
    call = calls.session_get("ns", "alice", "c", 100, None, None, 5)
    assert '"limit_chars" => %s::integer' in _text(call)
    assert '"limit_items" => %s::integer' in _text(call)
    assert "limit_turns" not in _text(call) and call.params[3:] == (100, 5)


def test_session_messages_sends_format_only_when_not_chat() -> None:
    chat = calls.session_messages("ns", "a", "c", None, None, None, None, "chat")
    assert "format" not in _text(chat)
    responses = calls.session_messages("ns", "a", "c", None, None, 3, None, "responses")
    assert _text(responses).endswith('"limit_turns" => %s::integer, "format" => %s::text)')
    assert responses.params[-2:] == (3, "responses")


def test_required_and_null_arguments() -> None:
    # session_start's agent_id has no SQL default: always sent, NULL when not given.
    start = calls.session_start("ns", "a", None, None)
    assert '"agent_id" => %s::text' in _text(start) and '"session_id" =>' not in _text(start)
    # limit is a reserved word: quoted.
    listing = calls.session_list("ns", "a", None, False, 10)
    assert '"limit" => %s::integer' in _text(listing)
    assert '"include_closed" => %s::boolean' in _text(listing)


def test_remember_sends_only_what_it_is_given() -> None:
    call = calls.remember("ns", "a", "Alice likes tea", None, None)
    assert _text(call) == (
        'SELECT aidb_memory.remember("namespace" => %s::text, "actor_id" => %s::text, '
        '"content" => %s::text)'
    )
    assert call.params == ("ns", "a", "Alice likes tea")
    both = calls.remember("ns", "a", "x", "conv-1", "bot")
    assert _text(both).endswith('"session_id" => %s::text, "agent_id" => %s::text)')
    assert both.params == ("ns", "a", "x", "conv-1", "bot")
    memory_id = uuid.uuid4()
    assert call.decode([(memory_id,)]) == memory_id


def test_jsonb_both_ways() -> None:
    turns = [{"role": "user", "content": "hi"}]
    call = calls.add("ns", "a", turns, "c", None, None)
    assert '"turns" => %s::jsonb' in _text(call)
    assert isinstance(call.params[2], Jsonb) and call.params[2].obj == turns
    already = Jsonb(turns)
    assert calls.add("ns", "a", already, None, None, None).params[2] is already
    ids = [uuid.uuid4(), uuid.uuid4()]
    selector = calls.delete("ns", "a", {"ids": ids}, "r", None, None).params[2]
    assert json.dumps(selector.obj) == json.dumps({"ids": [str(i) for i in ids]})


def test_decoding() -> None:
    read = calls.session_get("n", "a", "s", None, None, None, None).decode(
        [([{"seq": 1}], 5, 2, ["compaction_busy"])]
    )
    assert read == ReadResult([{"seq": 1}], 5, 2, ("compaction_busy",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        read.overflow_chars = 0  # type: ignore[misc]
    handoff = calls.session_end("n", "a", "s", None).decode(
        [
            (
                {
                    "session_id": "s",
                    "turn_count": 3,
                    "started_at": "2025-01-02T03:04:05.123+00:00",
                    "closed_at": None,
                    "summary": None,
                },
                datetime(2025, 1, 3, tzinfo=UTC),
            )
        ]
    )
    assert isinstance(handoff, Handoff)
    assert handoff.started_at == datetime(2025, 1, 2, 3, 4, 5, 123000, tzinfo=UTC)
    assert handoff.closed_at == datetime(2025, 1, 3, tzinfo=UTC)
    assert calls.session_end("n", "a", "s", None).decode([]) is None
    event = uuid.uuid4()
    status = calls.status("n", "a", event).decode(
        [
            (
                {
                    "event_id": str(event),
                    "status": "processed",
                    "attempts": 1,
                    "last_error": None,
                    "created_at": "2025-01-02T03:04:05+00:00",
                    "processed_at": None,
                    "next_attempt_at": None,
                    "result": {"added": 1},
                },
            )
        ]
    )
    assert isinstance(status, EventStatus)
    assert (status.event_id, status.status, status.result) == (event, "processed", {"added": 1})
    assert calls.status("n", "a", event).decode([(None,)]) is None


# --- imports ------------------------------------------------------------------------------------


def test_importing_the_client_imports_nothing_heavy() -> None:
    # What the import adds to what the interpreter had at startup (a namespace package's .pth
    # file may import an empty ``testing`` at startup: that is not the import's doing).
    code = (
        "import sys, json; before = set(sys.modules); import aidb_memory.client; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO / "src")},
    ).stdout
    added = set(json.loads(out))
    assert "aidb_memory.client" in added and "psycopg" in added
    heavy = (
        "pglast",
        "testing",
        "psycopg_pool",
        "aidb_memory.install",
        "aidb_memory.cli",
        "agents",
        "openai",
        "langchain_core",
        "langgraph",
        "mcp",
    )
    imported = {m for m in added if m.split(".")[0] in heavy or m in heavy}
    assert not imported, imported


def test_demo_without_the_demo_extra_names_it() -> None:
    # testing.postgresql missing: a None entry in sys.modules makes its import fail.
    code = (
        "import sys; sys.modules['testing.postgresql'] = None; "
        "from aidb_memory.cli import main; sys.exit(main(['demo']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(REPO / "src")},
    )
    assert result.returncode == 1
    assert "pip install 'aidb-memory[demo]'" in result.stderr
    assert "Traceback" not in result.stderr
