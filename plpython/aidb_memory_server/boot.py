"""Loads the server-side package from the database into this backend.

Every PL/Python function body is a stub that, when the backend has not yet loaded the current
code generation, fetches this module's source from ``aidb_memory.runtime_modules``, executes it and
calls :func:`boot`. This file must therefore stay self-contained: it runs before the package can be
imported.

A backend's first call pays for what it loads, so loading is kept to what the call needs
(docs/architecture.md, "Loading the code"): a module is executed only when something imports it,
from the bytecode that install compiled with the server's own Python
(``aidb_memory.runtime_bytecode``, :func:`store_bytecode`) when that is valid for this Python and
this very source, else compiled from the source here; and this file imports nothing beyond what
every Python process has already loaded (``importlib.abc``, for one, costs more than all of our
code, since it imports ``importlib.resources`` and ``pathlib``).
"""

from __future__ import annotations

import marshal
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs a few ms to import: only the type checker reads these
    from importlib.machinery import ModuleSpec
    from types import CodeType, ModuleType
    from typing import Any

PACKAGE = "aidb_memory_server"
_RUNTIME_KEY = "aidb_memory.rt"
_PATH_KEY = "aidb_memory.pythonpath"


def magic_number() -> bytes:
    """The bytecode version of this Python (``importlib.util.MAGIC_NUMBER``, without importing
    ``importlib.util``, which costs a few ms)."""
    # Loaded by every Python at startup: it is the import system itself.
    magic: bytes = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER
    return magic


def compile_module(name: str, source: str) -> CodeType:
    """A module's code, as this backend runs it: at boot and when install stores bytecode, so
    that both are the same (the filename is what tracebacks show)."""
    return compile(source, f"<aidb_memory.runtime_modules:{name}>", "exec")


_CODE = type(magic_number.__code__)  # types.CodeType, without importing types


class DatabaseFinder:
    """Serves ``aidb_memory_server.*`` from the database: stored bytecode when there is valid
    bytecode, else the source (a meta path finder and loader; the protocol needs no base class).

    ``modules`` maps a name to ``(source, is_package, code, source_md5)``: the source is None
    when bytecode came instead, the code None when there is none for this Python and source.
    """

    aidb_memory_finder = True

    def __init__(
        self, modules: dict[str, tuple[str | None, bool, bytes | None, str | None]]
    ) -> None:
        self.modules = modules

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        entry = self.modules.get(fullname)
        if entry is None:
            return None
        # ModuleSpec from the import system's own frozen module: `import importlib.machinery`
        # would load the importlib package (and warnings) on every backend's first call.
        spec: ModuleSpec = sys.modules["_frozen_importlib"].ModuleSpec(
            fullname,
            self,
            origin=f"aidb_memory.runtime_modules:{fullname}",
            is_package=entry[1],
        )
        return spec

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        exec(self.code(module.__name__), module.__dict__)

    def code(self, name: str) -> CodeType:
        source, _, blob, md5 = self.modules[name]
        if blob is not None:
            try:
                code = marshal.loads(blob)
            except (EOFError, ValueError, TypeError):
                code = None
            if isinstance(code, _CODE):
                return code
            # Unreadable (the row was changed by hand): the source it was compiled from.
            assert md5 is not None  # a bytecode row always has one
            source = _source(name, md5)
        assert source is not None
        return compile_module(name, source)


def _source(name: str, md5: str) -> str:
    import plpy

    # The source this backend's snapshot had (the md5 boot read), not a newer one.
    plan = plpy.prepare(
        "SELECT source FROM aidb_memory.runtime_modules "
        "WHERE name OPERATOR(pg_catalog.=) $1 AND source_md5 OPERATOR(pg_catalog.=) $2",
        ["text", "text"],
    )
    rows = plpy.execute(plan, [name, md5])
    if not rows:
        raise ImportError(f"{name}: the stored code changed while this backend was loading it")
    return str(rows[0]["source"])


def _forget_previous_code() -> None:
    # Old modules must go, or an upgraded module would import a stale sibling.
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "aidb_memory_finder", False)]
    for name in list(sys.modules):
        if name == PACKAGE or name.startswith(PACKAGE + "."):
            del sys.modules[name]


def _set_pythonpath(gd: dict[str, Any], directory: str | None) -> None:
    # The directory comes only from aidb_memory.runtime_settings, which only a superuser can
    # write; never from a setting a session could SET (SPEC §6).
    previous = gd.get(_PATH_KEY)
    if previous and previous in sys.path:
        sys.path.remove(previous)
    gd[_PATH_KEY] = directory
    if directory:
        sys.path.insert(0, directory)


