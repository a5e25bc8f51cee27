"""Pinned instructions (issue 11, item 6): namespace config ``pin_instructions``.

When true, a session's leading system/developer turns (its instructions prefix, added before any
other turn) come first in every budgeted read, count against its budgets, and are never
summarized: compaction covers only the turns after them. Off (the default), reads are as before.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import APP_USER, Database
from fake_openai import FakeOpenAI, Reply

NS = "pinned"
INSTRUCTIONS = "You are the ACME helpdesk. ".ljust(100, "I")
MIGRATION = Path(__file__).parents[2] / "migrations" / "0010_read_limits.sql"


def _namespace(db: Database, llm: str | None = None, **config: Any) -> None:
    spec = {"llm": llm} if llm else {}
    db.sql(
        "SELECT aidb_memory.init(%s, %s::jsonb, %s::jsonb)",
        (NS, json.dumps(spec), json.dumps(config)),
    )


def _model(db: Database, base_url: str) -> None:
    opts = {"model": "fake-chat", "base_url": base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))


@pytest.fixture
def app(db: Database) -> Iterator[psycopg.Connection[Any]]:
    with db.connect(APP_USER) as conn:
        yield conn


def _add(conn: psycopg.Connection[Any], turns: list[dict[str, Any]], session: str = "s") -> None:
    conn.execute(
        "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, %s)", (NS, json.dumps(turns), session)
    )


def _get(
    conn: psycopg.Connection[Any], session: str = "s", **limits: Any
) -> tuple[list[dict[str, Any]], int, int, list[str]]:
    args = "".join(f", {k} => %({k})s" for k in limits)
    row = conn.execute(
        "SELECT items, overflow_chars, compacted_entries, warnings FROM aidb_memory.session_get("
        f"%(ns)s, 'alice', %(s)s{args})",
        {"ns": NS, "s": session, **limits},
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2], row[3]


def _seqs(items: list[dict[str, Any]]) -> list[int | None]:
    return [i["seq"] for i in items]


def _conversation(app: psycopg.Connection[Any]) -> None:
    """The instructions (100 chars), then ten exchanges of two 100-char turns: seqs 1..21."""
    _add(app, [{"role": "system", "content": INSTRUCTIONS}])
    for i in range(1, 11):
        _add(
            app,
            [
                {"role": "user", "content": f"question {i:04d} ".ljust(100, "q")},
                {"role": "assistant", "content": f"answer {i:04d} ".ljust(100, "a")},
            ],
        )


def _pinned(db: Database, session: str = "s") -> tuple[int, int]:
    ((seq, chars),) = db.sql(
        "SELECT pinned_seq, pinned_chars FROM aidb_memory.session WHERE session_id = %s",
        (session,),
    )
    return int(seq), int(chars)


def test_a_compacting_read_keeps_the_instructions_first_and_never_summarizes_them(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _model(db, fake.base_url)
    _namespace(db, "chat", pin_instructions=True)
    _conversation(app)
    assert _pinned(db) == (1, 100)
    fake.queue(Reply(content="S" * 200))
    # 1,100 chars: the instructions' 100, then 1,000 for the rest, as without them.
    items, overflow, compacted, warnings = _get(app, limit_chars=1100)
    assert warnings == []
    assert items[0]["seq"] == 1 and items[0]["content"] == INSTRUCTIONS
    assert items[1]["kind"] == "summary"
    assert items[1]["meta"] == {"from_seq": 2, "to_seq": 16, "turn_count": 15, "model": "chat"}
    assert _seqs(items[2:]) == [17, 18, 19, 20, 21]
    assert (overflow, compacted) == (0, 15)
    (request,) = fake.calls()
    sent = json.dumps(request.body["messages"])
    assert "ACME" not in sent, "the pinned instructions are never sent to the summarizer"
    assert "question 0001" in sent and "[2]" in sent and "[1]" not in sent
    assert db.sql("SELECT from_seq, from_offset, to_offset FROM aidb_memory.summary") == [
        (2, 100, 1600)
    ]
    # session_messages: the instructions, then the summary, then the turns.
    (messages,) = app.execute(
        "SELECT aidb_memory.session_messages(%s, 'alice', 's', 1100)", (NS,)
    ).fetchone() or (None,)
    assert messages[0] == {"role": "system", "content": INSTRUCTIONS}
    assert messages[1] == {"role": "system", "content": "S" * 200}
    assert len(messages) == 7
    # A second read needs no model.
    assert _seqs(_get(app, limit_chars=1100)[0]) == [1, None, 17, 18, 19, 20, 21]
    assert len(fake.calls()) == 1


def test_pinned_turns_count_against_every_budget(
    db: Database, app: psycopg.Connection[Any]
) -> None:
    _namespace(db, pin_instructions=True)
    _add(
        app,
        [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "system", "content": "Answer in English."},
        ],
    )
    _add(app, [{"role": "user", "content": f"turn {i}"} for i in range(8)])
    assert _pinned(db) == (2, 118)
    assert _seqs(_get(app, limit_items=4)[0]) == [1, 2, 9, 10]
    assert _seqs(_get(app, limit_turns=3)[0]) == [1, 2, 10]
    assert _seqs(_get(app, limit_chars=118 + 12)[0]) == [1, 2, 9, 10]
    # Unbudgeted: everything in order, as always.
    assert _seqs(_get(app)[0]) == list(range(1, 11))
    # The instructions alone fill the budget: they are all that comes back, with a warning.
    for limits in ({"limit_items": 2}, {"limit_turns": 1}, {"limit_chars": 50}):
        items, overflow, _, warnings = _get(app, **limits)
        assert _seqs(items) == [1, 2], limits
        assert warnings == ["pinned_instructions_over_budget"], limits
        assert overflow == 8 * 6, limits


def test_only_leading_instructions_are_pinned_and_pop_keeps_the_prefix_right(
    db: Database, app: psycopg.Connection[Any]
) -> None:
    _namespace(db, pin_instructions=True)
    _add(app, [{"role": "system", "content": "one"}])
    _add(app, [{"role": "system", "content": "two"}, {"role": "user", "content": "hi"}])
    _add(app, [{"role": "system", "content": "later"}])
    assert _pinned(db) == (2, 6)
    assert app.execute("SELECT aidb_memory.session_pop(%s, 'alice', 's')", (NS,)).fetchone()
    assert _pinned(db) == (2, 6)
    app.execute("SELECT aidb_memory.session_pop(%s, 'alice', 's')", (NS,))  # the user turn
    assert _pinned(db) == (2, 6)
    popped = app.execute("SELECT aidb_memory.session_pop(%s, 'alice', 's')", (NS,)).fetchone()
    assert popped is not None and popped[0]["content"] == "two"
    assert _pinned(db) == (1, 3)
    # The prefix is open again: a new system turn extends it, the user turn closes it.
    _add(app, [{"role": "system", "content": "three"}, {"role": "user", "content": "hello"}])
    assert _pinned(db) == (2, 8)
    assert _seqs(_get(app, limit_items=3)[0]) == [1, 2, 3]
    assert _seqs(_get(app, limit_items=3)[0]) == [1, 2, 3]
    # A session that starts with a user turn has no prefix.
    _add(app, [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}], "t")
    assert _pinned(db, "t") == (0, 0)
    assert _seqs(_get(app, "t", limit_items=1)[0]) == [2]


def test_config_off_reads_as_before(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _model(db, fake.base_url)
    _namespace(db, "chat")
    _conversation(app)
    assert _pinned(db) == (1, 100)  # tracked whatever the config, so it can be turned on later
    assert _seqs(_get(app, limit_items=3)[0]) == [19, 20, 21]
    fake.queue(Reply(content="S" * 200))
    items, _, _, warnings = _get(app, limit_chars=1100)
    assert warnings == []
    assert items[0]["kind"] == "summary" and items[0]["meta"]["from_seq"] == 1
    assert "ACME" in json.dumps(fake.calls()[0].body["messages"])
    # Turned on later: the instructions come first, and the summary that covers them stays.
    db.sql(
        "SELECT aidb_memory.namespace_update(%s, config => '{\"pin_instructions\": true}')", (NS,)
    )
    assert _seqs(_get(app, limit_items=3)[0]) == [1, 20, 21]


def test_the_config_key_is_validated(db: Database) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"config\.pin_instructions"):
        _namespace(db, pin_instructions="yes")


def test_the_migration_fills_the_prefix_of_existing_sessions(
    db: Database, app: psycopg.Connection[Any]
) -> None:
    _namespace(db)
    _conversation(app)
    _add(app, [{"role": "system", "content": "a"}, {"role": "system", "content": "b"}], "t")
    _add(app, [{"role": "user", "content": "x"}], "u")
    db.sql("UPDATE aidb_memory.session SET pinned_seq = 0, pinned_chars = 0")
    update = MIGRATION.read_text().split(";\n\nUPDATE", 1)[1]
    db.sql("UPDATE" + update)
    assert (_pinned(db), _pinned(db, "t"), _pinned(db, "u")) == ((1, 100), (2, 2), (0, 0))
