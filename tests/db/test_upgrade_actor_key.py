"""Issue 15, item 2: the upgrade to the actor-keyed schema (migration 0015) keeps every row and
every read result of a database the release before it filled.

The release before is this repository's own history: the tree of the commit before the one that
added the migration, installed with its own sql/, migrations/ and plpython/, then upgraded in
place by this package.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from aidb_memory.install.citus import PER_ACTOR_TABLES
from aidb_memory.install.installer import Package, install
from aidb_memory.install.sources import SourceTree
from conftest import APP_USER, REPO, Database

NS = "upgrade_ns"
MIGRATION = "migrations/0015_actor_key.sql"
TOOLS = [
    {"role": "user", "content": "What is the weather in Lisbon?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Lisbon"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24 C"},
    {"role": "assistant", "content": "Sunny and 24 degrees."},
]
RESPONSES = [
    {"type": "message", "role": "user", "content": "and tomorrow?"},
    {"type": "function_call", "call_id": "fc_1", "name": "forecast", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "fc_1", "output": "rain"},
    {"type": "message", "role": "assistant", "content": "Rain tomorrow."},
]


def _git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True).stdout


def tree_before(migration: str, root: Path) -> Path:
    """sql/, migrations/ and plpython/ as they were right before ``migration`` arrived, in
    ``root``."""
    added = _git("log", "--diff-filter=A", "--format=%H", "--", migration).split()
    assert added, f"{migration} is not in this checkout's git history"
    archive = _git(
        "archive", "--format=tar", f"{added[-1].decode()}^", "sql", "migrations", "plpython"
    )
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    assert not (root / migration).exists()
    return root


@pytest.fixture(scope="module")
def release_before(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sql/, migrations/ and plpython/ as they were right before migration 0015."""
    return tree_before(MIGRATION, tmp_path_factory.mktemp("release-before"))


def install_tree(db: Database, source: Path | None) -> None:
    """Install ``source`` (None: this checkout) into ``db`` with this package's installer (an
    older release's server code knows real[] embeddings only: this installer keeps them real[]
    for it)."""
    package = Package.load(SourceTree(source) if source else None)
    with db.connect(autocommit=False) as conn:
        install(conn, package, say=lambda _line: None, pgvector=source is None)
        conn.commit()


def _fill(db: Database) -> None:
    """What a year of use leaves: sessions of two actors with tool calls and Responses items,
    a closed session and its handoff, a summary, an add without a session (an event holding its
    turns), an idempotency key, memories (one superseded, with history) and their words."""
    db.sql("SELECT aidb_memory.init(%s)", (NS,))

    def add(
        actor: str, session: str | None, turns: list[dict[str, Any]], key: str | None = None
    ) -> None:
        db.sql(
            "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s, 'agent-1', %s)",
            (NS, actor, json.dumps(turns), session, key),
            user=APP_USER,
        )

    for actor in ("alice", "bob"):
        add(
            actor,
            "s1",
            [
                {"role": "user", "content": f"hello, I am {actor}"},
                {"role": "assistant", "content": "hello!"},
            ],
            key=f"{actor}-1",
        )
        add(actor, "s1", TOOLS)
        add(actor, "s1", RESPONSES)
        add(actor, "s2", [{"role": "user", "content": "a second conversation"}])
        add(actor, None, [{"role": "user", "content": "I moved to Porto"}])
    db.sql(
        "SELECT * FROM aidb_memory.session_end(%s, 'alice', 's2', 'notes')", (NS,), user=APP_USER
    )
    db.sql(
        "SELECT * FROM aidb_memory.session_start(%s, 'alice', 'agent-1', 's3')",
        (NS,),
        user=APP_USER,
    )
    db.sql(
        """INSERT INTO aidb_memory.summary
               (session_ref, from_seq, to_seq, turn_count, content, chars, model, from_offset,
                to_offset)
           SELECT s.id, 1, 2, 2, 'They said hello.', 16, 'm', 0,
                  (SELECT t.char_offset + t.chars FROM aidb_memory.turn t
                   WHERE t.session_ref = s.id AND t.seq = 2)
           FROM aidb_memory.session s WHERE s.actor_id = 'alice' AND s.session_id = 's1'"""
    )
    for actor, facts in (
        ("alice", ("lives in Lisbon", "lives in Porto", "allergic to peanuts")),
        ("bob", ("drives a red Volvo",)),
    ):
        for fact in facts:
            db.sql(
                """INSERT INTO aidb_memory.memory
                       (namespace_id, actor_id, session_id, content, content_hash, source_event)
                   SELECT n.id, %s, 's1', %s, md5(%s),
                          (SELECT e.id FROM aidb_memory.event e
                           WHERE e.actor_id = %s AND e.session_id IS NULL LIMIT 1)
                   FROM aidb_memory.namespace n WHERE n.name = %s""",
                (actor, fact, fact, actor, NS),
            )
    db.sql(
        """UPDATE aidb_memory.memory AS old
           SET valid_to = now(), superseded_by = new.id
           FROM aidb_memory.memory AS new
           WHERE old.content = 'lives in Lisbon' AND new.content = 'lives in Porto'"""
    )
    db.sql(
        """INSERT INTO aidb_memory.memory_history
               (memory_id, namespace_id, actor_id, event_id, operation, old_content, new_content)
           SELECT m.id, m.namespace_id, m.actor_id, m.source_event, 'supersede',
                  'lives in Lisbon', m.content
           FROM aidb_memory.memory m WHERE m.content = 'lives in Porto'"""
    )
    db.sql(
        """INSERT INTO aidb_memory.actor_lock (namespace_id, actor_id)
           SELECT id, 'alice' FROM aidb_memory.namespace WHERE name = %s""",
        (NS,),
    )


