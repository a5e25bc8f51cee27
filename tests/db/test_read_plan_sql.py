"""The plan of a common read without Python (sql/30_sessions.sql, issue 33).

session_get and session_messages run the block of aidb_memory.session_read_plan_sql and call
aidb_memory.session_read_plan (PL/Python) only when it planned nothing. Here both are called
directly (as their owner) on random histories (plain exchanges, tool rounds, system turns, open
tool calls, summaries) and random budgets: wherever the SQL block plans, its plan must be the
Python one, column for column; it must plan every read it is meant for (an existing session, no
open tool calls, no limit_items, no pinned turns under a budget, valid budgets, plain
identifiers), and leave every other read, the invalid ones included, to the Python code.
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

from aidb_memory_server import budget, compaction, validation
from conftest import Database

PLAIN, PINNED, MODEL, SMALL = "rp_plain", "rp_pinned", "rp_model", "rp_small"
SQL_PLAN = "SELECT aidb_memory.session_read_plan_sql(%s, %s, %s, %s, %s, %s, %s)"
PY_PLAN = (
    "SELECT to_jsonb(p) FROM aidb_memory.session_read_plan(%s, %s, %s, %s, %s, %s, %s, "
    "'session_get') AS p"
)
_ids = itertools.count()


def _call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}


TEXT = st.integers(1, 600).map(lambda n: "x" * n)
EXCHANGE = st.tuples(TEXT, TEXT).map(
    lambda p: [{"role": "user", "content": p[0]}, {"role": "assistant", "content": p[1]}]
)
TOOL_ROUND = st.tuples(TEXT, TEXT, st.integers(1, 3)).map(
    lambda p: [
        {"role": "user", "content": p[0]},
        {"role": "assistant", "content": None, "tool_calls": [_call(f"c{i}") for i in range(p[2])]},
        *({"role": "tool", "tool_call_id": f"c{i}", "content": p[1]} for i in range(p[2])),
        {"role": "assistant", "content": "done"},
    ]
)
SYSTEM = TEXT.map(lambda t: [{"role": "system", "content": t}])
HISTORY = st.lists(st.one_of(EXCHANGE, EXCHANGE, TOOL_ROUND, SYSTEM), min_size=0, max_size=10)
# A read: limit_chars, limit_turns, limit_items, fallback_model (invalid budgets among them).
READ = st.tuples(
    st.sampled_from([None, None, 0, 1, 150, 900, 2_000, 2_000, 8_000, budget.BUDGET_MAX + 1]),
    st.sampled_from([None, None, None, 0, 1, 2, 5, 20, budget.TURNS_MAX + 1]),
    st.sampled_from([None, None, None, None, 3]),
    st.sampled_from([None, "fallback"]),
)


@pytest.fixture
def namespaces(db: Database) -> Database:
    opts = {"model": "fake-chat", "base_url": "http://127.0.0.1:9/v1", "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('m', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql("SELECT aidb_memory.init(%s)", (PLAIN,))
    db.sql("SELECT aidb_memory.init(%s, '{}', '{\"pin_instructions\": true}')", (PINNED,))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "m"}\')', (MODEL,))
    db.sql(
        "SELECT aidb_memory.init(%s, '{}', '{\"compaction_min_target_chars\": 500, "
        '"max_identifier_chars": 12}\')',
        (SMALL,),
    )
    return db


def _summarize(conn: psycopg.Connection[Any], ref: int, key: int, ends: list[int]) -> None:
    """Summaries of the history up to each of ``ends`` (seqs that end a round), as a
    compaction leaves them: consecutive, with the turns' char offsets."""
    offsets = dict(
        conn.execute(
            "SELECT seq, char_offset + chars FROM aidb_memory.turn WHERE session_ref = %s", (ref,)
        ).fetchall()
    )
    start, start_offset = 1, 0
    for end in ends:
        conn.execute(
            """INSERT INTO aidb_memory.summary
                   (actor_key, session_ref, from_seq, to_seq, turn_count, content, chars, model,
                    from_offset, to_offset)
               VALUES (%s, %s, %s, %s, %s, %s, %s, 'm', %s, %s)""",
            (
                key,
                ref,
                start,
                end,
                end - start + 1,
                "s" * (end * 37 % 300 + 1),
                end * 37 % 300 + 1,
                start_offset,
                offsets[end],
            ),
        )
        start, start_offset = end + 1, offsets[end]


