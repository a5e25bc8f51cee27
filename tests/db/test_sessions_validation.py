"""Malformed input to the session API (SPEC §1, §3), through the real SQL functions.

Every refused call must carry its documented SQLSTATE and a one-line message that starts with the
function's name and names the offending field (for turns: index and field), and must store
nothing: no session row from a failed first add, no event, no turn, no change to the session.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from aidb_memory.throwaway import ThrowawayServer
from conftest import APP_USER, Database, _create_database, _drop_database

NS = "val"
CONFIG = {"max_turn_chars": 100, "max_turns_per_add": 4, "max_identifier_chars": 16}
HISTORY = "history"  # an existing session, set up once, that no failed add may change


def _call(call_id: str = "c1", arguments: str = "{}", name: str = "f") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _user(content: Any = "hi", **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": content, **extra}


@pytest.fixture(scope="module")
def vdb(pg_server: ThrowawayServer, template_db: Database) -> Iterator[Database]:
    """One database for the whole module: every case checks that it stored nothing."""
    database = _create_database(pg_server, template_db.name)
    try:
        database.sql("SELECT aidb_memory.init(%s, '{}', %s::jsonb)", (NS, json.dumps(CONFIG)))
        database.sql(
            "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, %s)",
            (
                NS,
                json.dumps(
                    [
                        _user("first", meta={"sequence_id": "s1"}),
                        {"role": "assistant", "content": "ok", "meta": {"sequence_id": "s1"}},
                    ]
                ),
                HISTORY,
            ),
            user=APP_USER,
        )
        yield database
    finally:
        _drop_database(database)


@pytest.fixture(scope="module")
def app(vdb: Database) -> Iterator[psycopg.Connection[Any]]:
    """The API role's connection that every refused call goes through."""
    with vdb.connect(APP_USER) as conn:
        yield conn


def _everything(db: Database) -> list[Any]:
    """All that sessions and events store, in a comparable form."""
    return [
        db.sql("SELECT to_jsonb(s) FROM aidb_memory.session s ORDER BY id"),
        db.sql("SELECT to_jsonb(e) FROM aidb_memory.event e ORDER BY id"),
        db.sql("SELECT to_jsonb(t) FROM aidb_memory.turn t ORDER BY session_ref, seq"),
    ]


def _refused(db: Database, conn: psycopg.Connection[Any], query: str, params: Any) -> psycopg.Error:
    """Run ``query``, expect an error, and check that nothing at all was stored."""
    before = _everything(db)
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    assert _everything(db) == before, "a refused call stored something"
    return info.value


def _check(error: psycopg.Error, sqlstate: str, prefix: str, problem: str = "") -> None:
    primary = error.diag.message_primary or ""
    assert error.sqlstate == sqlstate, (error.sqlstate, primary)
    assert primary.startswith(prefix), primary
    assert problem in primary, primary
    assert "\n" not in primary and "Traceback" not in primary
    assert "Traceback" not in (error.diag.message_detail or "")
    assert "Traceback" not in (error.diag.message_hint or "")


ADD = "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s, %s, %s)"
MODES = ["new_session", "existing_session", "no_session", "with_key"]


def _add(
    db: Database,
    conn: psycopg.Connection[Any],
    turns_text: str | None,
    mode: str,
    *,
    namespace: str | None = NS,
    actor: str | None = "alice",
) -> psycopg.Error:
    session = {"new_session": "fresh", "existing_session": HISTORY}.get(mode)
    key = "k-refused" if mode == "with_key" else None
    return _refused(db, conn, ADD, (namespace, actor, turns_text, session, None, key))


# --- every rule of the turn shape ---------------------------------------------------------------

