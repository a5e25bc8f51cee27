"""The idempotent part of an install: server-side modules and the ``sql/`` files.

PL/Python functions in ``sql/`` are written with a one-line body naming their target,
``AS $py$ namespaces.init $py$``. Rendering replaces it with a stub that loads the server-side
package from the database (once per connection and code generation) and dispatches to the
target. Every stub embeds the code generation, so an upgrade that changes any module rewrites
every function, and PostgreSQL makes each open connection recompile it on its next call: the
stub then sees a new generation and reloads the package (SPEC §1).
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Mapping
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pglast
from pglast import ast as pgast
from pglast.enums import FunctionParameterMode
from pglast.stream import RawStream

from aidb_memory import __version__
from aidb_memory.install import catalog
from aidb_memory.install.migrations import SqlSourceError, parse_statements
from aidb_memory.install.sources import SourceTree

SERVER_PACKAGE = "aidb_memory_server"
BOOT_MODULE = f"{SERVER_PACKAGE}.boot"

# A dispatch target: a module of the server-side package, then a function of it.
_TARGET = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
# boot.py itself, as install compiled it for this Python (runtime_bytecode, valid for the source
# stored now) or else its source: compiling it cost a first call ~1.5 ms. A row that does not
# unmarshal (written by hand) falls back to the source, as boot() does for the other modules.
_LOAD_BOOT = (
    """b = plpy.execute("SELECT m.source, c.magic, c.code """
    """FROM aidb_memory.runtime_modules AS m LEFT JOIN aidb_memory.runtime_bytecode AS c """
    """ON c.name = m.name AND c.source_md5 = m.source_md5 """
    """WHERE m.name = '{boot}'")[0]
        code = b["source"]
        if b["magic"] == __import__("_frozen_importlib_external").MAGIC_NUMBER:
            try:
                code = __import__("marshal").loads(b["code"])
            except Exception:
                pass
        exec(code, boot)"""
)
_STUB = (
    """
# aidb_memory: runs {target} (code generation {generation})
rt = GD.get("aidb_memory.rt")
if rt is None or rt.generation != "{generation}":
    boot = {{"__name__": "{boot}"}}
    try:
        """
    + _LOAD_BOOT
    + """
        rt = boot["boot"](GD, "{generation}")
    except plpy.SPIError as e:
        raise type("{name}", (plpy.Error,), {{
            "__module__": "aidb_memory", "sqlstate": getattr(e, "sqlstate", None) or "XX000",
            "detail": getattr(e, "detail", None), "hint": getattr(e, "hint", None),
        }})(" ".join(str(e.args[0] if e.args else "").split())) from None
return rt.bind(globals(), "{target}", "{generation}")()
"""
)
# Loading the code runs queries, which can meet a lock (an install under way) or a cancel: such
# an error reaches the client as ``aidb_memory.<function>: <message>`` with its SQLSTATE, DETAIL
# and HINT, as every other error of ours (runtime.py makes those), not as the PL/Python
# ``spiexceptions.LockNotAvailable: ...`` with the query that failed.

# Statements that create or destroy stored data do not belong in files re-run on every install.
_FORBIDDEN_IN_SQL_DIR = {
    "CreateStmt": "CREATE TABLE",
    "CreateTableAsStmt": "CREATE TABLE AS",
    "CreateSeqStmt": "CREATE SEQUENCE",
    "IndexStmt": "CREATE INDEX",
    "InsertStmt": "INSERT",
    "UpdateStmt": "UPDATE",
    "DeleteStmt": "DELETE",
    "MergeStmt": "MERGE",
    "CopyStmt": "COPY",
    "TruncateStmt": "TRUNCATE",
    "TransactionStmt": "transaction control",
}
# DROP of these destroys data (DROP FUNCTION or DROP VIEW, e.g. of an old signature, is fine).
_FORBIDDEN_DROPS = {
    "OBJECT_TABLE": "DROP TABLE",
    "OBJECT_SCHEMA": "DROP SCHEMA",
    "OBJECT_SEQUENCE": "DROP SEQUENCE",
    "OBJECT_MATVIEW": "DROP MATERIALIZED VIEW",
    "OBJECT_INDEX": "DROP INDEX",
}

