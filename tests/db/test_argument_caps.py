"""Issue 23, part 2: a text or jsonb argument over its size cap is refused before it reaches
PL/Python (sql/12_argument_caps.sql and the wrappers codebundle generates), with the error the
Python code gives for it; a 100 MB add costs the backend no more than PostgreSQL's own parse of
the value."""

from __future__ import annotations

import ast
import contextlib
import json
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aidb_memory_server import validation
from conftest import ADMIN_USER, APP_USER, REPO, Database

NS = "caps"
PYTHON_CONTEXTS = (
    "SELECT pg_catalog.count(*) FROM pg_catalog.pg_backend_memory_contexts "
    "WHERE name LIKE 'PL/Python%'"
)


def _peak_kb(pid: int) -> int:
    """The backend's peak resident memory so far (VmHWM), in kB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def _call_in_new_backend(
    db: Database, role: str, query: str, params: Any
) -> tuple[psycopg.Error | None, int, int]:
    """Run ``query`` as ``role`` as the first call of a new backend: the error it raised (or
    None), the backend's peak memory in kB, and how many PL/Python memory contexts it then has
    (none unless a PL/Python function ran)."""
    with db.connect() as conn:
        pid = conn.info.backend_pid
        conn.execute(f"SET ROLE {role}")
        error = None
        try:
            conn.execute(query, params)
        except psycopg.Error as e:
            error = e
        peak = _peak_kb(pid)
        conn.execute("RESET ROLE")
        row = conn.execute(PYTHON_CONTEXTS).fetchone()
        assert row is not None
        return error, peak, int(row[0])


def _add_in_new_backends(ns: Database, text: str) -> tuple[psycopg.Error | None, int, int, int]:
    """PostgreSQL's own parse of ``text`` as jsonb, sent as an add sends it, then the add of it,
    each in a backend of its own: the add's error, both peaks (kB) and the add's PL/Python
    memory contexts."""
    error, parse_peak, _ = _call_in_new_backend(
        ns, APP_USER, "SELECT pg_catalog.pg_column_size(%s::jsonb)", (text,)
    )
    assert error is None
    error, add_peak, python = _call_in_new_backend(
        ns, APP_USER, "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's1')", (NS, text)
    )
    return error, parse_peak, add_peak, python


@pytest.fixture
def ns(db: Database) -> Database:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    return db


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param(
            lambda: [{"role": "user", "content": f"{i} " + "x" * 1_000} for i in range(100_000)],
            id="100k turns of 1 kB",
        ),
        pytest.param(
            lambda: [{"role": "user", "content": "y" * 100_000_000}], id="one 100 MB turn"
        ),
        pytest.param(lambda: [{"role": "user", "content": "é\n" * 25_000_000}], id="escapes"),
    ],
)
def test_a_refused_100_mb_add_peaks_within_the_parse_of_its_value(ns: Database, shape: Any) -> None:
    text = json.dumps(shape(), ensure_ascii=False)
    assert len(text) >= 50_000_000
    error, parse_peak, add_peak, python = _add_in_new_backends(ns, text)
    assert isinstance(error, psycopg.errors.InvalidParameterValue)
    assert re.fullmatch(
        r"aidb_memory\.add: turns has at least \d+ characters of JSON, more than the namespace "
        r"limit of 1000000",
        error.diag.message_primary or "",
    ), error.diag.message_primary
    assert error.diag.message_hint == (
        "split the batch, or raise config.max_add_chars with namespace_update"
    )
    assert python == 0, "the value reached PL/Python"
    assert add_peak <= 1.25 * parse_peak, (add_peak, parse_peak)
    assert ns.value("SELECT count(*) FROM aidb_memory.event") == 0


def test_a_small_jsonb_of_wide_numbers_is_refused_before_its_json_text_is_made(
    ns: Database,
) -> None:
    """1e100000 is a few bytes of jsonb and 100,001 characters of JSON text: 300 of them in a
    5 kB value would be a 30 MB text and a 30 MB Python string before any check ran."""
    text = "[" + ", ".join(["1e100000"] * 300) + "]"
    assert ns.value("SELECT pg_catalog.pg_column_size(%s::jsonb)", (text,)) < 65_536
    error, parse_peak, add_peak, python = _add_in_new_backends(ns, text)
    assert isinstance(error, psycopg.errors.InvalidParameterValue)
    assert error.diag.message_primary == (
        "aidb_memory.add: turns has at least 30000300 characters of JSON, more than the namespace "
        "limit of 1000000"
    )
    assert python == 0, "the value reached PL/Python"
    assert add_peak <= 1.25 * parse_peak + 10_240, (add_peak, parse_peak)  # kB
    # A wide number within the cap is the Python code's to refuse, with where it is.
    turns = [{"role": "user", "content": "hi", "meta": {"n": int("9" * 500)}}]
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        ns.sql(
            "SELECT aidb_memory.add(%s, 'alice', %s::jsonb)", (NS, json.dumps(turns)), user=APP_USER
        )
    assert raised.value.diag.message_primary == (
        "aidb_memory.add: turns[0].meta has a number of 500 characters"
    )


def test_between_the_guard_and_five_times_the_cap_the_count_is_exact(ns: Database) -> None:
    ns.sql(
        "SELECT aidb_memory.namespace_update(%s, config => '{\"max_add_chars\": 100000}')", (NS,)
    )
    turns = [{"role": "user", "content": f'line {i}\n"quoted" é' * 6} for i in range(1_000)]
    text = json.dumps(turns)
    chars = ns.value("SELECT pg_catalog.length(%s::jsonb::text)", (text,))
    assert chars > 100_000 and ns.value("SELECT pg_column_size(%s::jsonb)", (text,)) > 65_536
    error, _, python = _call_in_new_backend(
        ns, APP_USER, "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's1')", (NS, text)
    )
    assert isinstance(error, psycopg.errors.InvalidParameterValue)
    assert error.diag.message_primary == (
        f"aidb_memory.add: turns has {chars} characters of JSON, more than the namespace limit "
        "of 100000"
    )
    assert python == 0
    # The same count as the Python check makes on a value under the guard's 64 kB.
    small = json.dumps(turns[:100])
    small_chars = ns.value("SELECT pg_catalog.length(%s::jsonb::text)", (small,))
    ns.sql("SELECT aidb_memory.namespace_update(%s, config => '{\"max_add_chars\": 1000}')", (NS,))
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        ns.sql("SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's1')", (NS, small), user=APP_USER)
    assert raised.value.diag.message_primary == (
        f"aidb_memory.add: turns has {small_chars} characters of JSON, more than the namespace "
        "limit of 1000"
    )
    # Over the guard and under the cap: measured, then stored as usual.
    ns.sql(
        "SELECT aidb_memory.namespace_update(%s, config => '{\"max_add_chars\": 1000000}')", (NS,)
    )
    ns.sql("SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's1')", (NS, text), user=APP_USER)
    assert ns.value("SELECT count(*) FROM aidb_memory.turn") == 1_000


BIG = "z" * 100_000
# Over the cap of 500,000 characters; json.dumps writes JSON as jsonb's output does.
SELECTOR = json.dumps({"ids": list(range(80_000))})
CAPPED = [
    # (role, query, params, message): every size cap of a text or jsonb argument, over it by far.
    (
        APP_USER,
        'SELECT aidb_memory.add(%s, %s, \'[{"role": "user", "content": "hi"}]\')',
        (NS, BIG),
        "aidb_memory.add: actor_id is longer than 255 characters",
    ),
    (
        APP_USER,
        'SELECT aidb_memory.add(%s, \'a\', \'[{"role": "user", "content": "hi"}]\', %s)',
        (NS, BIG),
        "aidb_memory.add: session_id is longer than 255 characters",
    ),
    (
        APP_USER,
        'SELECT aidb_memory.add(%s, \'a\', \'[{"role": "user", "content": "hi"}]\', \'s\', '
        "idempotency_key => %s)",
        (NS, BIG),
        "aidb_memory.add: idempotency_key is longer than 255 characters",
    ),
    (
        APP_USER,
        'SELECT aidb_memory.add(%s, \'a\', \'[{"role": "user", "content": "hi"}]\')',
        (BIG,),
        'aidb_memory.add: namespace "' + "z" * 199 + '…" does not exist',  # as Python says it
    ),
    (
        APP_USER,
        "SELECT * FROM aidb_memory.session_start(%s, 'a', %s)",
        (NS, BIG),
        "aidb_memory.session_start: agent_id is longer than 255 characters",
    ),
    (
        APP_USER,
        "SELECT * FROM aidb_memory.session_end(%s, 'a', 's', %s)",
        (NS, BIG + "z"),
        "aidb_memory.session_end: notes is longer than 100000 characters",
    ),
    (
        APP_USER,
        "SELECT * FROM aidb_memory.session_get(%s, 'a', %s, 1000)",
        (NS, BIG),
        "aidb_memory.session_get: session_id is longer than 255 characters",
    ),
    (
        APP_USER,
        "SELECT aidb_memory.session_messages(%s, %s, 's')",
        (NS, BIG),
        "aidb_memory.session_messages: actor_id is longer than 255 characters",
    ),
    (
        APP_USER,
        "SELECT * FROM aidb_memory.search(%s, 'a', %s)",
        (NS, BIG),
        "aidb_memory.search: query has 100000 characters, more than the namespace limit of 4000",
    ),
    (
        APP_USER,
        "SELECT aidb_memory.delete(%s, 'a', %s::jsonb, 'why')",
        (NS, SELECTOR),
        f"aidb_memory.delete: selector has {len(SELECTOR)} characters of JSON, more than the limit "
        "of 500000",
    ),
    (
        ADMIN_USER,
        "SELECT aidb_memory.set_secret('k', %s)",
        (BIG,),
        "aidb_memory.set_secret: value is longer than 16384 characters",
    ),
    (
        ADMIN_USER,
        "SELECT aidb_memory.init(%s)",
        (BIG,),
        "aidb_memory.init: name is longer than 128 characters",
    ),
    (
        ADMIN_USER,
        "SELECT aidb_memory.drop_model(%s)",
        (BIG,),
        "aidb_memory.drop_model: name is longer than 128 characters",
    ),
]


@pytest.mark.parametrize(("role", "query", "params", "message"), CAPPED)
def test_every_capped_argument_is_refused_before_python(
    ns: Database, role: str, query: str, params: Any, message: str
) -> None:
    error, _, python = _call_in_new_backend(ns, role, query, params)
    expected = (
        psycopg.errors.UndefinedObject
        if "exist" in message
        else psycopg.errors.InvalidParameterValue
    )
    assert isinstance(error, expected), error
    assert error.diag.message_primary == message
    assert python == 0, "the value reached PL/Python"


def _constant(module: str, name: str) -> Any:
    """A module-level constant of a server-side module that imports plpy (read, not imported)."""
    source = (REPO / "plpython" / "aidb_memory_server" / f"{module}.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
            name
        ]:
            namespace: dict[str, Any] = {}
            for other in ast.parse(source).body:  # constants defined from constants
                if isinstance(other, ast.Assign) and other.lineno < node.lineno:
                    # A constant made by a call of the module's own is not needed here.
                    with contextlib.suppress(Exception):
                        exec(compile(ast.Module([other], []), module, "exec"), namespace)
            return eval(compile(ast.Expression(node.value), module, "eval"), namespace)
    raise AssertionError(f"{module}.{name} not found")


def test_the_caps_are_the_python_codes(ns: Database) -> None:
    def cap(fn: str, field: str, namespace: str | None = NS) -> Any:
        return ns.value(
            "SELECT cap FROM aidb_memory.argument_cap(%s, %s, %s)", (fn, field, namespace)
        )

    defaults = validation.CONFIG_DEFAULTS
    assert cap("add", "turns") == defaults["max_add_chars"]
    assert cap("add", "session_id") == defaults["max_identifier_chars"]
    assert cap("search", "query") == defaults["search_max_query_chars"]
    assert cap("session_end", "notes") == defaults["max_turn_chars"]
    assert cap("remember", "metadata") == defaults["memory_metadata_max_chars"]
    assert cap("update_memory", "metadata") == defaults["memory_metadata_max_chars"]
    assert cap("add", "memory_metadata") == defaults["memory_metadata_max_chars"]
    assert cap("update_memory", "content") == defaults["memory_max_chars"]
    assert cap("update_memory", "reason") == defaults["max_turn_chars"]
    assert cap("remember", "key") == defaults["max_identifier_chars"]
    assert cap("search", "filter") == defaults["memory_filter_max_chars"]
    assert cap("list_memories", "filter") == defaults["memory_filter_max_chars"]
    assert cap("delete", "selector") == _constant("memories", "SELECTOR_MAX_CHARS")
    assert cap("set_secret", "value", None) == _constant("models", "SECRET_VALUE_MAX")
    assert cap("create_model", "name", None) == _constant("models", "NAME_MAX")
    assert cap("init", "name", None) == validation.NAMESPACE_NAME_MAX
    assert cap("add", "namespace") == validation.NAMESPACE_NAME_MAX
    assert cap("session_end", "reason") is None
    # A namespace's own setting, and the defaults for a namespace that does not exist.
    ns.sql(
        "SELECT aidb_memory.namespace_update(%s, config => "
        '\'{"max_add_chars": 5000, "max_identifier_chars": 40}\')',
        (NS,),
    )
    assert cap("add", "turns") == 5000
    assert cap("session_start", "actor_id") == 40
    assert cap("add", "turns", "no such namespace") == defaults["max_add_chars"]


def _json() -> st.SearchStrategy[Any]:
    # PostgreSQL's text holds no NUL, and JSON no lone surrogate.
    chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(-(10**6), 10**6)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(chars, max_size=20)
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=6) | st.dictionaries(st.text(chars, max_size=5), inner)
        ),
        max_leaves=40,
    )


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(values=st.lists(_json(), min_size=1, max_size=20))
def test_the_lower_bound_never_exceeds_the_json_text(ns: Database, values: list[Any]) -> None:
    """What the jsonb refusal relies on: a jsonb value of b bytes has at least (b - 64) / 5
    characters of JSON text, for values of every kind, and the densest ones too."""
    extremes: list[Any] = [
        [[]] * 10_000,
        [0] * 10_000,
        [{}] * 10_000,
        ["𝄞" * 1_000] * 10,
        ["", 0, [], {}, None, True] * 1_000,
    ]
    deep: Any = []
    for _ in range(1_000):
        deep = [deep]
    for value in [*values, *extremes, deep, values * 200]:
        text = json.dumps(value)
        row = ns.sql(
            "SELECT pg_catalog.pg_column_size(v), pg_catalog.length(v::text) "
            "FROM (SELECT %s::jsonb AS v) AS x",
            (text,),
        )[0]
        size, chars = row
        assert (size - 64) // 5 <= chars, (size, chars, text[:200])


def test_an_upgrade_lets_a_namespace_that_raised_max_turn_chars_keep_its_adds(db: Database) -> None:
    """migrations/0016: a namespace that raised max_turn_chars without max_add_chars (set before
    the key existed) gets a max_add_chars that carries such a turn; one that set it keeps it."""
    for name, config in (
        ("big_turns", {"max_turn_chars": 3_000_000}),
        ("huge_turns", {"max_turn_chars": 10_000_000}),
        ("chose", {"max_turn_chars": 3_000_000, "max_add_chars": 2_000_000}),
        ("plain", {}),
        ("small_turns", {"max_turn_chars": 400_000}),
    ):
        db.sql(
            "INSERT INTO aidb_memory.namespace (name, config) VALUES (%s, %s::jsonb)",
            (name, json.dumps(config)),
        )
    db.sql("DELETE FROM aidb_memory.schema_migrations WHERE name = '0016_add_chars_fit_turns'")
    from aidb_memory.install.installer import Package, install

    with db.connect(autocommit=False) as conn:
        install(conn, Package.load(), say=lambda _line: None)
        conn.commit()
    configs = dict(db.sql("SELECT name, config FROM aidb_memory.namespace"))
    assert configs["big_turns"] == {"max_turn_chars": 3_000_000, "max_add_chars": 6_000_000}
    assert configs["huge_turns"] == {"max_turn_chars": 10_000_000, "max_add_chars": 20_000_000}
    assert configs["chose"] == {"max_turn_chars": 3_000_000, "max_add_chars": 2_000_000}
    assert configs["plain"] == {}
    assert configs["small_turns"] == {"max_turn_chars": 400_000}
    # A turn of max_turn_chars characters is an add the namespace takes.
    turn = json.dumps([{"role": "user", "content": "w" * 3_000_000}])
    db.sql("SELECT aidb_memory.add('big_turns', 'a', %s::jsonb, 's')", (turn,), user=APP_USER)
