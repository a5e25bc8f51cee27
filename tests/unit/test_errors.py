"""The one-line messages that errors of our internal statements reach the client with."""

from __future__ import annotations

from aidb_memory_server.errors import named_message, one_line


def test_a_postgres_message_is_named_after_the_function() -> None:
    assert (
        named_message("session_get", "canceling statement due to statement timeout")
        == "aidb_memory.session_get: canceling statement due to statement timeout"
    )


def test_an_internal_functions_name_gives_way_to_the_called_one() -> None:
    assert (
        named_message("session_get", "aidb_memory.session_read_plan: limit_chars must be > 0")
        == "aidb_memory.session_get: limit_chars must be > 0"
    )
    assert named_message("add", "aidb_memory.add: x") == "aidb_memory.add: x"


def test_text_that_only_looks_like_a_prefix_is_kept() -> None:
    # "aidb_memory.turn" is a table, then no ": " directly after an identifier.
    text = 'relation "aidb_memory.turn" does not exist'
    assert named_message("add", text) == f"aidb_memory.add: {text}"
    assert named_message("add", "aidb_memory.x y: z") == "aidb_memory.add: aidb_memory.x y: z"


def test_messages_become_one_line() -> None:
    flat = 'aidb_memory.add: duplicate key value "x"'
    assert named_message("add", 'duplicate key\n  value "x"') == flat
    assert one_line("a" * 300, limit=10) == "a" * 9 + "…"