# Modules and settings in one statement, so that both come from the same snapshot. Bytecode only
# for this Python (its magic number) and only compiled from the source stored now: an edited
# module, a downgrade or a new server Python all fall back to the source. The source is sent
# only where no bytecode is.
_LOAD = """
SELECT 'module' AS kind, m.name AS key,
       CASE WHEN b.code IS NULL THEN m.source END AS value, m.is_package, b.code, b.source_md5
FROM aidb_memory.runtime_modules AS m
LEFT JOIN aidb_memory.runtime_bytecode AS b
       ON b.name OPERATOR(pg_catalog.=) m.name
      AND b.magic OPERATOR(pg_catalog.=) '\\x{magic}'::pg_catalog.bytea
      AND b.source_md5 OPERATOR(pg_catalog.=) m.source_md5
UNION ALL
SELECT 'setting', key, value, NULL, NULL, NULL FROM aidb_memory.runtime_settings
"""


def boot(gd: dict[str, Any], generation: str) -> Any:
    """Load the stored code into this backend and return its runtime.

    ``generation`` is the one the calling stub was rendered with. The runtime is labelled with
    the generation recorded next to the modules it actually loaded, which differs when the
    caller's snapshot predates an upgrade (a REPEATABLE READ transaction begun before it: the
    catalog already has the new functions, the tables still show the old code). Labelling that
    old code with the new generation would make this connection run it for good; labelled with
    its own, the first call after that transaction loads the new code.
    """
    import plpy

    rows = plpy.execute(_LOAD.format(magic=magic_number().hex()))
    modules = {
        r["key"]: (r["value"], r["is_package"], r["code"], r["source_md5"])
        for r in rows
        if r["kind"] == "module"
    }
    settings = {r["key"]: r["value"] for r in rows if r["kind"] == "setting"}
    loaded = settings.get("generation") or generation
    current = gd.get(_RUNTIME_KEY)
    if current is not None and getattr(current, "generation", None) == loaded:
        return current  # this code is already loaded (the stale-snapshot case above)
    _forget_previous_code()
    sys.meta_path.insert(0, DatabaseFinder(modules))
    _set_pythonpath(gd, settings.get("server_pythonpath"))
    __import__(PACKAGE + ".runtime")
    runtime = sys.modules[PACKAGE + ".runtime"]
    rt = runtime.Runtime(loaded, settings)
    gd[_RUNTIME_KEY] = rt
    return rt


# What needs compiling: modules with no bytecode for this Python and their current source, and
# bytecode that does not load (written by hand).
_STALE = """
SELECT m.name, m.source, m.source_md5, b.code
FROM aidb_memory.runtime_modules AS m
LEFT JOIN aidb_memory.runtime_bytecode AS b
       ON b.name OPERATOR(pg_catalog.=) m.name
      AND b.magic OPERATOR(pg_catalog.=) $1
      AND b.source_md5 OPERATOR(pg_catalog.=) m.source_md5
ORDER BY m.name
"""
_STORE = """
INSERT INTO aidb_memory.runtime_bytecode (name, magic, python, source_md5, code)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (name) DO UPDATE
    SET magic = EXCLUDED.magic, python = EXCLUDED.python, source_md5 = EXCLUDED.source_md5,
        code = EXCLUDED.code, compiled_at = EXCLUDED.compiled_at
"""
_DROP_GONE = """
DELETE FROM aidb_memory.runtime_bytecode AS b
WHERE NOT EXISTS (SELECT FROM aidb_memory.runtime_modules AS m
                  WHERE m.name OPERATOR(pg_catalog.=) b.name)
"""


def store_bytecode() -> int:
    """Compile every stored module whose bytecode is missing, stale or unreadable with this
    (the server's) Python and store it; drop the bytecode of modules that are gone. Returns how
    many modules it compiled. Run by install, as a superuser, in its transaction: only install
    writes ``runtime_bytecode`` (no other role has any privilege on it), and bytecode is only
    ever the compiled form of the source stored next to it."""
    import plpy

    magic = magic_number()
    python = ".".join(map(str, sys.version_info[:3]))
    stale = plpy.prepare(_STALE, ["bytea"])
    store = plpy.prepare(_STORE, ["text", "bytea", "text", "text", "bytea"])
    compiled = 0
    for row in plpy.execute(stale, [magic]):
        if row["code"] is not None and _loads(row["code"]):
            continue
        code = marshal.dumps(compile_module(row["name"], row["source"]))
        plpy.execute(store, [row["name"], magic, python, row["source_md5"], code])
        compiled += 1
    plpy.execute(_DROP_GONE)
    return compiled


def _loads(blob: bytes) -> bool:
    try:
        return isinstance(marshal.loads(blob), _CODE)
    except (EOFError, ValueError, TypeError):
        return False
