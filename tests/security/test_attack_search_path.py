"""Attack: a search_path someone else controls (issue 9, acceptance 1, 2 and 4).

A database's owner (not a superuser) owns schema public on PostgreSQL 15, so they can put there a
look-alike of every function and operator our SQL uses, and can make the database's default
search_path `public, pg_catalog`. Whatever of ours then resolves a name through the search_path
of a superuser, of a SECURITY DEFINER function or of a worker runs the owner's code with those
rights; a look-alike bound into a column, default or CHECK at install runs later, forever.

The look-alikes are not a hand-written list: every function and operator name is taken with
pglast from the install script (DO blocks, the SQL strings they EXECUTE, SQL and PL/pgSQL function
bodies, the Python stubs) and from the SQL string constants of the server-side modules and of the
CLI. For each, every overload that pg_catalog has (with the extensions our install creates) and
whose argument types a PL/pgSQL function can declare is planted in public, plus an all-text
variant of each arity, each with a sequence of its own that it advances before it raises: a
sequence is not transactional, so a call is recorded even when the caller catches the error or
rolls back.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pglast
import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.types.json import Jsonb

from aidb_memory.install.installer import Package, install
from conftest import (
    ADMIN_USER,
    APP_USER,
    OWNER_USER,
    REPO,
    WORKER_USER,
    Database,
    psql,
    run_cli,
)
from fake_openai import FakeOpenAI, Reply, serve

PINNED = "-c search_path=pg_catalog,pg_temp"
HOSTILE_PATH = "public, pg_catalog"
NS = "trapped"

# --- the names our SQL resolves, with pglast --------------------------------------------------


@dataclass
class Names:
    """Function and operator names that SQL text leaves to the search_path to resolve."""

    functions: set[str] = field(default_factory=set)
    operators: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)

    def sql(self, text: str) -> bool:
        """Every statement of ``text``; a string that is not SQL is ignored (False)."""
        if text in self.seen:
            return True
        self.seen.add(text)
        try:
            tree = json.loads(pglast.parser.parse_sql_json(text))
        except pglast.parser.ParseError:
            return False
        for raw in tree.get("stmts", ()):
            location = raw.get("stmt_location", 0)
            length = raw.get("stmt_len") or len(text.encode()) - location
            statement = text.encode()[location : location + length].decode()
            self._node(raw["stmt"], statement)
        return True

    def python(self, source: str) -> None:
        """The SQL strings of Python source (server modules, stubs, the CLI): string constants,
        f-strings and ``str.format`` templates with the module's own string constants (or NULL)
        put in their fields, and fragments such as a WHERE condition, read as expressions."""
        try:
            tree = ast.parse(source)
        except SyntaxError:
            return
        constants: dict[str, str] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    text = _python_text(node.value, constants)
                    if text is not None:
                        constants[target.id] = text
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant | ast.JoinedStr):
                text = _python_text(node, constants)
                if text is None:
                    continue
                filled = re.sub(r"\{(\w*)\}", lambda m: constants.get(m.group(1), "NULL"), text)
                for candidate in (text, filled, "SELECT " + text, "SELECT " + filled):
                    if self.sql(candidate):
                        break

    def plpgsql(self, create_statement: str) -> None:
        """The queries and expressions of a PL/pgSQL function (a CREATE FUNCTION statement)."""
        try:
            functions = pglast.parse_plpgsql(create_statement)
        except pglast.parser.ParseError:
            return
        self._plpgsql_node(functions)

    def _plpgsql_node(self, node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                self._plpgsql_node(item)
        elif isinstance(node, dict):
            expr = node.get("PLpgSQL_expr")
            if isinstance(expr, dict) and "query" in expr:
                query = str(expr["query"])
                if expr.get("parseMode", 0) == 0:
                    self.sql(query)
                else:  # an expression, or an assignment `target := expression`
                    self.sql("SELECT " + re.sub(r"^[\w.\[\]\" ]+:?=(?!=)", "", query, count=1))
            for value in node.values():
                self._plpgsql_node(value)

    def _node(self, node: Any, statement: str) -> None:
        if isinstance(node, list):
            for item in node:
                self._node(item, statement)
            return
        if not isinstance(node, dict):
            return
        for kind, value in node.items():
            if not isinstance(value, dict):
                self._node(value, statement)
                continue
            if kind == "FuncCall":
                self._name(self.functions, value.get("funcname"))
            elif kind == "A_Expr":
                self._name(self.operators, value.get("name"))
                if str(value.get("kind", "")).startswith("AEXPR_BETWEEN"):
                    self.operators.update({">=", "<="})
            elif kind == "SubLink":
                self._name(self.operators, value.get("operName") or [{"String": {"sval": "="}}])
            elif (kind == "CaseExpr" and value.get("arg")) or (
                kind == "JoinExpr" and (value.get("usingClause") or value.get("isNatural"))
            ):
                self.operators.add("=")  # CASE x WHEN, JOIN USING: equality by name
            elif kind == "A_Const" and isinstance(value.get("sval"), dict):
                self.sql(str(value["sval"].get("sval", "")))  # EXECUTE '...', format('...')
            elif kind == "CreateFunctionStmt":
                self._function(value, statement)
            elif kind == "DoStmt":
                self._do(value)
            self._node(value, statement)

    def _name(self, target: set[str], parts: Any) -> None:
        names = [p["String"]["sval"] for p in parts or () if "String" in p]
        if names and (len(names) == 1 or names[0] == "pg_catalog"):
            target.add(names[-1])

    @staticmethod
    def _options(stmt: dict[str, Any], key: str) -> dict[str, Any]:
        return {
            o["DefElem"]["defname"]: o["DefElem"].get("arg")
            for o in stmt.get(key) or ()
            if "DefElem" in o
        }

    def _function(self, stmt: dict[str, Any], statement: str) -> None:
        options = self._options(stmt, "options")
        language = (options.get("language") or {}).get("String", {}).get("sval", "sql")
        bodies = [
            b["String"]["sval"] for b in (options.get("as") or {}).get("List", {}).get("items", ())
        ]
        for body in bodies:
            if language == "sql":
                self.sql(body)
            elif language == "plpython3u":
                self.python(body)
        if language == "plpgsql":
            self.plpgsql(statement)

    def _do(self, stmt: dict[str, Any]) -> None:
        options = self._options(stmt, "args")
        language = (options.get("language") or {}).get("String", {}).get("sval", "plpgsql")
        body = str((options.get("as") or {}).get("String", {}).get("sval", ""))
        if language == "plpython3u":
            self.python(body)
        elif language == "plpgsql":
            tag = "$do_body$"
            self.plpgsql(
                f"CREATE FUNCTION do_block() RETURNS void LANGUAGE plpgsql AS {tag}{body}{tag}"
            )


def _python_text(node: ast.expr, constants: dict[str, str]) -> str | None:
    """The text of a string expression, fields filled from ``constants`` (else NULL)."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.FormattedValue):
                inner = value.value
                name = inner.id if isinstance(inner, ast.Name) else ""
                parts.append(constants.get(name, "NULL"))
            else:
                parts.append(_python_text(value, constants) or "")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left = _python_text(node.left, constants)
        right = _python_text(node.right, constants)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def names_we_use() -> Names:
    """What the install script, the server-side modules and the CLI leave to name resolution."""
    names = Names()
    for step in Package.load().steps():
        names.sql(step.sql)
    for path in sorted((REPO / "plpython").rglob("*.py")) + sorted((REPO / "src").rglob("*.py")):
        names.python(path.read_text(encoding="utf-8"))
    return names