Parsed = list[tuple[Any, str]]
# Settings every SECURITY DEFINER function sets to off for its own execution.
PINNED_OFF = ("debug_print_parse", "debug_print_rewritten", "debug_print_plan")


@dataclass(frozen=True)
class Module:
    """One server-side Python module as stored in ``aidb_memory.runtime_modules``."""

    name: str
    source: str
    is_package: bool


@dataclass(frozen=True)
class SqlFile:
    """One idempotent file of ``sql/``, rendered: statements ready to execute."""

    name: str
    statements: tuple[str, ...]


@dataclass(frozen=True)
class CodeBundle:
    """Everything an install re-applies, with the checksums that say whether it must."""

    modules: tuple[Module, ...]
    sql_files: tuple[SqlFile, ...]
    generation: str
    checksum: str


def load_modules(plpython_dir: Path) -> tuple[Module, ...]:
    """Every ``.py`` of the server-side package, named as Python would import it."""
    package_dir = plpython_dir / SERVER_PACKAGE
    modules = []
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(plpython_dir).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        modules.append(Module(".".join(parts), path.read_text(encoding="utf-8"), is_package))
    if not any(m.name == BOOT_MODULE for m in modules):
        raise SqlSourceError(f"{package_dir}: {BOOT_MODULE} is missing")
    return tuple(modules)


def generation_of(modules: tuple[Module, ...]) -> str:
    """A short hash of all module sources: changes whenever any module changes."""
    h = hashlib.sha256()
    for m in modules:
        h.update(f"{m.name}\0{m.source}\0".encode())
    return h.hexdigest()[:16]


def stub_source(target: str, generation: str) -> str:
    """The body that loads the server-side package and calls ``target``."""
    name = target.rpartition(".")[2]
    return _STUB.format(target=target, generation=generation, boot=BOOT_MODULE, name=name)


def render_stub(target: str, generation: str) -> str:
    """:func:`stub_source`, dollar-quoted."""
    return f"$py${stub_source(target, generation)}$py$"


# A function that a role of ours may execute (granted in sql/) and that is written in PL/Python
# is installed as two: ``<name>_py``, the PL/Python function, which only the owner may execute,
# and ``<name>`` itself, this PL/pgSQL wrapper, with the same signature, options and comment,
# which calls it and raises its error again. PL/Python always gives an error that leaves Python
# a CONTEXT of ``Traceback (most recent call last):`` (and, on a function's first call in a
# connection, the stub's frame); raised again from here, the CONTEXT is this function's one
# line. The message keeps its ``aidb_memory.<function>:`` (the worker's functions name
# process_events) and gets this function's when it has none (an error of PostgreSQL's own).
BODY_SUFFIX = "_py"
# A granted PL/Python function ``<name>`` may have a fast path in PL/pgSQL: a function
# ``<name>_fast`` with the same arguments, defined in sql/, whose body is ``BEGIN <block> RETURN
# NULL; END`` (``RETURN; END`` for a set-returning one), where the block returns (a value, or
# ``RETURN QUERY ...; RETURN;``) when it did the common case without Python and falls through,
# having written nothing, otherwise. The wrapper runs that block before calling
# the PL/Python body, inside its exception handler (so that its errors reach the client as the
# Python code's do, without its statements in the CONTEXT): the same code as the function, which
# tests call on its own, without the cost of a second call with its own SET clauses.
FAST_SUFFIX = "_fast"
_FAST_BODY = re.compile(r"\A\s*BEGIN\n(?P<block>.*\n)\s*RETURN(?: NULL)?;\s*END\s*\Z", re.S)
_WRAPPER = r"""
DECLARE
    _state text;
    _message text;
    _detail text;
    _hint text;
BEGIN
{guards}{fast}    {call}
EXCEPTION WHEN OTHERS OR query_canceled THEN
    GET STACKED DIAGNOSTICS _state = RETURNED_SQLSTATE, _message = MESSAGE_TEXT,
        _detail = PG_EXCEPTION_DETAIL, _hint = PG_EXCEPTION_HINT;
    IF _message !~ '^aidb_memory\.\w+: ' THEN
        _message := 'aidb_memory.{name}: ' || _message;
    END IF;
    -- RAISE sends an empty DETAIL or HINT as one, and refuses a NULL: name only those present.
    IF _detail <> '' AND _hint <> '' THEN
        RAISE EXCEPTION USING ERRCODE = _state, MESSAGE = _message, DETAIL = _detail, HINT = _hint;
    ELSIF _detail <> '' THEN
        RAISE EXCEPTION USING ERRCODE = _state, MESSAGE = _message, DETAIL = _detail;
    ELSIF _hint <> '' THEN
        RAISE EXCEPTION USING ERRCODE = _state, MESSAGE = _message, HINT = _hint;
    END IF;
    RAISE EXCEPTION USING ERRCODE = _state, MESSAGE = _message;
END
"""


