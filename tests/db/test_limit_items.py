"""limit_items on session_get and session_messages (issue 11, item 5).

The newest N items as the caller counts them (one stored turn, one item), never more than N and
never a tool result without its call. A read may cut before a turn unless a tool result at or
after it belongs to a round that starts before it; when the kept items start inside a round
(or the newest round alone holds more than N items and nothing can be returned), the warning
``limit_items_round_split`` says so.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import APP_USER, Database

NS = "items"


@pytest.fixture
def app(db: Database) -> Iterator[psycopg.Connection[Any]]:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    with db.connect(APP_USER) as conn:
        yield conn


def _add(conn: psycopg.Connection[Any], turns: list[dict[str, Any]], session: str = "s") -> None:
    conn.execute(
        "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, %s)", (NS, json.dumps(turns), session)
    )


def _get(
    conn: psycopg.Connection[Any], session: str = "s", **limits: Any
) -> tuple[list[int | None], list[str], int]:
    args = "".join(f", {k} => %({k})s" for k in limits)
    row = conn.execute(
        f"SELECT items, warnings, overflow_chars FROM aidb_memory.session_get(%(ns)s, 'alice', "
        f"%(s)s{args})",
        {"ns": NS, "s": session, **limits},
    ).fetchone()
    assert row is not None
    return [i["seq"] for i in row[0]], row[1], row[2]


def _call(call_id: str, name: str = "lookup") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def _chat(n: int) -> list[dict[str, Any]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(n)
    ]


def test_plain_chat_gives_exactly_the_newest_n_items(app: psycopg.Connection[Any]) -> None:
    _add(app, _chat(9))
    for n in range(1, 12):
        seqs, warnings, _ = _get(app, limit_items=n)
        assert seqs == list(range(max(1, 10 - n), 10)), n
        assert warnings == []
    # session_messages counts the same items.
    for n in (1, 4, 9, 20):
        messages = app.execute(
            "SELECT aidb_memory.session_messages(%s, 'alice', 's', limit_items => %s)", (NS, n)
        ).fetchone()
        assert messages is not None
        assert len(messages[0]) == min(n, 9)
        assert messages[0][-1] == {"role": "user", "content": "message 8"}


def _tool_session(app: psycopg.Connection[Any]) -> None:
    # 1 user, 2 assistant with two parallel calls, 3-4 their results, 5 assistant, 6 user.
    _add(
        app,
        [
            {"role": "user", "content": "weather in Oslo and Rome?"},
            {"role": "assistant", "content": None, "tool_calls": [_call("c1"), _call("c2")]},
            {"role": "tool", "tool_call_id": "c1", "content": "Oslo: 3 C"},
            {"role": "tool", "tool_call_id": "c2", "content": "Rome: 17 C"},
            {"role": "assistant", "content": "Oslo 3 C, Rome 17 C."},
            {"role": "user", "content": "thanks"},
        ],
    )


def test_parallel_tool_calls_are_never_split_from_their_results(
    app: psycopg.Connection[Any],
) -> None:
    _tool_session(app)
    expected = {
        1: ([6], []),
        2: ([5, 6], []),
        # 3 and 4 would be results without their call: fewer items, cut where a round starts
        # (5 starts one), so no warning.
        3: ([5, 6], []),
        4: ([5, 6], []),
        5: ([2, 3, 4, 5, 6], []),
        6: ([1, 2, 3, 4, 5, 6], []),
        50: ([1, 2, 3, 4, 5, 6], []),
    }
    for n, (seqs, warnings) in expected.items():
        assert _get(app, limit_items=n)[:2] == (seqs, warnings), n
    # limit_turns keeps its meaning: whole rounds (the round 2..4 plus 5, 6 are separate rounds).
    assert _get(app, limit_turns=4)[0] == [5, 6]


def test_the_newest_round_larger_than_n(app: psycopg.Connection[Any]) -> None:
    # One round by sequence_id: a call, its result, a second call, its result, the answer.
    seq_id = {"sequence_id": "r1"}
    _add(
        app,
        [
            {"role": "user", "content": "plan a trip", "meta": seq_id},
            {"role": "assistant", "content": None, "tool_calls": [_call("a")], "meta": seq_id},
            {"role": "tool", "tool_call_id": "a", "content": "flights", "meta": seq_id},
            {"role": "assistant", "content": None, "tool_calls": [_call("b")], "meta": seq_id},
            {"role": "tool", "tool_call_id": "b", "content": "hotels", "meta": seq_id},
            {"role": "assistant", "content": "Here is the plan.", "meta": seq_id},
        ],
    )
    # The items after the round's last tool result.
    assert _get(app, limit_items=1)[:2] == ([6], ["limit_items_round_split"])
    # Never a cut before a call whose round started earlier and has a later tool result: 4..6
    # would leave result 5 in a round that starts at 1, so only what follows the last result.
    assert _get(app, limit_items=3)[:2] == ([6], ["limit_items_round_split"])
    assert _get(app, limit_items=2)[:2] == ([6], ["limit_items_round_split"])
    assert _get(app, limit_items=6)[:2] == ([1, 2, 3, 4, 5, 6], [])
    # limit_turns, whole rounds: nothing fits, and it says so.
    assert _get(app, limit_turns=5)[:2] == ([], ["newest_round_over_budget"])
    # A round that ends with a tool result whose answer is not there yet: nothing, with the
    # warning.
    _add(
        app,
        [
            {"role": "user", "content": "and a car?", "meta": {"sequence_id": "r2"}},
            {"role": "assistant", "content": None, "tool_calls": [_call("c")]},
            {"role": "tool", "tool_call_id": "c", "content": "cars"},
        ],
    )
    assert _get(app, limit_items=1)[:2] == ([], ["limit_items_round_split"])
    assert _get(app, limit_items=2)[:2] == ([8, 9], [])  # 8 starts a round (no sequence_id)
    assert _get(app, limit_items=3)[:2] == ([7, 8, 9], [])


def test_limit_items_with_limit_chars_the_tighter_wins(app: psycopg.Connection[Any]) -> None:
    # Over a char budget, a read would compact; with no model it says why there is no summary.
    too_small = "compaction_budget_too_small"
    _add(
        app,
        [{"role": "user" if i % 2 == 0 else "assistant", "content": "x" * 10} for i in range(6)],
    )
    assert _get(app, limit_items=4, limit_chars=1000)[:2] == ([3, 4, 5, 6], [])
    assert _get(app, limit_items=4, limit_chars=25)[:2] == ([5, 6], [too_small])
    assert _get(app, limit_items=2, limit_chars=30) == ([5, 6], [too_small], 40)
    # The newest item alone over the char budget.
    assert _get(app, limit_items=3, limit_chars=5)[:2] == (
        [],
        [too_small, "newest_round_over_budget"],
    )
    # With limit_items, limit_chars cuts by items too: 5 chars of a tool round.
    _add(
        app,
        [
            {"role": "assistant", "content": "y" * 10, "tool_calls": [_call("t")]},
            {"role": "tool", "tool_call_id": "t", "content": "z" * 10},
            {"role": "assistant", "content": "y" * 10},
            {"role": "user", "content": "x" * 10},
        ],
    )
    # 7 and its result 8 are one round; 9 and 10 each start one.
    seqs, warnings, _ = _get(app, limit_chars=20, limit_items=10)
    assert (seqs, warnings) == ([9, 10], [too_small])
    seqs, warnings, _ = _get(app, limit_chars=45, limit_items=10)
    assert (seqs, warnings) == ([7, 8, 9, 10], [too_small])
    # 7 alone has 10 chars of content plus its call's arguments: 45 does not reach it.
    seqs, warnings, _ = _get(app, limit_chars=45 - 5, limit_items=10)
    assert (seqs, warnings) == ([9, 10], [too_small])


@pytest.mark.parametrize("value", [0, -1, 1_000_001])
def test_bad_limit_items_is_22023(app: psycopg.Connection[Any], value: int) -> None:
    _add(app, _chat(2))
    for fn in ("session_get", "session_messages"):
        with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
            app.execute(
                f"SELECT * FROM aidb_memory.{fn}(%s, 'alice', 's', limit_items => %s)", (NS, value)
            )
        assert str(info.value).startswith(f"aidb_memory.{fn}: limit_items must be between 1")


def test_pending_tool_calls_and_unknown_sessions(app: psycopg.Connection[Any]) -> None:
    assert _get(app, "nope", limit_items=3) == ([], [], 0)
    _add(app, _chat(2))
    _add(app, [{"role": "assistant", "content": None, "tool_calls": [_call("p")]}])
    assert _get(app, limit_items=5)[:2] == ([1, 2], ["tool_results_pending"])


# --- the rule against a brute force, on random sessions ------------------------------------------

_calls = itertools.count()


@st.composite
def _rounds(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Random protocol-valid turns: plain turns, parallel tool calls, sequence_id groups."""
    turns: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 8))):
        meta = draw(st.sampled_from([None, None, "a", "b"]))
        extra = {} if meta is None else {"meta": {"sequence_id": meta}}
        kind = draw(st.sampled_from(["user", "assistant", "system", "tools"]))
        if kind != "tools":
            turns.append({"role": kind, "content": "x" * draw(st.integers(1, 30)), **extra})
            continue
        ids = [f"c{next(_calls)}" for _ in range(draw(st.integers(1, 3)))]
        turns.append(
            {"role": "assistant", "content": None, "tool_calls": [_call(i) for i in ids], **extra}
        )
        for i in draw(st.permutations(ids)):
            turns.append(
                {"role": "tool", "tool_call_id": i, "content": "r" * draw(st.integers(0, 9)) or "r"}
            )
    return turns


