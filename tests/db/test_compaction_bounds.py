"""Compaction's cost does not grow with history (issue 10, items 7, 8 and 13c).

The assertions are structural, never timed: the turn rows a compacting read fetches (the
transaction's own table statistics, ``pg_stat_get_xact_tuples_*``), what the fake model was
sent, the warnings and the summaries stored.
"""

from __future__ import annotations

import json
import random
from typing import Any

import psycopg
import pytest

from aidb_memory_server import compaction
from conftest import APP_USER, Database
from fake_openai import FakeOpenAI, Reply

NS = "bounds"
CAP = 20_000  # compaction_max_input_chars of these tests


def _setup(db: Database, fake: FakeOpenAI | None, **config: Any) -> None:
    spec: dict[str, Any] = {}
    if fake is not None:
        opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
        db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
        spec = {"llm": "chat"}
    db.sql(
        "SELECT aidb_memory.init(%s, %s::jsonb, %s::jsonb)",
        (NS, json.dumps(spec), json.dumps(config)),
    )


def _generate(db: Database, contents_sql: str, n: int) -> None:
    """A session 's' of ``n`` one-turn rounds generated in SQL, with the positions, offsets and
    counters ``add`` would give them (as bench/sessions.py makes its 100,000-turn session);
    ``contents_sql`` is the content of turn ``g``."""
    db.sql(f"SELECT aidb_memory.session_start('{NS}', 'alice', NULL, 's')")
    db.sql(
        f"""
        WITH s AS (SELECT id, actor_key FROM aidb_memory.session WHERE session_id = 's'),
        c AS (
            SELECT g AS seq, CASE WHEN mod(g, 2) = 1 THEN 'user' ELSE 'assistant' END AS role,
                   {contents_sql} AS content
            FROM generate_series(1, {n}) AS g
        )
        INSERT INTO aidb_memory.turn
            (actor_key, session_ref, seq, round_start, char_offset, chars, role, content, kind)
        SELECT s.actor_key, s.id, c.seq, c.seq,
               coalesce(sum(length(c.content)) OVER (ORDER BY c.seq ROWS BETWEEN UNBOUNDED
                                                     PRECEDING AND 1 PRECEDING), 0),
               length(c.content), c.role, c.content,
               CASE c.role WHEN 'user' THEN 'user_prompt' ELSE 'model_response' END
        FROM s, c
        """
    )
    db.sql(
        """
        UPDATE aidb_memory.session AS s
        SET next_seq = x.n + 1, total_chars = x.chars, tail_round_start = x.n,
            last_user_seq = x.last_user
        FROM (SELECT max(seq) AS n, sum(chars) AS chars,
                     max(seq) FILTER (WHERE role = 'user') AS last_user
              FROM aidb_memory.turn) AS x
        WHERE s.session_id = 's'
        """
    )
    db.sql("VACUUM ANALYZE aidb_memory.turn")


def _read_counting(db: Database, limit_chars: int) -> tuple[tuple[Any, ...], int]:
    """A budgeted read, and the turn rows its transaction read."""
    with db.connect(autocommit=False) as conn:
        row = conn.execute(
            "SELECT items, overflow_chars, compacted_entries, warnings "
            "FROM aidb_memory.session_get(%s, 'alice', 's', %s)",
            (NS, limit_chars),
        ).fetchone()
        # Heap rows a sequential scan read, a bitmap scan fetched (both counted on the
        # table) or an index scan fetched (counted on its index).
        read = conn.execute(
            "SELECT pg_stat_get_xact_tuples_returned(t.oid)"
            " + pg_stat_get_xact_tuples_fetched(t.oid)"
            " + (SELECT sum(pg_stat_get_xact_tuples_fetched(i.indexrelid)) FROM pg_index i"
            "    WHERE i.indrelid = t.oid)"
            " FROM pg_class t WHERE t.oid = 'aidb_memory.turn'::regclass"
        ).fetchone()
        conn.commit()
    assert row is not None and read is not None
    return row, int(read[0])