def granted_functions(files: list[tuple[Path, Parsed]]) -> set[str]:
    """Signatures (as :func:`catalog.signature`) of the functions that sql/ grants EXECUTE on."""
    granted = set()
    for _, parsed in files:
        for stmt, _ in parsed:
            if (
                type(stmt).__name__ == "GrantStmt"
                and stmt.is_grant
                and getattr(stmt.objtype, "name", "") == "OBJECT_FUNCTION"
            ):
                for obj in stmt.objects or ():
                    args = ", ".join(RawStream()(a) for a in obj.objargs or ())
                    granted.add(f"{'.'.join(n.sval for n in obj.objname)}({args})")
    return granted


def _with_options(stmt: Any, **replace: Any) -> Any:
    """A copy of a CreateFunctionStmt with the options named in ``replace`` set anew."""
    copy = deepcopy(stmt)
    copy.options = tuple(
        pgast.DefElem(defname=o.defname, arg=replace[o.defname]) if o.defname in replace else o
        for o in stmt.options
    )
    return copy


def _renamed(stmt: Any, name: str) -> Any:
    """A copy of a CreateFunctionStmt under another name in its schema."""
    copy = deepcopy(stmt)
    copy.funcname = (stmt.funcname[0], pgast.String(sval=name))
    return copy


