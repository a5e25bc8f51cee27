"""add's fast path in PL/pgSQL (sql/31_add_fast.sql, issue 33): a batch of plain chat messages
to an open session is written without Python, exactly as the Python code writes it; any other
call is left to the Python code, with nothing written.

aidb_memory.add_fast is called directly here (as its owner), beside aidb_memory.add_py, the
PL/Python body, on twin sessions: the same batches must leave the same rows. The wrapper of add
calls add_fast first and add_py when it returned NULL (tests/unit/test_codebundle.py).

Each test that writes runs both ways the fast path writes: its one statement, and the statements
routed to one shard that it runs with aidb_memory.shard_routed on (as install --citus sets it;
tests/db/test_citus_cluster.py counts what they send on a real cluster).
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aidb_memory_server import keys, validation
from conftest import APP_USER, Database

NS = "quick"
SKIPPING = "quick_skip"  # extraction off: events are 'skipped'
FAST = "SELECT aidb_memory.add_fast(%s, %s, %s::jsonb, %s, %s, %s)"
PY = "SELECT aidb_memory.add_py(%s, %s, %s::jsonb, %s, %s, %s)"
ADD = "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s, %s, %s)"
START = "SELECT * FROM aidb_memory.session_start(%s, %s, NULL, %s)"
TURNS = """
SELECT t.seq, t.round_start, t.char_offset, t.chars, t.role, t.content, t.kind, t.name,
       t.tool_calls, t.tool_call_id, t.meta, t.item, t.item_format, t.actor_key,
       e.status, e.turn_count, e.agent_id, e.actor_id, e.turns, e.turns_hash, e.idempotency_key,
       e.kind, e.actor_key, e.attempts
FROM aidb_memory.turn t
JOIN aidb_memory.session s ON s.id = t.session_ref
JOIN aidb_memory.event e ON e.id = t.event_ref
WHERE s.namespace_id = (SELECT id FROM aidb_memory.namespace WHERE name = %s)
  AND s.session_id = %s
ORDER BY seq
"""
SESSION = """
SELECT next_seq, total_chars, tail_sequence_id, tail_round_start, open_calls, last_user_seq,
       pinned_seq, pinned_chars, tail_joinable, tail_item_type, closed_at
FROM aidb_memory.session
WHERE namespace_id = (SELECT id FROM aidb_memory.namespace WHERE name = %s) AND session_id = %s
"""
COUNTS = """
SELECT (SELECT count(*) FROM aidb_memory.turn), (SELECT count(*) FROM aidb_memory.event),
       (SELECT coalesce(sum(next_seq), 0) FROM aidb_memory.session)
