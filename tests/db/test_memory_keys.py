"""Issue 34, items 2 and 3: a memory's key (remember with a key is a put that replaces in place),
and one memory read, corrected and traced by its id: get_memory, update_memory, memory_history."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

from conftest import APP_USER, WORKER_USER, Database
from fake_openai import FakeOpenAI, Reply
from plans import memory_scans

NS = "keyed"
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
        "SELECT id::text, content, metadata, key, valid_to IS NULL "
        f"FROM aidb_memory.get_memory(%(ns)s, %(actor)s{names})",
        {"ns": NS, "actor": actor, **kwargs},
        user=APP_USER,
    )


def _update(db: Database, memory_id: str, **kwargs: Any) -> list[tuple[Any, ...]]:
    names = "".join(f", {k} => %({k})s" for k in kwargs)
    return db.sql(
        "SELECT id::text, content, metadata, key "
        f"FROM aidb_memory.update_memory(%(ns)s, 'alice', %(id)s{names})",
        {"ns": NS, "id": memory_id, **kwargs},
        user=APP_USER,
    )


def _history(db: Database, memory_id: str, actor: str = "alice") -> list[tuple[Any, ...]]:
    return db.sql(
        "SELECT version, operation, content, previous_content, metadata, by_role, reason "
        "FROM aidb_memory.memory_history(%s, %s, %s)",
        (NS, actor, memory_id),
        user=APP_USER,
    )


def _search(db: Database, query: str) -> list[str]:
    rows = db.sql(
        "SELECT id::text FROM aidb_memory.search(%s, 'alice', %s)", (NS, query), user=APP_USER
    )
    return [r[0] for r in rows]


def _work(db: Database, events: int = 10) -> None:
    with db.connect(WORKER_USER) as conn:
        conn.execute(PROCESS, (events,))


def _fails(db: Database, query: str, params: Any, user: str = APP_USER) -> psycopg.Error:
    with db.connect(user) as conn, pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    return info.value


def _rows(db: Database) -> int:
    return int(db.value("SELECT count(*) FROM aidb_memory.memory"))


@pytest.fixture
def ns(db: Database) -> Database:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    return db


def test_a_put_on_a_key_replaces_the_memory_in_place_and_a_repeated_put_changes_nothing(
    ns: Database,
) -> None:
    first = _remember(ns, "Prefers window seats", key="seat", metadata=json.dumps({"v": 1}))
    assert _get(ns, key="seat") == [(first, "Prefers window seats", {"v": 1}, "seat", True)]
    again = _remember(ns, "Prefers aisle seats", key="seat", metadata=json.dumps({"v": 2}))
    assert again == first, "the same key is the same memory"
    assert _get(ns, id=first) == [(first, "Prefers aisle seats", {"v": 2}, "seat", True)]
    assert _rows(ns) == 1
    # Searchable by its new words at once, no longer by the old ones.
    assert _search(ns, "aisle") == [first]
    assert _search(ns, "window") == []
    # A retried put changes nothing: no new version.
    assert _remember(ns, "Prefers aisle seats", key="seat", metadata=json.dumps({"v": 2.0})) == (
        first
    )
    assert [(v, op, c, p, m) for v, op, c, p, m, _, _ in _history(ns, first)] == [
        (1, "add", "Prefers window seats", None, {"v": 1}),
        (2, "update", "Prefers aisle seats", "Prefers window seats", {"v": 2}),
    ]
    # Its metadata alone is a change too.
    _remember(ns, "Prefers aisle seats", key="seat", metadata=json.dumps({"v": True}))
    assert _get(ns, key="seat")[0][2] == {"v": True}
    assert len(_history(ns, first)) == 3


def test_keyed_memories_may_say_the_same_and_the_keyless_rule_stays(ns: Database) -> None:
    a = _remember(ns, "Likes tea", key="a")
    b = _remember(ns, "Likes tea", key="b")
    assert a != b, "two keys, two memories, one text"
    plain = _remember(ns, "Likes tea")
    assert plain not in (a, b), "a keyless memory is no duplicate of a keyed one"
    assert _remember(ns, "likes tea.") == plain, "the keyless exact-duplicate rule stays"
    assert _rows(ns) == 3
    # Other actors' keys are theirs.
    other = _remember(ns, "Likes coffee", actor="bob", key="a")
    assert other != a
    assert _get(ns, key="a") == [(a, "Likes tea", {}, "a", True)]
    assert _get(ns, actor="bob", key="a")[0][0] == other


def test_get_memory_by_id_or_key_is_one_row_or_none(ns: Database) -> None:
    memory_id = _remember(ns, "Lives in Lisbon", metadata='{"topic": "home"}')
    assert _get(ns, id=memory_id) == [(memory_id, "Lives in Lisbon", {"topic": "home"}, None, True)]
    assert _get(ns, id=str(uuid.uuid4())) == []
    assert _get(ns, key="nothing") == []
    assert _get(ns, actor="bob", id=memory_id) == [], "another actor's memory is not found"
    for kwargs in ({}, {"id": memory_id, "key": "k"}):
        names = "".join(f", {k} => %({k})s" for k in kwargs)
        err = _fails(
            ns,
            f"SELECT * FROM aidb_memory.get_memory(%(ns)s, 'alice'{names})",
            {"ns": NS, **kwargs},
        )
        assert err.sqlstate == "22023"
        assert str(err).startswith("aidb_memory.get_memory: id or key must be given, not both")
    err = _fails(ns, "SELECT * FROM aidb_memory.get_memory(%s, 'alice', key => '')", (NS,))
    assert (err.sqlstate, str(err).splitlines()[0]) == (
        "22023",
        "aidb_memory.get_memory: key must not be empty",
    )


def test_update_memory_corrects_in_place_audited_and_searchable_at_once(ns: Database) -> None:
    memory_id = _remember(ns, "Works at Initech", metadata='{"source": "crm"}')
    updated = _update(ns, memory_id, content="Works at Globex", reason="she changed jobs")
    assert updated == [(memory_id, "Works at Globex", {"source": "crm"}, None)]
    assert _search(ns, "globex") == [memory_id]
    assert _search(ns, "initech") == []
    # The vocabulary follows: the old word is gone, the new one is there.
    words = {r[0] for r in ns.sql("SELECT word FROM aidb_memory.memory_word")}
    assert "globex" in words and "initech" not in words
    # Metadata alone, replaced as a whole.
    assert _update(ns, memory_id, metadata='{"source": "user"}')[0][2] == {"source": "user"}
    history = _history(ns, memory_id)
    assert [(v, op, c, p, m, r) for v, op, c, p, m, _, r in history] == [
        (1, "add", "Works at Initech", None, {"source": "crm"}, None),
        (2, "update", "Works at Globex", "Works at Initech", {"source": "crm"}, "she changed jobs"),
        (3, "update", "Works at Globex", "Works at Globex", {"source": "user"}, None),
    ]
    assert {h[5] for h in history} == {APP_USER}, "by the login role"


def test_update_memory_refuses_what_it_cannot_do_and_changes_nothing(ns: Database) -> None:
    memory_id = _remember(ns, "Owns a cat")
    twin = _remember(ns, "Owns a dog")
    call = "SELECT * FROM aidb_memory.update_memory(%s, 'alice', %s, %s, %s::jsonb, %s)"
    cases = [
        ((NS, memory_id, None, None, None), "22023", "content and metadata are both NULL"),
        ((NS, None, "x", None, None), "22004", "id must not be NULL"),
        ((NS, memory_id, " ", None, None), "22023", "content must not be empty"),
        ((NS, memory_id, None, "[1]", None), "22023", "metadata must be a JSON object"),
        ((NS, memory_id, "x", None, " "), "22023", "reason must not be empty"),
        ((NS, str(uuid.uuid4()), "x", None, None), "42704", "has no current memory"),
        ((NS, memory_id, "owns a dog!", None, None), "23505", "already has a current memory"),
    ]
    for params, state, message in cases:
        err = _fails(ns, call, params)
        assert err.sqlstate == state, (params, err)
        assert message in str(err).splitlines()[0], (params, err)
        assert str(err).startswith("aidb_memory.update_memory: ")
    assert _get(ns, id=memory_id)[0][1] == "Owns a cat"
    assert _get(ns, id=twin)[0][1] == "Owns a dog"
    assert [h[1] for h in _history(ns, memory_id)] == ["add"]
    # A superseded memory is not changed (the one that replaced it is current).
    ns.sql("UPDATE aidb_memory.memory SET valid_to = now() WHERE public_id = %s", (memory_id,))
    err = _fails(ns, call, (NS, memory_id, "Owns two cats", None, None))
    assert err.sqlstate == "42704"
    # Nor another actor's.
    err = _fails(
        ns,
        "SELECT * FROM aidb_memory.update_memory(%s, 'bob', %s, 'x')",
        (NS, twin),
    )
    assert err.sqlstate == "42704"


def test_update_memory_queues_the_vector_again_and_a_stale_one_is_not_kept(
    db: Database, fake: FakeOpenAI
) -> None:
    opts = {"model": "fake-embedding", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('emb', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"embedding": "emb"}\')', (NS,))
    memory_id = _remember(db, "Alice keeps bees")
    _work(db)
    assert db.value("SELECT embedding IS NOT NULL FROM aidb_memory.memory") is True
    _update(db, memory_id, content="Alice keeps goats")
    assert db.value("SELECT embedding IS NULL FROM aidb_memory.memory") is True
    assert db.sql("SELECT status FROM aidb_memory.event WHERE kind = 'embedding' ORDER BY id") == [
        ("processed",),
        ("accepted",),
    ]
    # A metadata change keeps the vector of the same text.
    _work(db)
    embedded = [r.body["input"] for r in fake.calls("/embeddings")]
    assert embedded == [["Alice keeps bees"], ["Alice keeps goats"]]
    _update(db, memory_id, metadata='{"animal": "goat"}')
    assert db.value("SELECT embedding IS NOT NULL FROM aidb_memory.memory") is True
    # A task that embeds the text while the memory changes does not store that vector: the
    # change queued another task, which embeds the new text.
    _update(db, memory_id, content="Alice keeps sheep")
    fake.queue(Reply(delay=1.0))
    worker = threading.Thread(target=_work, args=(db, 1))
    worker.start()
    deadline = time.monotonic() + 10
    while len(fake.calls("/embeddings")) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    _update(db, memory_id, content="Alice keeps llamas")
    worker.join(30)
    assert fake.calls("/embeddings")[2].body["input"] == ["Alice keeps sheep"]
    assert db.value("SELECT embedding IS NULL FROM aidb_memory.memory") is True
    _work(db)
    assert fake.calls("/embeddings")[3].body["input"] == ["Alice keeps llamas"]
    assert db.value("SELECT embedding IS NOT NULL FROM aidb_memory.memory") is True


def test_concurrent_puts_on_one_key_make_one_memory(ns: Database) -> None:
    done: list[str] = []
    with ns.connect(APP_USER, autocommit=False) as conn:
        (first,) = conn.execute(
            "SELECT aidb_memory.remember(%s, 'alice', 'Drives a van', key => 'car')::text", (NS,)
        ).fetchone() or (None,)

        def other() -> None:
            done.append(_remember(ns, "Drives a truck", key="car"))

        thread = threading.Thread(target=other)
        thread.start()
        time.sleep(0.5)
        assert thread.is_alive(), "the second put waits for the actor's lock"
        conn.commit()
    thread.join(30)
    assert done == [first]
    assert _get(ns, key="car") == [(first, "Drives a truck", {}, "car", True)]
    assert _rows(ns) == 1


def test_history_goes_with_delete_and_forget(ns: Database) -> None:
    kept = _remember(ns, "Has a sister", key="family")
    _update(ns, kept, content="Has two sisters")
    gone = _remember(ns, "Plays chess")
    ns.sql(
        "SELECT aidb_memory.delete(%s, 'alice', %s::jsonb, 'asked')",
        (NS, json.dumps({"ids": [gone]})),
        user=APP_USER,
    )
    assert _history(ns, gone) == []
    assert len(_history(ns, kept)) == 2
    ns.sql("SELECT aidb_memory.forget(%s, 'alice', 'asked')", (NS,), user=APP_USER)
    assert _history(ns, kept) == []
    assert ns.value("SELECT count(*) FROM aidb_memory.memory_history") == 0


def test_search_and_list_memories_return_the_key(ns: Database) -> None:
    memory_id = _remember(ns, "Speaks Portuguese", key="language")
    assert ns.sql(
        "SELECT id::text, key FROM aidb_memory.search(%s, 'alice', 'portuguese')",
        (NS,),
        user=APP_USER,
    ) == [(memory_id, "language")]
    assert ns.sql(
        "SELECT id::text, key FROM aidb_memory.list_memories(%s, 'alice')", (NS,), user=APP_USER
    ) == [(memory_id, "language")]


def test_a_memory_is_found_by_its_id_with_one_index_probe(ns: Database) -> None:
    """The generic plan of a read by id probes memory_public_id_key: when it was (actor_key,
    public_id), with the namespace and actor as keys or not, the plan scanned the actor's every
    memory on memory_actor_idx, also led by the key and smaller (bench (m), migration 0024)."""
    # Alice has 3,000 memories; 6,000 other actors one each: the average actor has one.
    ns.sql(
        "INSERT INTO aidb_memory.memory (actor_key, namespace_id, actor_id, content, "
        "content_hash, lexemes) "
        "SELECT aidb_memory.actor_key(%s, a.actor), n.id, a.actor, 'fact ' || g, md5('f' || g), "
        "to_tsvector('english', 'fact ' || g) "
        "FROM aidb_memory.namespace n, generate_series(1, 9000) g, "
        "LATERAL (SELECT CASE WHEN g <= 3000 THEN 'alice' ELSE 'u-' || g END AS actor) a "
        "WHERE n.name = %s",
        (NS, NS),
    )
    ns.sql("ANALYZE aidb_memory.memory")
    memory_id = _remember(ns, "Keeps a diary")
    calls = [
        ("SELECT * FROM aidb_memory.get_memory(%s, 'alice', id => %s)", (NS, memory_id)),
        ("SELECT * FROM aidb_memory.memory_history(%s, 'alice', %s)", (NS, memory_id)),
        ("SELECT * FROM aidb_memory.update_memory(%s, 'alice', %s, 'x')", (NS, memory_id)),
        ("SELECT * FROM aidb_memory.list_memories(%s, 'alice', after => %s)", (NS, memory_id)),
    ]
    for query, params in calls:
        with ns.connect() as conn:
            conn.execute("SET plan_cache_mode = force_generic_plan")
            scans = memory_scans(conn, query, params)
        probes = [s for s in scans if "public_id" in s.get("Index Cond", "")]
        seen = [(s.get("Index Name"), s.get("Index Cond"), s.get("Filter")) for s in scans]
        assert probes, (query, seen)
        assert all(s.get("Index Name") == "memory_public_id_key" for s in probes), query
        assert all(s.get("Rows Removed by Filter", 0) == 0 for s in probes), query
