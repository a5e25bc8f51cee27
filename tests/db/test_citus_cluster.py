"""aidb_memory on a real Citus cluster (issue 25): a coordinator and two workers on loopback
(tests/deployments.py), one cluster for the module.

``install --citus`` and its re-run (what an upgrade runs), an upgrade from the previous release
with data, every function a role may execute called through the coordinator as that role with
the same expectations as on one server, the worker, and what each hot call sends to the workers:
the shards of one shard index, never more.

Without the citus extension (../shared/citus/build.sh installs it) every test here is skipped,
with that reason in the summary.
"""

from __future__ import annotations

import json
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from test_upgrade_releases import LAST_RELEASE_BEFORE_ISSUE_23, _git, _install_release

from aidb_memory.install import citus
from aidb_memory.ops.worker import key_ranges
from aidb_memory.throwaway import ThrowawayServer
from conftest import (
    ADMIN_USER,
    APP_USER,
    WORKER_USER,
    Database,
    SqlDatabase,
    pending_events,
    run_cli,
)
from deployments import CitusCluster, citus_available, citus_cluster
from fake_openai import FakeOpenAI, Reply, serve

DB = "citus_app"
NS = "cns"
SKIP_REASON = "the citus extension is not installed here (run ../shared/citus/build.sh as root)"


class Node(SqlDatabase):
    """One database of the cluster, reached through the coordinator."""

    def __init__(self, cluster: CitusCluster, name: str) -> None:
        self.cluster = cluster
        self.name = name

    def dsn(self, user: str = "postgres") -> str:
        return self.cluster.dsn(self.name, user)


@pytest.fixture(scope="module")
def cluster(pg_server: ThrowawayServer) -> Iterator[CitusCluster]:
    if not citus_available(pg_server):
        pytest.skip(SKIP_REASON)
    with citus_cluster() as started:
        yield started


def _install(node: Node) -> None:
    result = run_cli("install", "--citus", dsn=node.dsn())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "citus: " in result.stdout


def _verify(node: Node) -> None:
    result = run_cli("verify", dsn=node.dsn())
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def node(cluster: CitusCluster, server_pylib: Path, template_db: Database) -> Node:
    """The database of the module: aidb_memory installed with ``install --citus``, the login
    roles of the suite (Citus creates them on the workers too), the server's packages (which
    ``deps`` puts in ``server_pylib`` for the template: the model calls need them)."""
    cluster.create_database(DB)
    db = Node(cluster, DB)
    _install(db)
    with db.connect() as conn:
        for user, group in (
            (APP_USER, "aidb_users"),
            (ADMIN_USER, "aidb_admins"),
            (WORKER_USER, "aidb_workers"),
        ):
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (user,)).fetchone()
            if not exists:
                conn.execute(f"CREATE ROLE {user} LOGIN IN ROLE {group}")
        # What `deps` recorded for the suite's server (one host: the same directory serves).
        conn.execute(
            "INSERT INTO aidb_memory.runtime_settings (key, value) "
            "VALUES ('server_pythonpath', %s)",
            (str(server_pylib),),
        )
    return db


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with serve() as server:
        yield server


# --- install ----------------------------------------------------------------------------------


def test_install_citus_distributes_every_table_and_verify_is_clean(node: Node) -> None:
    with node.connect() as conn:
        done = citus.distributed(conn)
    want = {
        s.table: citus._wanted(s)  # the kinds install --citus asks for
        for s in citus.statements()
    }
    assert done == want
    # One co-location group for every per-actor table.
    groups = node.sql(
        "SELECT DISTINCT colocationid FROM pg_dist_partition "
        "WHERE logicalrelid::regclass::text = ANY(%s)",
        ([f"aidb_memory.{t}" for t in citus.PER_ACTOR_TABLES],),
    )
    assert len(groups) == 1
    _verify(node)
    again = run_cli("install", "--citus", dsn=node.dsn())
    assert again.returncode == 0, again.stderr
    assert "citus: every table is distributed already" in again.stdout
    _verify(node)


def test_no_statement_of_a_call_is_compiled_by_jit(node: Node) -> None:
    """Citus costs a statement over distributed tables far above jit_above_cost, and with JIT on
    (PostgreSQL's default) the statements of every add were compiled by LLVM on each call, ~110
    ms of it (issue 37). install --citus runs our functions with jit = off: with JIT forced on for
    the session, no statement run inside an add or a session_get through the coordinator is
    compiled (pg_stat_statements' jit_functions), while the client's own statement is."""
    ns = "no_jit"
    node.sql("SELECT aidb_memory.init(%s)", (ns,))
    calls = [
        f"SELECT aidb_memory.add('{ns}', 'alice', '{_turns('I like tea.')}'::jsonb, 's')",
        f"SELECT * FROM aidb_memory.session_get('{ns}', 'alice', 's', 2000)",
    ]
    with node.connect() as conn:  # pg_stat_statements.track: a superuser's
        assert conn.execute("SELECT pg_catalog.pg_jit_available()").fetchone() == (True,)
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        for call in calls:  # the namespace and the session known
            conn.execute(call)
        conn.execute("SELECT pg_stat_statements_reset()")
        for setting in ("pg_stat_statements.track = 'all'", "jit = on", "jit_above_cost = 0"):
            conn.execute(f"SET {setting}")
        for call in calls:
            conn.execute(call)
        rows = conn.execute(
            "SELECT toplevel, query, jit_functions FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND query NOT LIKE 'SET %' AND query NOT LIKE '%pg_stat_statements%'"
        ).fetchall()
    own = [r for r in rows if r[0]]
    nested = [r for r in rows if not r[0]]
    assert len(own) == len(calls) and all(r[2] > 0 for r in own), own
    assert len(nested) > 2, rows
    assert [r for r in nested if r[2] > 0] == []


