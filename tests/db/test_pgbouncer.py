"""Behind PgBouncer in transaction pooling mode (issue 10 item 12; docs/operations.md "Connection
poolers").

PgBouncer (Debian's package, tests/deployments.py) runs on loopback in front of the test server
with two server connections per database and user; several clients (threads), each with its own
connection to PgBouncer, run the whole session API and the memory API at once. Each statement also
returns ``pg_backend_pid()``: the clients share at most two backends, so consecutive transactions
of one client run in different backends, after other clients' transactions, and every result is
still exactly that client's.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from aidb_memory.throwaway import ThrowawayServer
from conftest import APP_USER, Database, run_cli
from deployments import PgBouncer, pgbouncer_for
from fake_openai import Reply, serve

NS = "pooled"
CLIENTS = 6
POOL_SIZE = 2
ROUNDS = 4
RESULT_S = 240  # guard: a client that hangs fails the test instead of hanging the suite


@pytest.fixture(scope="module")
def bouncer(pg_server: ThrowawayServer) -> Iterator[PgBouncer]:
    with pgbouncer_for(pg_server, [APP_USER, "postgres"], pool_size=POOL_SIZE) as running:
        yield running


@pytest.fixture
def ns(db: Database) -> Database:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    return db


class Client:
    """One application connection through PgBouncer; remembers the backends it was served by."""

    def __init__(self, bouncer: PgBouncer, db: Database) -> None:
        self.conn = bouncer.connect(db.name, APP_USER, autocommit=True)
        self.backends: set[int] = set()

    def rows(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Run ``query`` (its columns, then the backend's pid as the last one)."""
        rows = self.conn.execute(
            f"SELECT q.*, pg_catalog.pg_backend_pid() FROM ({query}) q", {"ns": NS, **params}
        ).fetchall()
        self.backends.update(row[-1] for row in rows)
        return [row[:-1] for row in rows]

    def one(self, query: str, params: dict[str, Any]) -> Any:
        (row,) = self.rows(query, params)
        return row[0] if len(row) == 1 else row

    def close(self) -> None:
        self.conn.close()


def _run_clients(
    bouncer: PgBouncer, db: Database, work: Callable[[Client, int, threading.Barrier], None]
) -> set[int]:
    """Run ``work`` in CLIENTS threads at once; returns every backend pid that served them."""
    start = threading.Barrier(CLIENTS, timeout=RESULT_S)

    def one(i: int) -> set[int]:
        client = Client(bouncer, db)
        try:
            work(client, i, start)
            return client.backends
        finally:
            client.close()

    with ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(one, i) for i in range(CLIENTS)]
        backends: set[int] = set()
        for future in futures:
            backends |= future.result(timeout=RESULT_S)
    return backends


def _turns(i: int, r: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"client {i} asks question {r}"},
        {"role": "assistant", "content": f"client {i} gets answer {r}"},
    ]