def test_the_names_come_from_our_sql_with_pglast() -> None:
    names = names_we_use()
    # The examples: in a DO block's EXECUTE, in the script's preamble and checks, in the
    # generated column of a migration, in the worker's procedure, and in the CLI.
    assert {"format", "current_setting", "to_regclass", "to_tsvector", "set_config"} <= (
        names.functions
    )
    assert {"=", "<", ">", "+", "<>", "@@"} <= names.operators
    # Taken from the server modules' SQL strings (memories.py: search). pg_trgm's similarity is
    # qualified by the extension's schema there (extensions.py), so it is not left to the path.
    assert {"websearch_to_tsquery", "ts_rank_cd", "tsvector_to_array"} <= names.functions
    assert "similarity" not in names.functions


# --- the trap -----------------------------------------------------------------------------------

# Types a PL/pgSQL function cannot take or return.
_UNDECLARABLE = {
    "internal",
    "cstring",
    '"any"',
    "any",
    "language_handler",
    "fdw_handler",
    "index_am_handler",
    "table_am_handler",
    "tsm_handler",
    "trigger",
    "event_trigger",
    "pg_ddl_command",
    "unknown",
}
_SIGNATURES = """
SELECT p.proname::text,
       pg_catalog.pg_get_function_identity_arguments(p.oid),
       pg_catalog.pg_get_function_result(p.oid),
       ARRAY(SELECT pg_catalog.format_type(t, NULL)
             FROM pg_catalog.unnest(p.proargtypes::pg_catalog.oid[]) AS t)
           || pg_catalog.format_type(p.prorettype, NULL),
       p.pronargs::int
FROM pg_catalog.pg_proc AS p
WHERE p.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
  AND p.proname OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.name[])
ORDER BY 1, 2
"""
_OPERATORS = """
SELECT o.oprname::text,
       CASE WHEN o.oprleft OPERATOR(pg_catalog.<>) 0
            THEN pg_catalog.format_type(o.oprleft, NULL) END,
       pg_catalog.format_type(o.oprright, NULL),
       pg_catalog.format_type(o.oprresult, NULL)
FROM pg_catalog.pg_operator AS o
WHERE o.oprnamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
  AND o.oprname OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.name[])
ORDER BY 1, 2, 3
"""
_FIRE = """
CREATE FUNCTION public.trap_fire(seq text, what text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_catalog.nextval(seq::pg_catalog.regclass);
    RAISE EXCEPTION 'trap: % ran as %', what, current_user;
END
$$
"""