def test_upgrade_from_the_previous_release_with_data_then_install_citus(
    cluster: CitusCluster, tmp_path: Path
) -> None:
    name = "citus_upgrade"
    cluster.create_database(name)
    db = Node(cluster, name)
    tree = tmp_path / "release"
    _git("worktree", "add", "--detach", str(tree), LAST_RELEASE_BEFORE_ISSUE_23)
    try:
        _install_release(db, tree)
        db.sql("SELECT aidb_memory.init('up')")
        for actor in ("alice", "bob"):
            db.sql(
                "SELECT aidb_memory.add('up', %s, %s::jsonb, 's1')",
                (actor, json.dumps([{"role": "user", "content": f"I am {actor}"}])),
            )
        _install(db)  # the upgrade, then the tables distributed with their rows
        _verify(db)
        _install(db)
        _verify(db)
        with db.connect() as conn:
            assert set(citus.distributed(conn)) == {s.table for s in citus.statements()}
        assert db.value("SELECT count(*) FROM aidb_memory.turn") == 2
        db.sql(
            "SELECT aidb_memory.add('up', 'alice', %s::jsonb, 's1')",
            (json.dumps([{"role": "assistant", "content": "hello"}]),),
        )
        rows = db.sql("SELECT session_id, turn_count FROM aidb_memory.session_list('up', 'alice')")
        assert rows == [("s1", 2)]
    finally:
        _git("worktree", "remove", "--force", str(tree))
        cluster.drop_database(name)


# --- the API through the coordinator, as the roles that may call it ----------------------------


def _turns(*contents: str) -> str:
    roles = ("user", "assistant")
    return json.dumps([{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)])


@pytest.fixture(scope="module")
def ns(node: Node) -> str:
    """A namespace without a model: extraction is verbatim (the worker stores what the user
    said), no compaction."""
    node.sql("SELECT aidb_memory.init(%s)", (NS,), user=ADMIN_USER)
    return NS


def test_sessions_as_the_application(node: Node, ns: str) -> None:
    actor = "s-alice"

    def app(query: str, *params: Any) -> list[tuple[Any, ...]]:
        return node.sql(query, (ns, actor, *params), user=APP_USER)

    assert app("SELECT session_id FROM aidb_memory.session_start(%s, %s, 'agent', 'a')") == [("a",)]
    first = app("SELECT aidb_memory.add(%s, %s, %s::jsonb, 'a')", _turns("hi", "hello"))[0][0]
    app("SELECT aidb_memory.add(%s, %s, %s::jsonb, 'a')", _turns("where?", "Porto"))
    keyed = app("SELECT aidb_memory.add(%s, %s, %s::jsonb, 'a', NULL, 'k1')", _turns("again"))
    replay = app("SELECT aidb_memory.add(%s, %s, %s::jsonb, 'a', NULL, 'k1')", _turns("again"))
    assert keyed == replay and keyed[0][0] != first
    with pytest.raises(psycopg.errors.UniqueViolation):
        app("SELECT aidb_memory.add(%s, %s, %s::jsonb, 'a', NULL, 'k1')", _turns("other"))
    # Without a session: an event only.
    assert app("SELECT aidb_memory.add(%s, %s, %s::jsonb)", _turns("no session"))[0][0]
    status = app("SELECT aidb_memory.status(%s, %s, %s)", first)[0][0]
    assert status["status"] in ("accepted", "skipped"), status
    listed = app("SELECT session_id, turn_count FROM aidb_memory.session_list(%s, %s)")
    assert listed == [("a", 5)]
    popped = app("SELECT aidb_memory.session_pop(%s, %s, 'a')")[0][0]
    assert (popped["role"], popped["content"], popped["seq"]) == ("user", "again", 5)
    ended = app("SELECT handoff, closed_at FROM aidb_memory.session_end(%s, %s, 'a', 'notes')")
    handoff = ended[0][0]
    assert handoff["notes"] == "notes" and handoff["last_user_prompt"] == "where?"
    assert handoff["turn_count"] == 4 and handoff["closed_at"]
    again = app("SELECT handoff FROM aidb_memory.session_end(%s, %s, 'a', 'other')")
    assert again[0][0] == handoff
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        app("SELECT aidb_memory.add(%s, %s, %s::jsonb, 'a')", _turns("closed"))
    assert app("SELECT aidb_memory.session_delete(%s, %s, 'a', 'test')") == [(4,)]  # turns
    assert app("SELECT * FROM aidb_memory.session_list(%s, %s)") == []


def test_session_reads_as_the_application(node: Node, ns: str) -> None:
    actor = "r-alice"
    for i in range(5):
        node.sql(
            "SELECT aidb_memory.add(%s, %s, %s::jsonb, 'r')",
            (ns, actor, _turns(f"question {i}", f"answer {i}")),
            user=APP_USER,
        )
    items = node.value(
        "SELECT items FROM aidb_memory.session_get(%s, %s, 'r')", (ns, actor), user=APP_USER
    )
    assert [i["content"] for i in items][-2:] == ["question 4", "answer 4"]
    assert len(items) == 10
    window = node.value(
        "SELECT items FROM aidb_memory.session_get(%s, %s, 'r', limit_turns => 4)",
        (ns, actor),
        user=APP_USER,
    )
    assert [i["seq"] for i in window] == [7, 8, 9, 10]
    messages = node.value(
        "SELECT aidb_memory.session_messages(%s, %s, 'r', limit_turns => 2)",
        (ns, actor),
        user=APP_USER,
    )
    assert messages == [
        {"role": "user", "content": "question 4"},
        {"role": "assistant", "content": "answer 4"},
    ]


