"""Issue 9, class 7: nothing of another actor reaches a client through debug settings.

``debug_print_parse``, ``debug_print_rewritten`` and ``debug_print_plan`` are settable by any
session; with ``client_min_messages = log`` the session receives, as LOG messages, the query trees
of every statement planned in it — our SECURITY DEFINER code's statements included, and a custom
plan carries its parameters (other actors' memory text) as constants.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from conftest import APP_USER, WORKER_USER, Database
from fake_openai import FakeOpenAI, Reply

NS = "leaky"
SECRET_TURN = "my locker code is 4471-PLUM-ORCHID"
SECRET_FACT = "Alice's locker code is 4471-PLUM-ORCHID."
NEEDLE = "PLUM-ORCHID"
DEBUG = ("debug_print_parse", "debug_print_rewritten", "debug_print_plan")


@pytest.fixture
def ns(db: Database, fake: FakeOpenAI) -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\')', (NS,))


def _shows(message: str, needle: str) -> bool:
    """Whether ``needle`` is in a LOG message, as text or as a printed datum (a plan tree prints a
    constant's bytes in decimal: ``:constvalue 12 [ 48 0 0 0 80 76 ... ]``)."""
    as_datum = " " + " ".join(str(b) for b in needle.encode()) + " "
    return needle in message or as_datum in message


def _debugging(db: Database, user: str) -> tuple[psycopg.Connection[Any], list[str]]:
    """A connection of ``user`` that asks for every query tree, and the messages it receives."""
    conn = db.connect(user)
    received: list[str] = []
    conn.add_notice_handler(lambda d: received.append(f"{d.message_primary} {d.message_detail}"))
    for setting in DEBUG:
        conn.execute(f"SET {setting} = on")
    conn.execute("SET client_min_messages = log")
    return conn, received


def _ops(text: str) -> str:
    return json.dumps({"operations": [{"op": "add", "text": text, "target": None}]})


def test_the_setup_really_prints_plans_with_constants(db: Database) -> None:
    # The attack needs a session to see its own statements' trees with their constants; if this
    # failed, the tests below would pass for the wrong reason.
    conn, received = _debugging(db, WORKER_USER)
    with conn:
        conn.execute(f"SELECT 1 FROM pg_catalog.pg_class WHERE relname::text = '{NEEDLE}'")
    assert any(_shows(m, NEEDLE) for m in received)


def test_a_worker_sees_no_other_actors_memories_in_plan_trees(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    turns = json.dumps([{"role": "user", "content": SECRET_TURN}])
    db.sql("SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's1')", (NS, turns), user=APP_USER)
    fake.queue(Reply(content=_ops(SECRET_FACT)))
    conn, received = _debugging(db, WORKER_USER)
    with conn:
        row = conn.execute("CALL aidb_memory.process_events()").fetchone()
    assert row is not None and row[0] == 1, "the event was processed"
    assert db.value("SELECT count(*) FROM aidb_memory.memory WHERE content = %s", (SECRET_FACT,))
    assert received, "the worker's session did receive LOG messages (its own statements)"
    leaked = [m for m in received if _shows(m, NEEDLE)]
    assert leaked == []


def test_every_security_definer_function_pins_the_debug_settings(db: Database) -> None:
    rows = db.sql(
        """SELECT p.oid::regprocedure::text, coalesce(p.proconfig, '{}')
           FROM pg_catalog.pg_proc p
           WHERE p.pronamespace = 'aidb_memory'::regnamespace AND p.prosecdef"""
    )
    assert rows
    for name, config in rows:
        for setting in DEBUG:
            assert f"{setting}=off" in config, name