def pinned(
    db: Database, user: str = "postgres", autocommit: bool = True
) -> psycopg.Connection[Any]:
    """A connection of the test's own, immune to the search_path it sets for everyone else."""
    return psycopg.connect(db.dsn(user), autocommit=autocommit, options=PINNED)


class Trap:
    """Look-alikes in public of every function and operator of pg_catalog that we use."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.what: dict[str, str] = {}  # sequence name -> the signature it records

    def plant(self) -> None:
        names = names_we_use()
        with pinned(self.db, autocommit=False) as conn:
            # The extensions install creates, for their signatures only (rolled back).
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm WITH SCHEMA pg_catalog")
            conn.execute("CREATE EXTENSION IF NOT EXISTS btree_gin WITH SCHEMA pg_catalog")
            functions = conn.execute(_SIGNATURES, (sorted(names.functions),)).fetchall()
            operators = conn.execute(_OPERATORS, (sorted(names.operators),)).fetchall()
            conn.rollback()
        statements: list[tuple[str, str]] = []
        # name -> arity -> the result of an overload with that arity, for the all-text variant
        # (the same result type, so that a column or default binds it without complaint).
        arities: dict[str, dict[int, str]] = {}
        exact: set[tuple[str, str]] = set()
        for name, args, result, types, nargs in functions:
            plain = not (types[-1].startswith("any") or _UNDECLARABLE & {types[-1]})
            arities.setdefault(name, {}).setdefault(nargs, result if plain else "text")
            exact.add((name, ", ".join(types[:-1])))
            if _UNDECLARABLE & {t.removeprefix("VARIADIC ") for t in types}:
                continue
            statements.append((f"{name}({args})", self._function(name, args, result)))
        for name, results in sorted(arities.items()):
            for n, result in sorted(results.items()):
                args = ", ".join(["text"] * n)
                if (name, args) not in exact:
                    statements.append((f"{name}({args})", self._function(name, args, result)))
        for i, (name, left, right, result) in enumerate(operators):
            if _UNDECLARABLE & {left, right, result}:
                continue
            fn = f"public.trap_op_{i}"
            params = ", ".join(t for t in (left, right) if t)
            leftarg = f"LEFTARG = {left}, " if left else ""
            statements.append(
                (
                    f"operator {name}({left or 'NONE'}, {right})",
                    self._function(fn, params, result, qualified=True)
                    + f";\nCREATE OPERATOR public.{name} ({leftarg}RIGHTARG = {right}, "
                    f"FUNCTION = {fn})",
                )
            )
        planted = []
        with pinned(self.db, OWNER_USER) as conn:
            conn.execute(_FIRE)
            for what, statement in statements:
                seq = f"public.trap_{len(self.what)}"
                body = statement.replace("__SEQ__", seq).replace(
                    "__WHAT__", what.replace("'", "''")
                )
                try:
                    with conn.transaction():
                        conn.execute(f"CREATE SEQUENCE {seq}")
                        conn.execute(f"GRANT USAGE ON SEQUENCE {seq} TO PUBLIC")
                        conn.execute(body.encode())
                except psycopg.errors.Error as e:
                    # A signature PL/pgSQL cannot have (a polymorphic result without a
                    # polymorphic argument, ...): nothing can call that look-alike either.
                    assert isinstance(
                        e,
                        psycopg.errors.InvalidFunctionDefinition
                        | psycopg.errors.FeatureNotSupported
                        | psycopg.errors.DatatypeMismatch
                        | psycopg.errors.InvalidObjectDefinition,
                    ), f"{what}: {e}"
                    continue
                self.what[seq] = what
                planted.append(what)
        # The look-alikes the issue names are among them.
        assert {
            "format(text, text)",
            "current_setting(text, boolean)",
            "to_regclass(text)",
            "to_tsvector(text, text)",
            "operator =(name, name)",
            "operator =(text, text)",
            "operator <(integer, integer)",
        } <= set(planted)

    @staticmethod
    def _function(name: str, args: str, result: str, *, qualified: bool = False) -> str:
        target = name if qualified else f"public.{pgsql.Identifier(name).as_string(None)}"
        return (
            f"CREATE FUNCTION {target}({args}) RETURNS {result}\n"
            "LANGUAGE plpgsql IMMUTABLE AS $trap$\nBEGIN\n"
            "    PERFORM public.trap_fire('__SEQ__', '__WHAT__');\nEND\n$trap$"
        )

    def hostile_search_path(self) -> None:
        with pinned(self.db, OWNER_USER) as conn:
            conn.execute(
                pgsql.SQL("ALTER DATABASE {} SET search_path = {}").format(
                    pgsql.Identifier(self.db.name), pgsql.SQL(HOSTILE_PATH)
                )
            )

    def fired(self) -> list[str]:
        with pinned(self.db) as conn:
            rows = conn.execute(
                "SELECT schemaname OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) sequencename"
                " FROM pg_catalog.pg_sequences WHERE last_value IS NOT NULL"
            ).fetchall()
        return sorted(self.what[r[0]] for r in rows if r[0] in self.what)

    def assert_quiet(self, after: str) -> None:
        assert self.fired() == [], f"after {after}, look-alikes in public ran"


def ok(result: Any, what: str) -> str:
    assert result.returncode == 0, f"{what}: {result.stdout}{result.stderr}"
    return str(result.stdout)


# Run on a pinned connection: the names are pg_catalog's.
_FOREIGN_BINDINGS = """
SELECT pg_describe_object(d.classid, d.objid, d.objsubid) || ' uses '
       || pg_describe_object(d.refclassid, d.refobjid, 0)