@pytest.mark.parametrize(
    ("isolation", "repeatable"), [("READ COMMITTED", False), ("REPEATABLE READ", True)]
)
def test_session_reads_keep_a_repeatable_read_callers_snapshot(
    node: Node, ns: str, isolation: str, repeatable: bool
) -> None:
    """install --citus runs the reads without a transaction block on the worker (each statement
    its own snapshot, as under READ COMMITTED); a REPEATABLE READ caller whose transaction starts
    with them still reads one snapshot on the worker, as on one server."""
    actor, session = "rr-alice", f"rr-{uuid.uuid4()}"
    node.sql("SELECT aidb_memory.add(%s, %s, %s::jsonb, %s)", (ns, actor, _turns("one"), session))
    get = "SELECT items FROM aidb_memory.session_get(%s, %s, %s, 2000)"
    messages = "SELECT aidb_memory.session_messages(%s, %s, %s, 2000)"
    with node.connect(user=APP_USER) as reader:
        reader.execute(f"BEGIN ISOLATION LEVEL {isolation}")
        assert len(reader.execute(get, (ns, actor, session)).fetchone()[0]) == 1
        assert len(reader.execute(messages, (ns, actor, session)).fetchone()[0]) == 1
        node.sql(
            "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s)", (ns, actor, _turns("two"), session)
        )
        seen = len(reader.execute(get, (ns, actor, session)).fetchone()[0])
        seen_messages = len(reader.execute(messages, (ns, actor, session)).fetchone()[0])
        reader.execute("COMMIT")
    assert (seen, seen_messages) == ((1, 1) if repeatable else (2, 2))


@pytest.mark.parametrize(
    ("isolation", "repeatable"), [("READ COMMITTED", False), ("REPEATABLE READ", True)]
)
def test_search_keeps_a_repeatable_read_callers_snapshot(
    node: Node, ns: str, isolation: str, repeatable: bool
) -> None:
    """As the session reads (above), search."""
    actor = f"rr-{uuid.uuid4()}"
    remember = "SELECT aidb_memory.remember(%s, %s, %s)"
    search = "SELECT count(*) FROM aidb_memory.search(%s, %s, 'kettle')"
    node.sql(remember, (ns, actor, "the kettle is blue"))
    with node.connect(user=APP_USER) as reader:
        reader.execute(f"BEGIN ISOLATION LEVEL {isolation}")
        assert reader.execute(search, (ns, actor)).fetchone() == (1,)
        node.sql(remember, (ns, actor, "the kettle whistles"))
        seen = reader.execute(search, (ns, actor)).fetchone()
        reader.execute("COMMIT")
    assert seen == ((1,) if repeatable else (2,))


def test_grants_through_the_coordinator(node: Node) -> None:
    """Issue 35 on Citus: the grants are a reference table every node holds; the checks run on
    the coordinator (in statements of their own), so a namespace with grants is refused to
    another role and usable by the granted one, its common calls' fast paths included."""
    ns = "granted"
    other = f"{APP_USER}_other"
    with node.connect() as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (other,)).fetchone():
            conn.execute(f"CREATE ROLE {other} LOGIN IN ROLE aidb_users")
    node.sql("SELECT aidb_memory.init(%s)", (ns,), user=ADMIN_USER)
    node.sql("SELECT aidb_memory.namespace_grant(%s, %s)", (ns, APP_USER), user=ADMIN_USER)
    kinds = dict(
        node.sql(
            "SELECT logicalrelid::regclass::text, partmethod FROM pg_dist_partition "
            "WHERE logicalrelid = 'aidb_memory.namespace_grant'::regclass"
        )
    )
    assert kinds == {"aidb_memory.namespace_grant": "n"}  # a reference table
    for i in range(3):
        node.sql(
            "SELECT aidb_memory.add(%s, 'g-alice', %s::jsonb, 'g')",
            (ns, _turns(f"question {i}", f"answer {i}")),
            user=APP_USER,
        )
    read = "SELECT items FROM aidb_memory.session_get(%s, 'g-alice', 'g', 2000)"
    assert len(node.value(read, (ns,), user=APP_USER)) == 6
    node.sql("SELECT aidb_memory.remember(%s, 'g-bob', 'likes tea')", (ns,), user=APP_USER)
    assert [
        r[0] for r in node.sql("SELECT * FROM aidb_memory.list_actors(%s)", (ns,), user=APP_USER)
    ] == [
        "g-alice",
        "g-bob",
    ]
    for query in (read, "SELECT aidb_memory.add(%s, 'g-alice', '[]', 'g')"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
            node.sql(query, (ns,), user=other)
    node.sql("SELECT aidb_memory.namespace_revoke(%s, %s)", (ns, APP_USER), user=ADMIN_USER)
    assert len(node.value(read, (ns,), user=other)) == 6  # open again


def test_memories_as_the_application(node: Node, ns: str) -> None:
    actor = "m-alice"

    def app(query: str, *params: Any) -> list[tuple[Any, ...]]:
        return node.sql(query, (ns, actor, *params), user=APP_USER)

    tea = app("SELECT aidb_memory.remember(%s, %s, 'I like green tea')")[0][0]
    app("SELECT aidb_memory.remember(%s, %s, 'I live in Porto')")
    listed = app("SELECT id, content FROM aidb_memory.list_memories(%s, %s)")
    assert sorted(c for _i, c in listed) == ["I like green tea", "I live in Porto"]
    assert app(
        "SELECT aidb_memory.delete(%s, %s, %s::jsonb, 'test')", json.dumps({"ids": [str(tea)]})
    ) == [(1,)]
    assert [c for _i, c in app("SELECT id, content FROM aidb_memory.list_memories(%s, %s)")] == [
        "I live in Porto"
    ]
    erased = app("SELECT aidb_memory.forget(%s, %s, 'test')")[0][0]
    assert erased["memories"] == 1
    assert app("SELECT * FROM aidb_memory.list_memories(%s, %s)") == []


def test_expiry_through_the_coordinator(node: Node, ns: str) -> None:
    """An expired memory is gone for the reads at once and the sweep (a query over every shard)
    deletes it, audited."""
    actor = "expiring-alice"
    brief = node.value(
        "SELECT aidb_memory.remember(%s, %s, 'brief tea', ttl_s => 600)", (ns, actor), user=APP_USER
    )
    node.value("SELECT aidb_memory.remember(%s, %s, 'lasting tea')", (ns, actor), user=APP_USER)
    node.sql(
        "UPDATE aidb_memory.memory SET expires_at = now() - interval '1 second' "
        "WHERE public_id = %s",
        (brief,),
    )
    found = node.sql(
        "SELECT content FROM aidb_memory.search(%s, %s, 'tea')", (ns, actor), user=APP_USER
    )
    assert found == [("lasting tea",)]
    assert node.value("SELECT aidb_memory.expire_memories(1000)", user=WORKER_USER) == 1
    assert node.value("SELECT count(*) FROM aidb_memory.memory WHERE public_id = %s", (brief,)) == 0
    assert node.value("SELECT count(*) FROM aidb_memory.audit_log WHERE action = 'expire'") >= 1


def test_search_without_an_embedding_model(node: Node, ns: str) -> None:
    actor = "q-alice"
    node.sql("SELECT aidb_memory.remember(%s, %s, 'I like green tea')", (ns, actor), user=APP_USER)
    node.sql("SELECT aidb_memory.remember(%s, %s, 'I live in Porto')", (ns, actor), user=APP_USER)
    hits = node.sql(
        "SELECT content FROM aidb_memory.search(%s, %s, 'tea')", (ns, actor), user=APP_USER
    )
    assert hits[0] == ("I like green tea",)


def test_search_with_an_embedding_model(node: Node, fake: FakeOpenAI) -> None:
    """The vector signal: the worker embeds what remember stored, and a query whose words no
    memory holds finds them by their vectors (the fake gives every text the same one)."""
    opts = {"model": "fake-embedding", "base_url": fake.base_url, "max_retries": 0}
    admin = {"user": ADMIN_USER}
    node.sql("SELECT aidb_memory.create_model('cemb', 'openai', %s::jsonb)", (json.dumps(opts),),
             **admin)  # fmt: skip
    node.sql("SELECT aidb_memory.init('vec', '{\"embedding\": \"cemb\"}')", **admin)
    for text in ("I like green tea", "I live in Porto"):
        node.sql("SELECT aidb_memory.remember('vec', 'v-alice', %s)", (text,), user=APP_USER)
    result = run_cli("worker", "--once", dsn=node.dsn(WORKER_USER))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        node.value(
            "SELECT count(*) FROM aidb_memory.memory WHERE actor_id = 'v-alice' "
            "AND embedding_model = 'cemb'"
        )
        == 2
    )
    before = len(fake.calls("/embeddings"))
    hits = node.sql(
        "SELECT content FROM aidb_memory.search('vec', 'v-alice', 'beverage')", user=APP_USER
    )
    assert sorted(c for (c,) in hits) == ["I like green tea", "I live in Porto"]
    assert len(fake.calls("/embeddings")) == before + 1, "the query's embedding"


