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


def boot(gd: dict[str, Any], generation: str) -> Any:
    """Load code generation ``generation`` into this backend and return its runtime."""
    import plpy

    rows = plpy.execute("SELECT name, source, is_package FROM aidb_memory.runtime_modules")
    settings = {
        r["key"]: r["value"]
        for r in plpy.execute("SELECT key, value FROM aidb_memory.runtime_settings")
    }
    _forget_previous_code()
    sys.meta_path.insert(0, DatabaseFinder({r["name"]: (r["source"], r["is_package"]) for r in rows}))
    _set_pythonpath(gd, settings.get("server_pythonpath"))
    runtime = importlib.import_module(PACKAGE + ".runtime")
    rt = runtime.Runtime(generation, settings)
    gd[_RUNTIME_KEY] = rt
    return rt
