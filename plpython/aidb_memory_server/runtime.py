"""Dispatch from the PL/Python stubs to the package's functions, and error translation."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import plpy

from aidb_memory_server.errors import INTERNAL_ERROR, ApiError

PACKAGE = "aidb_memory_server"
_current: Runtime | None = None


def current() -> Runtime:
    """The runtime loaded in this connection (set when boot.py loads a code generation)."""
    assert _current is not None, "the runtime is created before any function runs"
    return _current


class Runtime:
    """One loaded code generation in one backend (kept in PL/Python's ``GD``)."""

    def __init__(self, generation: str, settings: dict[str, str]) -> None:
        self.generation = generation
        self.settings = settings
        self._targets: dict[str, Callable[..., Any]] = {}
        global _current
        _current = self

    def _resolve(self, target: str) -> Callable[..., Any]:
        module_name, _, attr = target.rpartition(".")
        fn: Callable[..., Any] = getattr(importlib.import_module(f"{PACKAGE}.{module_name}"), attr)
        self._targets[target] = fn
        return fn

    def call(self, target: str, args: Sequence[Any]) -> Any:
        """Call ``module.function`` with the SQL function's arguments, in order."""
        fn = self._targets.get(target) or self._resolve(target)
        try:
            return fn(*args)
        except ApiError as e:
            plpy.error(e.message, detail=e.detail, hint=e.hint, sqlstate=e.sqlstate)
        except plpy.SPIError:
            raise  # a SQL error already carries its own SQLSTATE and message
        except Exception as e:  # a bug: report it as one line, not as a traceback
            import traceback

            plpy.log(f"aidb_memory.{attr_of(target)}: internal error\n{traceback.format_exc()}")
            plpy.error(
                f"aidb_memory.{attr_of(target)}: internal error ({type(e).__name__}: {e})",
                hint="this is a bug in aidb_memory; the server log has the details",
                sqlstate=INTERNAL_ERROR,
            )


def attr_of(target: str) -> str:
    """The SQL-facing name of a dispatch target (``namespaces.init`` -> ``init``)."""
    return target.rpartition(".")[2]