# Compaction (tests/db/test_compaction_ahead.py): turns of 100 chars, a budget of 1,000.
BUDGET = 1000


def _exchange(i: int) -> str:
    return _turns(f"question {i:04d} ".ljust(100, "q"), f"answer {i:04d} ".ljust(100, "a"))


def test_compaction_in_the_read_and_ahead_of_it(node: Node, fake: FakeOpenAI) -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    node.sql("SELECT aidb_memory.create_model('cchat', 'openai', %s::jsonb)", (json.dumps(opts),),
             user=ADMIN_USER)  # fmt: skip
    node.sql(
        "SELECT aidb_memory.init('cmp', '{\"llm\": \"cchat\"}', "
        '\'{"extraction": false, "llm_timeout_s": 5}\')',
        user=ADMIN_USER,
    )

    def add(i: int) -> None:
        node.sql("SELECT aidb_memory.add('cmp', 'c-alice', %s::jsonb, 's')", (_exchange(i),),
                 user=APP_USER)  # fmt: skip

    def get() -> tuple[list[dict[str, Any]], list[str]]:
        rows = node.sql(
            "SELECT items, warnings FROM aidb_memory.session_get('cmp', 'c-alice', 's', %s)",
            (BUDGET,),
            user=APP_USER,
        )
        return rows[0][0], rows[0][1]

    for i in range(1, 11):
        add(i)
    # Over budget: the read compacts, then reads the summary and the newest turns.
    fake.queue(Reply(content="S" * 200))
    items, warnings = get()
    assert warnings == []
    assert [i["kind"] for i in items[:1]] == ["summary"]
    assert items[-1]["content"].startswith("answer 0010")
    # Past the ahead threshold: add queues a task, and the worker writes the next summary.
    add(11)
    add(12)
    tasks = node.sql(
        "SELECT status FROM aidb_memory.event WHERE actor_id = 'c-alice' AND kind = 'compaction'"
    )
    assert tasks == [("accepted",)]
    fake.queue(Reply(content="T" * 150))
    result = run_cli("worker", "--once", dsn=node.dsn(WORKER_USER))
    assert result.returncode == 0, result.stdout + result.stderr
    assert node.sql(
        "SELECT status FROM aidb_memory.event WHERE actor_id = 'c-alice' AND kind = 'compaction'"
    ) == [("processed",)]
    # The next read finds it ready: no model call.
    calls = len(fake.calls())
    items, warnings = get()
    assert warnings == [] and len(fake.calls()) == calls
    assert [i["kind"] for i in items[:2]] == ["summary", "summary"]
    assert [i["seq"] for i in items[2:]] == [23, 24]