def test_a_long_unsummarized_history_is_caught_up_a_cap_at_a_time_reading_only_that(
    db: Database, fake: FakeOpenAI
) -> None:
    """20,000 turns of 100 chars (2,000,000 chars) that grew before the namespace had a model.
    Each read summarizes at most the cap (200 turns), fetches about that many turn rows, not
    the whole history, says it is still catching up, and returns the summary made so far."""
    _setup(db, fake, compaction_max_input_chars=CAP)
    _generate(db, "lpad(g::text, 100, 'x')", 20_000)
    fake.default = lambda req: Reply(content="S" * 300)
    (items, overflow, compacted, warnings), fetched = _read_counting(db, 2000)
    assert warnings == ["compaction_incomplete"]
    assert db.sql("SELECT from_seq, to_seq, from_offset, to_offset FROM aidb_memory.summary") == [
        (1, 200, 0, CAP)
    ]
    assert fetched < 1000, f"the read fetched {fetched} turn rows: it loaded the history"
    (request,) = fake.calls()
    assert "[1] user:" in request.body["messages"][-1]["content"]
    assert "[201]" not in request.body["messages"][-1]["content"]
    # The summary made so far, then the newest turns in the budget left.
    summary, *turns = items
    assert summary["kind"] == "summary" and summary["meta"]["to_seq"] == 200
    assert [t["seq"] for t in turns] == list(range(19_984, 20_001))
    assert compacted == 200
    assert overflow == 2_000_000 - CAP - 1700

    # The next read goes on from there, just as cheaply.
    (items, _, compacted, warnings), fetched = _read_counting(db, 2000)
    assert warnings == ["compaction_incomplete"] and compacted == 200
    assert items[0]["meta"]["from_seq"] == 201, "the newest summary"
    assert fetched < 1000
    assert db.sql("SELECT from_seq, to_seq FROM aidb_memory.summary ORDER BY 1") == [
        (1, 200),
        (201, 400),
    ]


def test_a_round_larger_than_the_cap_is_sent_as_its_head_and_its_tail(
    db: Database, fake: FakeOpenAI
) -> None:
    """A 1,000,000-char first turn: the model gets its opening and its end within the cap,
    never the whole turn; the summary stands in for all of it."""
    _setup(db, fake, compaction_max_input_chars=CAP, max_turn_chars=1_000_000)
    _generate(
        db,
        "CASE WHEN g = 1 THEN 'BEGIN' || repeat('h', 499996) || repeat('t', 499996) || 'END' "
        "ELSE lpad(g::text, 100, 'x') END",
        3,
    )
    fake.default = lambda req: Reply(content="S" * 300)
    (items, _, compacted, warnings), _ = _read_counting(db, 2000)
    (request,) = fake.calls()
    sent = request.body["messages"][-1]["content"]
    assert len(sent) < CAP + 200, f"{len(sent)} chars sent, the cap is {CAP}"
    assert "BEGIN" in sent and "END" in sent and "[…]" in sent
    assert sent.count("h") >= CAP // 2 - 10 and sent.count("t") >= CAP // 2 - 10
    assert db.sql("SELECT from_seq, to_seq, from_offset, to_offset FROM aidb_memory.summary") == [
        (1, 1, 0, 1_000_000)
    ]
    assert warnings == [] and compacted == 1
    assert [i["seq"] for i in items] == [None, 2, 3]


