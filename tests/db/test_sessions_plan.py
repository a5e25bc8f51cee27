"""The cost of a budgeted read grows with the budget, not with the history (SPEC §1, §3).

A 50,000-turn session is written straight into the tables (as 50,000 adds would leave it), one
more turn comes through the API, and the real session_get runs under auto_explain: the window
query must range-scan turn_offset_idx on char_offset and read about as many rows as the budget
holds, never the whole session.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from aidb_memory.throwaway import ThrowawayServer
from conftest import APP_USER, Database, _create_database, _drop_database
from plans import nested_plans

NS = "plan"
SID = "big"
N = 50_000
ROUND = 3  # turns per reasoning round in the generated history
LAST = {"role": "user", "content": "q" * 100}


def _chars(g: int) -> int:
    return 90 + (g * 7) % 21  # 90..110, as the INSERT below computes it


def _content(g: int) -> str:
    return str(g).rjust(_chars(g), ".")  # lpad(g::text, chars, '.')


@pytest.fixture(scope="module")
def big(pg_server: ThrowawayServer, template_db: Database) -> Iterator[Database]:
    """One database for the module (built once: reads without a model write nothing)."""
    db = _create_database(pg_server, template_db.name)
    try:
        yield _build(db)
    finally:
        _drop_database(db)


def _build(db: Database) -> Database:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    db.sql("SELECT * FROM aidb_memory.session_start(%s, 'actor', NULL, %s)", (NS, SID))
    with db.connect() as conn:
        conn.execute(
            """
            INSERT INTO aidb_memory.turn
                (actor_key, session_ref, seq, round_start, char_offset, chars, role, content,
                 kind, meta)
            SELECT s.actor_key, s.id, g.g, g.g - (g.g - 1) %% %(round)s,
                   sum(g.c) OVER (ORDER BY g.g) - g.c, g.c,
                   CASE WHEN (g.g - 1) %% %(round)s = 0 THEN 'user' ELSE 'assistant' END,
                   lpad(g.g::text, g.c, '.'),
                   CASE WHEN (g.g - 1) %% %(round)s = 0 THEN 'user_prompt'
                        ELSE 'model_response' END,
                   jsonb_build_object('sequence_id', 'r' || (g.g - 1) / %(round)s)
            FROM aidb_memory.session s,
                 (SELECT g, 90 + (g * 7) %% 21 AS c FROM generate_series(1, %(n)s) g) g
            WHERE s.session_id = %(sid)s
            """,
            {"round": ROUND, "n": N, "sid": SID},
        )
        conn.execute(
            """
            UPDATE aidb_memory.session s
            SET next_seq = %(n)s + 1,
                total_chars = (SELECT sum(t.chars) FROM aidb_memory.turn t
                               WHERE t.session_ref = s.id),
                tail_round_start = %(n)s - (%(n)s - 1) %% %(round)s,
                tail_sequence_id = 'r' || (%(n)s - 1) / %(round)s
            WHERE s.session_id = %(sid)s
            """,
            {"round": ROUND, "n": N, "sid": SID},
        )
        conn.execute("ANALYZE aidb_memory.turn")
        conn.execute("ANALYZE aidb_memory.session")
    # One more turn through the API: it must continue the generated history seamlessly.
    db.sql(
        "SELECT aidb_memory.add(%s, 'actor', %s::jsonb, %s)",
        (NS, json.dumps([LAST]), SID),
        user=APP_USER,
    )
    return db


def _history() -> list[tuple[int, int, int, str]]:
    """(seq, round_start, chars, content) of the whole session, as built above plus LAST."""
    rows = [(g, g - (g - 1) % ROUND, _chars(g), _content(g)) for g in range(1, N + 1)]
    rows.append((N + 1, N + 1, len(LAST["content"]), LAST["content"]))
    return rows


def _expected(limit_chars: int | None, limit_turns: int | None) -> list[int]:
    """The seqs a read keeps: the longest suffix of whole rounds within both limits."""
    history = _history()
    best, chars = len(history), 0
    for i in range(len(history) - 1, -1, -1):
        seq, start, c, _ = history[i]
        chars += c
        if (limit_chars is not None and chars > limit_chars) or (
            limit_turns is not None and len(history) - i > limit_turns
        ):
            break
        if seq == start:
            best = i
    return [h[0] for h in history[best:]]


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _turn_scans(plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every plan node that reads aidb_memory.turn or one of its indexes."""
    return [
        n
        for p in plans
        for n in _nodes(p)
        if n.get("Relation Name") == "turn" or n.get("Index Name", "").startswith("turn_")
    ]


GET = "SELECT * FROM aidb_memory.session_get(%s, 'actor', %s, %s, NULL, %s)"


@pytest.mark.parametrize(
    ("limit_chars", "limit_turns", "max_rows"),
    [
        # ~100-char turns: an 8,000-char budget holds about 80 of them.
        (8_000, None, 8_000 // 90 + 2),
        (None, 30, 30),
        (50_000, 40, 40),
        (1_000, 200, 1_000 // 90 + 2),
    ],
)
def test_a_budgeted_read_range_scans_the_offset_index_within_the_budget(
    big: Database, limit_chars: int | None, limit_turns: int | None, max_rows: int
) -> None:
    with big.connect() as conn:
        plans, rows = nested_plans(conn, GET, (NS, SID, limit_chars, limit_turns))

    (items, overflow, compacted, warnings), *more = rows
    assert more == []
    expected = _expected(limit_chars, limit_turns)
    assert [i["seq"] for i in items] == expected
    history = {h[0]: h for h in _history()}
    assert [i["content"] for i in items] == [history[s][3] for s in expected]
    total = sum(h[2] for h in history.values())
    assert overflow == total - sum(history[s][2] for s in expected)
    assert compacted == 0
    assert warnings == (
        ["compaction_model_unavailable"] if limit_chars is not None and total > limit_chars else []
    )

    scans = _turn_scans(plans)
    assert scans, "auto_explain reported no plan touching aidb_memory.turn"
    assert not [n for n in scans if n["Node Type"] == "Seq Scan"], "a read scanned the session"
    # The window: an index scan (plain or bitmap) of turn_offset_idx bounded on char_offset.
    window = [n for n in scans if n.get("Index Name") == "turn_offset_idx"]
    assert window, [(n["Node Type"], n.get("Index Name")) for n in scans]
    for node in window:
        assert node["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Index Scan")
        assert re.search(r"\bchar_offset\b", node.get("Index Cond", "")), node.get("Index Cond")
    # No node touching turns reads more than the budget holds (50,000 turns are there).
    for node in scans:
        read = (
            node["Actual Rows"] * node["Actual Loops"]
            + node.get("Rows Removed by Filter", 0)
            + node.get("Rows Removed by Index Recheck", 0)
        )
        assert read <= max_rows, (node["Node Type"], node.get("Index Name"), read)


def test_the_generated_history_continues_through_the_api(big: Database) -> None:
    """The turn added through the API got the next position, offset and its own round."""
    row = big.sql(
        "SELECT t.seq, t.round_start, t.char_offset, s.next_seq, s.total_chars "
        "FROM aidb_memory.turn t JOIN aidb_memory.session s ON s.id = t.session_ref "
        "WHERE s.session_id = %s ORDER BY t.seq DESC LIMIT 1",
        (SID,),
    )
    before = sum(_chars(g) for g in range(1, N + 1))
    assert row == [(N + 1, N + 1, before, N + 2, before + 100)]
