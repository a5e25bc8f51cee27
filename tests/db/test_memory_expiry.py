"""Issue 34, item 5: memories that expire. remember's ``expires_at`` and ``ttl_s`` and the
namespace's ``config.memory_ttl_s``; an expired memory is invisible to every read from the moment
it expires, before any sweep; a write that meets one where it holds a place (its text, its key)
deletes it first; a read may refresh a time to live; the worker's sweep (``expire_memories``, from
``process_events``) deletes expired memories in bounded batches, audited as ``expire``.

Most tests make a memory expire by moving its ``expires_at`` into the past as the superuser: that
is what the passage of time does to it, without waiting for it (one test waits, with a one-second
time to live)."""

from __future__ import annotations

import datetime
import json
import time
from typing import Any

import psycopg
import pytest

from conftest import APP_USER, WORKER_USER, Database
from fake_openai import FakeOpenAI

NS = "expiring"
PROCESS = "CALL aidb_memory.process_events(max_events => %s, lease_s => 60, backoff_s => 0)"


def _remember(db: Database, content: str, actor: str = "alice", **kwargs: Any) -> str:
    names = "".join(f", {k} => %({k})s" for k in kwargs)
    return str(
        db.value(
            f"SELECT aidb_memory.remember(%(ns)s, %(actor)s, %(content)s{names})",
            {"ns": NS, "actor": actor, "content": content, **kwargs},
            user=APP_USER,
        )
    )


def _get(db: Database, actor: str = "alice", **kwargs: Any) -> list[tuple[Any, ...]]:
    names = "".join(f", {k} => %({k})s" for k in kwargs)
    return db.sql(
        f"SELECT id::text, content, expires_at FROM aidb_memory.get_memory(%(ns)s, %(actor)s"
        f"{names})",
        {"ns": NS, "actor": actor, **kwargs},
        user=APP_USER,
    )


def _listed(db: Database, actor: str = "alice", superseded: bool = False) -> list[str]:
    rows = db.sql(
        "SELECT id::text FROM aidb_memory.list_memories(%s, %s, include_superseded => %s)",
        (NS, actor, superseded),
        user=APP_USER,
    )
    return sorted(r[0] for r in rows)


def _search(db: Database, query: str, actor: str = "alice") -> list[str]:
    rows = db.sql(
        "SELECT id::text FROM aidb_memory.search(%s, %s, %s)", (NS, actor, query), user=APP_USER
    )
    return sorted(r[0] for r in rows)


def _expire(db: Database, *memory_ids: str, ago: str = "1 second") -> None:
    """Move the memories' expiry into the past, as time would."""
    db.sql(
        "UPDATE aidb_memory.memory SET expires_at = now() - %s::interval "
        "WHERE public_id = ANY (%s::uuid[])",
        (ago, list(memory_ids)),
    )


def _stored(db: Database) -> int:
    return int(db.value("SELECT count(*) FROM aidb_memory.memory"))


def _fails(db: Database, query: str, params: Any, user: str = APP_USER) -> psycopg.Error:
    with db.connect(user) as conn, pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    return info.value


def _seconds_left(db: Database, memory_id: str) -> float:
    return float(
        db.value(
            "SELECT extract(epoch FROM expires_at - now()) FROM aidb_memory.memory "
            "WHERE public_id = %s",
            (memory_id,),
        )
    )


def _audit(db: Database) -> list[tuple[Any, ...]]:
    return db.sql(
        "SELECT action, reason, counts->>'memories', counts->>'selector' "
        "FROM aidb_memory.audit_log WHERE action = 'expire' ORDER BY id"
    )


@pytest.fixture
def ns(db: Database) -> Database:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    return db


