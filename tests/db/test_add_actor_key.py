"""``add`` writes every row by the actor's key (issue 15): each path (one statement, general,
new session, idempotency key, no session, compaction task) inserts ``actor_key`` itself, and a
backend that remembers a namespace dropped and made again under its name writes to the new one.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from conftest import APP_USER, Database

NS = "keyed"
ADD = "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s, NULL, %s)"
# Rows whose key is not their (namespace, actor)'s. A turn with a wrong key fails its foreign key.
WRONG_KEYS = """
SELECT e.id, e.kind FROM aidb_memory.event e JOIN aidb_memory.namespace n ON n.id = e.namespace_id
WHERE e.actor_key <> aidb_memory.actor_key(n.name, e.actor_id)
"""


def _turns(text: str) -> str:
    return json.dumps([{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}])


@pytest.fixture
def keyed(db: Database) -> Database:
    # A model, so that add may queue compaction tasks; extraction off: no event waits for it.
    opts = {"model": "fake-chat", "base_url": "http://127.0.0.1:9", "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql(
        'SELECT aidb_memory.init(%s, \'{"llm": "chat"}\', \'{"extraction": false}\'::jsonb)',
        (NS,),
    )
    return db


def _add(
    conn: psycopg.Connection[Any],
    text: str,
    session: str | None,
    key: str | None = None,
    actor: str = "alice",
) -> str:
    row = conn.execute(ADD, (NS, actor, _turns(text), session, key)).fetchone()
    assert row is not None
    return str(row[0])


def _namespace_id(db: Database) -> int:
    return int(db.value("SELECT id FROM aidb_memory.namespace WHERE name = %s", (NS,)))


def test_every_path_writes_the_actors_key(keyed: Database) -> None:
    db = keyed
    with db.connect(APP_USER) as conn:
        _add(conn, "new session", "s")  # a backend's first add: namespace, session, lock, store
        _add(conn, "one statement", "s")
        first = _add(conn, "with a key", "s", key="k1")
        assert _add(conn, "with a key", "s", key="k1") == first  # the retry finds it by key
        _add(conn, "no session", None)
        _add(conn, "no session, a key", None, key="k2")
        _add(conn, "another actor", "s", actor="bob")
    with db.connect(APP_USER) as conn:
        _add(conn, "a new backend", "s")
    # The session passes its ahead threshold: the next add queues a compaction task, once.
    db.sql(
        "INSERT INTO aidb_memory.compaction_ahead (actor_key, session_ref, read_budget, ahead_at) "
        "SELECT actor_key, id, 1000, 0 FROM aidb_memory.session "
        "WHERE session_id = 's' AND actor_id = 'alice'"
    )
    with db.connect(APP_USER) as conn:
        _add(conn, "general path, queues", "s", key="k3")
        _add(conn, "one statement, queued already", "s")
    with db.connect(APP_USER) as conn:
        _add(conn, "warm", "s")
        db.sql("DELETE FROM aidb_memory.event WHERE kind = 'compaction'")
        _add(conn, "one statement, queues", "s")
    assert db.sql(WRONG_KEYS) == []
    keys = db.sql(
        "SELECT DISTINCT e.actor_id, e.actor_key = aidb_memory.actor_key(%s, e.actor_id) "
        "FROM aidb_memory.event e ORDER BY 1",
        (NS,),
    )
    assert keys == [("alice", True), ("bob", True)]
    assert db.value("SELECT count(*) FROM aidb_memory.event WHERE kind = 'compaction'") == 1
    assert db.value("SELECT count(*) FROM aidb_memory.turn") == 2 * 9
    assert (
        db.value(
            "SELECT count(*) FROM aidb_memory.turn t JOIN aidb_memory.session s "
            "ON s.actor_key = t.actor_key AND s.id = t.session_ref"
        )
        == 2 * 9
    )


def test_a_namespace_made_again_under_its_name(keyed: Database) -> None:
    """A backend that remembers the namespace (adding._known) while it is dropped and made again
    under its name: its next adds go to the new one, on every path."""
    db = keyed
    old_id = _namespace_id(db)
    with db.connect(APP_USER) as conn:
        _add(conn, "first", "s")
        _add(conn, "second", "s")
        db.sql("SELECT aidb_memory.namespace_drop(%s, 'test')", (NS,))
        db.sql("SELECT aidb_memory.init(%s, '{}'::jsonb, '{\"extraction\": false}'::jsonb)", (NS,))
        new_id = _namespace_id(db)
        assert new_id != old_id
        _add(conn, "to the new namespace", "s")
        _add(conn, "one statement again", "s")
        _add(conn, "no session, a key", None, key="k")
        _add(conn, "a key", "s", key="k2")
    assert db.sql(WRONG_KEYS) == []
    counts = db.sql("SELECT s.namespace_id, s.next_seq FROM aidb_memory.session s ORDER BY 1")
    assert counts == [(new_id, 7)]
    events = db.sql("SELECT namespace_id, count(*) FROM aidb_memory.event GROUP BY 1 ORDER BY 1")
    assert events == [(new_id, 4)]