def _session_client(client: Client, i: int, start: threading.Barrier) -> None:
    # Three actors, two clients each, every client with its own session: a mix-up of actors or
    # of sessions would show as a foreign turn.
    who = {"actor": f"user{i % 3}", "sid": f"conv-{i}", "agent": f"agent-{i}"}
    start.wait()
    started = client.one(
        "SELECT session_id, closed_at FROM aidb_memory.session_start("
        "%(ns)s, %(actor)s, %(agent)s, %(sid)s)",
        who,
    )
    assert started == (who["sid"], None)
    expected: list[str] = []
    for r in range(1, ROUNDS + 1):
        turns = _turns(i, r)
        event = client.one(
            "SELECT aidb_memory.add(%(ns)s, %(actor)s, %(turns)s::jsonb, %(sid)s, %(agent)s, "
            "%(key)s)",
            {**who, "turns": json.dumps(turns), "key": f"key-{i}-{r}"},
        )
        again = client.one(  # a retry after a lost reply: the same event, nothing written
            "SELECT aidb_memory.add(%(ns)s, %(actor)s, %(turns)s::jsonb, %(sid)s, %(agent)s, "
            "%(key)s)",
            {**who, "turns": json.dumps(turns), "key": f"key-{i}-{r}"},
        )
        assert again == event
        expected += [t["content"] for t in turns]
        items = client.one(
            "SELECT items FROM aidb_memory.session_get(%(ns)s, %(actor)s, %(sid)s)", who
        )
        assert [item["content"] for item in items] == expected
        assert [item["seq"] for item in items] == list(range(1, len(expected) + 1))
    messages = client.one(
        "SELECT aidb_memory.session_messages(%(ns)s, %(actor)s, %(sid)s) AS m", who
    )
    assert [m["content"] for m in messages] == expected
    popped = client.one("SELECT aidb_memory.session_pop(%(ns)s, %(actor)s, %(sid)s) AS p", who)
    assert popped["content"] == expected.pop()
    items = client.one(
        "SELECT items FROM aidb_memory.session_get(%(ns)s, %(actor)s, %(sid)s, 10000)", who
    )
    assert [item["content"] for item in items] == expected
    listed = client.rows(
        "SELECT session_id, agent_id, turn_count FROM aidb_memory.session_list("
        "%(ns)s, %(actor)s, %(agent)s)",
        who,
    )
    assert listed == [(who["sid"], who["agent"], len(expected))]
    handoff, closed_at = client.one(
        "SELECT handoff, closed_at FROM aidb_memory.session_end("
        "%(ns)s, %(actor)s, %(sid)s, %(notes)s)",
        {**who, "notes": f"notes of client {i}"},
    )
    assert closed_at is not None
    assert handoff["notes"] == f"notes of client {i}"
    assert handoff["turn_count"] == len(expected)
    assert handoff["last_user_prompt"] == f"client {i} asks question {ROUNDS}"
    deleted = client.one(
        "SELECT aidb_memory.session_delete(%(ns)s, %(actor)s, %(sid)s, 'test') AS n", who
    )
    assert deleted == len(expected)
    assert (
        client.rows("SELECT * FROM aidb_memory.session_list(%(ns)s, %(actor)s, %(agent)s)", who)
        == []
    )


def test_the_session_api_through_pgbouncer_with_clients_sharing_two_connections(
    ns: Database, bouncer: PgBouncer
) -> None:
    backends = _run_clients(bouncer, ns, _session_client)
    assert 1 <= len(backends) <= POOL_SIZE < CLIENTS
    assert ns.value("SELECT count(*) FROM aidb_memory.session") == 0
    events = ns.value("SELECT count(*) FROM aidb_memory.event")
    assert events == CLIENTS * ROUNDS  # one per add: the retries wrote nothing


FACTS = ["likes {colour} tea", "lives in {city}", "has a cat called {cat}"]
WORDS = [
    {"colour": "green", "city": "Lisbon", "cat": "Miso"},
    {"colour": "black", "city": "Porto", "cat": "Tofu"},
    {"colour": "white", "city": "Braga", "cat": "Nori"},
    {"colour": "yellow", "city": "Faro", "cat": "Yuzu"},
    {"colour": "purple", "city": "Evora", "cat": "Kiwi"},
    {"colour": "orange", "city": "Coimbra", "cat": "Soba"},
]


def _memories(db: Database) -> dict[int, dict[str, str]]:
    """Each client's actor gets three memories (inserted as the worker would): content -> id."""
    out: dict[int, dict[str, str]] = {}
    for i in range(CLIENTS):
        out[i] = {}
        for fact in FACTS:
            content = f"Actor {i} " + fact.format(**WORDS[i])
            out[i][content] = str(
                db.value(
                    """INSERT INTO aidb_memory.memory
                           (actor_key, namespace_id, actor_id, content, content_hash, lexemes)
                       VALUES (aidb_memory.actor_key(%s, %s),
                               (SELECT id FROM aidb_memory.namespace WHERE name = %s), %s, %s,
                               md5(%s), to_tsvector('english', %s))
                       RETURNING public_id::text""",
                    (NS, f"mem{i}", NS, f"mem{i}", content, content, content),
                )
            )
    return out


