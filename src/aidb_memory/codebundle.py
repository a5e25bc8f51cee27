"""The idempotent part of an install: server-side modules and the ``sql/`` files.

PL/Python functions in ``sql/`` are written with a one-line body naming their target,
``AS $py$ namespaces.init $py$``. Rendering replaces it with a stub that loads the server-side
package from the database (once per connection and code generation) and dispatches to the
target. Every stub embeds the code generation, so an upgrade that changes any module rewrites
every function, and PostgreSQL makes each open connection recompile it on its next call: the
stub then sees a new generation and reloads the package (SPEC §1).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from aidb_memory import __version__
from aidb_memory.migrations import SqlSourceError, parse_statements
from aidb_memory.sources import SourceTree

SERVER_PACKAGE = "aidb_memory_server"
BOOT_MODULE = f"{SERVER_PACKAGE}.boot"

_TARGET = re.compile(r"\$py\$\s*([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)\s*\$py\$")
_STUB = """$py$
# aidb_memory: runs {target} (code generation {generation})
rt = GD.get("aidb_memory.rt")
if rt is None or rt.generation != "{generation}":
    boot = {{"__name__": "{boot}"}}
    exec(plpy.execute("SELECT source FROM aidb_memory.runtime_modules WHERE name = '{boot}'")[0]["source"], boot)
    rt = boot["boot"](GD, "{generation}")
return rt.call("{target}", args)
$py$"""

# Statements that create or destroy stored data do not belong in files re-run on every install.
_FORBIDDEN_IN_SQL_DIR = {
    "CreateStmt": "CREATE TABLE",
    "CreateTableAsStmt": "CREATE TABLE AS",
    "CreateSeqStmt": "CREATE SEQUENCE",
    "InsertStmt": "INSERT",
    "UpdateStmt": "UPDATE",
    "DeleteStmt": "DELETE",
    "TransactionStmt": "transaction control",
}


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


def render_stubs(text: str, generation: str) -> str:
    """Replace each ``$py$ module.function $py$`` body with the loading stub."""
    return _TARGET.sub(
        lambda m: _STUB.format(target=m.group(1), generation=generation, boot=BOOT_MODULE), text
    )


def _lint_sql_file(path: Path, parsed: list[tuple[object, str]]) -> None:
    for stmt, text in parsed:
        kind = type(stmt).__name__
        if kind in _FORBIDDEN_IN_SQL_DIR:
            raise SqlSourceError(
                f"sql/{path.name}: {_FORBIDDEN_IN_SQL_DIR[kind]} does not belong in an idempotent "
                "file; write a migration (migrations/NNNN_name.sql)"
            )
        if kind == "CreateFunctionStmt":
            _lint_function(path, stmt, text)


def _lint_function(path: Path, stmt: object, text: str) -> None:
    options = {opt.defname: opt.arg for opt in getattr(stmt, "options", None) or ()}
    name = ".".join(n.sval for n in stmt.funcname)  # type: ignore[attr-defined]
    language = getattr(options.get("language"), "sval", None)
    if language == "plpython3u" and not _TARGET.search(text):
        raise SqlSourceError(
            f"sql/{path.name}: {name} must have the one-line body $py$ module.function $py$"
        )
    security = options.get("security")
    if not getattr(security, "boolval", False):
        raise SqlSourceError(f"sql/{path.name}: {name} must be SECURITY DEFINER (SPEC §6)")
    search_path = options.get("set")
    value = getattr(search_path, "name", None), [
        getattr(getattr(a, "val", None), "sval", None) for a in getattr(search_path, "args", None) or ()
    ]
    if value != ("search_path", ["pg_catalog", "pg_temp"]):
        raise SqlSourceError(
            f"sql/{path.name}: {name} must SET search_path = pg_catalog, pg_temp (SPEC §6)"
        )


def load_sql_files(sql_dir: Path, generation: str) -> tuple[SqlFile, ...]:
    """Every ``sql/*.sql`` in name order, linted, with PL/Python stubs rendered."""
    files = []
    for path in sorted(sql_dir.glob("*.sql")):
        text = path.read_text(encoding="utf-8")
        _lint_sql_file(path, parse_statements(path, text))
        rendered = parse_statements(path, render_stubs(text, generation))
        files.append(SqlFile(path.name, tuple(t for _, t in rendered)))
    return tuple(files)


def load_bundle(tree: SourceTree) -> CodeBundle:
    """Read and check the whole idempotent part of the package."""
    modules = load_modules(tree.plpython_dir)
    generation = generation_of(modules)
    sql_files = load_sql_files(tree.sql_dir, generation)
    h = hashlib.sha256(f"{__version__}\0{generation}\0".encode())
    for f in sql_files:
        h.update(f.name.encode() + b"\0" + "\0".join(f.statements).encode() + b"\0")
    return CodeBundle(modules, sql_files, generation, h.hexdigest())