FROM pg_depend AS d
JOIN (SELECT 'pg_proc'::regclass AS class, oid, pronamespace AS ns FROM pg_proc
      UNION ALL SELECT 'pg_operator'::regclass, oid, oprnamespace FROM pg_operator
      UNION ALL SELECT 'pg_type'::regclass, oid, typnamespace FROM pg_type) AS used
  ON used.class = d.refclassid AND used.oid = d.refobjid
WHERE used.ns <> ALL (ARRAY['pg_catalog'::regnamespace, 'aidb_memory'::regnamespace])
  AND 'aidb_memory'::regnamespace = CASE d.classid
      WHEN 'pg_class'::regclass THEN (SELECT relnamespace FROM pg_class WHERE oid = d.objid)
      WHEN 'pg_attrdef'::regclass THEN
          (SELECT c.relnamespace FROM pg_attrdef AS a JOIN pg_class AS c ON c.oid = a.adrelid
           WHERE a.oid = d.objid)
      WHEN 'pg_constraint'::regclass THEN
          (SELECT connamespace FROM pg_constraint WHERE oid = d.objid)
      WHEN 'pg_rewrite'::regclass THEN
          (SELECT c.relnamespace FROM pg_rewrite AS r JOIN pg_class AS c ON c.oid = r.ev_class
           WHERE r.oid = d.objid)
      WHEN 'pg_trigger'::regclass THEN
          (SELECT c.relnamespace FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid
           WHERE t.oid = d.objid)
      WHEN 'pg_proc'::regclass THEN (SELECT pronamespace FROM pg_proc WHERE oid = d.objid)
      WHEN 'pg_type'::regclass THEN (SELECT typnamespace FROM pg_type WHERE oid = d.objid)
  END