def test_the_memory_api_through_pgbouncer_with_clients_sharing_two_connections(
    ns: Database, bouncer: PgBouncer
) -> None:
    memories = _memories(ns)

    def work(client: Client, i: int, start: threading.Barrier) -> None:
        mine = memories[i]
        who = {"actor": f"mem{i}"}
        start.wait()
        found = client.rows(
            "SELECT id::text, content FROM aidb_memory.search(%(ns)s, %(actor)s, %(q)s)",
            {**who, "q": f"cat called {WORDS[i]['cat']}"},
        )
        assert found[0][1] == f"Actor {i} has a cat called {WORDS[i]['cat']}"
        assert all(mine.get(content) == public_id for public_id, content in found)
        listed = client.rows(
            "SELECT id::text, content FROM aidb_memory.list_memories(%(ns)s, %(actor)s)", who
        )
        assert sorted(listed) == sorted((public_id, c) for c, public_id in mine.items())
        first = next(iter(mine.values()))
        deleted = client.one(
            "SELECT aidb_memory.delete(%(ns)s, %(actor)s, %(sel)s::jsonb, 'test') AS n",
            {**who, "sel": json.dumps({"ids": [first]})},
        )
        assert deleted == 1
        left = client.rows("SELECT id::text FROM aidb_memory.list_memories(%(ns)s, %(actor)s)", who)
        assert sorted(left) == sorted((p,) for p in mine.values() if p != first)
        counts = client.one("SELECT aidb_memory.forget(%(ns)s, %(actor)s, 'test') AS c", who)
        assert isinstance(counts, dict)
        assert client.rows("SELECT * FROM aidb_memory.list_memories(%(ns)s, %(actor)s)", who) == []

    backends = _run_clients(bouncer, ns, work)
    assert 1 <= len(backends) <= POOL_SIZE < CLIENTS
    assert ns.value("SELECT count(*) FROM aidb_memory.memory") == 0


def test_a_compacting_read_through_pgbouncer(ns: Database, bouncer: PgBouncer) -> None:
    """Compaction's locks (a row of compaction_lock) and its summary live in the read's own
    transaction: nothing of it needs the session, so a pooled connection compacts as well."""
    with serve() as fake:
        opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
        ns.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
        ns.sql('SELECT aidb_memory.namespace_update(%s, \'{"llm": "chat"}\'::jsonb)', (NS,))
        client = Client(bouncer, ns)
        try:
            for r in range(1, 11):  # 20 turns of 100 chars
                turns = [
                    {"role": "user", "content": f"question {r:04d} ".ljust(100, "q")},
                    {"role": "assistant", "content": f"answer {r:04d} ".ljust(100, "a")},
                ]
                client.one(
                    "SELECT aidb_memory.add(%(ns)s, 'alice', %(turns)s::jsonb, 's') AS e",
                    {"turns": json.dumps(turns)},
                )
            fake.queue(Reply(content="S" * 200))
            items, compacted, warnings = client.one(
                "SELECT items, compacted_entries, warnings "
                "FROM aidb_memory.session_get(%(ns)s, 'alice', 's', 1000)",
                {},
            )
        finally:
            client.close()
        assert len(fake.calls()) == 1
    assert warnings == []
    assert (items[0]["kind"], items[0]["content"], compacted) == ("summary", "S" * 200, 15)
    assert [item["seq"] for item in items[1:]] == [16, 17, 18, 19, 20]


def test_the_cli_refuses_to_go_through_pgbouncer_rather_than_lose_its_pinned_search_path(
    bouncer: PgBouncer, template_db: Database
) -> None:
    """The CLI pins search_path with the ``options`` startup parameter, which PgBouncer 1.18
    refuses: the CLI (install, verify, the worker) must connect to PostgreSQL directly, and says
    why it cannot connect instead of running unpinned."""
    result = run_cli("status", dsn=bouncer.dsn("postgres", "postgres"))
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("aidb-memory: cannot connect")
    assert line.endswith("unsupported startup parameter: options"), line
