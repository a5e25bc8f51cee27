"""Issue 9, acceptance 9: hostile JSON gets a clear 22023 naming the field, never XX000.

jsonb takes any depth and any number of digits; Python's json did not (a ``meta`` nested 2,000
deep was a RecursionError, a 5,000-digit integer a ValueError: both XX000 with a traceback in the
server log, per call). Every jsonb argument now goes through ``validation.parse_json``: depth at
most 100, numbers at most 100 characters and within a double's range. Application roles attack
add and delete; admin roles init, namespace_update and create_model. Nothing is stored.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from conftest import ADMIN_USER, APP_USER, Database

NS = "hostile"
DEEP = 2_000
HUGE = "9" * 5_000


def _deep(levels: int, leaf: str = "1") -> str:
    """JSON text of ``levels`` nested objects around ``leaf``."""
    return '{"a": ' * levels + leaf + "}" * levels


def _refused(db: Database, sql: str, params: Any, user: str) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        db.sql(sql, params, user=user)
    return info.value


def _assert_22023(e: psycopg.Error, field: str) -> None:
    assert e.sqlstate == "22023", f"{e.sqlstate}: {e}"
    message = e.diag.message_primary or ""
    assert f" {field} " in message, message
    assert "Error" not in message and len(message) < 300  # ours, not a Python exception


@pytest.fixture
def ns(db: Database) -> None:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))


def _add(db: Database, turns_text: str, session: str | None = "s1") -> psycopg.Error:
    return _refused(
        db,
        "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, %s)",
        (NS, turns_text, session),
        APP_USER,
    )


def _stored(db: Database) -> int:
    return int(
        db.value(
            "SELECT (SELECT count(*) FROM aidb_memory.event) + "
            "(SELECT count(*) FROM aidb_memory.session)"
        )
    )


# --- add ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "meta",
    [
        pytest.param(_deep(DEEP), id="nested-2000"),
        pytest.param(_deep(150), id="nested-150"),
        pytest.param('{"n": ' + HUGE + "}", id="int-5000-digits"),
        pytest.param('{"n": -' + "1" * 101 + "}", id="int-101-digits"),
        pytest.param('{"n": 1e400}', id="float-out-of-range"),
        pytest.param('{"n": 0.' + "1" * 5000 + "}", id="float-5000-digits"),
    ],
)
@pytest.mark.parametrize("session", [None, "s1"])
def test_hostile_meta_is_22023_naming_the_turn_and_nothing_is_stored(
    db: Database, ns: None, meta: str, session: str | None
) -> None:
    turns = (
        '[{"role": "user", "content": "hi"}, {"role": "user", "content": "x", "meta": '
        + meta
        + "}]"
    )
    _assert_22023(_add(db, turns, session), "turns[1].meta")
    assert _stored(db) == 0


def test_hostile_tool_call_and_batch_nesting_are_22023(db: Database, ns: None) -> None:
    deep_array = "[" * DEEP + "]" * DEEP
    _assert_22023(_add(db, deep_array), "turns[0][0]")
    call = '{"id": "c1", "type": "function", "function": ' + _deep(DEEP, '"x"') + "}"
    turns = '[{"role": "assistant", "content": null, "tool_calls": [' + call + "]}]"
    _assert_22023(_add(db, turns), "turns[0].tool_calls")
    assert _stored(db) == 0


def test_a_sane_meta_is_still_stored_as_given(db: Database, ns: None) -> None:
    meta = {"sequence_id": 7, "n": 10**40, "x": 1.5, "deep": json.loads(_deep(90))}
    db.sql(
        "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's1')",
        (NS, json.dumps([{"role": "user", "content": "hi", "meta": meta}])),
        user=APP_USER,
    )
    stored = db.value("SELECT meta FROM aidb_memory.turn")
    assert stored == meta


# --- delete -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "field"),
    [
        pytest.param(_deep(DEEP), "selector.a.a", id="nested-2000"),
        pytest.param(
            '{"ids": [' + "[" * DEEP + "]" * DEEP + "]}", "selector.ids[0]", id="ids-nested"
        ),
        pytest.param('{"ids": [' + HUGE + "]}", "selector.ids[0]", id="ids-huge-int"),
        pytest.param('{"before": ' + HUGE + "}", "selector.before", id="before-huge-int"),
    ],
)
def test_hostile_delete_selectors_are_22023(
    db: Database, ns: None, selector: str, field: str
) -> None:
    e = _refused(
        db,
        "SELECT aidb_memory.delete(%s, 'alice', %s::jsonb, 'cleanup')",
        (NS, selector),
        APP_USER,
    )
    _assert_22023(e, field)
    assert db.value("SELECT count(*) FROM aidb_memory.audit_log WHERE action = 'delete'") == 0


# --- admin functions ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "field"),
    [
        pytest.param(_deep(DEEP), "{arg}.a.a", id="nested-2000"),
        pytest.param('{"max_turn_chars": ' + HUGE + "}", "{arg}.max_turn_chars", id="huge-int"),
    ],
)
@pytest.mark.parametrize("arg", ["model_spec", "config"])
def test_hostile_init_and_namespace_update_arguments_are_22023(
    db: Database, ns: None, value: str, field: str, arg: str
) -> None:
    before = db.sql("SELECT model_spec, config FROM aidb_memory.namespace WHERE name = %s", (NS,))
    e = _refused(db, f"SELECT aidb_memory.init('other', {arg} => %s::jsonb)", (value,), ADMIN_USER)
    _assert_22023(e, field.format(arg=arg))
    e = _refused(
        db,
        f"SELECT * FROM aidb_memory.namespace_update(%s, {arg} => %s::jsonb)",
        (NS, value),
        ADMIN_USER,
    )
    _assert_22023(e, field.format(arg=arg))
    assert db.value("SELECT count(*) FROM aidb_memory.namespace WHERE name = 'other'") == 0
    assert (
        db.sql("SELECT model_spec, config FROM aidb_memory.namespace WHERE name = %s", (NS,))
        == before
    )


@pytest.mark.parametrize(
    ("options", "field"),
    [
        pytest.param(_deep(DEEP), "options.a.a", id="nested-2000"),
        pytest.param('{"timeout_s": ' + HUGE + "}", "options.timeout_s", id="huge-int"),
    ],
)
def test_hostile_create_model_options_are_22023(db: Database, options: str, field: str) -> None:
    e = _refused(
        db,
        "SELECT aidb_memory.create_model('m', 'openai', %s::jsonb)",
        (options,),
        ADMIN_USER,
    )
    _assert_22023(e, field)
    assert db.value("SELECT count(*) FROM aidb_memory.model WHERE name = 'm'") == 0