def test_an_expired_memory_is_invisible_to_every_read_before_any_sweep(ns: Database) -> None:
    gone = _remember(ns, "Alice is at the Lisbon office this week", ttl_s=3600)
    keyed = _remember(
        ns, "Alice's Lisbon badge number is 4417", key="badge", expires_at="2999-01-01T00:00:00Z"
    )
    kept = _remember(ns, "Alice likes Lisbon")
    assert _search(ns, "Lisbon") == sorted([gone, keyed, kept])
    assert _listed(ns) == sorted([gone, keyed, kept])
    _expire(ns, gone, keyed)
    assert _search(ns, "Lisbon") == [kept]
    assert _search(ns, "office week") == []
    assert _listed(ns) == [kept]
    assert _listed(ns, superseded=True) == [kept]
    assert _get(ns, id=gone) == []
    assert _get(ns, key="badge") == []
    assert _get(ns, id=keyed) == []
    assert (
        ns.sql(
            "SELECT * FROM aidb_memory.memory_history(%s, 'alice', %s)", (NS, gone), user=APP_USER
        )
        == []
    )
    err = _fails(ns, "SELECT * FROM aidb_memory.update_memory(%s, 'alice', %s, 'x')", (NS, gone))
    assert err.sqlstate == "42704"
    assert _stored(ns) == 3, "nothing was swept: the reads left them out themselves"


def test_a_memory_with_a_time_to_live_is_gone_when_it_has_passed(ns: Database) -> None:
    memory_id = _remember(ns, "Alice is on a call", ttl_s=1)
    assert [r[0] for r in _get(ns, id=memory_id)] == [memory_id]
    time.sleep(1.2)
    assert _get(ns, id=memory_id) == []
    assert _search(ns, "call") == []