def _wrapped(
    stmt: Any, generation: str, fast_paths: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """The body function, its comment and the wrapper that replace one granted PL/Python
    function (see :data:`BODY_SUFFIX`); the wrapper runs the function's fast path first when
    ``fast_paths`` (:func:`_fast_paths`) has one (:data:`FAST_SUFFIX`)."""
    schema, name = (n.sval for n in stmt.funcname)
    body_name = f"{name}{BODY_SUFFIX}"
    target = (python_body(stmt) or "").strip()
    body = _with_options(stmt, **{"as": (pgast.String(sval=stub_source(target, generation)),)})
    body.funcname = (pgast.String(sval=schema), pgast.String(sval=body_name))
    parameters = stmt.parameters or ()
    args = [p for p in parameters if p.mode not in catalog.NOT_ARGUMENTS]
    call = f"{schema}.{body_name}({', '.join(f'${i}' for i in range(1, len(args) + 1))})"
    fast_name = f"{name}{FAST_SUFFIX}"
    fast = (fast_paths or {}).get(catalog.signature(_renamed(stmt, fast_name)), "")
    if stmt.is_procedure or any(
        p.mode in (FunctionParameterMode.FUNC_PARAM_OUT, FunctionParameterMode.FUNC_PARAM_INOUT)
        for p in parameters
    ):
        raise SqlSourceError(
            f"{schema}.{name}: a granted PL/Python function must return a value, a set or a "
            "table (its wrapper is written for those)"
        )
    if stmt.returnType.setof or any(
        p.mode == FunctionParameterMode.FUNC_PARAM_TABLE for p in parameters
    ):
        statement = f"RETURN QUERY SELECT * FROM {call};"
    elif RawStream()(stmt.returnType) == "void":
        statement = f"PERFORM {call};"
    else:
        statement = f"RETURN {call};"
    if fast and not statement.startswith("RETURN "):
        raise SqlSourceError(
            f"{schema}.{fast_name}: a fast path is for a function that returns a value or a set"
        )
    wrapper = _with_options(
        stmt,
        language=pgast.String(sval="plpgsql"),
        **{
            "as": (
                pgast.String(
                    sval=_WRAPPER.format(
                        guards=_size_guards(schema, name, args),
                        fast=fast,
                        call=statement,
                        name=name,
                    )
                ),
            )
        },
    )
    comment = (
        f"COMMENT ON FUNCTION {catalog.signature(body)} IS "
        f"'Internal: the PL/Python body of {schema}.{name}, which calls it and raises its errors "
        "again without the Python traceback (docs/architecture.md, Errors).'"
    )
    return RawStream()(body), comment, RawStream()(wrapper)


# Text and jsonb arguments larger than this are measured by the wrapper, before PL/Python copies
# them (sql/12_argument_caps.sql); a smaller one is checked by the Python code after it.
GUARD_BYTES = 65_536
# A number of more than 100 characters of JSON text (what validation.JSON_MAX_NUMBER_CHARS
# refuses) whose magnitude makes its text long whatever the client sent: jsonb keeps 1e100000 in
# a few bytes and writes it out as 100,001 digits, so a small jsonb could become a huge JSON text
# before Python sees it. sql/12_argument_caps.sql has the same path (a unit test holds them equal).
WIDE_NUMBER_PATH = (
    'strict $.** ? (@.type() == "number" && (@ >= 1e100 || @ <= -1e100 '
    "|| (@ != 0 && @ > -1e-98 && @ < 1e-98)))"
)
_GUARD = """    IF pg_catalog.pg_column_size(${i}) OPERATOR(pg_catalog.>) {bytes}{wide} THEN
        PERFORM {schema}.refuse_oversized('{name}', '{field}', {namespace}, ${i});
    END IF;
"""
_WIDE = "\n       OR pg_catalog.jsonb_path_exists(${i}, '{path}')"


def _size_guards(schema: str, name: str, args: list[Any]) -> str:
    """The wrapper's checks of its text and jsonb arguments' sizes (:data:`GUARD_BYTES`; a
    jsonb's numbers too, :data:`WIDE_NUMBER_PATH`)."""
    names = [a.name for a in args]
    namespace = f"${names.index('namespace') + 1}" if "namespace" in names else "NULL::text"
    guards = []
    for i, a in enumerate(args, start=1):
        kind = RawStream()(a.argType)
        if kind not in ("text", "jsonb"):
            continue
        wide = _WIDE.format(i=i, path=WIDE_NUMBER_PATH) if kind == "jsonb" else ""
        guards.append(
            _GUARD.format(
                i=i,
                bytes=GUARD_BYTES,
                wide=wide,
                schema=schema,
                name=name,
                field=a.name,
                namespace=namespace,
            )
        )
    return "".join(guards)


def _options(stmt: Any) -> list[tuple[str, Any]]:
    return [(opt.defname, opt.arg) for opt in getattr(stmt, "options", None) or ()]


def python_body(stmt: Any) -> str | None:
    """A plpython3u function's body as written (None for any other statement)."""
    if type(stmt).__name__ != "CreateFunctionStmt":
        return None
    options = _options(stmt)
    if "plpython3u" not in [getattr(arg, "sval", None) for n, arg in options if n == "language"]:
        return None
    bodies = [arg for n, arg in options if n == "as"]
    if len(bodies) != 1 or len(bodies[0]) != 1:
        return ""
    return str(getattr(bodies[0][0], "sval", ""))


def _render_statement(
    stmt: Any,
    text: str,
    generation: str,
    granted: set[str] | frozenset[str] = frozenset(),
    fast_paths: Mapping[str, str] | None = None,
) -> tuple[str, ...]:
    body = python_body(stmt)
    if not body:
        return (text,)
    if catalog.signature(stmt) in granted:
        return _wrapped(stmt, generation, fast_paths)
    # Only the function's own body is replaced (the lint made sure it is `$py$ target $py$`);
    # comments, strings and other functions keep any text that looks like one.
    return (text.replace(f"$py${body}$py$", render_stub(body.strip(), generation), 1),)


def render_stubs(text: str, generation: str, name: str = "<sql>") -> str:
    """``text`` with each plpython3u function's ``$py$ module.function $py$`` body replaced by
    the loading stub, one statement after the other (and its ``@<name>@`` lines expanded)."""
    parsed = parse_statements(Path(name), expand_fragments(Path(name), text))
    granted = granted_functions([(Path(name), parsed)])
    fast_paths = _fast_paths([(Path(name), parsed)])
    return "".join(
        f"{s};\n"
        for stmt, t in parsed
        for s in _render_statement(stmt, t, generation, granted, fast_paths)
    )


def _lint_sql_file(path: Path, parsed: Parsed) -> None:
    for stmt, text in parsed:
        kind = type(stmt).__name__
        what = _FORBIDDEN_IN_SQL_DIR.get(kind)
        if kind == "DropStmt":
            what = _FORBIDDEN_DROPS.get(getattr(stmt.removeType, "name", ""))
        if kind == "SelectStmt" and getattr(stmt, "intoClause", None) is not None:
            what = "SELECT INTO"
        if what:
            raise SqlSourceError(
                f"sql/{path.name}: {what} does not belong in an idempotent "
                "file; write a migration (migrations/NNNN_name.sql)"
            )
        if kind == "CreateFunctionStmt":
            _lint_function(path, stmt, text)


def _lint_function(path: Path, stmt: Any, text: str) -> None:
    options = _options(stmt)
    name = ".".join(n.sval for n in stmt.funcname)
    body = python_body(stmt)
    if body is not None and not (
        "\n" not in body and _TARGET.fullmatch(body.strip()) and f"$py${body}$py$" in text
    ):
        raise SqlSourceError(
            f"sql/{path.name}: {name} must have the one-line body $py$ module.function $py$"
        )
    if getattr(stmt, "is_procedure", False) and body is None:
        _lint_invoker_procedure(path, name, options)
        _lint_procedure_pins_search_path(path, name, options, text)
        return
    if not any(n == "security" and getattr(arg, "boolval", False) for n, arg in options):
        raise SqlSourceError(f"sql/{path.name}: {name} must be SECURITY DEFINER (SPEC §6)")
    # A function may SET other settings too; its search_path must be exactly this one.
    search_paths = [
        [getattr(getattr(a, "val", None), "sval", None) for a in getattr(arg, "args", None) or ()]
        for n, arg in options
        if n == "set" and getattr(arg, "name", None) == "search_path"
    ]
    if search_paths != [["pg_catalog", "pg_temp"]]:
        raise SqlSourceError(
            f"sql/{path.name}: {name} must SET search_path = pg_catalog, pg_temp (SPEC §6)"
        )
    # debug_print_* are settable by any session and print the plans of our statements, with
    # other actors' data substituted as constants, to a client that lowered client_min_messages.
    pinned = {
        getattr(arg, "name", None): [
            getattr(getattr(a, "val", None), "sval", None) for a in arg.args or ()
        ]
        for n, arg in options
        if n == "set"
    }
    for setting in PINNED_OFF:
        if pinned.get(setting) != ["off"]:
            raise SqlSourceError(
                f"sql/{path.name}: {name} must SET {setting} = off (it would print our plans, "
                "with their data, to any session that turned it on)"
            )


def _lint_invoker_procedure(path: Path, name: str, options: list[tuple[str, Any]]) -> None:
    """A procedure that commits (the worker's loop) cannot be SECURITY DEFINER nor SET anything:
    PostgreSQL forbids transaction control there. It must then hold no rights of its own: it runs
    as its caller and may only call functions the caller can execute."""
    if any(n == "security" and getattr(arg, "boolval", False) for n, arg in options):
        raise SqlSourceError(
            f"sql/{path.name}: procedure {name} is SECURITY DEFINER; a procedure here commits, "
            "which PostgreSQL allows only with SECURITY INVOKER: make it a function instead"
        )
    if any(n == "set" for n, _ in options):
        raise SqlSourceError(
            f"sql/{path.name}: procedure {name} has a SET clause, which forbids COMMIT inside it"
        )


# What an invoker procedure runs first, and again after each COMMIT or ROLLBACK (as PL/pgSQL
# reports a PERFORM: the query it runs).
PIN_STATEMENT = "SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true)"
_DECLARE_SECTION = re.compile(r"\bDECLARE\b(.*?)\bBEGIN\b", re.IGNORECASE | re.DOTALL)
_DECLARATION = re.compile(
    r"^\s*(?P<var>\w+)\s+(?:CONSTANT\s+)?(?P<type>[^\s;:=]+)", re.IGNORECASE | re.DOTALL
)


def _is_pin(statement: Any) -> bool:
    perform = statement.get("PLpgSQL_stmt_perform") if isinstance(statement, dict) else None
    query = ((perform or {}).get("expr") or {}).get("PLpgSQL_expr", {}).get("query", "")
    return " ".join(str(query).split()) == PIN_STATEMENT


def _statement_lists(node: Any) -> list[list[Any]]:
    """Every list of PL/pgSQL statements in ``node``: block bodies, branches, loops, handlers."""
    found: list[list[Any]] = []
    if isinstance(node, dict):
        for value in node.values():
            found.extend(_statement_lists(value))
    elif isinstance(node, list):
        if any(isinstance(n, dict) and any(k.startswith("PLpgSQL_stmt_") for k in n) for n in node):
            found.append(node)
        for value in node:
            found.extend(_statement_lists(value))
    return found


def _lint_procedure_pins_search_path(
    path: Path, name: str, options: list[tuple[str, Any]], text: str
) -> None:
    """Without SET, an invoker procedure resolves names through its caller's search_path, which a
    database owner can point at their own `<` or `=`: a superuser, worker or pg_cron job calling
    it would run them. So it must pin the search_path before evaluating anything and again after
    every COMMIT or ROLLBACK (a local setting ends with its transaction), and its variables'
    types must be qualified (PL/pgSQL resolves them when it compiles the body)."""
    where = f"sql/{path.name}: procedure {name}"
    languages = [getattr(arg, "sval", None) for n, arg in options if n == "language"]
    if languages != ["plpgsql"]:
        raise SqlSourceError(f"{where} must be LANGUAGE plpgsql (it commits)")
    pin = f"PERFORM {PIN_STATEMENT[len('SELECT ') :]};"
    try:
        (function,) = pglast.parse_plpgsql(text)
    except pglast.parser.ParseError as e:
        raise SqlSourceError(f"{where}: PL/pgSQL syntax error: {e}") from e
    tree = function["PLpgSQL_function"]
    for datum in tree.get("datums", ()):
        var = next(iter(datum.values()))
        if "default_val" in var:
            raise SqlSourceError(
                f"{where}: variable {var.get('refname')} has a default, which is evaluated "
                f"before the first statement; assign it after `{pin}`"
            )
    body = [str(arg.sval) for n, args in options if n == "as" for arg in args]
    for section in _DECLARE_SECTION.findall("\n".join(body)):
        for declaration in section.split(";"):
            match = _DECLARATION.match(declaration)
            if match and not match.group("type").lower().startswith("pg_catalog."):
                raise SqlSourceError(
                    f"{where}: variable {match.group('var')} must have a type qualified with "
                    "pg_catalog. (PL/pgSQL resolves it through the caller's search_path)"
                )
    top = tree["action"]["PLpgSQL_stmt_block"].get("body") or []
    if not top or not _is_pin(top[0]):
        raise SqlSourceError(f"{where} must start with `{pin}`")
    for statements in _statement_lists(tree["action"]):
        for i, statement in enumerate(statements):
            ends = [k for k in statement if k in ("PLpgSQL_stmt_commit", "PLpgSQL_stmt_rollback")]
            if ends and not (i + 1 < len(statements) and _is_pin(statements[i + 1])):
                raise SqlSourceError(
                    f"{where}: every {ends[0][len('PLpgSQL_stmt_') :].upper()} must be followed "
                    f"by `{pin}` (a local setting ends with the transaction)"
                )


def _top_level_names(source: str) -> set[str] | None:
    """Names a module binds at top level; None when that cannot be told (``__getattr__``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return None if "__getattr__" in names else names


def _check_targets(files: list[tuple[Path, Parsed]], modules: tuple[Module, ...]) -> None:
    """Each plpython3u function calls a function that its module defines at top level."""
    sources = {m.name: m.source for m in modules}
    for path, parsed in files:
        for stmt, _ in parsed:
            target = (python_body(stmt) or "").strip()
            if not target:
                continue
            module_name, _, attr = target.rpartition(".")
            module = f"{SERVER_PACKAGE}.{module_name}"
            if module not in sources:
                raise SqlSourceError(f"sql/{path.name}: {target}: plpython/ has no module {module}")
            names = _top_level_names(sources[module])
            if names is not None and attr not in names:
                raise SqlSourceError(f"sql/{path.name}: {target}: {module} defines no {attr}")


# Lines that several functions run are written once (issue 28): in one of them, between the
# lines ``-- BEGIN <name>`` and ``-- END <name>``; the others hold the line ``@<name>@`` where
# they run them, in the same sql/ file or another one (a name is written once in sql/), and the
# lines may hold ``@<name>@`` lines of their own. Each function then has the lines in its own
# body, so each plans their statements for itself (a function both called would cost a call,
# and the planner could not drop the columns one caller does not use); unexpanded, ``@<name>@``
# is a syntax error, never code.
_FRAGMENT = re.compile(r"^[ \t]*-- BEGIN (\w+)\n(.*?)\n[ \t]*-- END \1[ \t]*$", re.M | re.S)
_FRAGMENT_USE = re.compile(r"^[ \t]*@(\w+)@[ \t]*$", re.M)


def fragments(path: Path, text: str) -> dict[str, str]:
    """The lines ``text`` writes between ``-- BEGIN <name>`` and ``-- END <name>``, by name (a
    name written twice is refused)."""
    found: dict[str, str] = {}
    for m in _FRAGMENT.finditer(text):
        if m.group(1) in found:
            raise SqlSourceError(f"sql/{path.name}: -- BEGIN {m.group(1)} stands twice")
        found[m.group(1)] = m.group(2)
    return found


def sql_fragments(sql_dir: Path) -> dict[str, str]:
    """The fragments (:func:`fragments`) of every file of ``sql_dir``, by name (a name written
    in two files is refused)."""
    found: dict[str, str] = {}
    where: dict[str, str] = {}
    for path in sorted(sql_dir.glob("*.sql")):
        for name, lines in fragments(path, path.read_text(encoding="utf-8")).items():
            if name in found:
                raise SqlSourceError(
                    f"sql/{path.name}: -- BEGIN {name} stands in sql/{where[name]} too"
                )
            found[name] = lines
            where[name] = path.name
    return found


def expand_fragments(path: Path, text: str, written: dict[str, str] | None = None) -> str:
    """``text`` with each line ``@<name>@`` replaced by the lines between ``-- BEGIN <name>``
    and ``-- END <name>`` (of ``text``: :func:`fragments`; or ``written``), expanded too."""
    found = fragments(path, text) if written is None else written

    def expand(lines: str, within: tuple[str, ...]) -> str:
        def lines_of(use: re.Match[str]) -> str:
            name = use.group(1)
            if name not in found:
                raise SqlSourceError(
                    f"sql/{path.name}: @{name}@ names no lines of sql/ "
                    f"(-- BEGIN {name} ... -- END {name})"
                )
            if name in within:
                raise SqlSourceError(f"sql/{path.name}: @{name}@ stands within its own lines")
            return expand(found[name], (*within, name))

        return _FRAGMENT_USE.sub(lines_of, lines)

    return expand(text, ())


def _parse_sql_dir(sql_dir: Path) -> list[tuple[Path, Parsed]]:
    files = []
    written = sql_fragments(sql_dir)
    for path in sorted(sql_dir.glob("*.sql")):
        text = path.read_text(encoding="utf-8")
        parsed = parse_statements(path, expand_fragments(path, text, written))
        _lint_sql_file(path, parsed)
        files.append((path, parsed))
    return files


def _fast_paths(files: list[tuple[Path, Parsed]]) -> dict[str, str]:
    """The block of each ``<name>_fast`` function of sql/ (:data:`FAST_SUFFIX`), by its
    signature."""
    found = {}
    for _, parsed in files:
        for stmt, _ in parsed:
            if type(stmt).__name__ != "CreateFunctionStmt" or not stmt.funcname[-1].sval.endswith(
                FAST_SUFFIX
            ):
                continue
            bodies = [arg for n, arg in _options(stmt) if n == "as"]
            match = _FAST_BODY.match(str(getattr(bodies[0][0], "sval", ""))) if bodies else None
            if match is None:
                raise SqlSourceError(
                    f"{catalog.signature(stmt)}: a fast path's body is BEGIN <block> RETURN "
                    "NULL; END, or RETURN; END for a set (codebundle.FAST_SUFFIX)"
                )
            found[catalog.signature(stmt)] = match.group("block")
    return found


def _render_files(files: list[tuple[Path, Parsed]], generation: str) -> tuple[SqlFile, ...]:
    granted = granted_functions(files)
    defined = {
        catalog.signature(s)
        for _, p in files
        for s, _ in p
        if type(s).__name__ == "CreateFunctionStmt"
    }
    fast_paths = _fast_paths(files)
    unknown = sorted(granted - defined)
    if unknown:
        raise SqlSourceError(f"sql/ grants EXECUTE on what it does not define: {unknown}")
    return tuple(
        SqlFile(
            path.name,
            tuple(
                s
                for stmt, t in parsed
                for s in _render_statement(stmt, t, generation, granted, fast_paths)
            ),
        )
        for path, parsed in files
    )


def load_sql_files(sql_dir: Path, generation: str) -> tuple[SqlFile, ...]:
    """Every ``sql/*.sql`` in name order, linted, with PL/Python stubs rendered."""
    return _render_files(_parse_sql_dir(sql_dir), generation)


def load_bundle(tree: SourceTree) -> CodeBundle:
    """Read and check the whole idempotent part of the package."""
    modules = load_modules(tree.plpython_dir)
    generation = generation_of(modules)
    parsed = _parse_sql_dir(tree.sql_dir)
    _check_targets(parsed, modules)
    sql_files = _render_files(parsed, generation)
    h = hashlib.sha256(f"{__version__}\0{generation}\0".encode())
    for f in sql_files:
        h.update(f.name.encode() + b"\0" + "\0".join(f.statements).encode() + b"\0")
    return CodeBundle(modules, sql_files, generation, h.hexdigest())