def _brute_force(rows: list[tuple[int, int, str]], n: int) -> tuple[list[int], bool]:
    """The oldest cut among the newest ``n`` turns before which no later tool result belongs to
    a round that starts earlier; whether the kept turns start inside a round (or none is kept
    though there were some)."""
    for start in range(max(0, len(rows) - n), len(rows)):
        seq = rows[start][0]
        if all(rs >= seq for s, rs, role in rows[start:] if role == "tool"):
            return [r[0] for r in rows[start:]], rows[start][1] != seq
    return [], bool(rows)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(turns=_rounds(), data=st.data())
def test_limit_items_matches_the_rule_on_random_sessions(
    db: Database, app: psycopg.Connection[Any], turns: list[dict[str, Any]], data: st.DataObject
) -> None:
    session = f"p{next(_calls)}"
    _add(app, turns, session)
    rows = [
        (int(seq), int(rs), role)
        for seq, rs, role in db.sql(
            "SELECT t.seq, t.round_start, t.role FROM aidb_memory.turn t "
            "JOIN aidb_memory.session s ON s.id = t.session_ref WHERE s.session_id = %s "
            "ORDER BY t.seq",
            (session,),
        )
    ]
    n = data.draw(st.integers(1, len(rows) + 1))
    seqs, warnings, _ = _get(app, session, limit_items=n)
    expected, split = _brute_force(rows, n)
    assert seqs == expected
    assert len(seqs) <= n
    assert warnings == (["limit_items_round_split"] if split else [])
