"""Dispatch from the PL/Python stubs to the package's functions, and error translation."""

from __future__ import annotations

import itertools
import operator
import sys

import plpy

from aidb_memory_server import errors
from aidb_memory_server.errors import INTERNAL_ERROR, ApiError, named_message

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs a first call ~4 ms (docs/architecture.md, "Loading the code")
    from collections.abc import Callable, Generator, Iterator, MutableMapping, Sequence
    from typing import Any

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
        # __import__, not importlib.import_module: importing importlib costs a first call.
        name = f"{PACKAGE}.{module_name}"
        __import__(name)
        fn: Callable[..., Any] = getattr(sys.modules[name], attr)
        self._targets[target] = fn
        return fn

    def call(self, target: str, args: Sequence[Any]) -> Any:
        """Call ``module.function`` with the SQL function's arguments, in order."""
        try:
            fn = self._targets.get(target) or self._resolve(target)
            return fn(*args)
        except ApiError as e:
            raise sql_error(e.sqlstate, e.message, hint=e.hint, detail=e.detail) from None
        except plpy.SPIError as e:
            # An error of a statement we ran: raised as it is, it would show the client our
            # internal query (its QUERY field and a "SQL statement" CONTEXT line) and arrive as
            # "spiexceptions.QueryCanceled: ...". Keep its SQLSTATE, DETAIL and HINT only.
            raise sql_error(
                getattr(e, "sqlstate", None) or INTERNAL_ERROR,
                named_message(attr_of(target), str(e.args[0]) if e.args else ""),
                hint=getattr(e, "hint", None),
                detail=getattr(e, "detail", None),
            ) from None
        except plpy.Error as e:
            # plpy.error(..., sqlstate=...) in the package: keep its SQLSTATE, hint and detail,
            # and give it the function's name instead of PL/Python's "plpy.Error:" prefix.
            if type(e).__module__ == "aidb_memory":
                raise  # already made by sql_error()
            text = one_line(str(e.args[0]) if e.args else "", limit=1000)
            if not text.startswith("aidb_memory."):
                text = f"aidb_memory.{attr_of(target)}: {text}"
            raise sql_error(
                getattr(e, "sqlstate", None) or INTERNAL_ERROR,
                text,
                hint=getattr(e, "hint", None),
                detail=getattr(e, "detail", None),
            ) from None
        except Exception as e:  # a bug: one line for the client, the traceback for the log
            name = attr_of(target)
            _log_traceback(name)
            raise sql_error(
                INTERNAL_ERROR,
                f"aidb_memory.{name}: internal error ({type(e).__name__}: {one_line(str(e))})",
                hint="this is a bug in aidb_memory; the server log has the details",
            ) from None

    def bind(
        self, namespace: MutableMapping[str, Any], target: str, generation: str
    ) -> Callable[[], Any]:
        """The callable that runs ``target``, installed as the PL/Python procedure itself.

        PL/Python runs a function as the expression ``__plpython_procedure_<name>_<oid>()`` in
        the function's own globals (``namespace``). The callable made here is built of C
        functions around our dispatch and raises the error from C: bound to that name, later
        calls of this function in this connection run no stub and leave no Python frame of ours
        (PL/Python's traceback of an error is then its fixed header alone, which the PL/pgSQL
        wrapper of every granted function drops: docs/architecture.md, Errors).

        Bound, the callable skips the stub's check of the code generation: that is safe only
        when this runtime is the generation the stub was rendered with (a new generation
        rewrites every function, which makes PL/Python compile it again, with new globals). A
        runtime loaded from an older snapshot than the catalog's (see ``boot``) is not bound.
        """
        name = sys._getframe(1).f_code.co_name
        call = self._entry(namespace, target)
        if (
            generation == self.generation
            and name.startswith("__plpython_procedure_")
            and name in namespace
        ):
            namespace[name] = call
        return call

    def _entry(self, namespace: MutableMapping[str, Any], target: str) -> Callable[[], Any]:
        def outcome(_: object) -> tuple[Callable[[Any], Any], Any]:
            try:
                return _result, self.call(target, namespace["args"])
            except plpy.Error as e:  # call() turns every failure into one
                return _raise, e.with_traceback(None)

        # next() of this iterator calls outcome() (its frame is gone once it returns) and then
        # _raise(error) or _result(value): only C frames are left when the error is raised.
        steps: Iterator[Any] = itertools.starmap(
            operator.call, map(outcome, itertools.repeat(None))
        )
        return steps.__next__  # a C method: no frame of ours (functools would load collections)


def _finished() -> Generator[None, None, None]:
    yield None


_done = _finished()
for _ in _done:
    pass
# Raises its argument without a frame: throw() into a finished generator runs no code.
_raise: Callable[[BaseException], Any] = _done.throw


def _result(value: Any) -> Any:
    return value


def _log_traceback(name: str) -> None:
    """Write the exception being handled to the server log, and only there.

    Any session can ``SET client_min_messages = log`` and would receive the traceback: the
    setting is raised to ``error`` for the rest of this transaction (or savepoint), which the
    error about to be raised aborts anyway, restoring the session's own value.
    """
    import traceback

    text = traceback.format_exc()
    try:
        plpy.execute("SELECT pg_catalog.set_config('client_min_messages', 'error', true)")
    except plpy.SPIError:
        return  # better no log line than a traceback for the client
    plpy.log(f"aidb_memory.{name}: internal error\n{text}")


one_line = errors.one_line


def attr_of(target: str) -> str:
    """The SQL-facing name of a dispatch target (``namespaces.init`` -> ``init``)."""
    return target.rpartition(".")[2]


_error_classes: dict[str, type[plpy.Error]] = {}


def sql_error(
    sqlstate: str, message: str, *, hint: str | None = None, detail: str | None = None
) -> plpy.Error:
    """An exception that PL/Python reports as exactly ``message`` with this SQLSTATE.

    PL/Python prints an escaping exception as ``<module>.<class>: <text>``. Naming the class
    after the SQL function, in a module called ``aidb_memory``, makes that prefix the
    ``aidb_memory.function:`` our messages start with. PL/Python reads ``sqlstate``, ``hint``
    and ``detail`` off a ``plpy.Error``.
    """
    prefix, sep, text = message.partition(": ")
    module, dot, function = prefix.partition(".")
    if not (sep and dot and module == "aidb_memory" and function.isidentifier()):
        module, function, text = "aidb_memory", "error", message
    cls = _error_classes.get(function)
    if cls is None:
        cls = type(function, (plpy.Error,), {"__module__": module})
        _error_classes[function] = cls
    error = cls(text)
    error.sqlstate = sqlstate  # type: ignore[attr-defined]
    error.hint = hint  # type: ignore[attr-defined]
    error.detail = detail  # type: ignore[attr-defined]
    return error