LONG_ID = "x" * 17
SHAPE_CASES: list[tuple[str, list[Any], str, str]] = [
    ("not an object", [_user(), "hi"], "turns[1]", "must be an object"),
    ("missing role", [_user(), {"content": "x"}], "turns[1].role", "is required"),
    ("null role", [{"role": None, "content": "x"}], "turns[0].role", "is required"),
    ("bad role", [_user(), {"role": "bot", "content": "x"}], "turns[1].role", "must be one of"),
    ("role not a string", [{"role": 1, "content": "x"}], "turns[0].role", "must be one of"),
    ("unknown turn key", [_user(), {"role": "user", "contnet": "x"}], "turns[1].contnet", "known"),
    ("content missing", [_user(), {"role": "user"}], "turns[1].content", "is required"),
    ("user content empty", [_user("")], "turns[0].content", "is required"),
    ("user content null", [_user(None)], "turns[0].content", "is required"),
    ("system content empty", [{"role": "system", "content": ""}], "turns[0].content", "required"),
    (
        "tool content empty",
        [{"role": "assistant", "tool_calls": [_call()]}, {"role": "tool", "tool_call_id": "c1"}],
        "turns[1].content",
        "is required",
    ),
    ("assistant content null", [{"role": "assistant"}], "turns[0].content", "is required"),
    (
        "assistant content empty",
        [{"role": "assistant", "content": ""}],
        "turns[0].content",
        "is required",
    ),
    ("content a number", [_user(5)], "turns[0].content", "must be a string"),
    (
        "content part without text",
        [_user([{"type": "text"}])],
        "turns[0].content[0].text",
        "must be a string",
    ),
    (
        "tool_calls on user",
        [_user(tool_calls=[_call()])],
        "turns[0].tool_calls",
        "only on an assistant turn",
    ),
    (
        "tool_calls on system",
        [{"role": "system", "content": "x", "tool_calls": [_call()]}],
        "turns[0].tool_calls",
        "only on an assistant turn",
    ),
    (
        "tool_calls not an array",
        [{"role": "assistant", "tool_calls": _call()}],
        "turns[0].tool_calls",
        "non-empty array",
    ),
    (
        "tool_calls empty",
        [{"role": "assistant", "content": "x", "tool_calls": []}],
        "turns[0].tool_calls",
        "non-empty array",
    ),
    (
        "tool call id a number",
        [{"role": "assistant", "tool_calls": [{**_call(), "id": 3}]}],
        "turns[0].tool_calls[0].id",
        "must be a string",
    ),
    (
        "tool call id empty",
        [{"role": "assistant", "tool_calls": [_call(), {**_call(), "id": " "}]}],
        "turns[0].tool_calls[1].id",
        "must not be empty",
    ),
    (
        "tool call id too long",
        [{"role": "assistant", "tool_calls": [_call(LONG_ID)]}],
        "turns[0].tool_calls[0].id",
        "longer than 16",
    ),
    (
        "tool call type",
        [{"role": "assistant", "tool_calls": [{**_call(), "type": "code"}]}],
        "turns[0].tool_calls[0].type",
        'must be "function"',
    ),
    (
        "unknown tool call key",
        [{"role": "assistant", "tool_calls": [{**_call(), "index": 0}]}],
        "turns[0].tool_calls[0].index",
        "is not a known key",
    ),
    (
        "unknown function key",
        [{"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "a": ""}}]}],
        "turns[0].tool_calls[0].function.a",
        "is not a known key",
    ),
    (
        "function missing",
        [{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]}],
        "turns[0].tool_calls[0].function",
        "must be an object",
    ),
    (
        "arguments an object",
        [
            {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {}}}],
            }
        ],
        "turns[0].tool_calls[0].function.arguments",
        "must be a string",
    ),
    (
        "tool_call_id missing",
        [{"role": "assistant", "tool_calls": [_call()]}, {"role": "tool", "content": "x"}],
        "turns[1].tool_call_id",
        "is required",
    ),
    (
        "tool_call_id on assistant",
        [{"role": "assistant", "content": "x", "tool_call_id": "c1"}],
        "turns[0].tool_call_id",
        "only on a tool turn",
    ),
    (
        "tool result with no call",
        [_user(), {"role": "tool", "content": "x", "tool_call_id": "c1"}],
        "turns[1].tool_call_id",
        "does not answer an open tool call",
    ),
    (
        "tool result for another call",
        [
            {"role": "assistant", "tool_calls": [_call("a")]},
            {"role": "tool", "content": "x", "tool_call_id": "b"},
        ],
        "turns[1].tool_call_id",
        '"b" does not answer an open tool call',
    ),
    (
        "tool result twice",
        [
            {"role": "assistant", "tool_calls": [_call("a"), _call("b")]},
            {"role": "tool", "content": "x", "tool_call_id": "a"},
            {"role": "tool", "content": "x", "tool_call_id": "a"},
        ],
        "turns[2].tool_call_id",
        "does not answer an open tool call",
    ),
    (
        "user before results",
        [
            {"role": "assistant", "tool_calls": [_call("a"), _call("b")]},
            {"role": "tool", "content": "x", "tool_call_id": "a"},
            _user(),
        ],
        "turns[2]",
        'comes before tool call "b" has its result',
    ),
    (
        "duplicate call ids",
        [_user(), {"role": "assistant", "tool_calls": [_call("a"), _call("a")]}],
        "turns[1].tool_calls",
        "two calls with the same id",
    ),
    ("kind summary", [_user(kind="summary")], "turns[0].kind", "reserved"),
    ("meta an array", [_user(meta=["s"])], "turns[0].meta", "must be an object"),
    ("meta a string", [_user(meta="s")], "turns[0].meta", "must be an object"),
    (
        "sequence_id a float",
        [_user(meta={"sequence_id": 1.5})],
        "turns[0].meta.sequence_id",
        "must be a string or an integer",
    ),
    (
        "sequence_id an object",
        [_user(), _user(meta={"sequence_id": {}})],
        "turns[1].meta.sequence_id",
        "must be a string or an integer",
    ),
    ("name too long", [_user(name=LONG_ID)], "turns[0].name", "longer than 16 characters"),
    (
        "sequence_id too long",
        [_user(meta={"sequence_id": LONG_ID})],
        "turns[0].meta.sequence_id",
        "longer than 16 characters",
    ),
    ("content too long", [_user(), _user("é" * 101)], "turns[1].content", "longer than 100"),
    (
        "too long with arguments",
        [{"role": "assistant", "content": "x" * 50, "tool_calls": [_call("a", "y" * 51)]}],
        "turns[0].tool_calls",
        "101 characters",
    ),
    ("too many turns", [_user()] * 5, "turns", "has 5 turns, more than the namespace limit of 4"),
    ("empty array", [], "turns", "at least one turn"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("turns", "field", "problem"),
    [pytest.param(t, f, p, id=name) for name, t, f, p in SHAPE_CASES],
)
def test_malformed_turns_are_22023_naming_turn_and_field(
    vdb: Database,
    app: psycopg.Connection[Any],
    turns: list[Any],
    field: str,
    problem: str,
    mode: str,
) -> None:
    error = _add(vdb, app, json.dumps(turns), mode)
    _check(error, "22023", f"aidb_memory.add: {field} ", problem)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"role": "user", "content": "x"}', "must be a JSON array of turns, not an object"),
        ('"hi"', "not a string"),
        ("3", "not a number"),
        ("null", "not null"),
    ],
)
@pytest.mark.parametrize("mode", MODES)
def test_turns_that_are_not_an_array_are_22023(
    vdb: Database, app: psycopg.Connection[Any], text: str, problem: str, mode: str
) -> None:
    _check(_add(vdb, app, text, mode), "22023", "aidb_memory.add: turns ", problem)


