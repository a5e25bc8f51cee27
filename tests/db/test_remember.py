"""Issue 26, item 1: ``remember``, a memory written directly, now, without a model: validated,
deduplicated by the worker's exact rule, searchable at once, audited and erasable, its vector
added later by the worker."""

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

NS = "direct"
REMEMBER = "SELECT aidb_memory.remember(%s, %s, %s)"
PROCESS = "CALL aidb_memory.process_events(max_events => 10, lease_s => 60, backoff_s => 0)"


def _remember(db: Database, content: str, actor: str = "alice", **kwargs: Any) -> str:
    names = "".join(f", {k} => %({k})s" for k in kwargs)
    return str(
        db.value(
            f"SELECT aidb_memory.remember(%(ns)s, %(actor)s, %(content)s{names})",
            {"ns": NS, "actor": actor, "content": content, **kwargs},
            user=APP_USER,
        )
    )


def _memories(db: Database, actor: str = "alice") -> list[tuple[Any, ...]]:
    return db.sql(
        "SELECT public_id::text, content, session_id, agent_id, source_event "
        "FROM aidb_memory.memory WHERE actor_id = %s AND valid_to IS NULL ORDER BY id",
        (actor,),
    )


def _fails(db: Database, query: str, params: Any, user: str = APP_USER) -> psycopg.Error:
    with db.connect(user) as conn, pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    return info.value


@pytest.fixture
def ns(db: Database) -> Database:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    return db


def test_a_remembered_fact_is_a_memory_found_by_words_in_the_same_transaction(
    ns: Database,
) -> None:
    with ns.connect(APP_USER, autocommit=False) as conn:
        (memory_id,) = conn.execute(
            "SELECT aidb_memory.remember(%s, 'alice', 'Alice is allergic to peanuts', "
            "session_id => 's1', agent_id => 'helper')::text",
            (NS,),
        ).fetchone() or (None,)
        uuid.UUID(memory_id)
        found = conn.execute(
            "SELECT id::text, content FROM aidb_memory.search(%s, 'alice', 'peanuts')", (NS,)
        ).fetchall()
        assert found == [(memory_id, "Alice is allergic to peanuts")]
        # A misspelled word finds it too.
        assert conn.execute(
            "SELECT id::text FROM aidb_memory.search(%s, 'alice', 'peanust')", (NS,)
        ).fetchall() == [(memory_id,)]
        conn.rollback()
    assert _memories(ns) == [], "the caller's rollback takes the memory with it"
    memory_id = _remember(ns, "Alice is allergic to peanuts", session_id="s1", agent_id="helper")
    assert _memories(ns) == [(memory_id, "Alice is allergic to peanuts", "s1", "helper", None)]
    listed = ns.sql(
        "SELECT id::text, content FROM aidb_memory.list_memories(%s, 'alice')", (NS,), user=APP_USER
    )
    assert listed == [(memory_id, "Alice is allergic to peanuts")]
    # Audited like a memory the worker adds, without an event.
    assert ns.sql(
        "SELECT operation, old_content, new_content, event_id FROM aidb_memory.memory_history"
    ) == [("add", None, "Alice is allergic to peanuts", None)]


def test_an_exact_duplicate_returns_the_existing_memory_and_stores_nothing(ns: Database) -> None:
    first = _remember(ns, "Alice lives in Lyon.")
    assert _remember(ns, "alice   LIVES in lyon") == first  # the worker's normalization
    assert _remember(ns, "Alice lives in Lyon.", actor="bob") != first  # another actor's
    assert len(_memories(ns)) == 1
    assert ns.value("SELECT count(*) FROM aidb_memory.memory_history") == 2
    # A near duplicate is a memory of its own: the direct write keeps what it is given.
    _remember(ns, "Alice now lives in Lyon.")
    assert len(_memories(ns)) == 2


def test_delete_and_forget_erase_a_remembered_memory(ns: Database) -> None:
    keep = _remember(ns, "Alice plays the cello")
    gone = _remember(ns, "Alice's locker code is 4417")
    assert (
        ns.value(
            "SELECT aidb_memory.delete(%s, 'alice', %s::jsonb, 'asked')",
            (NS, json.dumps({"ids": [gone]})),
            user=APP_USER,
        )
        == 1
    )
    assert [m[0] for m in _memories(ns)] == [keep]
    ns.sql("SELECT aidb_memory.forget(%s, 'alice', 'asked')", (NS,), user=APP_USER)
    assert _memories(ns) == []
    assert ns.value("SELECT count(*) FROM aidb_memory.memory_history") == 0


