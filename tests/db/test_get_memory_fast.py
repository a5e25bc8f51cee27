"""get_memory's fast path (issue 34, bench row (m)): sql/61_get_memory_fast.sql reads one memory
by its id or key without Python. For every memory it finds it returns what the PL/Python body
(addressed.get_memory) returns; every other call falls through to that body, whose answers and
errors stand; and a memory found is found without it (the PL/Python body is not called)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest

from conftest import APP_USER, Database

NS = "fastget"
COLUMNS = (
    "id, content, agent_id, session_id, valid_from, valid_to, superseded_by, created_at, "
    "updated_at, metadata, key, expires_at"
)


def _rows(db: Database, function: str, args: dict[str, Any], user: str = APP_USER) -> Any:
    """The rows of ``function`` for ``args`` (``actor``: alice unless given)."""
    names = "".join(f", {k} => %({k})s" for k in args if k != "actor")
    return db.sql(
        f"SELECT {COLUMNS} FROM aidb_memory.{function}(%(ns)s, %(actor)s{names})",
        {"ns": NS, "actor": "alice", **args},
        user=user,
    )


@pytest.fixture
def memories(db: Database) -> dict[str, str]:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))

    def remember(content: str, **kwargs: Any) -> str:
        names = "".join(f", {k} => %({k})s" for k in kwargs)
        return str(
            db.value(
                f"SELECT aidb_memory.remember(%(ns)s, 'alice', %(content)s{names})",
                {"ns": NS, "content": content, **kwargs},
                user=APP_USER,
            )
        )

    found = {
        "plain": remember("Alice lives in Lisbon", agent_id="bot", session_id="s1"),
        "keyed": remember(
            "Alice's plan is Pro", key="plan", metadata=json.dumps({"tier": 2}), ttl_s=600
        ),
        "old": remember("Alice's car is red"),
        "gone": remember("Alice is on a call", ttl_s=600),
    }
    new = remember("Alice's car is blue")
    # A superseded memory, as reconciliation leaves one.
    db.sql(
        "UPDATE aidb_memory.memory SET valid_to = now(), superseded_by = "
        "(SELECT id FROM aidb_memory.memory WHERE public_id = %s) WHERE public_id = %s",
        (new, found["old"]),
    )
    db.sql(
        "UPDATE aidb_memory.memory SET expires_at = now() - interval '1 s' WHERE public_id = %s",
        (found["gone"],),
    )
    return found


def test_the_fast_path_returns_what_the_python_body_does(
    db: Database, memories: dict[str, str]
) -> None:
    cases: list[dict[str, Any]] = [
        {"id": memories["plain"]},
        {"id": memories["keyed"]},
        {"id": memories["old"]},
        {"id": memories["gone"]},
        {"id": "00000000-0000-0000-0000-000000000000"},
        {"key": "plan"},
        {"key": "no such key"},
        {"actor": "bob", "id": memories["plain"]},
        {"actor": "bob", "key": "plan"},
    ]
    taken = 0
    for args in cases:
        fast = _rows(db, "get_memory_fast", args, user="postgres")
        body = _rows(db, "get_memory_py", args, user="postgres")
        # The fast path answers a memory found that nothing superseded; for anything else it has
        # no row and the Python body answers.
        assert fast == (body if body and body[0][6] is None else []), args
        taken += bool(fast)
        assert _rows(db, "get_memory", args) == body, args
    assert taken == 3, "plain and keyed by id, keyed by key"
    assert [r[0] for r in _rows(db, "get_memory_fast", {"key": "plan"}, user="postgres")] == [
        uuid.UUID(memories["keyed"])
    ]
    assert _rows(db, "get_memory", {"id": memories["old"]})[0][6] is not None, "superseded_by"


def test_a_memory_found_does_not_reach_python(db: Database, memories: dict[str, str]) -> None:
    with db.connect() as conn:
        conn.execute("SET track_functions = 'all'")
        conn.execute("BEGIN")
        for args in ({"id": memories["plain"]}, {"key": "plan"}, {"key": "none"}):
            names = "".join(f", {k} => %({k})s" for k in args)
            conn.execute(
                f"SELECT * FROM aidb_memory.get_memory(%(ns)s, 'alice'{names})", {"ns": NS, **args}
            )
        conn.execute(
            "SELECT * FROM aidb_memory.get_memory(%s, 'alice', key => 'plan', refresh_ttl => true)",
            (NS,),
        )
        calls = dict(
            conn.execute(
                "SELECT funcname::text, calls FROM pg_stat_xact_user_functions "
                "WHERE schemaname = 'aidb_memory' AND funcname LIKE 'get_memory%'"
            ).fetchall()
        )
        conn.execute("COMMIT")
    assert calls == {"get_memory": 4, "get_memory_py": 2}, (
        "the memories found by id and by key did not reach Python; a key that names none and "
        "refresh_ttl did"
    )


@pytest.mark.parametrize(
    ("args", "sqlstate"),
    [
        ({"ns": "no such namespace", "id": "00000000-0000-0000-0000-000000000000"}, "42704"),
        ({"id": "00000000-0000-0000-0000-000000000000", "key": "plan"}, "22023"),
        ({}, "22023"),
        ({"actor": "al\x07ice", "key": "plan"}, "22023"),
        ({"actor": "a" * 300, "key": "plan"}, "22023"),
        ({"key": " "}, "22023"),
        ({"actor": None, "key": "plan"}, "22004"),
    ],
)
def test_what_the_fast_path_does_not_take_gets_the_python_answer(
    db: Database, memories: dict[str, str], args: dict[str, Any], sqlstate: str
) -> None:
    params = {"ns": NS, "actor": "alice", **args}
    names = "".join(f", {k} => %({k})s" for k in args if k not in ("ns", "actor"))
    with db.connect(APP_USER) as conn, pytest.raises(psycopg.Error) as info:
        conn.execute(f"SELECT * FROM aidb_memory.get_memory(%(ns)s, %(actor)s{names})", params)
    assert info.value.sqlstate == sqlstate
    assert (info.value.diag.message_primary or "").startswith("aidb_memory.get_memory: ")


def test_a_bound_actor_is_checked_on_the_fast_path_too(
    db: Database, memories: dict[str, str]
) -> None:
    db.sql(
        "SELECT aidb_memory.namespace_update(%s, config => %s::jsonb)",
        (NS, json.dumps({"actor_binding": "session_user"})),
    )
    with db.connect(APP_USER) as conn, pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT * FROM aidb_memory.get_memory(%s, 'alice', key => 'plan')", (NS,))
    assert info.value.sqlstate == "42501"


def test_an_actor_longer_than_the_namespace_now_allows_is_refused_on_the_fast_path_too(
    db: Database, memories: dict[str, str]
) -> None:
    db.sql(
        "SELECT aidb_memory.namespace_update(%s, config => %s::jsonb)",
        (NS, json.dumps({"max_identifier_chars": 3})),
    )
    with db.connect(APP_USER) as conn, pytest.raises(psycopg.Error) as info:
        conn.execute(
            "SELECT * FROM aidb_memory.get_memory(%s, 'alice', id => %s)", (NS, memories["plain"])
        )
    assert info.value.sqlstate == "22023"
    assert "actor_id is longer than 3 characters" in str(info.value)