def _expected_sql(ns: str, actor: str, session: str, row: Any, read: tuple[Any, ...]) -> bool:
    """Whether the SQL block is meant to plan this read."""
    limit_chars, limit_turns, limit_items, _ = read
    plain_id = re.compile(r"[!-~]")
    return (
        row is not None
        and not row["open_calls"]
        and limit_items is None
        and (limit_chars is None or 1 <= limit_chars <= budget.BUDGET_MAX)
        and (limit_turns is None or 1 <= limit_turns <= budget.TURNS_MAX)
        and all(
            plain_id.search(v) and len(v) <= (12 if ns == SMALL else 255) for v in (actor, session)
        )
        and not (
            ns == PINNED
            and row["pinned_seq"] > 0
            and (limit_chars is not None or limit_turns is not None)
        )
    )


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ns=st.sampled_from([PLAIN, PINNED, MODEL, SMALL]),
    actor=st.sampled_from(["alice", "alice", "zoë", "中文", "a-rather-long-actor"]),
    history=HISTORY,
    open_call=st.booleans(),
    summaries=st.integers(0, 3),
    reads=st.lists(READ, min_size=1, max_size=8),
)
def test_the_sql_plan_is_the_python_plan(
    namespaces: Database,
    ns: str,
    actor: str,
    history: list[list[dict[str, Any]]],
    open_call: bool,
    summaries: int,
    reads: list[tuple[Any, ...]],
) -> None:
    db = namespaces
    session = f"s{next(_ids)}"
    with db.connect() as conn:
        started = True
        try:
            conn.execute("SELECT aidb_memory.session_start(%s, %s, NULL, %s)", (ns, actor, session))
        except psycopg.errors.InvalidParameterValue:  # an actor over SMALL's identifier cap
            started = False
        if started:
            for turns in history:
                conn.execute(
                    "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s)",
                    (ns, actor, json.dumps(turns), session),
                )
            ref_key = conn.execute(
                "SELECT id, actor_key, tail_round_start FROM aidb_memory.session "
                "WHERE session_id = %s",
                (session,),
            ).fetchone()
            assert ref_key is not None
            ref, key, tail = ref_key
            # Round ends before the newest round: what a summary may cover.
            starts = [
                r[0]
                for r in conn.execute(
                    "SELECT DISTINCT round_start FROM aidb_memory.turn "
                    "WHERE session_ref = %s AND round_start > 1 AND round_start < %s "
                    "ORDER BY 1",
                    (ref, tail),
                )
            ]
            _summarize(conn, ref, key, [s - 1 for s in starts][:summaries])
            if open_call:
                conn.execute(
                    "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s)",
                    (
                        ns,
                        actor,
                        json.dumps(
                            [{"role": "assistant", "content": None, "tool_calls": [_call("open")]}]
                        ),
                        session,
                    ),
                )
        with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
            row = cur.execute(
                "SELECT open_calls, pinned_seq FROM aidb_memory.session WHERE session_id = %s",
                (session,),
            ).fetchone()
        for read in reads:
            for sid in (session, "no-such-session"):
                args = (ns, actor, sid, read[0], read[3], read[1], read[2])
                [[fast]] = conn.execute(SQL_PLAN, args).fetchall()
                try:
                    [[slow]] = conn.execute(PY_PLAN, args).fetchall()
                except psycopg.errors.InvalidParameterValue:
                    assert fast is None, (read, fast)
                    continue
                expected = _expected_sql(ns, actor, sid, row if sid == session else None, read)
                assert (fast is not None) == expected, (read, fast, slow)
                if fast is not None:
                    assert fast == slow, read


def _exchanges(n: int, size: int = 500) -> list[list[dict[str, Any]]]:
    return [
        [{"role": "user", "content": "u" * size}, {"role": "assistant", "content": "a" * size}]
        for _ in range(n)
    ]


def _branch(
    ns: str,
    batches: list[list[dict[str, Any]]],
    ends: list[int],
    limit_chars: int | None = None,
    fallback: str | None = None,
    limit_turns: int | None = None,
    **shows: Any,
) -> tuple[Any, ...]:
    return ns, batches, ends, limit_chars, fallback, limit_turns, shows


# Each branch of the plan, held by a history made for it: the namespace, the batches, the seqs
# the summaries end at, the read, and what the plan must show.
BRANCHES = {
    "compact with the namespace's model": _branch(
        MODEL, _exchanges(6), [], 2_000, compact=True, warnings=[]
    ),
    "compact with the fallback model": _branch(PLAIN, _exchanges(6), [], 2_000, "fb", compact=True),
    "no model": _branch(
        PLAIN, _exchanges(6), [], 2_000, compact=False, warnings=["compaction_model_unavailable"]
    ),
    "budget too small": _branch(
        SMALL, _exchanges(6), [], 1_000, warnings=["compaction_budget_too_small"]
    ),
    "one round over budget": _branch(
        MODEL,
        [[{"role": "user", "content": "u" * 3_000}]],
        [],
        2_000,
        warnings=["newest_round_over_budget"],
        empty_warning=None,
    ),
    "summaries fit beside the turns": _branch(
        PLAIN, _exchanges(6), [4, 8], 8_000, summary_seq=8, lo_seq=9
    ),
    "catching up": _branch(PLAIN, _exchanges(6, 300), [2, 4], 1_400, lo_seq=0, compact=False),
    "last turns of a summarized history": _branch(
        MODEL, _exchanges(6), [4], 8_000, None, 3, summary_room=-1, lo_seq=10
    ),
    "last turns, no budget": _branch(
        PLAIN, _exchanges(6), [4], None, None, 20, summary_room=-1, lo_seq=1
    ),
    "exactly the budget": _branch(
        PLAIN, _exchanges(6), [], 6_000, summary_room=0, lo_seq=1, warnings=[]
    ),
    "pinned turns, no budget": _branch(
        PINNED, [[{"role": "system", "content": "be brief"}], *_exchanges(2)], [], pin_seq=0
    ),
}