def test_the_limits_are_the_namespace_config(vdb: Database, app: psycopg.Connection[Any]) -> None:
    """At the limit is accepted, one past it refused: the numbers come from the config."""
    at_limit = [
        _user("é" * 100),
        _user(meta={"sequence_id": "s" * 16}),
        _user(name="n" * 16),
        {"role": "assistant", "content": "x" * 50, "tool_calls": [_call("i" * 16, "y" * 50)]},
    ]
    app.execute(ADD, (NS, "alice", json.dumps(at_limit), "limits", None, None))
    assert vdb.value("SELECT next_seq FROM aidb_memory.session WHERE session_id = 'limits'") == 5
    error = _add(vdb, app, json.dumps([_user("é" * 101)]), "existing_session")
    _check(error, "22023", "aidb_memory.add: turns[0].content ", "longer than 100 characters")
    assert error.diag.message_hint is None or "max_turn_chars" in error.diag.message_hint


# --- protocol across adds -----------------------------------------------------------------------


def test_protocol_holds_across_adds(vdb: Database, app: psycopg.Connection[Any]) -> None:
    sid = "protocol"
    app.execute(
        ADD,
        (
            NS,
            "alice",
            json.dumps([_user(), {"role": "assistant", "tool_calls": [_call("a"), _call("b")]}]),
            sid,
            None,
            None,
        ),
    )
    before = vdb.sql("SELECT to_jsonb(s) FROM aidb_memory.session s WHERE session_id = %s", (sid,))
    cases = [
        ([_user()], "turns[0]", 'comes before tool call "a" has its result'),
        (
            [{"role": "tool", "content": "x", "tool_call_id": "a"}, _user()],
            "turns[1]",
            'comes before tool call "b"',
        ),
        (
            [{"role": "tool", "content": "x", "tool_call_id": "z"}],
            "turns[0].tool_call_id",
            '"z" does not answer an open tool call',
        ),
        (
            [{"role": "assistant", "tool_calls": [_call("c")]}],
            "turns[0]",
            'comes before tool call "a"',
        ),
    ]
    for turns, field, problem in cases:
        error = _refused(vdb, app, ADD, (NS, "alice", json.dumps(turns), sid, None, None))
        _check(error, "22023", f"aidb_memory.add: {field} ", problem)
    assert (
        vdb.sql("SELECT to_jsonb(s) FROM aidb_memory.session s WHERE session_id = %s", (sid,))
        == before
    )
    # The session accepts its results, in any order and across adds, and then anything.
    for turns in (
        [{"role": "tool", "content": "B", "tool_call_id": "b"}],
        [{"role": "tool", "content": "A", "tool_call_id": "a"}, _user("next")],
    ):
        app.execute(ADD, (NS, "alice", json.dumps(turns), sid, None, None))
    # A result for a call that was answered in an earlier add is refused.
    error = _refused(
        vdb,
        app,
        ADD,
        (
            NS,
            "alice",
            json.dumps([{"role": "tool", "content": "x", "tool_call_id": "a"}]),
            sid,
            None,
            None,
        ),
    )
    _check(error, "22023", "aidb_memory.add: turns[0].tool_call_id ", "does not answer")
    items = app.execute(
        "SELECT items FROM aidb_memory.session_get(%s, 'alice', %s)", (NS, sid)
    ).fetchone()
    assert items is not None
    assert [(i["seq"], i["role"], i.get("tool_call_id")) for i in items[0]] == [
        (1, "user", None),
        (2, "assistant", None),
        (3, "tool", "b"),
        (4, "tool", "a"),
        (5, "user", None),
    ]