def test_expiry_arguments_are_checked_before_anything_is_stored(ns: Database) -> None:
    cases = [
        ({"ttl_s": 60, "expires_at": "2999-01-01T00:00:00Z"}, "ttl_s"),
        ({"expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
        ({"ttl_s": 0}, "ttl_s"),
        ({"ttl_s": 315_360_001}, "ttl_s"),
    ]
    for kwargs, field in cases:
        names = "".join(f", {k} => %({k})s" for k in kwargs)
        err = _fails(
            ns,
            f"SELECT aidb_memory.remember(%(ns)s, 'alice', 'x'{names})",
            {"ns": NS, **kwargs},
        )
        assert err.sqlstate == "22023", kwargs
        assert err.diag.message_primary is not None
        assert err.diag.message_primary.startswith(f"aidb_memory.remember: {field} "), kwargs
    assert _stored(ns) == 0
    err = _fails(
        ns,
        "SELECT aidb_memory.namespace_update(%s, config => '{\"memory_ttl_s\": 0}')",
        (NS,),
        user="postgres",
    )
    assert err.sqlstate == "22023"
    assert "config.memory_ttl_s" in str(err)


def test_the_namespace_default_applies_to_remember_and_to_extraction(ns: Database) -> None:
    ns.sql(
        "SELECT aidb_memory.namespace_update(%s, config => %s::jsonb)",
        (NS, json.dumps({"memory_ttl_s": 3600, "extraction_mode": "verbatim"})),
    )
    plain = _remember(ns, "Alice parks on level 2")
    assert 3590 < _seconds_left(ns, plain) <= 3600
    fixed = _remember(ns, "Alice's desk is 4B", expires_at="2999-01-01T00:00:00Z")
    assert _get(ns, id=fixed)[0][2] == datetime.datetime(2999, 1, 1, tzinfo=datetime.UTC)
    ns.sql(
        "SELECT aidb_memory.add(%s, 'alice', %s::jsonb)",
        (NS, json.dumps([{"role": "user", "content": "I moved to the Porto office."}])),
        user=APP_USER,
    )
    with ns.connect(WORKER_USER) as conn:
        conn.execute(PROCESS, (10,))
    extracted = ns.sql(
        "SELECT ttl_s, extract(epoch FROM expires_at - now()) FROM aidb_memory.memory "
        "WHERE source_event IS NOT NULL"
    )
    assert len(extracted) == 1
    assert extracted[0][0] == 3600 and 3500 < float(extracted[0][1]) <= 3600


def test_a_read_may_refresh_a_time_to_live(ns: Database) -> None:
    lived = _remember(ns, "Alice is drafting the budget", ttl_s=600, key="task")
    fixed = _remember(ns, "Alice's trial ends in March", expires_at="2999-01-01T00:00:00Z")
    ns.sql(
        "UPDATE aidb_memory.memory SET expires_at = now() + interval '10 seconds' "
        "WHERE public_id = %s",
        (lived,),
    )
    _get(ns, id=lived)
    assert _seconds_left(ns, lived) <= 10, "a plain read changes nothing"
    _get(ns, id=lived, refresh_ttl=True)
    assert 590 < _seconds_left(ns, lived) <= 600
    ns.sql(
        "UPDATE aidb_memory.memory SET expires_at = now() + interval '10 seconds' "
        "WHERE public_id = %s",
        (lived,),
    )
    _get(ns, key="task", refresh_ttl=True)
    assert 590 < _seconds_left(ns, lived) <= 600, "by key too"
    before = _get(ns, id=fixed)[0][2]
    _get(ns, id=fixed, refresh_ttl=True)
    assert _get(ns, id=fixed)[0][2] == before, "a fixed time is no time to live"
    _expire(ns, lived)
    assert _get(ns, id=lived, refresh_ttl=True) == [], "an expired memory is not revived"
    assert _seconds_left(ns, lived) < 0


def test_remembering_an_expired_text_or_key_makes_a_new_memory(ns: Database) -> None:
    old = _remember(ns, "Alice is in Berlin", ttl_s=60)
    old_keyed = _remember(ns, "Alice's room is 12", key="room", ttl_s=60)
    _expire(ns, old, old_keyed)
    new = _remember(ns, "Alice is in Berlin")
    new_keyed = _remember(ns, "Alice's room is 12", key="room")
    assert new != old and new_keyed != old_keyed
    assert _listed(ns) == sorted([new, new_keyed])
    assert _stored(ns) == 2, "the expired ones were deleted where they held the place"
    history = ns.sql(
        "SELECT operation FROM aidb_memory.memory_history(%s, 'alice', %s)",
        (NS, new_keyed),
        user=APP_USER,
    )
    assert history == [("add",)], "a new memory, with a history of its own"
    assert _audit(ns) == [("expire", "expired", "1", "expired")] * 2


def test_a_text_stated_again_keeps_the_later_expiry(ns: Database) -> None:
    memory_id = _remember(ns, "Alice is on call", ttl_s=100)
    assert _remember(ns, "Alice is on call", ttl_s=1000) == memory_id
    assert 990 < _seconds_left(ns, memory_id) <= 1000
    assert _remember(ns, "Alice is on call", ttl_s=10) == memory_id
    assert 990 < _seconds_left(ns, memory_id) <= 1000, "an earlier expiry does not shorten it"
    assert _remember(ns, "Alice is on call") == memory_id
    assert _get(ns, id=memory_id)[0][2] is None, "stated with no expiry, it no longer expires"


def test_a_put_with_a_time_to_live_pushes_it_back_without_a_new_version(ns: Database) -> None:
    memory_id = _remember(ns, "Alice is reviewing PR 7", key="review", ttl_s=600)
    ns.sql(
        "UPDATE aidb_memory.memory SET expires_at = now() + interval '5 seconds' "
        "WHERE public_id = %s",
        (memory_id,),
    )
    assert _remember(ns, "Alice is reviewing PR 7", key="review", ttl_s=600) == memory_id
    assert 590 < _seconds_left(ns, memory_id) <= 600
    assert _remember(ns, "Alice is reviewing PR 7", key="review") == memory_id
    assert _get(ns, id=memory_id)[0][2] is None, "a put without expiry makes it permanent"
    history = ns.sql(
        "SELECT operation FROM aidb_memory.memory_history(%s, 'alice', %s)",
        (NS, memory_id),
        user=APP_USER,
    )
    assert history == [("add",)]


def test_the_sweep_deletes_expired_memories_in_bounded_batches(ns: Database) -> None:
    expired = {
        actor: [_remember(ns, f"{actor} fact {i}", actor=actor, ttl_s=60) for i in range(3)]
        for actor in ("alice", "bob")
    }
    alive = _remember(ns, "alice fact that stays", ttl_s=3600)
    forever = _remember(ns, "bob fact that stays", actor="bob")
    for actor, ids in expired.items():
        for i, memory_id in enumerate(ids):
            _expire(ns, memory_id, ago=f"{10 * (i + 1) + (5 if actor == 'bob' else 0)} seconds")
    # Soonest expired first: alice's third (30 s ago) and bob's third (35 s ago).
    assert ns.value("SELECT aidb_memory.expire_memories(2)", user=WORKER_USER) == 2
    left = {r[0] for r in ns.sql("SELECT public_id::text FROM aidb_memory.memory")}
    assert expired["alice"][2] not in left and expired["bob"][2] not in left
    assert len(left) == 6
    assert (
        ns.value(
            "SELECT count(*) FROM aidb_memory.memory_history WHERE memory_id NOT IN "
            "(SELECT id FROM aidb_memory.memory)"
        )
        == 0
    )
    assert _audit(ns) == [("expire", "expired", "1", "expired")] * 2
    # A worker of a key range sweeps only its actors'.
    bob_key = int(ns.value("SELECT aidb_memory.actor_key(%s, 'bob')", (NS,)))
    assert (
        ns.value(
            "SELECT aidb_memory.expire_memories(100, %s, %s)", (bob_key, bob_key), user="postgres"
        )
        == 2
    )
    # process_events sweeps the rest, and says so.
    with ns.connect(WORKER_USER) as conn:
        row = conn.execute(PROCESS, (10,)).fetchone()
    assert row is not None and row[3]["expiry"] == {"expired": 2}
    assert {r[0] for r in ns.sql("SELECT public_id::text FROM aidb_memory.memory")} == {
        alive,
        forever,
    }
    assert _audit(ns)[2:] == [
        ("expire", "expired", "2", "expired"),
        ("expire", "expired", "2", "expired"),
    ]
    err = _fails(ns, "SELECT aidb_memory.expire_memories(0)", None, user=WORKER_USER)
    assert err.sqlstate == "22023"
    err = _fails(ns, "SELECT aidb_memory.expire_memories(10)", None, user=APP_USER)
    assert err.sqlstate == "42501", "an application role does not sweep"


def test_an_expired_memory_is_no_vector_candidate(db: Database, fake: FakeOpenAI) -> None:
    opts = {"model": "fake-embedding", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('emb', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"embedding": "emb"}\')', (NS,))
    gone = _remember(db, "Alice keeps bees", ttl_s=3600)
    kept = _remember(db, "Alice keeps goats")
    with db.connect(WORKER_USER) as conn:
        conn.execute(PROCESS, (10,))
    assert db.value("SELECT count(*) FROM aidb_memory.memory WHERE embedding IS NOT NULL") == 2
    vector = [0.5, 0.5]
    found = db.sql(
        "SELECT id::text FROM aidb_memory.search(%s, 'alice', 'zebra', "
        "query_embedding => %s::float8[])",
        (NS, vector),
        user=APP_USER,
    )
    assert sorted(r[0] for r in found) == sorted([gone, kept]), "both found by the vector alone"
    _expire(db, gone)
    found = db.sql(
        "SELECT id::text FROM aidb_memory.search(%s, 'alice', 'zebra', "
        "query_embedding => %s::float8[])",
        (NS, vector),
        user=APP_USER,
    )
    assert [r[0] for r in found] == [kept]
