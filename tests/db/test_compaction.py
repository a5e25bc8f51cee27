"""Compaction in budgeted reads (SPEC §3; issue 4 acceptance 1-6).

The model is the fake OpenAI-compatible server on 127.0.0.1 (tests/fake_openai.py): its request
log shows what the database sent and how many calls it made.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from conftest import APP_USER, Database
from fake_openai import FakeOpenAI, Reply, serve

NS = "support"
GET = "SELECT items, overflow_chars, compacted_entries, warnings FROM aidb_memory.session_get(%s)"


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with serve() as server:
        yield server


def _model(db: Database, name: str, base_url: str, **options: Any) -> None:
    opts = {"model": "fake-chat", "base_url": base_url, "max_retries": 0, **options}
    db.sql("SELECT aidb_memory.create_model(%s, 'openai', %s::jsonb)", (name, json.dumps(opts)))


def _namespace(db: Database, llm: str | None = None, **config: Any) -> None:
    spec = {"llm": llm} if llm else {}
    db.sql(
        "SELECT aidb_memory.init(%s, %s::jsonb, %s::jsonb)",
        (NS, json.dumps(spec), json.dumps(config)),
    )


def _exchange(i: int, size: int = 100) -> list[dict[str, Any]]:
    """One user turn and one assistant turn, each exactly ``size`` chars."""
    return [
        {"role": "user", "content": f"question {i:04d} ".ljust(size, "q")},
        {"role": "assistant", "content": f"answer {i:04d} ".ljust(size, "a")},
    ]


def _add(conn: psycopg.Connection[Any], turns: list[dict[str, Any]], session: str = "s") -> None:
    conn.execute(
        "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, %s)", (NS, json.dumps(turns), session)
    )


def _get(
    conn: psycopg.Connection[Any],
    limit_chars: int | None,
    fallback_model: str | None = None,
    session: str = "s",
) -> tuple[list[dict[str, Any]], int, int, list[str]]:
    row = conn.execute(
        "SELECT items, overflow_chars, compacted_entries, warnings FROM aidb_memory.session_get("
        "%s, 'alice', %s, limit_chars => %s, fallback_model => %s)",
        (NS, session, limit_chars, fallback_model),
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2], row[3]


def _summaries(db: Database) -> list[tuple[Any, ...]]:
    return db.sql(
        "SELECT from_seq, to_seq, turn_count, chars, model, from_offset, to_offset, content "
        "FROM aidb_memory.summary ORDER BY from_seq"
    )


@pytest.fixture
def app(db: Database) -> Iterator[psycopg.Connection[Any]]:
    with db.connect(APP_USER) as conn:
        yield conn


def test_a_long_session_read_with_a_budget_gets_one_new_summary_then_the_newest_rounds(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _model(db, "chat", fake.base_url)
    _namespace(db, "chat")
    for i in range(1, 11):  # 20 turns of 100 chars: 2,000 chars
        _add(app, _exchange(i))
    fake.queue(Reply(content="S" * 200))
    items, overflow, compacted, warnings = _get(app, 1000)
    assert warnings == []
    # Three quarters of 2,000 chars = 1,500: turns 1-15 (each plain turn is a round of its own).
    summary, *turns = items
    assert summary["kind"] == "summary" and summary["role"] == "system"
    assert summary["content"] == "S" * 200
    assert summary["seq"] is None
    assert summary["meta"] == {"from_seq": 1, "to_seq": 15, "turn_count": 15, "model": "chat"}
    assert [t["seq"] for t in turns] == [16, 17, 18, 19, 20]
    assert compacted == 15
    assert overflow == 0
    (request,) = fake.calls()
    sent = request.body["messages"][-1]["content"]
    assert "question 0001" in sent and "answer 0007" in sent and "question 0008" in sent
    assert "[15]" in sent and "[16]" not in sent and "answer 0008" not in sent, "nothing newer"
    assert _summaries(db) == [(1, 15, 15, 200, "chat", 0, 1500, "S" * 200)]