"""


def foreign_bindings(db: Database) -> list[str]:
    """What of ours depends on a function, operator or type outside pg_catalog and our schema."""
    with pinned(db) as conn:
        rows = conn.execute(_FOREIGN_BINDINGS).fetchall()
    return sorted(r[0] for r in rows)


# --- the API and the worker, as their roles call them on the hostile search_path ---------------


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with serve() as server:
        extraction = {
            "operations": [{"op": "add", "text": "Alice drinks green tea.", "target": None}]
        }
        server.default = lambda _request: Reply(content=json.dumps(extraction))
        yield server


def use_the_api(db: Database, fake: FakeOpenAI, trap: Trap) -> None:
    """Every kind of call an application, an admin and a worker make, on unpinned connections
    (the database's search_path), with nothing but function calls of their own."""
    opts = Jsonb({"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0})
    with db.connect(ADMIN_USER) as admin:
        admin.execute("SELECT aidb_memory.create_model(%s, %s, %s)", ("chat", "openai", opts))
        admin.execute(
            "SELECT aidb_memory.init(%s, %s, %s)",
            (NS, Jsonb({"llm": "chat"}), Jsonb({"compaction_min_target_chars": 20})),
        )
        admin.execute("SELECT * FROM aidb_memory.runtime_info()")
    trap.assert_quiet("admin calls")
    turns = [
        {"role": "user", "content": "I only drink green tea, never coffee. " * 4},
        {"role": "assistant", "content": "Noted: green tea it is, and no coffee. " * 4},
    ]
    with db.connect(APP_USER) as app:
        app.execute(
            "SELECT * FROM aidb_memory.session_start(%s, %s, %s, %s)", (NS, "alice", "a", "s")
        )
        event = app.execute(
            "SELECT aidb_memory.add(%s, %s, %s, %s)", (NS, "alice", Jsonb(turns), "s")
        ).fetchone()
        app.execute("SELECT aidb_memory.add(%s, %s, %s)", (NS, "alice", Jsonb(turns)))
        # A budget smaller than the history: compaction runs (the fake model summarizes).
        app.execute(
            "SELECT * FROM aidb_memory.session_get(%s, %s, %s, %s)", (NS, "alice", "s", 200)
        )
        app.execute(
            "SELECT * FROM aidb_memory.session_messages(%s, %s, %s, %s)", (NS, "alice", "s", 200)
        )
        app.execute("SELECT * FROM aidb_memory.session_list(%s, %s)", (NS, "alice"))
    trap.assert_quiet("session calls")
    assert event is not None

    # The worker, three ways: as a member of aidb_workers, as the superuser (pg_cron's job owner
    # usually is), and the CLI.
    with db.connect(WORKER_USER) as worker:
        worker.execute("CALL aidb_memory.process_events()")
    trap.assert_quiet("CALL process_events() as a member of aidb_workers")
    with db.connect(APP_USER) as app:
        app.execute("SELECT aidb_memory.add(%s, %s, %s, %s)", (NS, "bob", Jsonb(turns), "s"))
    with db.connect() as superuser:
        superuser.execute("CALL aidb_memory.process_events(max_events => 10)")
    trap.assert_quiet("CALL process_events() as the superuser")
    with db.connect(APP_USER) as app:
        app.execute("SELECT aidb_memory.add(%s, %s, %s, %s)", (NS, "carol", Jsonb(turns), "s"))
    ok(run_cli("worker", "--once", dsn=db.dsn()), "aidb-memory worker --once")
    trap.assert_quiet("aidb-memory worker --once")

    with db.connect(APP_USER) as app:
        memories = app.execute(
            "SELECT * FROM aidb_memory.list_memories(%s, %s)", (NS, "alice")
        ).fetchall()
        app.execute("SELECT * FROM aidb_memory.search(%s, %s, %s)", (NS, "alice", "green tea"))
        app.execute("SELECT * FROM aidb_memory.search(%s, %s, %s)", (NS, "alice", "gren tee"))
        app.execute("SELECT aidb_memory.status(%s, %s, %s)", (NS, "alice", event[0]))
        app.execute(
            "SELECT aidb_memory.delete(%s, %s, %s, %s)",
            (NS, "alice", Jsonb({"all": True}), "test"),
        )
        app.execute("SELECT * FROM aidb_memory.session_pop(%s, %s, %s)", (NS, "alice", "s"))
        app.execute("SELECT * FROM aidb_memory.session_end(%s, %s, %s)", (NS, "alice", "s"))
        app.execute("SELECT aidb_memory.forget(%s, %s, %s)", (NS, "bob", "test"))
    trap.assert_quiet("search, list_memories, status, delete, session_pop/end, forget")
    assert memories, "the worker extracted nothing: the memory path was not exercised"
    with db.connect(ADMIN_USER) as admin:
        admin.execute("SELECT aidb_memory.namespace_drop(%s, %s)", (NS, "test"))
    trap.assert_quiet("namespace_drop")


# --- the attacks ----------------------------------------------------------------------------------


def record_server_pythonpath(db: Database, directory: Path) -> None:
    """What `aidb-memory deps` records (without running pip again): where openai is."""
    with pinned(db) as conn:
        conn.execute(
            "INSERT INTO aidb_memory.runtime_settings (key, value) "
            "VALUES ('server_pythonpath', %s)",
            (str(directory),),
        )


def test_install_and_every_cli_command_run_nothing_of_the_database_owner(
    owned_empty_db: Database, fake: FakeOpenAI, server_pylib: Path
) -> None:
    """Acceptance 1: the owner plants look-alikes and a hostile database search_path before a
    superuser installs; install, a no-op re-install, status, verify, doctor, deps, `sql | psql`,
    an install by a library caller on its own connection, the API and the worker, and uninstall
    call none of them."""
    db = owned_empty_db
    trap = Trap(db)
    trap.plant()
    trap.hostile_search_path()

    ok(run_cli("install", dsn=db.dsn()), "install")
    trap.assert_quiet("install")
    assert foreign_bindings(db) == []
    record_server_pythonpath(db, server_pylib)
    again = ok(run_cli("install", dsn=db.dsn()), "re-install")
    assert "code is up to date" in again
    trap.assert_quiet("a no-op re-install")
    for command in (["status"], ["status", "--json"], ["verify"], ["doctor"]):
        ok(run_cli(*command, dsn=db.dsn()), " ".join(command))
        trap.assert_quiet(" ".join(command))
    # deps reads the state and probes the server's Python before it would run pip: stop there.
    deps = run_cli("deps", "--python", "/nonexistent/python3", dsn=db.dsn())
    assert "cannot run --python /nonexistent/python3" in deps.stderr, deps.stderr
    trap.assert_quiet("deps")
    script = ok(run_cli("sql"), "sql")
    ok(psql(db.dsn(), input=script), "aidb-memory sql | psql")
    trap.assert_quiet("aidb-memory sql | psql")
    # A library caller (like tests/conftest.py) with a connection that is not pinned.
    with db.connect(autocommit=False) as conn:
        install(conn, Package.load(), say=lambda _line: None)
    trap.assert_quiet("installer.install on the caller's connection")

    use_the_api(db, fake, trap)

    ok(run_cli("uninstall", "--yes", dsn=db.dsn()), "uninstall")
    trap.assert_quiet("uninstall")


def test_nothing_of_ours_binds_to_a_look_alike_planted_before_install(
    owned_empty_db: Database, fake: FakeOpenAI, server_pylib: Path
) -> None:
    """Acceptance 2: look-alikes planted before an install under the default search_path
    (pg_catalog first): a better-matching overload, such as to_tsvector(text, text) for
    to_tsvector('simple', ...), must not be bound into a column, default, CHECK or index of ours,
    where it would run inside SECURITY DEFINER code for as long as the table exists."""
    db = owned_empty_db
    trap = Trap(db)
    trap.plant()
    # Extensions that an operator created beforehand (where 0005 wants them): 0005 then creates
    # none, so what this test shows is the binding of our own columns and constraints.
    with pinned(db) as conn:
        conn.execute("CREATE EXTENSION pg_trgm WITH SCHEMA pg_catalog")
        conn.execute("CREATE EXTENSION btree_gin WITH SCHEMA pg_catalog")
    ok(run_cli("install", dsn=db.dsn()), "install")
    trap.assert_quiet("install")
    assert foreign_bindings(db) == []
    record_server_pythonpath(db, server_pylib)
    use_the_api(db, fake, trap)


def test_the_api_and_the_worker_run_nothing_of_the_database_owner(
    owned_db: Database, fake: FakeOpenAI
) -> None:
    """Acceptance 4 (and the API): in an installed database, the owner plants look-alikes and
    sets a hostile search_path; the worker procedure (as aidb_workers, as the superuser, and
    through `aidb-memory worker`) and every API call run none of them."""
    trap = Trap(owned_db)
    trap.plant()
    trap.hostile_search_path()
    use_the_api(owned_db, fake, trap)


# --- databases installed before the fix ----------------------------------------------------------

_BENIGN_TO_TSVECTOR = """
CREATE FUNCTION public.to_tsvector(config text, content text) RETURNS pg_catalog.tsvector
LANGUAGE sql IMMUTABLE
RETURN pg_catalog.to_tsvector(config::pg_catalog.regconfig, content)
"""
_MEMORY = (
    "INSERT INTO aidb_memory.memory (actor_key, namespace_id, actor_id, content, content_hash, "
    "lexemes) SELECT aidb_memory.actor_key(name, 'alice'), id, 'alice', %s, %s, "
    "pg_catalog.to_tsvector('pg_catalog.english'::pg_catalog.regconfig, %s) "
    "FROM aidb_memory.namespace WHERE id = 1"
)


def install_before_0006(db: Database, source_tree: Path) -> None:
    """Install the package as it was before migration 0006 (the same code without it)."""
    (source_tree / "migrations" / "0006_qualified_tsv.sql").unlink(missing_ok=True)
    ok(run_cli("install", "--source", str(source_tree), dsn=db.dsn()), "install before 0006")
    # Versions before 0.2.0 recorded no catalog_schema: the hand changes below stand for what
    # such an install made, not for drift since the last install.
    db.sql("DELETE FROM aidb_memory.runtime_settings WHERE key = 'catalog_schema'")


def test_an_upgrade_unbinds_the_look_alike_an_earlier_install_bound_into_memory_tsv(
    owned_empty_db: Database, source_tree: Path
) -> None:
    """Before 0006, to_tsvector('simple', content) bound a public.to_tsvector(text, text) that
    existed at install, even under the default search_path. The owner's look-alike is harmless
    until they replace its body; the upgrade must leave memory.tsv bound to pg_catalog, with
    its index, its data and the word triggers that read it."""
    db = owned_empty_db
    with pinned(db, OWNER_USER) as conn:
        conn.execute(_BENIGN_TO_TSVECTOR)
    install_before_0006(db, source_tree)
    with pinned(db) as conn:
        # What 0005 bound before the install pinned its search_path: the same column, resolved
        # to the better match (install today resolves it to pg_catalog whatever 0005 says).
        conn.execute("ALTER TABLE aidb_memory.memory DROP COLUMN tsv")
        conn.execute(
            "ALTER TABLE aidb_memory.memory ADD COLUMN tsv tsvector "
            "GENERATED ALWAYS AS (public.to_tsvector('simple', content)) STORED"
        )
        conn.execute(
            "CREATE INDEX memory_tsv_idx ON aidb_memory.memory "
            "USING gin (namespace_id, actor_id, tsv) WHERE valid_to IS NULL"
        )
        conn.execute(_MEMORY, ("Alice drinks green tea", "h1", "Alice drinks green tea"))
    assert any("to_tsvector(text,text)" in b for b in foreign_bindings(db))

    ok(run_cli("install", dsn=db.dsn()), "upgrade")

    assert foreign_bindings(db) == []
    with pinned(db) as conn:
        conn.execute(_MEMORY, ("Bob rides a bicycle", "h2", "Bob rides a bicycle"))
        rows = conn.execute(
            "SELECT content, tsv = to_tsvector('pg_catalog.simple'::regconfig, content) "
            "FROM aidb_memory.memory ORDER BY id"
        ).fetchall()
        index = conn.execute(
            "SELECT pg_get_indexdef('aidb_memory.memory_tsv_idx'::regclass)"
        ).fetchone()
        words = conn.execute(
            "SELECT array_agg(word ORDER BY word) FROM aidb_memory.memory_word"
        ).fetchone()
    assert rows == [("Alice drinks green tea", True), ("Bob rides a bicycle", True)]
    assert index is not None and index[0].endswith(
        "USING gin (namespace_id, actor_id, tsv) WHERE (valid_to IS NULL)"
    )
    assert words is not None
    assert words[0] == sorted(["alice", "drinks", "green", "tea", "bob", "rides", "a", "bicycle"])


def test_an_upgrade_refuses_a_database_whose_objects_use_another_schemas_code(
    owned_empty_db: Database, source_tree: Path
) -> None:
    """Anything else of ours found bound outside pg_catalog means an earlier install ran under
    another role's search_path (and ran their code as a superuser): 0006 stops the upgrade with
    42501 and a hint instead of carrying on with a database it cannot repair."""
    db = owned_empty_db
    install_before_0006(db, source_tree)
    with pinned(db, OWNER_USER) as conn:
        conn.execute(_BENIGN_TO_TSVECTOR)
    with pinned(db) as conn:  # what such an install would have bound
        conn.execute(
            "ALTER TABLE aidb_memory.namespace ADD CONSTRAINT planted "
            "CHECK (public.to_tsvector('simple', name) IS NOT NULL)"
        )

    result = run_cli("install", dsn=db.dsn())

    assert result.returncode == 1
    assert "install failed at migrations/0006_qualified_tsv.sql" in result.stderr
    assert "use functions, operators or types of another schema" in result.stderr
    assert "constraint planted on table aidb_memory.namespace uses function " in result.stderr
    assert "(hint: an earlier install resolved names through a search_path" in result.stderr
    with pinned(db) as conn:
        applied = conn.execute("SELECT name FROM aidb_memory.schema_migrations").fetchall()
    assert ("0006_qualified_tsv",) not in applied