def test_accepted_edge_shapes_are_stored_as_sent(
    vdb: Database, app: psycopg.Connection[Any]
) -> None:
    sid = "edges"
    batch = [
        {"role": "system", "content": "be brief", "name": "setup"},
        {"role": "assistant", "content": None, "tool_calls": [_call("a", '{"q": 1}')]},
        {"role": "tool", "content": "r", "tool_call_id": "a", "name": "f"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "b", "function": {"name": "g"}}],
        },
    ]
    app.execute(ADD, (NS, "alice", json.dumps(batch), sid, None, None))
    app.execute(
        ADD,
        (
            NS,
            "alice",
            json.dumps(
                [
                    {"role": "tool", "content": "s", "tool_call_id": "b"},
                    _user("x", kind="note", meta={"sequence_id": 9, "extra": [1]}),
                ]
            ),
            sid,
            None,
            None,
        ),
    )
    row = app.execute(
        "SELECT items, overflow_chars, warnings FROM aidb_memory.session_get(%s, 'alice', %s)",
        (NS, sid),
    ).fetchone()
    assert row is not None
    items = row[0]
    assert [{k: v for k, v in i.items() if k != "created_at"} for i in items] == [
        {
            "seq": 1,
            "role": "system",
            "content": "be brief",
            "kind": "system",
            "meta": {},
            "name": "setup",
        },
        {
            "seq": 2,
            "role": "assistant",
            "content": None,
            "kind": "tool_call",
            "meta": {},
            "tool_calls": [_call("a", '{"q": 1}')],
        },
        {
            "seq": 3,
            "role": "tool",
            "content": "r",
            "kind": "tool_result",
            "meta": {},
            "tool_call_id": "a",
            "name": "f",
            # A tool message's name is not in what session_messages renders from the columns:
            # the message is kept as it came (issue 11).
            "item": batch[2],
            "format": "chat",
        },
        {
            "seq": 4,
            "role": "assistant",
            "content": "",
            "kind": "tool_call",
            "meta": {},
            "tool_calls": [
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": ""}}
            ],
            # The call as sent, without its defaults (type, arguments).
            "item": batch[3],
            "format": "chat",
        },
        {
            "seq": 5,
            "role": "tool",
            "content": "s",
            "kind": "tool_result",
            "meta": {},
            "tool_call_id": "b",
        },
        {
            "seq": 6,
            "role": "user",
            "content": "x",
            "kind": "note",
            "meta": {"sequence_id": 9, "extra": [1]},
        },
    ]
    assert row[1:] == (0, [])
    chars = vdb.sql(
        "SELECT t.chars, t.char_offset FROM aidb_memory.turn t JOIN aidb_memory.session s "
        "ON s.id = t.session_ref WHERE s.session_id = %s ORDER BY t.seq",
        (sid,),
    )
    assert chars == [(8, 0), (8, 8), (1, 16), (0, 17), (1, 17), (1, 18)]


