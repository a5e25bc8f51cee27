"""Errors read like a C extension's (issue 10, item 10; docs/architecture.md, Errors).

Every function that aidb_users, aidb_admins or aidb_workers may execute is listed by the catalog
and must have an entry in ``CASES``: a call that fails in the function's own code. Its error must
carry a SQLSTATE other than XX000, a one-line message starting with ``aidb_memory.<function>:``
and a CONTEXT that holds no Python traceback, source or frame and none of our internal SQL: only
the line of the PL/pgSQL function that raised it (every granted PL/Python function is installed
behind a PL/pgSQL wrapper of the same name, codebundle.BODY_SUFFIX). Each call is made twice in
one connection: PL/Python shows more of itself on a function's first call in a connection.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from conftest import ADMIN_USER, APP_USER, WORKER_USER, Database
from fake_openai import FakeOpenAI, Reply

NS = "shapes"
SESSION = "s1"


@dataclass(frozen=True)
class Case:
    """A call that fails inside ``function``: run as ``user``, it raises ``sqlstate``."""

    user: str
    sql: str
    sqlstate: str
    # The API function the message names, when it is not the function itself: the worker's
    # internal functions report the errors of the procedure that calls them (process_events).
    named: str | None = None


# Functions whose only statement is one SQL query of the catalog or our settings: they have no
# code that can fail, so a client can get from them only PostgreSQL's own errors (no privilege to
# execute, a cancel), which name the function in PostgreSQL's words. The test checks they are
# still such functions.
# The rows of each view (sql/20_namespaces.sql says why a view reads through a function) too.
PLAIN_SQL = {
    "version",
    "catalog_fingerprint",
    *(f"{view}_rows" for view in ("namespaces", "sessions", "events", "models", "secrets")),
    "model_calls_rows",
    # process_events' steps of issue 36: an event's public id and namespace; the last-batch time.
    "event_brief",
    "event_batch_finished",
}

CASES: dict[str, Case] = {
    "add": Case(APP_USER, f"SELECT aidb_memory.add('nope', 'a', '[]', '{SESSION}')", "42704"),
    "create_model": Case(
        ADMIN_USER, "SELECT aidb_memory.create_model('m', 'no-such-provider', '{}')", "22023"
    ),
    "delete": Case(APP_USER, f"SELECT aidb_memory.delete('{NS}', 'a', '{{}}', NULL)", "22023"),
    "drop_model": Case(ADMIN_USER, "SELECT aidb_memory.drop_model('no-such-model')", "42704"),
    "drop_secret": Case(ADMIN_USER, "SELECT aidb_memory.drop_secret('no-such-secret')", "42704"),
    "event_claim": Case(
        WORKER_USER, "SELECT aidb_memory.event_claim(0, 5)", "22023", named="process_events"
    ),
    "event_error": Case(
        WORKER_USER,
        "SELECT aidb_memory.event_error(1, 1, 0, 1, 'x')",
        "22023",
        named="process_events",
    ),
    "event_interrupted": Case(
        WORKER_USER,
        "SELECT aidb_memory.event_interrupted(1, 1, 0, 1, 'x')",
        "22023",
        named="process_events",
    ),
    "events_retry": Case(ADMIN_USER, "SELECT aidb_memory.events_retry(NULL)", "22004"),
    "event_process": Case(
        WORKER_USER, "SELECT aidb_memory.event_process(1, 1, 0, 1)", "22023", named="process_events"
    ),
    # A lock held on the queue (as by a migration) and lock_timeout: an error of our query.
    "event_remaining": Case(WORKER_USER, "SELECT aidb_memory.event_remaining()", "55P03"),
    "expire_memories": Case(WORKER_USER, "SELECT aidb_memory.expire_memories(0)", "22023"),
    "forget": Case(APP_USER, f"SELECT aidb_memory.forget('{NS}', 'a', NULL)", "22004"),
    "init": Case(ADMIN_USER, "SELECT aidb_memory.init('other', '\"not an object\"')", "22023"),
    "list_memories": Case(
        APP_USER, f"SELECT * FROM aidb_memory.list_memories('{NS}', 'a', \"limit\" => 0)", "22023"
    ),
    "get_memory": Case(APP_USER, f"SELECT * FROM aidb_memory.get_memory('{NS}', 'a')", "22023"),
    "update_memory": Case(
        APP_USER,
        f"SELECT * FROM aidb_memory.update_memory('{NS}', 'a', gen_random_uuid(), 'x')",
        "42704",
    ),
    "memory_history": Case(
        APP_USER, f"SELECT * FROM aidb_memory.memory_history('{NS}', 'a', NULL)", "22004"
    ),
    "model_check": Case(ADMIN_USER, "SELECT aidb_memory.model_check('no-such-model')", "42704"),
    "namespace_drop": Case(
        ADMIN_USER, "SELECT aidb_memory.namespace_drop('no-such-ns', 'why')", "42704"
    ),
    "namespace_update": Case(
        ADMIN_USER, "SELECT * FROM aidb_memory.namespace_update('no-such-ns')", "42704"
    ),
    "list_actors": Case(APP_USER, "SELECT * FROM aidb_memory.list_actors('nope')", "42704"),
    "metrics": Case(WORKER_USER, "SELECT * FROM aidb_memory.metrics(-1)", "22023"),
    "namespace_grant": Case(
        ADMIN_USER, "SELECT aidb_memory.namespace_grant('no-such-ns', 'admin_user')", "42704"
    ),
    "namespace_revoke": Case(
        ADMIN_USER, "SELECT aidb_memory.namespace_revoke('no-such-ns', 'admin_user')", "42704"
    ),
    "process_events": Case(
        WORKER_USER, "CALL aidb_memory.process_events(max_events => 0)", "22023"
    ),
    # Loading the code in a new connection meets a lock held on it (as by an install).
    "runtime_info": Case(ADMIN_USER, "SELECT aidb_memory.runtime_info()", "55P03"),
    "search": Case(APP_USER, f"SELECT * FROM aidb_memory.search('{NS}', 'a', NULL)", "22004"),
    "remember": Case(APP_USER, f"SELECT aidb_memory.remember('{NS}', 'a', NULL)", "22004"),
    "session_delete": Case(
        APP_USER, f"SELECT aidb_memory.session_delete('{NS}', 'a', '{SESSION}', NULL)", "22004"
    ),
    "session_end": Case(APP_USER, "SELECT * FROM aidb_memory.session_end(NULL, 'a', 's')", "22004"),
    "session_get": Case(
        APP_USER, f"SELECT * FROM aidb_memory.session_get('{NS}', 'a', '{SESSION}', -5)", "22023"
    ),
    "session_list": Case(
        APP_USER, f"SELECT * FROM aidb_memory.session_list('{NS}', 'a', \"limit\" => 0)", "22023"
    ),
    "session_messages": Case(
        APP_USER, "SELECT aidb_memory.session_messages('no-such-ns', 'a', 's', 100)", "42704"
    ),
    "session_pop": Case(APP_USER, f"SELECT aidb_memory.session_pop('{NS}', NULL, 's')", "22004"),
    "session_start": Case(
        APP_USER, f"SELECT * FROM aidb_memory.session_start('{NS}', NULL, NULL)", "22004"
    ),
    "set_secret": Case(
        ADMIN_USER, "SELECT aidb_memory.set_secret('k', 'v', ARRAY['not a url'])", "22023"
    ),
    "status": Case(APP_USER, f"SELECT aidb_memory.status('{NS}', 'a', NULL)", "22004"),
}

# What CONTEXT may hold: the line of the PL/pgSQL function that raised the error again.
ALLOWED = r"PL/pgSQL function aidb_memory\.{name}\([a-z0-9, \[\]]*\) line \d+ at RAISE"
# Whatever else: none of this may appear (Python frames, our internal SQL, PL/Python's names).
FORBIDDEN = re.compile(
    r"\bline \d+, in (?!<module>)|SQL statement|(?<!PL/pg)SQL function"
    r"|\bSELECT\b|\bINSERT\b|\bUPDATE\b|\bWITH\b|\bFROM\b"
    r"|spiexceptions|aidb_memory_server|runtime_modules"
)


def public_functions(db: Database) -> dict[str, str]:
    """Every function or procedure of the schema a role of ours may execute, with its language."""
    rows = db.sql(
        """
        SELECT p.proname, l.lanname
        FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_language AS l ON l.oid = p.prolang
        WHERE p.pronamespace = 'aidb_memory'::regnamespace
          AND EXISTS (SELECT FROM unnest(ARRAY['aidb_users', 'aidb_admins', 'aidb_workers']) AS r
                      WHERE pg_catalog.has_function_privilege(r, p.oid, 'EXECUTE'))
        """
    )
    return {name: language for name, language in rows}


def assert_shape(error: psycopg.Error, function: str, case: Case) -> None:
    diag = error.diag
    named = case.named or function
    assert error.sqlstate == case.sqlstate, (function, error.sqlstate, str(error))
    assert error.sqlstate != "XX000"
    primary = diag.message_primary or ""
    assert primary.startswith(f"aidb_memory.{named}: "), (function, primary)
    assert "\n" not in primary and "Traceback" not in primary, (function, primary)
    context = diag.context or ""
    assert not FORBIDDEN.search(context), (function, context)
    assert "Traceback" not in context and "PL/Python" not in context, (function, context)
    assert re.fullmatch(ALLOWED.format(name=re.escape(function)), context), (function, context)


@pytest.fixture
def namespace(db: Database) -> Database:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    return db


def _provoke(db: Database, function: str, case: Case) -> list[psycopg.Error]:
    """Run ``case`` twice in one new connection; the two errors."""
    errors: list[psycopg.Error] = []
    with db.connect() as holder:
        if function in ("event_remaining", "runtime_info"):
            table = "event" if function == "event_remaining" else "runtime_modules"
            holder.execute("BEGIN")
            holder.execute(f"LOCK TABLE aidb_memory.{table} IN ACCESS EXCLUSIVE MODE")
        with db.connect(case.user) as conn:
            conn.execute("SET lock_timeout = '200ms'")
            for _ in range(2):
                with pytest.raises(psycopg.Error) as caught:
                    conn.execute(case.sql)
                errors.append(caught.value)
    return errors


def test_every_public_function_has_a_case(db: Database) -> None:
    functions = public_functions(db)
    missing = sorted(set(functions) - set(CASES) - PLAIN_SQL)
    assert not missing, f"add a failing call to CASES for: {missing}"
    assert not set(CASES) - set(functions), "CASES names a function that is not public"
    for name in PLAIN_SQL:
        # namespaces_rows asks namespace_allows in statements of its own (issue 35): PL/pgSQL
        # with no argument, raising nothing of its own. event_brief is one query in PL/pgSQL:
        # Citus cannot plan a statement of a SQL function that has parameters.
        plpgsql = name in ("namespaces_rows", "event_brief")
        assert functions[name] == ("plpgsql" if plpgsql else "sql"), name


@pytest.mark.parametrize("function", sorted(CASES))
def test_errors_name_the_function_and_hide_the_internals(
    namespace: Database, function: str
) -> None:
    case = CASES[function]
    first, second = _provoke(namespace, function, case)
    assert_shape(first, function, case)
    assert_shape(second, function, case)


def test_a_database_error_of_a_session_read_is_one_line_without_the_window_query(
    namespace: Database,
) -> None:
    with namespace.connect(APP_USER) as conn:
        for _ in range(2):
            with pytest.raises(psycopg.errors.UndefinedObject) as caught:
                conn.execute("SELECT * FROM aidb_memory.session_get('nope', 'a', 's', 1000)")
            error = caught.value
            assert (
                error.diag.message_primary
                == 'aidb_memory.session_get: namespace "nope" does not exist'
            )
            assert error.diag.message_hint
            context = error.diag.context or ""
            assert re.fullmatch(ALLOWED.format(name="session_get"), context), context


def _long_session(conn: psycopg.Connection[Any], session: str) -> None:
    for i in range(10):
        turns = [
            {"role": "user", "content": f"question {i:04d} ".ljust(100, "q")},
            {"role": "assistant", "content": f"answer {i:04d} ".ljust(100, "a")},
        ]
        conn.execute(
            "SELECT aidb_memory.add('talk', 'alice', %s::jsonb, %s)", (json.dumps(turns), session)
        )


@pytest.mark.parametrize("function", ["session_get", "session_messages"])
def test_a_statement_timeout_during_the_model_call_of_a_compacting_read(
    db: Database, fake: FakeOpenAI, function: str
) -> None:
    options = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(options),))
    db.sql("SELECT aidb_memory.init('talk', '{\"llm\": \"chat\"}', '{\"llm_timeout_s\": 30}')")
    read = f"SELECT * FROM aidb_memory.{function}('talk', 'alice', %s, 1000)"
    with db.connect(APP_USER) as conn:
        # A first compacting read loads the model client in this backend, so that the timeout
        # below falls in the model call, not in loading it.
        _long_session(conn, "warm")
        fake.queue(Reply(content="a summary"))
        conn.execute(read, ("warm",))
        _long_session(conn, "s")
        fake.queue(Reply(content="much too late", delay=20))
        conn.execute("SET statement_timeout = '1500ms'")
        with pytest.raises(psycopg.errors.QueryCanceled) as caught:
            conn.execute(read, ("s",))
    error = caught.value
    assert len(fake.calls()) == 2, "the read was cancelled during its model call"
    assert error.diag.message_primary == (
        f"aidb_memory.{function}: canceling statement due to statement timeout"
    )
    assert_shape(error, function, Case(APP_USER, "", "57014"))


def test_a_serialization_failure_inside_add_keeps_its_sqlstate(namespace: Database) -> None:
    turn = json.dumps([{"role": "user", "content": "hello"}])
    add = f"SELECT aidb_memory.add('{NS}', 'a', %s::jsonb, '{SESSION}')"
    with namespace.connect(APP_USER) as other:
        other.execute(add, (turn,))
        with namespace.connect(APP_USER, autocommit=False) as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            conn.execute("SELECT 1")  # the snapshot, older than the next add
            other.execute(add, (turn,))
            with pytest.raises(psycopg.errors.SerializationFailure) as caught:
                conn.execute(add, (turn,))
    error = caught.value
    assert (error.diag.message_primary or "").startswith("aidb_memory.add: could not serialize")
    assert_shape(error, "add", Case(APP_USER, "", "40001"))


def test_a_deadlock_inside_a_function_keeps_its_sqlstate(namespace: Database) -> None:
    # Two actors' sessions locked in opposite orders: the second add of one transaction waits
    # for the other, whose second add closes the cycle. One of them gets 40P01 from inside add.
    turn = json.dumps([{"role": "user", "content": "hello"}])

    def add(conn: psycopg.Connection[Any], actor: str) -> None:
        conn.execute(f"SELECT aidb_memory.add('{NS}', %s, %s::jsonb, 's')", (actor, turn))

    with namespace.connect(APP_USER) as setup:
        add(setup, "x")
        add(setup, "y")
    outcome: dict[str, BaseException] = {}
    with (
        namespace.connect(APP_USER, autocommit=False) as one,
        namespace.connect(APP_USER, autocommit=False) as two,
    ):
        for conn in (one, two):
            conn.execute("SET lock_timeout = '10s'")  # a guard: the test never waits longer
        add(one, "x")
        add(two, "y")

        def second() -> None:
            try:
                add(two, "x")
            except psycopg.Error as e:
                outcome["two"] = e

        thread = threading.Thread(target=second)
        thread.start()
        try:
            add(one, "y")
        except psycopg.Error as e:
            outcome["one"] = e
        thread.join(15)
        assert not thread.is_alive()
    errors = [e for e in outcome.values() if isinstance(e, psycopg.errors.DeadlockDetected)]
    assert len(errors) == 1, outcome
    primary = errors[0].diag.message_primary or ""
    assert primary == "aidb_memory.add: deadlock detected", primary
    assert_shape(errors[0], "add", Case(APP_USER, "", "40P01"))
