"""Exceptions of the client: one class per failure an application handles differently.

Every SQL error of a call comes back as a subclass of :class:`AidbMemoryError`, chosen by its
SQLSTATE (and, where one SQLSTATE covers several failures, by the message the server documents
in docs/reference.md). The psycopg error is kept as ``pgerror`` and as ``__cause__``.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "AidbMemoryError",
    "ConnectionFailed",
    "IdempotencyConflict",
    "InvalidArgument",
    "InvalidState",
    "InvalidTurn",
    "NamespaceInactive",
    "NamespaceNotFound",
    "NotFound",
    "PermissionDenied",
    "SessionClosed",
    "TransientError",
    "from_psycopg",
]

_PREFIX = re.compile(r"^aidb_memory\.(\w+): ")
# aidb_memory.add: turns[3].content is required ...  /  turns[1] comes before ...
# aidb_memory.add: turns[0].content[2].image_url.url ...
_TURN = re.compile(r"^aidb_memory\.add: turns\[(\d+)\]((?:\.\w+|\[\d+\])*)")


class AidbMemoryError(Exception):
    """A call of an aidb_memory function failed.

    ``sqlstate`` (None for a failure without one, e.g. a lost connection), ``message`` (the
    server's primary message, with its ``aidb_memory.<function>:`` prefix), ``function`` (the
    function the message names, if it names one), ``hint``, ``detail`` and ``pgerror`` (the
    psycopg exception, also ``__cause__``).
    """

    def __init__(
        self,
        message: str,
        *,
        sqlstate: str | None = None,
        hint: str | None = None,
        detail: str | None = None,
        pgerror: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate
        self.hint = hint
        self.detail = detail
        self.pgerror = pgerror
        m = _PREFIX.match(message)
        self.function: str | None = m.group(1) if m else None

    def __str__(self) -> str:
        text = f"{self.sqlstate}: {self.message}" if self.sqlstate else self.message
        if self.hint:
            text += f"\nHINT:  {self.hint}"
        return text


class InvalidArgument(AidbMemoryError):
    """A bad argument: NULL where a value is required (22004), a malformed value or identifier,
    an out-of-range limit, a cost bound (22023, 22003, 22P02)."""


class InvalidTurn(InvalidArgument):
    """``add`` refused a turn of its batch (22023 naming ``turns[i]``); nothing was stored.

    ``index`` is the turn's position in the batch, ``path`` where in the turn (``.content``,
    ``.content[2].type``, or ``""`` when the turn as a whole is at fault) and ``field`` its first
    key (``content``; None when the path is empty).
    """

    def __init__(self, message: str, *, index: int, path: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.index = index
        self.path = path
        first = re.match(r"\.(\w+)", path)
        self.field: str | None = first.group(1) if first else None


class NotFound(AidbMemoryError):
    """42704: something named does not exist (a model, a namespace)."""


class NamespaceNotFound(NotFound):
    """42704: the namespace does not exist (an admin creates it with ``aidb_memory.init``)."""


class PermissionDenied(AidbMemoryError):
    """42501: the role may not call the function, or the namespace binds ``actor_id`` to the
    logged-in role and it is another one."""


class InvalidState(AidbMemoryError):
    """55000: the object is not in a state that allows the call."""


class SessionClosed(InvalidState):
    """55000: ``add`` or ``session_pop`` on a session that ``session_end`` closed."""


class NamespaceInactive(InvalidState):
    """55000: a write in a namespace whose state is ``INACTIVE``."""


class IdempotencyConflict(AidbMemoryError):
    """23505: the idempotency key was already used with a different batch."""


class TransientError(AidbMemoryError):
    """A failure that the same call may not meet again: a serialization failure (40001), a
    deadlock (40P01), a lock not available (55P03), a statement timeout or cancel (57014)."""


class ConnectionFailed(AidbMemoryError):
    """No connection, or the connection was lost (08xxx, or no SQLSTATE at all)."""


_TRANSIENT = {"40001", "40P01", "55P03", "57014"}
_INVALID = {"22004", "22023", "22003", "22P02", "22001", "2201W", "2201X"}


def classify(sqlstate: str | None, message: str) -> type[AidbMemoryError]:
    """The exception class for a SQLSTATE and the server's primary message."""
    if sqlstate is None or sqlstate.startswith("08"):
        return ConnectionFailed
    if sqlstate == "22023" and _TURN.match(message):
        return InvalidTurn
    if sqlstate in _INVALID:
        return InvalidArgument
    if sqlstate == "42704":
        return (
            NamespaceNotFound if re.search(r": namespace .* does not exist", message) else NotFound
        )
    if sqlstate == "42501":
        return PermissionDenied
    if sqlstate == "23505":
        return IdempotencyConflict
    if sqlstate == "55000":
        if re.search(r": session .* is closed", message):
            return SessionClosed
        if re.search(r": namespace .* is INACTIVE", message):
            return NamespaceInactive
        return InvalidState
    if sqlstate in _TRANSIENT:
        return TransientError
    return AidbMemoryError


def make_error(
    sqlstate: str | None,
    message: str,
    *,
    hint: str | None = None,
    detail: str | None = None,
    pgerror: BaseException | None = None,
) -> AidbMemoryError:
    """The exception for these parts of a server error (what :func:`from_psycopg` uses)."""
    cls = classify(sqlstate, message)
    kwargs: dict[str, Any] = {
        "sqlstate": sqlstate,
        "hint": hint,
        "detail": detail,
        "pgerror": pgerror,
    }
    if cls is InvalidTurn:
        m = _TURN.match(message)
        assert m is not None
        return InvalidTurn(message, index=int(m.group(1)), path=m.group(2), **kwargs)
    return cls(message, **kwargs)


def from_psycopg(error: BaseException) -> AidbMemoryError:
    """The client's exception for a psycopg error (raise it ``from error``)."""
    sqlstate: str | None = getattr(error, "sqlstate", None)
    diag = getattr(error, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    message = primary or str(error).strip() or type(error).__name__
    hint = getattr(diag, "message_hint", None) if diag is not None else None
    detail = getattr(diag, "message_detail", None) if diag is not None else None
    return make_error(sqlstate, message, hint=hint, detail=detail, pgerror=error)