# --- arguments ---------------------------------------------------------------------------------

GOOD = json.dumps([_user()])


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ((None, "alice", GOOD, "s", None, None), "namespace"),
        ((NS, None, GOOD, "s", None, None), "actor_id"),
        ((NS, "alice", None, "s", None, None), "turns"),
        ((NS, "alice", None, None, None, None), "turns"),
    ],
)
def test_null_required_arguments_are_22004(
    vdb: Database, app: psycopg.Connection[Any], params: tuple[Any, ...], field: str
) -> None:
    error = _refused(vdb, app, ADD, params)
    _check(error, "22004", f"aidb_memory.add: {field} must not be NULL")


@pytest.mark.parametrize(
    ("params", "field", "problem"),
    [
        ((NS, LONG_ID, GOOD, "s", None, None), "actor_id", "is longer than 16 characters"),
        ((NS, "alice", GOOD, LONG_ID, None, None), "session_id", "is longer than 16 characters"),
        ((NS, "alice", GOOD, "s", LONG_ID, None), "agent_id", "is longer than 16 characters"),
        ((NS, "alice", GOOD, "s", None, LONG_ID), "idempotency_key", "longer than 16"),
        ((NS, "", GOOD, "s", None, None), "actor_id", "must not be empty"),
        ((NS, "alice", GOOD, " ", None, None), "session_id", "must not be empty"),
        ((NS, "alice", GOOD, "a\nb", None, None), "session_id", "control characters"),
        ((NS, "alice", GOOD, "a\x7fb", None, None), "session_id", "control characters"),
        ((NS, "alice", GOOD, "a\u2028b", None, None), "session_id", "control characters"),
        ((NS, "al\tice", GOOD, "s", None, None), "actor_id", "control characters"),
    ],
)
def test_bad_identifiers_are_22023(
    vdb: Database,
    app: psycopg.Connection[Any],
    params: tuple[Any, ...],
    field: str,
    problem: str,
) -> None:
    _check(_refused(vdb, app, ADD, params), "22023", f"aidb_memory.add: {field} ", problem)