def test_administration_as_the_admin(node: Node, fake: FakeOpenAI) -> None:
    def admin(query: str, *params: Any) -> list[tuple[Any, ...]]:
        return node.sql(query, params, user=ADMIN_USER)

    admin("SELECT aidb_memory.set_secret('key', 'sk-1', ARRAY[%s])", fake.base_url)
    admin("SELECT aidb_memory.set_secret('key', 'sk-2')")  # a rotation: endpoints kept
    opts = {"model": "fake-chat", "base_url": fake.base_url, "api_key_secret": "key"}
    model_id = admin(
        "SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", json.dumps(opts)
    )
    again = admin("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", json.dumps(opts))
    assert model_id == again
    fake.queue(Reply(content="OK"))
    checked = admin("SELECT aidb_memory.model_check('chat')")
    assert checked, checked
    ns_id = admin("SELECT aidb_memory.init('admin_ns')")[0][0]
    assert admin("SELECT aidb_memory.init('admin_ns')")[0][0] == ns_id
    updated = admin(
        "SELECT name, state, config->>'max_identifier_chars' FROM "
        "aidb_memory.namespace_update('admin_ns', config => '{\"max_identifier_chars\": 100}')"
    )
    assert updated == [("admin_ns", "ACTIVE", "100")]
    admin("SELECT aidb_memory.namespace_update('admin_ns', state => 'INACTIVE')")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        node.sql(
            "SELECT aidb_memory.add('admin_ns', 'x', %s::jsonb, 's')",
            (_turns("hi"),),
            user=APP_USER,
        )
    admin("SELECT aidb_memory.namespace_update('admin_ns', state => 'ACTIVE')")
    node.sql("SELECT aidb_memory.add('admin_ns', 'x', %s::jsonb, 's')", (_turns("hi"),),
             user=APP_USER)  # fmt: skip
    admin("SELECT aidb_memory.runtime_info()")
    admin("SELECT aidb_memory.catalog_fingerprint()")
    assert admin("SELECT aidb_memory.events_retry('admin_ns')") == [(0,)]
    dropped = admin("SELECT aidb_memory.namespace_drop('admin_ns', 'test')")[0][0]
    assert dropped["sessions"] == 1 and dropped["turns"] == 1
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        admin("SELECT aidb_memory.drop_secret('key')")  # the model still uses it
    admin("SELECT aidb_memory.drop_model('chat')")
    admin("SELECT aidb_memory.drop_secret('key')")
    assert admin("SELECT count(*) FROM aidb_memory.models WHERE name = 'chat'") == [(0,)]


@pytest.mark.parametrize(
    ("view", "user"),
    [
        ("namespaces", APP_USER),
        ("namespaces", WORKER_USER),
        ("sessions", ADMIN_USER),
        ("events", ADMIN_USER),
        ("events", WORKER_USER),
        ("models", ADMIN_USER),
        ("model_calls", ADMIN_USER),
        ("secrets", ADMIN_USER),
    ],
)
def test_the_views_as_the_roles_granted_them(node: Node, ns: str, view: str, user: str) -> None:
    """What a role may read, it reads through the coordinator as on one server."""
    assert node.value(f"SELECT count(*) FROM aidb_memory.{view}", user=user) >= 0


def test_the_worker_once_and_two_workers_by_key_range(node: Node) -> None:
    node.sql("SELECT aidb_memory.init('wk', config => '{\"extraction_mode\": \"verbatim\"}')")
    actors = [f"w{i}" for i in range(8)]
    for actor in actors:
        node.sql(
            "SELECT aidb_memory.add('wk', %s, %s::jsonb, 's')",
            (actor, json.dumps([{"role": "user", "content": f"My name is {actor}."}])),
            user=APP_USER,
        )

    def pending() -> int:
        return int(
            node.value(
                "SELECT count(*) FROM aidb_memory.event e JOIN aidb_memory.namespace n "
                "ON n.id = e.namespace_id WHERE n.name = 'wk' AND e.status = 'accepted'"
            )
        )

    assert pending() == len(actors)
    low, high = key_ranges(2)
    for lo, hi in (low, high):
        result = run_cli("worker", "--once", f"--key-range={lo}:{hi}", dsn=node.dsn(WORKER_USER))
        assert result.returncode == 0, result.stdout + result.stderr
    assert pending() == 0
    memories = node.sql("SELECT actor_id FROM aidb_memory.memory WHERE actor_id LIKE 'w%%'")
    assert sorted(a for (a,) in memories) == actors
    # And the worker without a range, on new events.
    node.sql(
        "SELECT aidb_memory.add('wk', 'w0', %s::jsonb, 's')",
        (json.dumps([{"role": "user", "content": "I also like tea."}]),),
        user=APP_USER,
    )
    result = run_cli("worker", "--once", dsn=node.dsn(WORKER_USER))
    assert result.returncode == 0, result.stdout + result.stderr
    assert pending() == 0


# --- one shard per hot call -------------------------------------------------------------------

SHARD_NAME = re.compile(r"aidb_memory\.(\w+?)_(\d+)\b")


def _shard_indexes(node: Node) -> dict[int, tuple[str, int]]:
    """shardid -> (table, index of the shard in its table's hash range)."""
    rows = node.sql(
        "SELECT c.relname, s.shardid, "
        "row_number() OVER (PARTITION BY s.logicalrelid ORDER BY s.shardminvalue::bigint) "
        "FROM pg_dist_shard s JOIN pg_class c ON c.oid = s.logicalrelid "
        "JOIN pg_dist_partition p ON p.logicalrelid = s.logicalrelid "
        "WHERE c.relnamespace = 'aidb_memory'::regnamespace AND p.partmethod = 'h'"
    )
    return {int(shard): (str(table), int(i)) for table, shard, i in rows}