def _reads(db: Database) -> dict[str, Any]:
    """Every read an application makes, as it sees them."""
    out: dict[str, Any] = {}
    for actor in ("alice", "bob"):
        for sid in ("s1", "s2", "s3"):
            for limit in (None, 60):
                out[f"get {actor} {sid} {limit}"] = db.sql(
                    "SELECT * FROM aidb_memory.session_get(%s, %s, %s, %s)",
                    (NS, actor, sid, limit),
                    user=APP_USER,
                )
            for fmt in ("chat", "responses"):
                out[f"messages {actor} {sid} {fmt}"] = db.sql(
                    "SELECT aidb_memory.session_messages(%s, %s, %s, format => %s)",
                    (NS, actor, sid, fmt),
                    user=APP_USER,
                )
        out[f"list {actor}"] = db.sql(
            "SELECT * FROM aidb_memory.session_list(%s, %s)", (NS, actor), user=APP_USER
        )
        out[f"memories {actor}"] = db.sql(
            # The columns of the release before (metadata came with 0021).
            "SELECT id, content, agent_id, session_id, valid_from, valid_to, superseded_by, "
            "created_at, updated_at "
            "FROM aidb_memory.list_memories(%s, %s, include_superseded => true)",
            (NS, actor),
            user=APP_USER,
        )
        for query in ("Porto", "peanuts", "Volvo", "peanust"):
            out[f"search {actor} {query}"] = db.sql(
                "SELECT id, content, score FROM aidb_memory.search(%s, %s, %s)",
                (NS, actor, query),
                user=APP_USER,
            )
    for (event,) in db.sql("SELECT public_id FROM aidb_memory.event ORDER BY public_id"):
        actor = db.value("SELECT actor_id FROM aidb_memory.event WHERE public_id = %s", (event,))
        out[f"status {event}"] = db.sql(
            "SELECT aidb_memory.status(%s, %s, %s)", (NS, actor, event), user=APP_USER
        )
    return out


def _rows(db: Database) -> dict[str, list[Any]]:
    """Every row of every per-actor table, without the new key column, in a stable order. A table
    a later migration adds (memory_lexeme, 0018) is not there before the upgrade."""
    rows = {}
    for table in PER_ACTOR_TABLES:
        if db.value("SELECT to_regclass(%s)", (f"aidb_memory.{table}",)) is None:
            continue
        rows[table] = sorted(
            json.dumps(r, sort_keys=True, default=str)
            # Columns later migrations add (memory.lexemes, lexeme_keys: 0018; metadata: 0021;
            # memory.key, memory_history.metadata, by_role, reason: 0022; event.memory_metadata:
            # 0023; memory.expires_at, ttl_s: 0025; checked on their own below) are its own.
            for (r,) in db.sql(
                f"SELECT to_jsonb(t) - 'actor_key' - 'lexemes' - 'lexeme_keys' - 'metadata' "
                f"- 'key' - 'by_role' - 'reason' - 'memory_metadata' - 'expires_at' - 'ttl_s' "
                f"FROM aidb_memory.{table} AS t"
            )
        )
    return rows