@pytest.mark.parametrize(
    ("args", "sqlstate", "message"),
    [
        ((NS, "alice", None), "22004", "aidb_memory.remember: content must not be NULL"),
        ((NS, "alice", "   "), "22023", "aidb_memory.remember: content must not be empty"),
        (
            (NS, "alice", "x" * 1001),
            "22023",
            "aidb_memory.remember: content is longer than 1000 characters",
        ),
        ((NS, None, "fact"), "22004", "aidb_memory.remember: actor_id must not be NULL"),
        (
            (NS, "a\nb", "fact"),
            "22023",
            "aidb_memory.remember: actor_id must not contain control characters",
        ),
        (
            ("nope", "alice", "fact"),
            "42704",
            'aidb_memory.remember: namespace "nope" does not exist',
        ),
    ],
)
def test_bad_input_is_refused_and_nothing_is_stored(
    ns: Database, args: tuple[Any, ...], sqlstate: str, message: str
) -> None:
    error = _fails(ns, REMEMBER, args)
    assert (error.sqlstate, error.diag.message_primary) == (sqlstate, message)
    assert ns.value("SELECT count(*) FROM aidb_memory.memory") == 0


def test_the_content_limit_is_the_namespaces(ns: Database) -> None:
    ns.sql(
        "SELECT aidb_memory.namespace_update(%s, config => '{\"memory_max_chars\": 100}')", (NS,)
    )
    error = _fails(ns, REMEMBER, (NS, "alice", "y" * 101))
    assert error.diag.message_primary == (
        "aidb_memory.remember: content is longer than 100 characters"
    )
    assert error.diag.message_hint == (
        "split it into facts, or an admin raises config.memory_max_chars"
    )
    # Over 64 kB the same refusal comes before the server's Python (sql/12_argument_caps.sql).
    error = _fails(ns, REMEMBER, (NS, "alice", "y" * 70_000))
    assert error.diag.message_primary == (
        "aidb_memory.remember: content is longer than 100 characters"
    )
    _remember(ns, "y" * 100)


def test_an_inactive_namespace_and_a_read_only_transaction_refuse_it(ns: Database) -> None:
    with ns.connect(APP_USER) as conn, pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        conn.execute("SET default_transaction_read_only = on")
        conn.execute(REMEMBER, (NS, "alice", "Alice likes jazz"))
    ns.sql("SELECT aidb_memory.namespace_update(%s, state => 'INACTIVE')", (NS,))
    assert _fails(ns, REMEMBER, (NS, "alice", "Alice likes jazz")).sqlstate == "55000"
    assert ns.value("SELECT count(*) FROM aidb_memory.memory") == 0


def test_only_the_application_roles_may_call_it(ns: Database) -> None:
    error = _fails(ns, REMEMBER, (NS, "alice", "fact"), user=WORKER_USER)
    assert error.sqlstate == "42501"


def _chat_namespace(db: Database, fake: FakeOpenAI, text: str) -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\')', (NS,))
    operations = [{"op": "add", "text": text, "target": None}]
    fake.default = lambda _r: Reply(content=json.dumps({"operations": operations}), delay=0.5)


def _work(db: Database) -> None:
    with db.connect(WORKER_USER) as conn:
        conn.execute(PROCESS)


def test_a_remember_racing_an_extraction_of_the_same_text_makes_one_memory(
    db: Database, fake: FakeOpenAI
) -> None:
    text = "Alice is vegetarian."
    _chat_namespace(db, fake, text)
    db.sql(
        "SELECT aidb_memory.add(%s, 'alice', %s::jsonb)",
        (NS, json.dumps([{"role": "user", "content": "I am vegetarian"}])),
        user=APP_USER,
    )
    # The direct write holds the actor's lock, uncommitted, while the worker extracts the same
    # fact and then waits to reconcile it.
    with db.connect(APP_USER, autocommit=False) as conn:
        (mine,) = conn.execute(
            "SELECT aidb_memory.remember(%s, 'alice', %s)::text", (NS, text)
        ).fetchone() or (None,)
        worker = threading.Thread(target=_work, args=(db,))
        worker.start()
        deadline = time.monotonic() + 10
        while not fake.calls() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fake.calls(), "the worker never asked the model"
        time.sleep(1)  # the answer (0.5 s) is in: the worker waits for the lock
        assert worker.is_alive()
        conn.commit()
    worker.join(30)
    assert [m[:2] for m in _memories(db)] == [(mine, text)]
    result = db.value("SELECT result FROM aidb_memory.event WHERE kind = 'extraction'")
    assert (result["added"], result["duplicates"]) == (0, 1)
    # The other order: the worker's memory first, then the direct write finds it.
    db.sql("SELECT aidb_memory.forget(%s, 'alice', 'again')", (NS,), user=APP_USER)
    db.sql(
        "SELECT aidb_memory.add(%s, 'alice', %s::jsonb)",
        (NS, json.dumps([{"role": "user", "content": "I am vegetarian"}])),
        user=APP_USER,
    )
    _work(db)
    (theirs,) = [m[0] for m in _memories(db)]
    assert _remember(db, text) == theirs
    assert len(_memories(db)) == 1