"""
_ids = itertools.count()
ALPHABET = st.sampled_from([*"abcxyz .,{}\"'\\\t\n", "é", "ß", "中", "😀", "\u0301", "\x01"])
CONTENT = st.text(ALPHABET, min_size=1, max_size=30)
PLAIN_TURN = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system"]), "content": CONTENT}
)
# Batches the Python code accepts that are not the fast path's: a name, meta, a developer turn.
OTHER_TURN = st.one_of(
    st.fixed_dictionaries({"role": st.just("user"), "content": CONTENT, "name": st.just("bob")}),
    st.fixed_dictionaries({"role": st.just("user"), "content": CONTENT, "meta": st.just({"a": 1})}),
    st.fixed_dictionaries({"role": st.just("developer"), "content": CONTENT}),
)
BATCH = st.lists(st.one_of(PLAIN_TURN, PLAIN_TURN, PLAIN_TURN, OTHER_TURN), min_size=1, max_size=5)


def _plain(batch: list[dict[str, Any]]) -> bool:
    """Whether the fast path takes the batch (turns._plain_batch, no system turn first)."""
    return batch[0]["role"] != "system" and all(
        set(t) == {"role", "content"} and t["role"] in ("user", "assistant", "system")
        for t in batch
    )


def _written(db: Database, ns: str, session: str) -> tuple[Any, ...]:
    return (db.sql(TURNS, (ns, session)), db.sql(SESSION, (ns, session)))


@pytest.fixture(params=["one statement", "routed statements"])
def writes(request: pytest.FixtureRequest, db: Database) -> Database:
    """``db``, whose connections take the fast path's one statement or, with
    aidb_memory.shard_routed on, its statements routed to one shard."""
    if request.param == "routed statements":
        db.sql(f"ALTER DATABASE {db.name} SET aidb_memory.shard_routed = on")
    return db


@pytest.fixture
def namespaces(writes: Database) -> Database:
    db = writes
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    db.sql("SELECT aidb_memory.init(%s, '{}', '{\"extraction\": false}')", (SKIPPING,))
    return db


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    batches=st.lists(BATCH, min_size=1, max_size=4),
    ns=st.sampled_from([NS, SKIPPING]),
    agent=st.sampled_from([None, "agent-7"]),
)
def test_the_fast_path_writes_what_the_python_code_writes(
    namespaces: Database, batches: list[list[dict[str, Any]]], ns: str, agent: str | None
) -> None:
    db = namespaces
    n = next(_ids)
    fast, slow = f"fast-{n}", f"slow-{n}"
    with db.connect() as conn:
        for sid in (fast, slow):
            conn.execute(START, (ns, "alice", sid))
        for batch in batches:
            args = (ns, "alice", json.dumps(batch), fast, agent, None)
            taken = conn.execute(FAST, args).fetchone()
            assert (taken is not None and taken[0] is not None) == _plain(batch), batch
            if taken[0] is None:
                conn.execute(PY, args)
            conn.execute(PY, (ns, "alice", json.dumps(batch), slow, agent, None))
    assert _written(db, ns, fast) == _written(db, ns, slow)


def test_the_wrapper_takes_the_fast_path_and_answers_with_its_event(namespaces: Database) -> None:
    db = namespaces
    batch = json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    with db.connect(APP_USER) as conn:
        conn.execute(START, (NS, "alice", "s"))
        event = conn.execute(ADD, (NS, "alice", batch, "s", None, None)).fetchone()[0]
    assert db.value("SELECT count(*) FROM aidb_memory.event WHERE public_id = %s", (event,)) == 1
    assert db.value("SELECT status FROM aidb_memory.event WHERE public_id = %s", (event,)) == (
        "accepted"
    )


def test_both_paths_queue_the_same_compaction_task_past_the_ahead_threshold(
    writes: Database,
) -> None:
    """A session whose total passes its ahead threshold (compaction_ahead) gets one compaction
    task from either path: the fast path's insert and adding._QUEUE_COMPACTION write the same."""
    db = writes
    opts = {"model": "m", "base_url": "http://127.0.0.1:9/v1"}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\')', (NS,))
    batch = json.dumps([{"role": "user", "content": "x" * 30}])
    with db.connect() as conn:
        for sid in ("fast", "slow"):
            conn.execute(START, (NS, "alice", sid))
            conn.execute(
                "INSERT INTO aidb_memory.compaction_ahead (actor_key, session_ref, read_budget, "
                "ahead_at) SELECT actor_key, id, 500, 10 FROM aidb_memory.session "
                "WHERE session_id = %s",
                (sid,),
            )
        for _ in range(2):  # the second add finds the task pending: still one
            assert conn.execute(FAST, (NS, "alice", batch, "fast", None, None)).fetchone()[0]
            conn.execute(PY, (NS, "alice", batch, "slow", None, None))
    tasks = """
    SELECT e.actor_key, e.actor_id, e.turn_count, e.status, e.budget, e.agent_id
    FROM aidb_memory.event e JOIN aidb_memory.session s ON s.id = e.session_ref
    WHERE e.kind = 'compaction' AND s.session_id = %s
    """
    fast = db.sql(tasks, ("fast",))
    assert len(fast) == 1 and fast[0][4] == 500
    assert fast == db.sql(tasks, ("slow",))


@pytest.mark.parametrize(
    "actor",
    ["alice", "Zoë@example.com", "用户-1", "a'b\"c\\d", "x" * 255],
)
def test_the_fast_paths_actor_key_is_actor_key(namespaces: Database, actor: str) -> None:
    db = namespaces
    db.sql(START, (NS, actor, "s"))
    batch = json.dumps([{"role": "user", "content": "hi"}])
    assert db.value(FAST, (NS, actor, batch, "s", None, None)) is not None
    stored = db.sql("SELECT DISTINCT actor_key FROM aidb_memory.turn")
    assert stored == [(keys.actor_key(NS, actor),)]
    assert stored == db.sql("SELECT aidb_memory.actor_key(%s, %s)", (NS, actor))