def _index(node: Node, actor: str) -> int:
    """The index of the shard that holds ``actor``'s rows in every per-actor table."""
    return int(
        node.value(
            "SELECT i FROM (SELECT shardid, row_number() OVER (ORDER BY shardminvalue::bigint) AS i"
            " FROM pg_dist_shard WHERE logicalrelid = 'aidb_memory.session'::regclass) AS s "
            "WHERE shardid = get_shard_id_for_distribution_column('aidb_memory.session', "
            "aidb_memory.actor_key(%s, %s))",
            (NS, actor),
        )
    )


@pytest.fixture(scope="module")
def hot(node: Node, ns: str) -> dict[str, Any]:
    """An actor with a session, turns, memories and an event, for the hot calls."""
    actor = "hot-alice"
    event = node.value(
        "SELECT aidb_memory.add(%s, %s, %s::jsonb, 'h')",
        (ns, actor, _turns(*(f"turn {i}" for i in range(6)))),
        user=APP_USER,
    )
    for i in range(3):
        node.sql(
            "SELECT aidb_memory.remember(%s, %s, %s, metadata => %s)",
            (ns, actor, f"fact {i} tea", json.dumps({"n": i})),
            user=APP_USER,
        )
    memory = node.value(
        "SELECT aidb_memory.remember(%s, %s, 'keyed tea', key => 'k')", (ns, actor), user=APP_USER
    )
    return {"actor": actor, "event": event, "memory": memory, "shards": _shard_indexes(node)}


# Each hot call of one actor; %(session)s is a new session id for every call.
HOT_CALLS: dict[str, str] = {
    "add": "SELECT aidb_memory.add(%(ns)s, %(actor)s, %(turns)s::jsonb, 'h')",
    "add of three turns": "SELECT aidb_memory.add(%(ns)s, %(actor)s, %(three)s::jsonb, 'h')",
    "session_start": "SELECT * FROM aidb_memory.session_start(%(ns)s, %(actor)s, 'agent', 'h')",
    "session_get": "SELECT * FROM aidb_memory.session_get(%(ns)s, %(actor)s, 'h', 2000)",
    "session_messages": "SELECT aidb_memory.session_messages(%(ns)s, %(actor)s, 'h', 2000)",
    "session_end": "SELECT * FROM aidb_memory.session_end(%(ns)s, %(actor)s, %(session)s)",
    "session_pop": "SELECT * FROM aidb_memory.session_pop(%(ns)s, %(actor)s, 'h')",
    "session_list": "SELECT * FROM aidb_memory.session_list(%(ns)s, %(actor)s)",
    "session_delete": "SELECT aidb_memory.session_delete(%(ns)s, %(actor)s, %(session)s, 'test')",
    "search": "SELECT * FROM aidb_memory.search(%(ns)s, %(actor)s, 'tea')",
    "search filtered": "SELECT * FROM aidb_memory.search(%(ns)s, %(actor)s, 'tea', "
    'filter => \'{"n": {"$gte": 1}}\', "offset" => 1)',
    "list_memories": "SELECT * FROM aidb_memory.list_memories(%(ns)s, %(actor)s)",
    "list_memories paged": "SELECT * FROM aidb_memory.list_memories(%(ns)s, %(actor)s, "
    'filter => \'{"n": {"$in": [0, 1]}}\', after => %(memory)s)',
    "remember with a key": "SELECT aidb_memory.remember(%(ns)s, %(actor)s, %(session)s, "
    "key => 'k')",
    "get_memory": "SELECT * FROM aidb_memory.get_memory(%(ns)s, %(actor)s, key => 'k')",
    "get_memory refreshed": "SELECT * FROM aidb_memory.get_memory(%(ns)s, %(actor)s, "
    "key => 'k', refresh_ttl => true)",
    "remember for a while": "SELECT aidb_memory.remember(%(ns)s, %(actor)s, %(session)s, "
    "ttl_s => 600)",
    "update_memory": "SELECT * FROM aidb_memory.update_memory(%(ns)s, %(actor)s, %(memory)s, "
    "metadata => jsonb_build_object('at', %(session)s::text))",
    "memory_history": "SELECT * FROM aidb_memory.memory_history(%(ns)s, %(actor)s, %(memory)s)",
    "delete": "SELECT aidb_memory.delete(%(ns)s, %(actor)s, %(selector)s::jsonb, 'test')",
    "forget": "SELECT aidb_memory.forget(%(ns)s, %(actor)s, 'test')",
    "status": "SELECT aidb_memory.status(%(ns)s, %(actor)s, %(event)s)",
}
# Calls that need rows of their own each time: they write them first (not what is checked...
# except that it is: the write goes to the same shard, and is part of the same check).
NEEDS_SESSION = ("session_end", "session_delete")


