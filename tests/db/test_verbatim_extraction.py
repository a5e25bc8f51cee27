"""Verbatim extraction (issue 26, item 2): long-term memory without a language model.

A namespace without a model that can extract (none, or only the builtin extractive summarizer)
gets ``extraction_mode`` ``auto`` = ``verbatim``: the worker stores what the user said, cut into
pieces of at most ``memory_max_chars``, merging exact duplicates; ``verbatim_all`` stores the
assistant's turns too. A namespace with a model keeps model extraction.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import APP_USER, WORKER_USER, Database
from fake_openai import FakeOpenAI, Reply

NS = "verbatim"
PROCESS = "CALL aidb_memory.process_events(backoff_s => 0)"


def _init(db: Database, model_spec: dict[str, Any] | None = None, **config: Any) -> None:
    db.sql(
        "SELECT aidb_memory.init(%s, %s::jsonb, %s::jsonb)",
        (NS, json.dumps(model_spec or {}), json.dumps(config)),
    )


def _add(
    db: Database, turns: list[dict[str, Any]], actor: str = "alice", session: str | None = "s"
) -> str:
    return str(
        db.value(
            "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s)",
            (NS, actor, json.dumps(turns), session),
            user=APP_USER,
        )
    )


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _work(db: Database) -> tuple[int, int, int]:
    with db.connect(WORKER_USER) as conn:
        row = conn.execute(PROCESS).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def _status(db: Database, event: str, actor: str = "alice") -> dict[str, Any]:
    value = db.value("SELECT aidb_memory.status(%s, %s, %s)", (NS, actor, event), user=APP_USER)
    assert isinstance(value, dict)
    return value


def _memories(db: Database, actor: str = "alice") -> list[str]:
    rows = db.sql(
        "SELECT content FROM aidb_memory.memory WHERE actor_id = %s AND valid_to IS NULL "
        "ORDER BY id",
        (actor,),
    )
    return [r[0] for r in rows]


def _search(db: Database, query: str) -> list[str]:
    rows = db.sql(
        "SELECT content FROM aidb_memory.search(%s, 'alice', %s)", (NS, query), user=APP_USER
    )
    return [r[0] for r in rows]


CONVERSATION = [
    {"role": "system", "content": "You are a travel assistant."},
    _user("I only drink green tea. My passport expires in March 2027."),
    {"role": "assistant", "content": "Noted: green tea, and a passport valid until March 2027."},
    {
        "role": "assistant",
        "content": "Let me look that up.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"q": "Lisbon"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "Lisbon: sunny"},
    _user("I live in Lisbon."),
]


def test_without_a_model_the_users_turns_become_memories(db: Database) -> None:
    _init(db)
    event = _add(db, CONVERSATION)
    assert _status(db, event)["status"] == "accepted"
    assert _work(db) == (1, 0, 0)
    assert _memories(db) == [
        "I only drink green tea. My passport expires in March 2027.",
        "I live in Lisbon.",
    ]
    status = _status(db, event)
    assert status["status"] == "processed"
    result = status["result"]
    assert (result["added"], result["updated"], result["invalidated"]) == (2, 0, 0)
    assert result["duplicates"] == 0 and len(result["memories"]) == 2
    rows = db.sql(
        "SELECT m.agent_id, m.session_id, m.content_hash = encode(sha256(convert_to("
        "'i live in lisbon', 'UTF8')), 'hex'), e.public_id::text "
        "FROM aidb_memory.memory m JOIN aidb_memory.event e "
        "ON e.actor_key = m.actor_key AND e.id = m.source_event "
        "WHERE m.content = 'I live in Lisbon.'"
    )
    assert rows == [(None, "s", True, event)]
    history = db.sql(
        "SELECT h.operation, h.new_content, e.public_id::text FROM aidb_memory.memory_history h "
        "JOIN aidb_memory.event e ON e.id = h.event_id ORDER BY h.id"
    )
    assert [h[0] for h in history] == ["add", "add"] and {h[2] for h in history} == {event}
    # Found by a word, and by a misspelled one (trigrams).
    assert _search(db, "Lisbon") == ["I live in Lisbon."]
    assert _search(db, "pasport")[0].startswith("I only drink green tea.")
    assert db.value(
        "SELECT status FROM aidb_memory.events WHERE public_id = %s::uuid", (event,)
    ) == ("processed")


def test_verbatim_all_stores_the_assistants_turns_too_but_no_tool_turns(db: Database) -> None:
    _init(db, extraction_mode="verbatim_all")
    _add(db, CONVERSATION)
    assert _work(db) == (1, 0, 0)
    assert _memories(db) == [
        "I only drink green tea. My passport expires in March 2027.",
        "Noted: green tea, and a passport valid until March 2027.",
        "I live in Lisbon.",
    ]


def test_a_long_turn_is_split_into_pieces_of_at_most_memory_max_chars(db: Database) -> None:
    _init(db, memory_max_chars=100)
    sentences = [f"Sentence number {i} talks about topic {i} at some length." for i in range(10)]
    long_word = "".join(f"{i:03d}" for i in range(84))  # 252 characters, no whitespace
    event = _add(db, [_user(" ".join(sentences) + "\n" + long_word)])
    assert _work(db) == (1, 0, 0)
    stored = _memories(db)
    assert all(0 < len(m) <= 100 for m in stored)
    assert stored[0] == " ".join(sentences[:1])
    assert "".join(" ".join(stored).split()) == "".join((" ".join(sentences) + long_word).split())
    assert stored[-3:] == [long_word[:100], long_word[100:200], long_word[200:]]
    assert _status(db, event)["result"]["added"] == len(stored)


def test_exact_duplicates_are_merged(db: Database) -> None:
    _init(db)
    first = _add(db, [_user("I live in Lisbon.")])
    second = _add(db, [_user("i live in   LISBON"), _user("I live in Lisbon!")], session="t")
    third = _add(db, [_user("I live in Lisbon, near the river.")], session="t")
    assert _work(db) == (3, 0, 0)
    assert _memories(db) == ["I live in Lisbon.", "I live in Lisbon, near the river."]
    assert _status(db, first)["result"]["added"] == 1
    result = _status(db, second)["result"]
    assert (result["added"], result["duplicates"], result["memories"]) == (0, 2, [])
    assert _status(db, third)["result"]["added"] == 1  # a near duplicate is kept


@pytest.mark.parametrize(
    ("model_spec", "config", "reason"),
    [
        ({}, {"extraction_mode": "model"}, None),
        ({}, {"extraction": False}, None),
        ({}, {"extraction": False, "extraction_mode": "verbatim"}, None),
        (
            {"llm": "summarizer"},
            {"extraction_mode": "model"},
            'the builtin extractive model cannot extract facts (extraction_mode "model")',
        ),
    ],
)
def test_model_mode_without_a_model_or_extraction_off_is_skipped(
    db: Database, model_spec: dict[str, Any], config: dict[str, Any], reason: str | None
) -> None:
    db.sql("SELECT aidb_memory.create_model('summarizer', 'builtin', '{\"kind\": \"extractive\"}')")
    _init(db, model_spec, **config)
    event = _add(db, [_user("I live in Lisbon.")])
    if reason is None:  # skipped by add: never queued
        assert _status(db, event)["status"] == "skipped"
        assert _work(db) == (0, 0, 0)
    else:  # the worker finds out
        assert _work(db) == (1, 0, 0)
        status = _status(db, event)
        assert (status["status"], status["result"]["reason"]) == ("skipped", reason)
    assert _memories(db) == []


def test_the_builtin_summarizer_alone_means_verbatim(db: Database) -> None:
    db.sql("SELECT aidb_memory.create_model('summarizer', 'builtin', '{\"kind\": \"extractive\"}')")
    _init(db, {"llm": "summarizer"})
    event = _add(db, [_user("I live in Lisbon.")])
    assert _work(db) == (1, 0, 0)
    assert _status(db, event)["status"] == "processed"
    assert _memories(db) == ["I live in Lisbon."]


def test_a_model_that_can_extract_keeps_model_extraction(db: Database, fake: FakeOpenAI) -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    _init(db, {"llm": "chat"})
    answer = {"operations": [{"op": "add", "target": None, "text": "Alice lives in Lisbon."}]}
    fake.queue(Reply(content=json.dumps(answer)))
    event = _add(db, [_user("I live in Lisbon.")])
    assert _work(db) == (1, 0, 0)
    assert len(fake.calls()) == 1
    assert _memories(db) == ["Alice lives in Lisbon."]
    assert _status(db, event)["result"]["added"] == 1


def test_with_an_embedding_model_the_pieces_get_vectors(db: Database, fake: FakeOpenAI) -> None:
    opts = {"model": "fake-embed", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('embed', 'openai', %s::jsonb)", (json.dumps(opts),))
    _init(db, {"embedding": "embed"})
    fake.queue(Reply(embedding=[1.0, 0.0, 0.0]))
    _add(db, [_user("I keep bees in my garden."), _user("I keep bees in my garden.")])
    assert _work(db) == (1, 0, 0)
    assert fake.calls() == [], "no chat completion"
    (request,) = fake.calls("/embeddings")
    assert request.body["input"] == ["I keep bees in my garden."]
    assert db.sql("SELECT embedding::real[], embedding_model FROM aidb_memory.memory") == [
        ([1.0, 0.0, 0.0], "embed")
    ]
    # A failed embedding fails the attempt: nothing stored, retried.
    fake.queue(Reply(status=500))
    event = _add(db, [_user("I have two hives.")])
    with db.connect(WORKER_USER) as conn:
        conn.execute("CALL aidb_memory.process_events(backoff_s => 60)")
    status = _status(db, event)
    assert status["status"] == "accepted"
    assert status["last_error"].startswith("embedding failed:")
    assert 'model "embed"' in status["last_error"]
    assert _memories(db) == ["I keep bees in my garden."]