def test_the_worker_adds_the_vector_and_the_call_never_waits_for_it(
    db: Database, fake: FakeOpenAI
) -> None:
    opts = {"model": "fake-embedding", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('emb', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"embedding": "emb"}\')', (NS,))
    first = _remember(db, "Alice's sister is called Ines")
    _remember(db, "Alice keeps bees on her roof")
    assert fake.requests == [], "remember called a model"
    # One task waits for the actor, however many memories wait for their vector.
    assert db.sql("SELECT kind, status FROM aidb_memory.event WHERE actor_id = 'alice'") == [
        ("embedding", "accepted")
    ]
    assert db.value("SELECT count(*) FROM aidb_memory.memory WHERE embedding IS NULL") == 2
    # By words until then.
    found = db.sql(
        "SELECT id::text FROM aidb_memory.search(%s, 'alice', 'sister')", (NS,), user=APP_USER
    )
    assert found == [(first,)]
    _work(db)
    (request,) = fake.calls("/embeddings")
    assert sorted(request.body["input"]) == ["Alice keeps bees on her roof",
                                             "Alice's sister is called Ines"]  # fmt: skip
    assert (
        db.value(
            "SELECT count(*) FROM aidb_memory.memory WHERE embedding IS NOT NULL "
            "AND embedding_model = 'emb'"
        )
        == 2
    )
    assert db.sql("SELECT status, result FROM aidb_memory.event WHERE actor_id = 'alice'") == [
        ("processed", {"embedded": 2})
    ]


# --- metadata (issue 34) ------------------------------------------------------------------------


def test_metadata_is_stored_and_returned_by_search_and_list_memories(ns: Database) -> None:
    tags = {"category": "preference", "source": "crm", "score": 3, "nested": {"a": [1, 2]}}
    tagged = _remember(ns, "Alice prefers window seats", metadata=json.dumps(tags))
    plain = _remember(ns, "Alice flies to Oslo in May")
    found = ns.sql(
        "SELECT id::text, metadata FROM aidb_memory.search(%s, 'alice', 'window seats')",
        (NS,),
        user=APP_USER,
    )
    assert found[0] == (tagged, tags)
    listed = dict(
        ns.sql(
            "SELECT id::text, metadata FROM aidb_memory.list_memories(%s, 'alice')",
            (NS,),
            user=APP_USER,
        )
    )
    assert listed == {tagged: tags, plain: {}}  # without metadata: the empty object


def test_an_exact_duplicate_keeps_the_metadata_it_has(ns: Database) -> None:
    first = _remember(ns, "Alice lives in Lyon", metadata='{"source": "crm"}')
    assert _remember(ns, "alice lives in lyon", metadata='{"source": "chat"}') == first
    assert ns.value("SELECT metadata FROM aidb_memory.memory") == {"source": "crm"}


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ('["a"]', "aidb_memory.remember: metadata must be a JSON object"),
        ('"tag"', "aidb_memory.remember: metadata must be a JSON object"),
        (
            json.dumps({"a": [[[[[[[["deep"]]]]]]]]}),
            "aidb_memory.remember: metadata.a[0] is nested deeper than 8 levels",
        ),
        (
            json.dumps({"note": "x" * 4000}),
            "aidb_memory.remember: metadata has 4012 characters of JSON, more than the namespace "
            "limit of 4000",
        ),
    ],
)
def test_bad_metadata_is_refused_and_nothing_is_stored(
    ns: Database, metadata: str, message: str
) -> None:
    error = _fails(
        ns,
        "SELECT aidb_memory.remember(%s, 'alice', 'Alice likes jazz', metadata => %s::jsonb)",
        (NS, metadata),
    )
    assert (error.sqlstate, error.diag.message_primary) == ("22023", message)
    assert ns.value("SELECT count(*) FROM aidb_memory.memory") == 0


def test_the_metadata_cap_is_the_namespaces_below_and_above_64_kb(ns: Database) -> None:
    ns.sql(
        "SELECT aidb_memory.namespace_update(%s, config => "
        "'{\"memory_metadata_max_chars\": 100000}')",
        (NS,),
    )
    big = json.dumps({"note": "z" * 90_000})  # over 64 kB: checked before the server's Python
    _remember(ns, "Alice keeps long notes", metadata=big)
    ns.sql(
        "SELECT aidb_memory.namespace_update(%s, config => '{\"memory_metadata_max_chars\": 50}')",
        (NS,),
    )
    small = json.dumps({"note": "z" * 60})
    # Far over the cap, the value's JSON text is never made: "at least" what its size implies.
    for text, count in ((big, "at least 17991"), (small, str(len(small)))):
        error = _fails(
            ns,
            "SELECT aidb_memory.remember(%s, 'alice', 'Alice keeps notes', metadata => %s::jsonb)",
            (NS, text),
        )
        assert error.diag.message_primary == (
            f"aidb_memory.remember: metadata has {count} characters of JSON, more than the "
            "namespace limit of 50"
        )
        assert error.diag.message_hint == (
            "keep the memory's tags small, or an admin raises config.memory_metadata_max_chars"
        )
    assert ns.value("SELECT count(*) FROM aidb_memory.memory") == 1