def _remote_commands(
    node: Node, call: Callable[[psycopg.Connection[Any]], None]
) -> tuple[list[str], list[str]]:
    """What the second of two ``call``s sends to the workers and runs locally, as Citus logs it
    (the first is the warm-up: plans prepared, the namespace known)."""
    remote: list[str] = []
    local: list[str] = []

    def seen(diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        if text.startswith("issuing "):
            remote.append(text)
        elif text.startswith("executing the command locally: "):
            local.append(text)

    with node.connect(APP_USER) as conn:
        call(conn)
        conn.add_notice_handler(seen)
        conn.execute("SET citus.log_remote_commands = on")
        conn.execute("SET citus.log_local_commands = on")
        call(conn)
    return remote, local


@pytest.mark.parametrize("name", list(HOT_CALLS))
def test_a_hot_call_touches_the_shards_of_one_index(
    node: Node, ns: str, hot: dict[str, Any], name: str
) -> None:
    # forget erases the actor: it gets one of its own.
    actor = f"{hot['actor']}-forgotten" if name == "forget" else hot["actor"]

    def call(conn: psycopg.Connection[Any]) -> None:
        session = f"h-{uuid.uuid4()}"
        params = {
            "ns": ns,
            "actor": actor,
            "event": hot["event"],
            "memory": hot["memory"],
            "session": session,
            "turns": _turns("x"),
            "three": _turns("x", "y", "z"),
            "selector": json.dumps({"ids": [str(uuid.uuid4())]}),
        }
        if name in NEEDS_SESSION or name == "forget":
            conn.execute(
                "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s)", (ns, actor, _turns("bye"), session)
            )
        conn.execute(HOT_CALLS[name], params)

    remote, local = _remote_commands(node, call)
    touched: dict[str, set[int]] = {}
    for command in remote:
        for _table, shard in SHARD_NAME.findall(command):
            found = hot["shards"].get(int(shard))
            if found is not None:  # a shard of a distributed table (not of a reference one)
                touched.setdefault(found[0], set()).add(found[1])
    per_actor = {t: i for t, i in touched.items() if t in citus.PER_ACTOR_TABLES}
    assert per_actor, f"{name} sent nothing to a per-actor shard: {remote}"
    indexes = {i for found in per_actor.values() for i in found}
    assert indexes == {_index(node, actor)}, "\n".join(remote)
    # The logs (model_usage, audit_log) are distributed by id: one shard each at most.
    assert all(len(i) == 1 for t, i in touched.items() if t not in citus.PER_ACTOR_TABLES)
    # Nothing per actor runs on the coordinator, which holds no shard of those tables.
    assert not [c for c in local if any(f"aidb_memory.{t}" in c for t in citus.PER_ACTOR_TABLES)]


# What each hot call of one actor sends to the workers (Citus' "issuing ..." commands, the
# transaction's BEGIN, PREPARE and COMMIT among them) as it stands: issue 37 asks for one round
# trip each (the call delegated to the actor's worker), and until then a change that adds a
# remote command to one of them fails here (bench/README.md, "Through a Citus coordinator").
REMOTE_COMMANDS_AT_MOST = {
    # BEGIN (with the SAVEPOINT of the EXCEPTION block), the session's UPDATE, the event's and
    # the turns' INSERTs, RELEASE, COMMIT: add's writes routed to the actor's shard, committed in
    # one phase (install --citus, sql/31_add_fast.sql; it was 20, with a two-phase commit); an
    # INSERT a turn (one INSERT ... SELECT of them all was one command, but slower:
    # bench/README.md).
    "add": 6,
    "add of three turns": 8,
    # The plan and the read, without a transaction block: it was 5 with BEGIN (and the
    # EXCEPTION block's SAVEPOINT), RELEASE and COMMIT (citus.select_opens_transaction_block).
    "session_get": 2,
    "session_messages": 2,
    "remember with a key": 8,
    # The statements of the words and of the ranking, without a transaction block: it was 8
    # with BEGIN, the SAVEPOINT and RELEASE of each of PL/Python's statements, and COMMIT.
    "search": 2,
}


@pytest.mark.parametrize("name", list(REMOTE_COMMANDS_AT_MOST))
def test_the_remote_commands_of_a_hot_call_do_not_grow(
    node: Node, ns: str, hot: dict[str, Any], name: str
) -> None:
    params = {
        "ns": ns,
        "actor": hot["actor"],
        "session": f"h-{uuid.uuid4()}",
        "turns": _turns("x"),
        "three": _turns("x", "y", "z"),
    }
    remote, _ = _remote_commands(node, lambda conn: conn.execute(HOT_CALLS[name], params))
    assert len(remote) <= REMOTE_COMMANDS_AT_MOST[name], (
        f"{name}: {len(remote)} remote commands\n" + "\n".join(remote)
    )


def test_the_latency_bench_measures_each_hot_call_on_both_sides(node: Node, db: Database) -> None:
    """bench/citus_latency.py's row (q) (issue 37) on this cluster and the suite's server: each
    hot call timed on both, and what it sent to the workers counted. Its figures are make
    bench's to judge (no timing is asserted here); this keeps the script measuring the cluster."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    try:
        import citus_latency
    finally:
        sys.path.pop(0)
    for dsn in (node.dsn(), db.dsn()):
        citus_latency.prepare(dsn, ["bench-alice"])
    found = citus_latency.latency(node.dsn(), db.dsn(), "bench-alice", calls=5)
    assert list(found) == list(citus_latency.HOT)
    for name, row in found.items():
        assert row["citus"]["median_us"] > 0 and row["one_server"]["median_us"] > 0, name
        assert row["median_ratio"] > 0 and row["p90_ratio"] > 0, name
        # Each went through Citus to a worker (the ones tests count are bounded above).
        assert row["remote_commands"] >= 1, name
        if name in REMOTE_COMMANDS_AT_MOST:
            assert row["remote_commands"] <= REMOTE_COMMANDS_AT_MOST[name], name


def test_the_worker_bench_drains_both_namespaces_on_both_sides(
    node: Node, db: Database, fake: FakeOpenAI, server_pylib: Path
) -> None:
    """bench/citus_latency.py's row (s) (issue 37, item 5): the worker's drain of events with
    and without a model, through the coordinator and on the suite's server; each side processes
    every event it queued (its figures are make bench's)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    try:
        import citus_latency
    finally:
        sys.path.pop(0)
    fake.default = lambda _r: Reply(content=citus_latency.FACT)
    for dsn in (node.dsn(), db.dsn()):
        citus_latency.prepare_drain(dsn, fake.base_url, server_pylib)
        for ns in citus_latency.DRAIN.values():
            found = citus_latency.drain(dsn, ns, ["drain-a", "drain-b"], events=4)
            # (and whatever else the module's tests left in the queue)
            assert found["events"] >= 4, (dsn, ns)
            assert found["events_per_s"] > 0 and found["cpu_us_per_event"] >= 0, (dsn, ns)
            with psycopg.connect(dsn, autocommit=True) as conn:
                statuses = conn.execute(
                    "SELECT e.status, count(*) FROM aidb_memory.event AS e "
                    "JOIN aidb_memory.namespace AS n ON n.id = e.namespace_id "
                    "WHERE n.name = %s GROUP BY 1",
                    (ns,),
                ).fetchall()
            assert statuses == [("processed", 4)], (dsn, ns)
        with psycopg.connect(dsn, autocommit=True) as conn:
            facts = conn.execute(
                "SELECT count(*) FROM aidb_memory.memory AS m "
                "JOIN aidb_memory.namespace AS n ON n.id = m.namespace_id "
                "WHERE n.name = %s",
                (citus_latency.DRAIN["model"],),
            ).fetchone()
        # The model's one fact, once an actor (the events after an actor's first find it).
        assert facts == (2,), dsn


def test_metrics_and_the_events_of_a_batch_through_the_coordinator(
    node: Node, fake: FakeOpenAI
) -> None:
    """Issue 36: process_events reports each event (event_brief) and counts it and its model
    call (the counters are reference tables), and metrics() reads them with the queue of the
    distributed events."""
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    node.sql("SELECT aidb_memory.create_model('metered', 'openai', %s::jsonb)", (json.dumps(opts),))
    node.sql("SELECT aidb_memory.init('metered', '{\"llm\": \"metered\"}')")
    fake.default = lambda _r: Reply(
        content=json.dumps({"operations": [{"op": "add", "text": "A fact.", "target": None}]})
    )
    for i in range(4):
        node.sql(
            "SELECT aidb_memory.add('metered', %s, %s::jsonb, 's')",
            (f"m{i}", _turns(f"I am actor {i}.")),
            user=APP_USER,
        )
    with node.connect(WORKER_USER) as conn:
        row = conn.execute("CALL aidb_memory.process_events(max_events => 100)").fetchone()
        assert row is not None
        samples = conn.execute("SELECT metric, labels, value FROM aidb_memory.metrics()").fetchall()
    metered = [e for e in row[3]["events"] if e["namespace"] == "metered"]
    assert [e["outcome"] for e in metered] == ["processed"] * 4
    values = {(m, json.dumps(lb, sort_keys=True)): v for m, lb, v in samples}
    ns = json.dumps({"kind": "extraction", "namespace": "metered"}, sort_keys=True)
    assert values[("aidb_memory_events_processed_total", ns)] == 4
    call = {"model": "metered", "namespace": "metered", "outcome": "ok", "purpose": "extraction"}
    assert values[("aidb_memory_model_calls_total", json.dumps(call, sort_keys=True))] == 4
    assert values[("aidb_memory_worker_last_batch_timestamp_seconds", "{}")] > 0
    ready = json.dumps({"kind": "extraction", "status": "ready"}, sort_keys=True)
    assert ("aidb_memory_queue_events", ready) in values
    assert node.value("SELECT count(*) FROM aidb_memory.metrics()", user=ADMIN_USER) == len(samples)


def test_metrics_past_5000_pending_events_through_the_coordinator(node: Node) -> None:
    """metrics()' bounded read of a large queue (the oldest 5,000 pending events, then a sample
    of ids past them) runs on the distributed events and estimates their number."""
    pending_events(node, "backlogged", 8000, actors=40)
    try:
        pending = node.value(
            "SELECT count(*) FROM aidb_memory.event WHERE status IN ('accepted', 'processing')"
        )
        rows = node.sql("SELECT metric, labels, value FROM aidb_memory.metrics()", user=ADMIN_USER)
        values = {(m, json.dumps(lb, sort_keys=True)): v for m, lb, v in rows}
        ready = json.dumps({"kind": "extraction", "status": "ready"}, sort_keys=True)
        assert values[("aidb_memory_queue_events_estimated", "{}")] == 1
        assert abs(values[("aidb_memory_queue_events", ready)] - pending) <= 0.1 * pending
    finally:
        node.sql(
            "DELETE FROM aidb_memory.event WHERE namespace_id = "
            "(SELECT id FROM aidb_memory.namespace WHERE name = 'backlogged')"
        )
        node.sql("SELECT aidb_memory.namespace_drop('backlogged', 'test cleanup')")


# --- data spreads -----------------------------------------------------------------------------


def test_fifty_actors_spread_over_both_workers(node: Node, cluster: CitusCluster) -> None:
    node.sql("SELECT aidb_memory.init('spread', config => '{\"extraction_mode\": \"verbatim\"}')")
    for i in range(50):
        node.sql(
            "SELECT aidb_memory.add('spread', %s, %s::jsonb, 's')",
            (f"actor{i}", json.dumps([{"role": "user", "content": f"I am actor {i}."}])),
            user=APP_USER,
        )
    result = run_cli("worker", "--once", dsn=node.dsn(WORKER_USER))
    assert result.returncode == 0, result.stdout + result.stderr
    for table in ("turn", "memory"):
        per_node = [_rows_on(w, table) for w in cluster.workers]
        assert all(n > 0 for n in per_node), f"{table}: {per_node}"


def _rows_on(worker: ThrowawayServer, table: str) -> int:
    """The rows of ``table``'s shards that ``worker`` holds."""
    with psycopg.connect(worker.dsn(DB), autocommit=True) as conn:
        # Citus hides the shards from the catalog unless asked.
        conn.execute("SET citus.override_table_visibility = off")
        shards = [
            r[0]
            for r in conn.execute(
                "SELECT c.relname FROM pg_class c "
                "WHERE c.relnamespace = 'aidb_memory'::regnamespace AND c.relkind = 'r' "
                "AND c.relname ~ %s",
                (f"^{table}_[0-9]+$",),
            )
        ]
        return sum(
            int(conn.execute(f'SELECT count(*) FROM aidb_memory."{s}"').fetchone()[0])  # type: ignore[index]
            for s in shards
        )