def _session(db: Database, turns: int = 20) -> None:
    with db.connect(APP_USER) as app:
        for i in range(1, turns // 2 + 1):
            batch = [
                {"role": "user", "content": f"question {i:04d} ".ljust(100, "q")},
                {"role": "assistant", "content": f"answer {i:04d} ".ljust(100, "a")},
            ]
            app.execute(
                "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's')", (NS, json.dumps(batch))
            )


def _get(conn: psycopg.Connection[Any], limit_chars: int, fallback: str | None = None) -> Any:
    row = conn.execute(
        "SELECT items, compacted_entries, warnings FROM aidb_memory.session_get("
        "%s, 'alice', 's', limit_chars => %s, fallback_model => %s)",
        (NS, limit_chars, fallback),
    ).fetchone()
    assert row is not None
    return row


@pytest.mark.parametrize("how", ["set_transaction", "default_transaction_read_only"])
def test_a_read_only_transaction_pays_for_no_summary_it_cannot_store(
    db: Database, fake: FakeOpenAI, how: str
) -> None:
    _setup(db, fake)
    _session(db)
    with db.connect(APP_USER, autocommit=False) as conn:
        if how == "set_transaction":
            conn.execute("SET TRANSACTION READ ONLY")
        else:
            conn.execute("SET default_transaction_read_only = on")
            conn.commit()
        items, compacted, warnings = _get(conn, 1000)
        conn.rollback()
    assert warnings == ["compaction_read_only"]
    assert fake.calls() == [], "no model call whose summary could not be stored"
    assert [i["seq"] for i in items] == list(range(11, 21)) and compacted == 0
    assert db.sql("SELECT count(*) FROM aidb_memory.model_usage") == [(0,)]
    # Read-write, the same read compacts.
    with db.connect(APP_USER) as conn:
        assert _get(conn, 1000)[1:] == (15, [])


@pytest.mark.parametrize("model", [None, "namespace", "fallback"])
def test_a_session_whose_only_round_is_over_budget_says_so_whatever_the_model(
    db: Database, fake: FakeOpenAI, model: str | None
) -> None:
    _setup(db, fake if model == "namespace" else None)
    if model == "fallback":
        opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
        db.sql("SELECT aidb_memory.create_model('spare', 'openai', %s::jsonb)", (json.dumps(opts),))
    with db.connect(APP_USER) as app:
        big = [{"role": "user", "content": "x" * 3000}]
        app.execute("SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's')", (NS, json.dumps(big)))
        items, compacted, warnings = _get(app, 2000, "spare" if model == "fallback" else None)
    assert warnings == ["newest_round_over_budget"]
    assert items == [] and compacted == 0
    assert fake.calls() == []


def _spans(db: Database) -> list[compaction.Span]:
    rows = db.sql("SELECT seq, round_start, chars FROM aidb_memory.turn ORDER BY seq")
    return [compaction.Span(*r) for r in rows]


@pytest.mark.parametrize("seed", range(6))
def test_the_cut_chosen_in_sql_is_the_rule_of_choose_cut(
    db: Database, fake: FakeOpenAI, seed: int
) -> None:
    """Rounds of random sizes (several turns sharing a sequence_id, or a tool call and its
    results), a random cap and budget: the summary ends where compaction.choose_cut says."""
    rnd = random.Random(seed)
    cap = rnd.choice([1000, 1500, 3000, 200_000])
    _setup(db, fake, compaction_max_input_chars=cap)
    fake.default = lambda req: Reply(content="S" * 50)
    with db.connect(APP_USER) as app:
        for r in range(rnd.randint(4, 14)):
            batch: list[dict[str, Any]] = []
            if rnd.random() < 0.3:
                batch = [
                    {"role": "user", "content": "u" * rnd.randint(1, 400)},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": f"c{r}",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": f"c{r}", "content": "t" * rnd.randint(1, 900)},
                ]
            else:
                for _ in range(rnd.randint(1, 3)):
                    batch.append(
                        {
                            "role": rnd.choice(["user", "assistant"]),
                            "content": "c" * rnd.randint(1, 700),
                            "meta": {"sequence_id": f"r{r}"},
                        }
                    )
            app.execute(
                "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's')", (NS, json.dumps(batch))
            )
        spans = _spans(db)
        tail = db.value("SELECT tail_round_start FROM aidb_memory.session")
        total = sum(s.chars for s in spans)
        limit = max(800, total // 2)
        expected = compaction.choose_cut(spans, tail, cap)
        _, _, warnings = _get(app, limit)
    stored = db.sql("SELECT to_seq FROM aidb_memory.summary")
    if expected is None:
        assert stored == [] and warnings == ["newest_round_over_budget"]
    else:
        assert stored == [(expected,)], (spans, tail, cap)