def test_an_upgrade_with_data_keeps_every_row_and_every_read(
    empty_db: Database, release_before: Path
) -> None:
    db = empty_db
    install_tree(db, release_before)
    assert db.value("SELECT to_regprocedure('aidb_memory.actor_key(bigint, text)')") is None
    _fill(db)
    rows_before, reads_before = _rows(db), _reads(db)
    # Rows in every per-actor table but those only a failed or ahead compaction writes.
    filled = set(PER_ACTOR_TABLES) - {"compaction_failure", "compaction_ahead", "memory_lexeme"}
    assert all(rows_before[t] for t in filled), [t for t in filled if not rows_before[t]]

    install_tree(db, None)

    after = _rows(db)
    assert {t: after[t] for t in rows_before} == rows_before
    # Every memory from before metadata existed has the empty object (migration 0021).
    assert db.sql("SELECT DISTINCT metadata FROM aidb_memory.memory") == [({},)]
    # And no key; their history no metadata, role or reason (migration 0022).
    assert db.sql("SELECT DISTINCT key FROM aidb_memory.memory") == [(None,)]
    assert db.sql("SELECT DISTINCT metadata, by_role, reason FROM aidb_memory.memory_history") == [
        (None, None, None)
    ]
    # Nor any event metadata for its memories (migration 0023).
    assert db.sql("SELECT DISTINCT memory_metadata FROM aidb_memory.event") == [(None,)]
    # Nor does any memory expire (migration 0025).
    assert db.sql("SELECT DISTINCT expires_at, ttl_s FROM aidb_memory.memory") == [(None, None)]
    assert _reads(db) == reads_before
    # Every row got its actor's key; the rows of a session, the session's.
    for table in ("session", "event", "memory", "memory_word", "memory_history", "actor_lock"):
        assert (
            db.value(
                f"SELECT count(*) FROM aidb_memory.{table} "
                "WHERE actor_key IS DISTINCT FROM aidb_memory.actor_key("
                "(SELECT name FROM aidb_memory.namespace WHERE id = namespace_id), actor_id)"
            )
            == 0
        ), table
    for table in ("turn", "summary", "compaction_lock"):
        assert (
            db.value(
                f"SELECT count(*) FROM aidb_memory.{table} AS x "
                "LEFT JOIN aidb_memory.session AS s ON s.id = x.session_ref "
                "WHERE x.actor_key IS DISTINCT FROM s.actor_key"
            )
            == 0
        ), table
    # The converted database keeps working: an add to an old session, a new session whose id
    # continues the old sequence, a retry of an old idempotency key.
    db.sql(
        "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's1')",
        (NS, json.dumps([{"role": "user", "content": "still here"}])),
        user=APP_USER,
    )
    items = db.value(
        "SELECT items FROM aidb_memory.session_get(%s, 'alice', 's1')", (NS,), user=APP_USER
    )
    assert items[-1]["content"] == "still here"
    assert items[:-1] == reads_before["get alice s1 None"][0][0]
    db.sql(
        "SELECT * FROM aidb_memory.session_start(%s, 'carol', 'agent-1', 'new')",
        (NS,),
        user=APP_USER,
    )
    assert db.value("SELECT id FROM aidb_memory.session WHERE actor_id = 'carol'") > db.value(
        "SELECT max(id) FROM aidb_memory.session WHERE actor_id <> 'carol'"
    )
    replay = db.value(
        "SELECT aidb_memory.add(%s, 'bob', %s::jsonb, 's1', 'agent-1', 'bob-1')",
        (
            NS,
            json.dumps(
                [
                    {"role": "user", "content": "hello, I am bob"},
                    {"role": "assistant", "content": "hello!"},
                ]
            ),
        ),
        user=APP_USER,
    )
    assert db.value("SELECT count(*) FROM aidb_memory.event WHERE public_id = %s", (replay,)) == 1
