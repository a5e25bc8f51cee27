"""The budget rule of a read (SPEC §3), as plain Python. Pure.

The database runs the same rule in one SQL statement (the read statement of ``session_get`` in
sql/); this module is its specification, checked against it by the property tests.
"""

from __future__ import annotations

from aidb_memory_server.errors import invalid

# collections.abc only for the type checker: it imports collections, which a read need not load.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

BUDGET_MAX = 100_000_000
TURNS_MAX = 1_000_000


class Row:
    """What the rule needs of a stored turn. A plain class: every read imports this module for
    check_limits, and dataclasses would cost it ~9 ms on a backend's first call."""

    __slots__ = ("chars", "round_start", "seq")

    def __init__(self, seq: int, round_start: int, chars: int) -> None:
        self.seq = seq
        self.round_start = round_start
        self.chars = chars

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Row) and (self.seq, self.round_start, self.chars) == (
            other.seq,
            other.round_start,
            other.chars,
        )

    def __hash__(self) -> int:
        return hash((self.seq, self.round_start, self.chars))

    def __repr__(self) -> str:
        return f"Row(seq={self.seq}, round_start={self.round_start}, chars={self.chars})"


def check_limits(
    fn: str, limit_chars: int | None, limit_turns: int | None, limit_items: int | None = None
) -> None:
    """Budgets are positive and sane (22023 otherwise)."""
    if limit_chars is not None and not 1 <= limit_chars <= BUDGET_MAX:
        raise invalid(
            fn, "limit_chars", f"must be between 1 and {BUDGET_MAX}, or NULL for no budget"
        )
    if limit_turns is not None and not 1 <= limit_turns <= TURNS_MAX:
        raise invalid(fn, "limit_turns", f"must be between 1 and {TURNS_MAX}, or NULL for no limit")
    if limit_items is not None and not 1 <= limit_items <= TURNS_MAX:
        raise invalid(fn, "limit_items", f"must be between 1 and {TURNS_MAX}, or NULL for no limit")


def window(rows: Sequence[Row], limit_chars: int | None, limit_turns: int | None) -> list[Row]:
    """The newest whole rounds that fit both limits; history stays contiguous.

    ``rows`` are a session's readable turns in order. Scanning from the newest, a cut is allowed
    before a turn when no round crosses it (the turn's seq equals the smallest round_start seen);
    the answer is the oldest allowed cut whose suffix fits.
    """
    best = len(rows)
    chars = 0
    smallest_start = None
    for i in range(len(rows) - 1, -1, -1):
        row = rows[i]
        chars += row.chars
        count = len(rows) - i
        if (limit_chars is not None and chars > limit_chars) or (
            limit_turns is not None and count > limit_turns
        ):
            break
        smallest_start = (
            row.round_start if smallest_start is None else min(smallest_start, row.round_start)
        )
        if row.seq == smallest_start:
            best = i
    return list(rows[best:])
