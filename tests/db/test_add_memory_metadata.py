"""Issue 34, item 1: ``add(..., memory_metadata)``, which the worker copies onto every memory it
makes of the batch (mem0's ``add(metadata=)``), refused before anything is stored when it is
not an object within the namespace's bounds."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from conftest import APP_USER, WORKER_USER, Database
from fake_openai import FakeOpenAI, Reply

NS = "tagged"
PROCESS = "CALL aidb_memory.process_events(max_events => 10, lease_s => 60, backoff_s => 0)"
TURNS = [{"role": "user", "content": "I play the cello on Sundays."}]


def _add(db: Database, turns: list[dict[str, Any]] = TURNS, **kwargs: Any) -> str:
    names = "".join(f", {k} => %({k})s" for k in kwargs)
    return str(
        db.value(
            f"SELECT aidb_memory.add(%(ns)s, 'hana', %(turns)s::jsonb{names})",
            {"ns": NS, "turns": json.dumps(turns), **kwargs},
            user=APP_USER,
        )
    )


def _work(db: Database) -> None:
    with db.connect(WORKER_USER) as conn:
        conn.execute(PROCESS)


def _memories(db: Database) -> list[tuple[Any, ...]]:
    return db.sql(
        "SELECT content, metadata FROM aidb_memory.list_memories(%s, 'hana') ORDER BY content",
        (NS,),
        user=APP_USER,
    )


@pytest.fixture
def verbatim(db: Database) -> Database:
    db.sql('SELECT aidb_memory.init(%s, config => \'{"extraction_mode": "verbatim"}\')', (NS,))
    return db


@pytest.mark.parametrize("session_id", [None, "s1"])
def test_verbatim_memories_carry_the_adds_metadata(
    verbatim: Database, session_id: str | None
) -> None:
    tags = {"source": "onboarding", "scores": [1, 2.5]}
    _add(verbatim, session_id=session_id, memory_metadata=json.dumps(tags))
    _add(verbatim, [{"role": "user", "content": "I live in Osaka."}], session_id=session_id)
    _work(verbatim)
    assert _memories(verbatim) == [
        ("I live in Osaka.", {}),
        ("I play the cello on Sundays.", tags),
    ]
    # A fact the actor already has keeps its own metadata.
    _add(verbatim, session_id=session_id, memory_metadata='{"source": "later"}')
    _work(verbatim)
    assert _memories(verbatim)[1] == ("I play the cello on Sundays.", tags)


def test_model_extraction_copies_it_onto_each_memory(db: Database, fake: FakeOpenAI) -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\')', (NS,))
    operations = [
        {"op": "add", "text": "Hana plays the cello.", "target": None},
        {"op": "add", "text": "Hana practises on Sundays.", "target": None},
    ]
    fake.queue(Reply(content=json.dumps({"operations": operations})))
    _add(db, memory_metadata='{"source": "chat"}')
    _work(db)
    assert _memories(db) == [
        ("Hana plays the cello.", {"source": "chat"}),
        ("Hana practises on Sundays.", {"source": "chat"}),
    ]


def test_bad_memory_metadata_is_refused_before_anything_is_stored(verbatim: Database) -> None:
    cases = [
        (4000, "[1, 2]", "memory_metadata must be a JSON object"),
        (4000, '{"a": ' * 9 + "1" + "}" * 9, "is nested deeper than 8 levels"),
        (20, '{"a": "' + "x" * 30 + '"}', "more than the namespace limit of 20"),
    ]
    for cap, value, message in cases:
        verbatim.sql(
            "SELECT aidb_memory.namespace_update(%s, config => %s::jsonb)",
            (NS, json.dumps({"memory_metadata_max_chars": cap})),
        )
        for session_id in (None, "new-session"):
            with (
                verbatim.connect(APP_USER) as conn,
                pytest.raises(psycopg.errors.InvalidParameterValue) as info,
            ):
                conn.execute(
                    "SELECT aidb_memory.add(%s, 'hana', %s::jsonb, %s, memory_metadata => %s)",
                    (NS, json.dumps(TURNS), session_id, value),
                )
            assert str(info.value).startswith("aidb_memory.add: "), info.value
            assert message in str(info.value), info.value
    for table in ("event", "session", "turn"):
        assert verbatim.value(f"SELECT count(*) FROM aidb_memory.{table}") == 0, table


def test_a_retry_repeats_the_metadata_too(verbatim: Database) -> None:
    first = _add(verbatim, idempotency_key="k1", memory_metadata='{"a": 1}')
    assert _add(verbatim, idempotency_key="k1", memory_metadata='{"a": 1}') == first
    with verbatim.connect(APP_USER) as conn, pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(
            "SELECT aidb_memory.add(%s, 'hana', %s::jsonb, idempotency_key => 'k1', "
            "memory_metadata => '{\"a\": 2}')",
            (NS, json.dumps(TURNS)),
        )
    # An add without metadata under a key keeps the hash it had before metadata existed.
    plain = _add(verbatim, idempotency_key="k2")
    assert _add(verbatim, idempotency_key="k2") == plain
    assert verbatim.value("SELECT count(*) FROM aidb_memory.event") == 2


def test_an_open_session_with_metadata_takes_the_python_path_and_keeps_it(
    verbatim: Database,
) -> None:
    _add(verbatim, session_id="s1")  # the session exists: the fast path would take the next one
    event = _add(verbatim, session_id="s1", memory_metadata='{"k": "v"}')
    assert verbatim.value(
        "SELECT memory_metadata FROM aidb_memory.event WHERE public_id = %s", (event,)
    ) == {"k": "v"}
    assert verbatim.value("SELECT count(*) FROM aidb_memory.turn") == 2
