"""Loads the server-side package from the database into this backend.

Every PL/Python function body is a stub that, when the backend has not yet loaded the current
code generation, fetches this module's source from ``aidb_memory.runtime_modules``, executes it and
calls :func:`boot`. This file must therefore stay self-contained: it runs before the package can be
imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

PACKAGE = "aidb_memory_server"
_RUNTIME_KEY = "aidb_memory.rt"
_PATH_KEY = "aidb_memory.pythonpath"


class DatabaseFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``aidb_memory_server.*`` from source text read out of the database."""

    aidb_memory_finder = True

    def __init__(self, sources: dict[str, tuple[str, bool]]) -> None:
        self.sources = sources

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        entry = self.sources.get(fullname)
        if entry is None:
            return None
        return importlib.util.spec_from_loader(
            fullname, self, origin=f"aidb_memory.runtime_modules:{fullname}", is_package=entry[1]
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        source, _ = self.sources[module.__name__]
        code = compile(source, f"<aidb_memory.runtime_modules:{module.__name__}>", "exec")
        exec(code, module.__dict__)


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


# Modules and settings in one statement, so that both come from the same snapshot.
_LOAD = """
SELECT 'module' AS kind, name AS key, source AS value, is_package
FROM aidb_memory.runtime_modules
UNION ALL
SELECT 'setting', key, value, NULL FROM aidb_memory.runtime_settings
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

    rows = plpy.execute(_LOAD)
    modules = {r["key"]: (r["value"], r["is_package"]) for r in rows if r["kind"] == "module"}
    settings = {r["key"]: r["value"] for r in rows if r["kind"] == "setting"}
    loaded = settings.get("generation") or generation
    current = gd.get(_RUNTIME_KEY)
    if current is not None and getattr(current, "generation", None) == loaded:
        return current  # this code is already loaded (the stale-snapshot case above)
    _forget_previous_code()
    sys.meta_path.insert(0, DatabaseFinder(modules))
    _set_pythonpath(gd, settings.get("server_pythonpath"))
    runtime = importlib.import_module(PACKAGE + ".runtime")
    rt = runtime.Runtime(loaded, settings)
    gd[_RUNTIME_KEY] = rt
    return rt