@pytest.mark.parametrize("branch", BRANCHES)
def test_each_branch_of_the_plan(namespaces: Database, branch: str) -> None:
    ns, batches, ends, limit_chars, fallback, limit_turns, shows = BRANCHES[branch]
    with namespaces.connect() as conn:
        conn.execute("SELECT aidb_memory.session_start(%s, 'alice', NULL, 's')", (ns,))
        for turns in batches:
            conn.execute(
                "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's')", (ns, json.dumps(turns))
            )
        row = conn.execute("SELECT id, actor_key FROM aidb_memory.session").fetchone()
        assert row is not None
        _summarize(conn, row[0], row[1], ends)
        args = (ns, "alice", "s", limit_chars, fallback, limit_turns, None)
        [[fast]] = conn.execute(SQL_PLAN, args).fetchall()
        [[slow]] = conn.execute(PY_PLAN, args).fetchall()
    assert fast == slow
    assert {k: fast[k] for k in shows} == shows


SYSTEM_FIRST = [[{"role": "system", "content": "be brief"}], *_exchanges(3)]
OPEN = [*_exchanges(2), [{"role": "assistant", "content": None, "tool_calls": [_call("x")]}]]
# Reads the SQL block leaves to session_read_plan: (namespace, actor, batches, limit_chars,
# limit_turns, limit_items).
LEFT = {
    "pinned turns under a budget": (PINNED, "alice", SYSTEM_FIRST, 2_000, None, None),
    "pinned turns under a turn limit": (PINNED, "alice", SYSTEM_FIRST, None, 2, None),
    "open tool calls": (PLAIN, "alice", OPEN, 2_000, None, None),
    "limit_items": (PLAIN, "alice", _exchanges(3), None, None, 2),
    "an actor with no ASCII character": (PLAIN, "中文", _exchanges(3), None, None, None),
    "an actor over the namespace's cap": (SMALL, "abcdefghijkl", _exchanges(3), None, 2, None),
}


@pytest.mark.parametrize("case", LEFT)
def test_reads_left_to_the_python_plan(namespaces: Database, case: str) -> None:
    ns, actor, batches, limit_chars, limit_turns, limit_items = LEFT[case]
    with namespaces.connect() as conn:
        conn.execute("SELECT aidb_memory.session_start(%s, %s, NULL, 's')", (ns, actor))
        for turns in batches:
            conn.execute(
                "SELECT aidb_memory.add(%s, %s, %s::jsonb, 's')", (ns, actor, json.dumps(turns))
            )
        if ns == SMALL:  # the cap lowered under an existing actor's id
            conn.execute(
                "UPDATE aidb_memory.namespace "
                "SET config = config || '{\"max_identifier_chars\": 11}' WHERE name = %s",
                (SMALL,),
            )
        args = (ns, actor, "s", limit_chars, None, limit_turns, limit_items)
        [[fast]] = conn.execute(SQL_PLAN, args).fetchall()
        # The same read one step inside the SQL block's reach is planned by it.
        plain = (PLAIN, "alice", "near", limit_chars, None, limit_turns, None)
        conn.execute("SELECT aidb_memory.session_start(%s, 'alice', NULL, 'near')", (PLAIN,))
        conn.execute(
            "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 'near')",
            (PLAIN, json.dumps(_exchanges(1)[0])),
        )
        [[near]] = conn.execute(SQL_PLAN, plain).fetchall()
    assert fast is None
    assert near is not None


def test_the_constants_are_the_python_ones() -> None:
    """The SQL block writes out budget's bounds, compaction's divisor and the config defaults
    it reads."""
    text = (Path(__file__).parents[2] / "sql" / "30_sessions.sql").read_text()
    block = text[text.index("-- BEGIN fast_read_plan") : text.index("-- END fast_read_plan")]
    assert f"BETWEEN 1 AND {budget.BUDGET_MAX}" in block
    assert f"BETWEEN 1 AND {budget.TURNS_MAX}" in block
    assert block.count(f"$4 / {compaction.TARGET_DIVISOR}") == 2
    defaults = dict(
        re.findall(r"coalesce\(\(?n\.config->>'(\w+)'\)?(?:::\w+)?, '?(\w+)'?\)", block)
    )
    assert defaults == {
        k: str(validation.CONFIG_DEFAULTS[k]).lower()
        for k in (
            "compaction_min_target_chars",
            "max_identifier_chars",
            "actor_binding",
            "pin_instructions",
        )
    }