@pytest.mark.parametrize("session", ["s", None])
def test_unknown_namespace_is_42704(
    vdb: Database, app: psycopg.Connection[Any], session: str | None
) -> None:
    error = _refused(vdb, app, ADD, ("nope", "alice", GOOD, session, None, None))
    _check(error, "42704", 'aidb_memory.add: namespace "nope" does not exist')


def test_an_unknown_namespace_is_named_on_one_line(
    vdb: Database, app: psycopg.Connection[Any]
) -> None:
    """A name the caller made up must not break the one-line message (SPEC §1)."""
    for name in ("a\nb", "a\rb", "x\u2028y"):
        error = _refused(vdb, app, ADD, (name, "alice", GOOD, "s", None, None))
        primary = error.diag.message_primary or ""
        assert error.sqlstate in ("42704", "22023"), primary
        assert primary.startswith("aidb_memory.add: namespace ")
        assert len(primary.splitlines()) == 1, repr(primary)
        assert "\u2028" not in primary, repr(primary)


def test_an_inactive_namespace_refuses_adds_with_55000(
    vdb: Database, app: psycopg.Connection[Any]
) -> None:
    vdb.sql("SELECT aidb_memory.init('resting')")
    app.execute(ADD, ("resting", "alice", GOOD, "s", None, None))
    vdb.sql("SELECT * FROM aidb_memory.namespace_update('resting', NULL, NULL, 'INACTIVE')")
    for session in ("s", "other", None):
        error = _refused(vdb, app, ADD, ("resting", "alice", GOOD, session, None, None))
        _check(error, "55000", 'aidb_memory.add: namespace "resting" is INACTIVE')
    # Reads still work: the history is not lost while the namespace rests.
    items = app.execute(
        "SELECT items FROM aidb_memory.session_get('resting', 'alice', 's')"
    ).fetchone()
    assert items is not None and [i["content"] for i in items[0]] == ["hi"]


def test_adding_to_a_closed_session_is_55000(vdb: Database, app: psycopg.Connection[Any]) -> None:
    app.execute(ADD, (NS, "alice", GOOD, "closing", None, None))
    app.execute("SELECT * FROM aidb_memory.session_end(%s, 'alice', 'closing')", (NS,))
    for key in (None, "k-closed"):
        error = _refused(vdb, app, ADD, (NS, "alice", GOOD, "closing", None, key))
        _check(error, "55000", 'aidb_memory.add: session "closing" is closed')
        assert error.diag.message_hint and "new session" in error.diag.message_hint


def test_a_refused_add_does_not_use_up_its_idempotency_key(
    vdb: Database, app: psycopg.Connection[Any]
) -> None:
    bad = json.dumps([_user(), {"role": "user", "contnet": "x"}])
    _refused(vdb, app, ADD, (NS, "alice", bad, "keyed", None, "k1"))
    first = app.execute(ADD, (NS, "alice", GOOD, "keyed", None, "k1")).fetchone()
    again = app.execute(ADD, (NS, "alice", GOOD, "keyed", None, "k1")).fetchone()
    assert first == again
    assert vdb.value("SELECT next_seq FROM aidb_memory.session WHERE session_id = 'keyed'") == 2


# --- session_get arguments ----------------------------------------------------------------------

GET = "SELECT * FROM aidb_memory.session_get(%s, %s, %s, %s, NULL, %s)"


@pytest.mark.parametrize(
    ("limit_chars", "limit_turns", "field"),
    [
        (0, None, "limit_chars"),
        (-1, None, "limit_chars"),
        (-2147483648, None, "limit_chars"),
        (2147483647, None, "limit_chars"),
        (None, 0, "limit_turns"),
        (None, -3, "limit_turns"),
        (100, 0, "limit_turns"),
        (0, 5, "limit_chars"),
    ],
)
@pytest.mark.parametrize("session", [HISTORY, "unknown"])
def test_out_of_range_budgets_are_22023(
    vdb: Database,
    app: psycopg.Connection[Any],
    limit_chars: int | None,
    limit_turns: int | None,
    field: str,
    session: str,
) -> None:
    error = _refused(vdb, app, GET, (NS, "alice", session, limit_chars, limit_turns))
    _check(error, "22023", f"aidb_memory.session_get: {field} ", "must be between 1 and")


