"""Expected failures and the SQLSTATEs they reach the client with (SPEC §1)."""

from __future__ import annotations

INVALID_PARAMETER_VALUE = "22023"
NULL_VALUE_NOT_ALLOWED = "22004"
UNDEFINED_OBJECT = "42704"
OBJECT_NOT_IN_PREREQUISITE_STATE = "55000"
UNIQUE_VIOLATION = "23505"
INSUFFICIENT_PRIVILEGE = "42501"
INTERNAL_ERROR = "XX000"


class ApiError(Exception):
    """An expected failure: becomes a SQL error with this SQLSTATE, message and hint."""

    def __init__(
        self, sqlstate: str, message: str, hint: str | None = None, detail: str | None = None
    ) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message
        self.hint = hint
        self.detail = detail


def invalid(function: str, field: str, problem: str, hint: str | None = None) -> ApiError:
    """A 22023 naming the function and the offending field."""
    return ApiError(INVALID_PARAMETER_VALUE, f"aidb_memory.{function}: {field} {problem}", hint)


def required(function: str, field: str) -> ApiError:
    """A 22004 for a required argument passed as NULL."""
    return ApiError(
        NULL_VALUE_NOT_ALLOWED,
        f"aidb_memory.{function}: {field} must not be NULL",
        hint=f"pass a value for {field}",
    )


def one_line(text: str, limit: int = 200) -> str:
    """``text`` with every run of whitespace (newlines too) made one space, cut to ``limit``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def named_message(function: str, text: str) -> str:
    """The one-line message of an error that a statement run inside ``function`` raised: its
    primary message after ``aidb_memory.<function>:``. An ``aidb_memory.<other>:`` prefix (an
    internal function's) gives way to it; the client called ``function``, not the other."""
    text = one_line(text, limit=1000)
    prefix, sep, rest = text.partition(": ")
    name = prefix.removeprefix("aidb_memory.")
    if sep and name != prefix and name.isidentifier():
        text = rest
    return f"aidb_memory.{function}: {text}"