# Each case: what to do to the namespace or session first (SQL), then the add's arguments.
PLAIN = [{"role": "user", "content": "hi"}]
LEFT_TO_PYTHON: dict[str, tuple[list[str], tuple[Any, ...]]] = {
    "idempotency key": ([], ("alice", PLAIN, "s", None, "key-1")),
    "no session id": ([], ("alice", PLAIN, None, None, None)),
    "no such session": ([], ("alice", PLAIN, "other", None, None)),
    "closed session": (
        ["SELECT * FROM aidb_memory.session_end('quick', 'alice', 's', NULL)"],
        ("alice", PLAIN, "s", None, None),
    ),
    "open tool calls": (
        [
            'SELECT aidb_memory.add(\'quick\', \'alice\', \'[{"role": "assistant", "tool_calls": '
            '[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]'
            "', 's')"
        ],
        ("alice", PLAIN, "s", None, None),
    ),
    "inactive namespace": (
        ["SELECT * FROM aidb_memory.namespace_update('quick', NULL, NULL, 'INACTIVE')"],
        ("alice", PLAIN, "s", None, None),
    ),
    "another actor than the bound one": (
        [
            "SELECT * FROM aidb_memory.namespace_update('quick', NULL, "
            '\'{"actor_binding": "session_user"}\')'
        ],
        ("alice", PLAIN, "s", None, None),
    ),
    "a turn over max_turn_chars": (
        ["SELECT * FROM aidb_memory.namespace_update('quick', NULL, '{\"max_turn_chars\": 10}')"],
        ("alice", [{"role": "user", "content": "x" * 11}], "s", None, None),
    ),
    "more turns than max_turns_per_add": (
        ["SELECT * FROM aidb_memory.namespace_update('quick', NULL, '{\"max_turns_per_add\": 2}')"],
        ("alice", PLAIN * 3, "s", None, None),
    ),
    "more JSON than max_add_chars": (
        ["SELECT * FROM aidb_memory.namespace_update('quick', NULL, '{\"max_add_chars\": 1000}')"],
        ("alice", [{"role": "user", "content": "x" * 980}], "s", None, None),
    ),
    "an agent_id over max_identifier_chars": (
        [
            "SELECT * FROM aidb_memory.namespace_update('quick', NULL, "
            "'{\"max_identifier_chars\": 8}')"
        ],
        ("alice", PLAIN, "s", "agent-1234", None),
    ),
    "an actor_id with a control character": ([], ("al\u0085ice", PLAIN, "s", None, None)),
    "a session_id of spaces": ([], ("alice", PLAIN, "   ", None, None)),
    "an agent_id without an ASCII character": ([], ("alice", PLAIN, "s", "\u00a0\u00a0", None)),
    "not an array": ([], ("alice", {"role": "user", "content": "hi"}, "s", None, None)),
    "an empty batch": ([], ("alice", [], "s", None, None)),
    "a turn that is no object": ([], ("alice", ["hi"], "s", None, None)),
    "a missing role": ([], ("alice", [{"content": "hi"}], "s", None, None)),
    "a third key": ([], ("alice", [{"role": "user", "content": "hi", "x": 1}], "s", None, None)),
    "content that is no string": ([], ("alice", [{"role": "user", "content": 7}], "s", None, None)),
    "empty content": ([], ("alice", [{"role": "user", "content": ""}], "s", None, None)),
    "a tool turn": (
        [],
        ("alice", [{"role": "tool", "content": "x", "tool_call_id": "c"}], "s", None, None),
    ),
    "a developer turn": ([], ("alice", [{"role": "developer", "content": "x"}], "s", None, None)),
    "a system turn first": ([], ("alice", [{"role": "system", "content": "x"}], "s", None, None)),
    "a role that is no string": ([], ("alice", [{"role": 1, "content": "x"}], "s", None, None)),
}


@pytest.mark.parametrize("case", list(LEFT_TO_PYTHON))
def test_anything_else_is_left_to_the_python_code_with_nothing_written(
    namespaces: Database, case: str
) -> None:
    db = namespaces
    before_sql, (actor, batch, session, agent, key) = LEFT_TO_PYTHON[case]
    db.sql(START, (NS, "alice", "s"))
    for statement in before_sql:
        db.sql(statement)
    before = db.sql(COUNTS)
    assert db.value(FAST, (NS, actor, json.dumps(batch), session, agent, key)) is None
    assert db.sql(COUNTS) == before


@pytest.mark.parametrize("content", ["\x01" * 170, 'é"\\' * 200, "x" * 1000])
def test_max_add_chars_is_the_json_texts_length_however_it_is_escaped(
    namespaces: Database, content: str
) -> None:
    """The fast path takes a batch whose JSON text (as the Python code receives it) is within
    max_add_chars, and leaves one longer than it to the Python code, which refuses it; around
    the limit, where a batch's bound does not decide."""
    db = namespaces
    db.sql(START, (NS, "alice", "s"))
    batch = json.dumps([{"role": "user", "content": content}])
    chars = db.value("SELECT length(%s::jsonb::text)", (batch,))
    assert chars > 1000  # the smallest cap a namespace takes
    for limit, taken in ((chars, True), (chars - 1, False)):
        db.sql(
            "SELECT * FROM aidb_memory.namespace_update(%s, NULL, %s)",
            (NS, json.dumps({"max_add_chars": limit})),
        )
        got = db.value(FAST, (NS, "alice", batch, "s", None, None))
        assert (got is not None) == taken, (limit, chars)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="characters of JSON"):
        db.sql(ADD, (NS, "alice", batch, "s", None, None))


def test_a_namespace_that_does_not_exist_is_the_python_codes_error(writes: Database) -> None:
    db = writes
    with db.connect(APP_USER) as conn, pytest.raises(psycopg.errors.UndefinedObject) as info:
        conn.execute(ADD, ("nowhere", "alice", json.dumps(PLAIN), "s", None, None))
    assert info.value.diag.message_primary == 'aidb_memory.add: namespace "nowhere" does not exist'


def test_its_config_defaults_are_the_python_codes() -> None:
    source = (Path(__file__).parents[2] / "sql" / "31_add_fast.sql").read_text()
    found = dict(re.findall(r"coalesce\(\(n\.config->>'(\w+)'\)::\w+, (\w+)\)", source))
    found.update(re.findall(r"coalesce\(n\.config->>'(\w+)', '(\w+)'\)", source))
    assert len(found) == 8, found
    for key, value in found.items():
        default = validation.CONFIG_DEFAULTS[key]
        assert str(default).lower() == value.lower(), key