@pytest.mark.parametrize(
    ("params", "sqlstate", "prefix"),
    [
        ((None, "alice", HISTORY, None, None), "22004", "aidb_memory.session_get: namespace "),
        ((NS, None, HISTORY, None, None), "22004", "aidb_memory.session_get: actor_id "),
        ((NS, "alice", None, None, None), "22004", "aidb_memory.session_get: session_id "),
        ((NS, "alice", LONG_ID, None, None), "22023", "aidb_memory.session_get: session_id "),
        (("nope", "alice", HISTORY, None, None), "42704", 'aidb_memory.session_get: namespace "'),
    ],
)
def test_session_get_argument_errors(
    vdb: Database,
    app: psycopg.Connection[Any],
    params: tuple[Any, ...],
    sqlstate: str,
    prefix: str,
) -> None:
    _check(_refused(vdb, app, GET, params), sqlstate, prefix)


def test_smallest_budgets_are_accepted(vdb: Database, app: psycopg.Connection[Any]) -> None:
    row = app.execute(GET, (NS, "alice", HISTORY, 1, 1)).fetchone()
    assert row is not None
    items, overflow, compacted, warnings = row
    assert items == [] and overflow == len("first") + len("ok") and compacted == 0
    # The session's only round is over the budget: no model could help (issue 10, item 13).
    assert warnings == ["newest_round_over_budget"]
    row = app.execute(GET, (NS, "alice", HISTORY, None, 2)).fetchone()
    assert row is not None
    assert [i["content"] for i in row[0]] == ["first", "ok"], "one round of two turns fits"
    row = app.execute(GET, (NS, "bob", HISTORY, None, None)).fetchone()
    assert row == ([], 0, 0, []), "another actor's session reads as empty"


def test_the_compaction_warning_follows_the_namespace_min_target(
    vdb: Database, app: psycopg.Connection[Any]
) -> None:
    """Over budget: 'too small' when a quarter of limit_chars is below the configured
    compaction_min_target_chars, else 'model unavailable' (no model is configured)."""
    vdb.sql("SELECT aidb_memory.init('tight', '{}', '{\"compaction_min_target_chars\": 50}')")
    turns = [_user("x" * 100) for _ in range(3)]
    app.execute(ADD, ("tight", "alice", json.dumps(turns), "s", None, None))
    for limit_chars, warnings, kept in [
        (199, ["compaction_budget_too_small"], 1),
        (200, ["compaction_model_unavailable"], 2),
        (299, ["compaction_model_unavailable"], 2),
        (300, [], 3),
    ]:
        row = app.execute(GET, ("tight", "alice", "s", limit_chars, None)).fetchone()
        assert row is not None
        items, overflow, _, got = row
        assert (len(items), overflow, got) == (kept, 300 - 100 * kept, warnings), limit_chars


def test_sessions_are_scoped_by_actor(vdb: Database, app: psycopg.Connection[Any]) -> None:
    """The same session id under two actors is two sessions; neither reads the other."""
    app.execute(ADD, (NS, "ann", json.dumps([_user("from ann")]), "shared-id", None, None))
    app.execute(ADD, (NS, "ben", json.dumps([_user("from ben")]), "shared-id", None, None))
    app.execute(ADD, (NS, "ben", json.dumps([_user("ben again")]), "shared-id", None, None))
    for actor, contents in (("ann", ["from ann"]), ("ben", ["from ben", "ben again"])):
        row = app.execute(GET, (NS, actor, "shared-id", None, None)).fetchone()
        assert row is not None
        assert [(i["seq"], i["content"]) for i in row[0]] == list(enumerate(contents, start=1))
