"""Reading from a streaming replica (issue 10 item 8; docs/operations.md "Reading from replicas").

A small primary of its own (a throwaway server, aidb_memory installed, not the shared test server,
whose many databases would make the base backup slow) and a hot standby made from it with
``pg_basebackup -R`` (tests/deployments.py). The primary is written as the application and, for
memories, directly as the superuser (what the extraction worker writes); the standby is read as
the application after it has replayed everything the primary wrote.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from aidb_memory.install.installer import Package, install
from aidb_memory.throwaway import ThrowawayServer
from conftest import APP_USER, Database
from deployments import Standby, replication_primary, standby_of
from fake_openai import FakeOpenAI, Reply, serve

NS = "replicated"
EMBEDDED = "embedded"  # a namespace whose search embeds the query: a model call on every search
FACTS = ["Alice prefers green tea over coffee", "Alice lives in Lisbon near the river"]


@dataclass
class Replicated:
    primary: Database
    standby: Standby
    fake: FakeOpenAI
    memories: dict[str, str]  # content -> public id
    embedded: dict[str, str]  # content -> public id, in namespace EMBEDDED

    def standby_connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.standby.dsn(self.primary.name, APP_USER), autocommit=True)


def _exchange(i: int, size: int = 100) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"question {i:04d} ".ljust(size, "q")},
        {"role": "assistant", "content": f"answer {i:04d} ".ljust(size, "a")},
    ]


def _write(db: Database, fake: FakeOpenAI) -> dict[str, str]:
    """What the primary holds: session 'short' (one exchange, closed), session 'long' (20 turns
    of 100 chars: a read with a budget of 1,000 needs compaction) and two memories."""
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\'::jsonb)', (NS,))
    with db.connect(APP_USER) as app:
        app.execute("SELECT * FROM aidb_memory.session_start(%s, 'alice', NULL, 'short')", (NS,))
        app.execute(
            "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 'short')",
            (NS, json.dumps(_exchange(1))),
        )
        app.execute("SELECT * FROM aidb_memory.session_end(%s, 'alice', 'short', 'done')", (NS,))
        for i in range(1, 11):
            app.execute(
                "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 'long')",
                (NS, json.dumps(_exchange(i))),
            )
    memories = {}
    for content in FACTS:
        memories[content] = str(
            db.value(
                """INSERT INTO aidb_memory.memory
                       (actor_key, namespace_id, actor_id, session_id, content, content_hash,
                        lexemes)
                   VALUES (aidb_memory.actor_key(%s, 'alice'),
                           (SELECT id FROM aidb_memory.namespace WHERE name = %s), 'alice',
                           'short', %s, md5(%s), to_tsvector('english', %s))
                   RETURNING public_id::text""",
                (NS, NS, content, content, content),
            )
        )
    return memories


def _write_embedded(db: Database, fake: FakeOpenAI) -> dict[str, str]:
    """Namespace EMBEDDED: an embedding model and three memories embedded with it."""
    opts = {"model": "fake-embedding", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('emb', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"embedding": "emb"}\'::jsonb)', (EMBEDDED,))
    facts = {
        "The customer owns a dog named Rex": [1.0, 0.0, 0.0],
        "Invoice 4411 was paid in March": [0.0, 1.0, 0.0],
        "Prefers e-mail to phone calls": [0.0, 0.2, 1.0],
    }
    return {
        content: str(
            db.value(
                """INSERT INTO aidb_memory.memory
                       (actor_key, namespace_id, actor_id, content, content_hash, embedding,
                        embedding_model, lexemes)
                   VALUES (aidb_memory.actor_key(%s, 'alice'),
                           (SELECT id FROM aidb_memory.namespace WHERE name = %s), 'alice',
                           %s, md5(%s), %s::real[], 'emb', to_tsvector('english', %s))
                   RETURNING public_id::text""",
                (EMBEDDED, EMBEDDED, content, content, vector, content),
            )
        )
        for content, vector in facts.items()
    }


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with serve() as server:
        yield server


@pytest.fixture(scope="module")
def replicated(template_db: Database, server_pylib: Path, fake: FakeOpenAI) -> Iterator[Replicated]:
    """The primary written once, and its standby caught up (``template_db`` has built the
    server's Python packages in ``server_pylib``; the primary uses the same directory)."""
    server: ThrowawayServer = replication_primary()
    try:
        with psycopg.connect(server.dsn(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE primary_db")
        primary = Database(server, "primary_db")
        with primary.connect(autocommit=False) as conn:
            install(conn, Package.load(), say=lambda _line: None)
            conn.execute(
                "INSERT INTO aidb_memory.runtime_settings (key, value) "
                "VALUES ('server_pythonpath', %s)",
                (str(server_pylib),),
            )
            conn.commit()
            conn.execute(f"CREATE ROLE {APP_USER} LOGIN IN ROLE aidb_users")
            conn.commit()
        memories = _write(primary, fake)
        embedded = _write_embedded(primary, fake)
        with standby_of(server) as standby:
            standby.catch_up()
            yield Replicated(primary, standby, fake, memories, embedded)
    finally:
        server.stop()


def _rows(conn: psycopg.Connection[Any], query: str) -> list[tuple[Any, ...]]:
    return conn.execute(query, {"ns": NS}).fetchall()


WRITES = {
    "add": "SELECT aidb_memory.add(%(ns)s, 'alice', %(turns)s::jsonb, 'long')",
    "session_start": "SELECT * FROM aidb_memory.session_start(%(ns)s, 'alice', NULL, 'new')",
    "session_end": "SELECT * FROM aidb_memory.session_end(%(ns)s, 'alice', 'long')",
    "session_pop": "SELECT aidb_memory.session_pop(%(ns)s, 'alice', 'long')",
    "session_delete": "SELECT aidb_memory.session_delete(%(ns)s, 'alice', 'long', 'test')",
    "delete": "SELECT aidb_memory.delete(%(ns)s, 'alice', '{\"all\": true}', 'test')",
    "forget": "SELECT aidb_memory.forget(%(ns)s, 'alice', 'test')",
    "remember": "SELECT aidb_memory.remember(%(ns)s, 'alice', 'Alice is on the standby')",
}


@pytest.mark.parametrize("name", sorted(WRITES))
def test_writes_on_the_standby_fail_with_25006(replicated: Replicated, name: str) -> None:
    """What docs/operations.md says does not work on a standby: every write (session_start of a
    new session included)."""
    with replicated.standby_connect() as conn:
        assert conn.execute("SELECT pg_catalog.pg_is_in_recovery()").fetchone() == (True,)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute(WRITES[name], {"ns": NS, "turns": json.dumps(_exchange(11))})


def test_session_reads_on_the_standby_return_what_the_primary_wrote(
    replicated: Replicated,
) -> None:
    queries = [
        "SELECT items, overflow_chars, compacted_entries, warnings "
        "FROM aidb_memory.session_get(%(ns)s, 'alice', %(session)s)",
        "SELECT aidb_memory.session_messages(%(ns)s, 'alice', %(session)s)",
    ]
    results = {}
    connects: list[tuple[str, Callable[[], psycopg.Connection[Any]]]] = [
        ("primary", lambda: replicated.primary.connect(APP_USER)),
        ("standby", replicated.standby_connect),
    ]
    for where, connect in connects:
        with connect() as conn:
            results[where] = [
                conn.execute(query, {"ns": NS, "session": session}).fetchall()
                for query in queries
                for session in ("long", "short")
            ]
    assert results["standby"] == results["primary"]
    [(items, overflow, compacted, warnings)], [short], [(messages,)], [(short_messages,)] = results[
        "standby"
    ]
    assert len(items) == 20 and (overflow, compacted, warnings) == (0, 0, [])
    assert items[-1]["content"].startswith("answer 0010")
    assert len(short[0]) == 2
    assert [m["role"] for m in messages] == ["user", "assistant"] * 10
    assert messages[0]["content"] == items[0]["content"]
    assert len(short_messages) == 2
    with replicated.standby_connect() as conn:
        sessions = _rows(
            conn,
            "SELECT session_id, closed_at IS NOT NULL, turn_count, total_chars "
            "FROM aidb_memory.session_list(%(ns)s, 'alice') ORDER BY session_id",
        )
        resumed = _rows(
            conn,
            "SELECT session_id, closed_at IS NOT NULL, prev_handoff "
            "FROM aidb_memory.session_start(%(ns)s, 'alice', NULL, 'short')",
        )
    assert resumed == [("short", True, None)]  # an existing session: session_start only reads
    assert sessions == [("long", False, 20, 2000), ("short", True, 2, 200)]


def test_a_budgeted_read_that_fits_works_on_the_standby(replicated: Replicated) -> None:
    """A budget the session fits in needs no compaction: the read is an ordinary read."""
    with replicated.standby_connect() as conn:
        row = conn.execute(
            "SELECT items, overflow_chars, warnings "
            "FROM aidb_memory.session_get(%s, 'alice', 'long', limit_chars => 5000)",
            (NS,),
        ).fetchone()
    assert row is not None
    assert (len(row[0]), row[1], row[2]) == (20, 0, [])


def test_memory_reads_on_the_standby_return_what_the_primary_wrote(
    replicated: Replicated,
) -> None:
    with replicated.standby_connect() as conn:
        found = _rows(
            conn,
            "SELECT id::text, content FROM aidb_memory.search(%(ns)s, 'alice', 'Lisbon river')",
        )
        listed = _rows(
            conn,
            "SELECT id::text, content, session_id "
            "FROM aidb_memory.list_memories(%(ns)s, 'alice') ORDER BY content",
        )
        nobody = _rows(conn, "SELECT * FROM aidb_memory.list_memories(%(ns)s, 'bob')")
    lisbon = "Alice lives in Lisbon near the river"
    assert found[0] == (replicated.memories[lisbon], lisbon)
    assert listed == sorted(
        ((public_id, content, "short") for content, public_id in replicated.memories.items()),
        key=lambda row: row[1],
    )
    assert nobody == []


def test_a_search_that_embeds_its_query_works_on_the_standby(replicated: Replicated) -> None:
    """The query's embedding is a model call whose result needs no storing: it is made, and its
    usage row, which a standby cannot write, is left out (it used to fail the search with 25006
    after the call was paid for)."""
    before = len(replicated.fake.calls("/embeddings"))
    replicated.fake.queue(Reply(embedding=[0.9, 0.1, 0.0]))
    with replicated.standby_connect() as conn:
        found = conn.execute(
            "SELECT id::text, content FROM aidb_memory.search(%s, 'alice', 'pets')", (EMBEDDED,)
        ).fetchall()
    assert len(replicated.fake.calls("/embeddings")) == before + 1
    dog = "The customer owns a dog named Rex"
    assert found[0] == (replicated.embedded[dog], dog)  # the vector signal alone finds it


def test_a_search_that_embeds_its_query_works_in_a_read_only_transaction(
    replicated: Replicated,
) -> None:
    """The same on the primary in a READ ONLY transaction (what a router sending reads to
    read-only connections gives): the search works; its usage row is not written."""
    replicated.fake.queue(Reply(embedding=[0.0, 0.9, 0.1]))
    usage = "SELECT count(*) FROM aidb_memory.model_usage WHERE purpose = 'embedding'"
    before = replicated.primary.value(usage)
    with replicated.primary.connect(APP_USER, autocommit=False) as conn:
        conn.execute("SET TRANSACTION READ ONLY")
        found = conn.execute(
            "SELECT id::text, content FROM aidb_memory.search(%s, 'alice', 'payments')",
            (EMBEDDED,),
        ).fetchall()
        conn.rollback()
    invoice = "Invoice 4411 was paid in March"
    assert found[0] == (replicated.embedded[invoice], invoice)
    assert replicated.primary.value(usage) == before


def test_a_read_that_needs_compaction_on_the_standby_calls_no_model(
    replicated: Replicated,
) -> None:
    """A summary made on a standby could not be stored: no model call is made (it would be paid
    for on every read), and the read says why it did not compact. (The warning comes with engineer
    i3's read-only check in compactor.py, issue 10 item 8.)"""
    replicated.fake.queue(Reply(content="S" * 200))
    before = len(replicated.fake.calls())
    with replicated.standby_connect() as conn:
        row = conn.execute(
            "SELECT items, overflow_chars, compacted_entries, warnings "
            "FROM aidb_memory.session_get(%s, 'alice', 'long', limit_chars => 1000)",
            (NS,),
        ).fetchone()
    assert row is not None
    items, overflow, compacted, warnings = row
    assert len(replicated.fake.calls()) == before, "a model call whose summary cannot be stored"
    assert warnings == ["compaction_read_only"]
    assert [item["seq"] for item in items] == list(range(11, 21))
    assert (overflow, compacted) == (1000, 0)
