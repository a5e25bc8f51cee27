"""Reciprocal-rank fusion and the normalization of its score to [0, 1] (SPEC §5 ``search``).

Pure: no database. ``search`` fuses in SQL (``memories._SEARCH``) with the ``K`` and the
``best`` of this module; :func:`fuse` is the same computation over Python lists, which the unit
tests pin down and which states what the SQL must do.

Each signal (full-text, trigram, vector) ranks its candidates 1, 2, 3, ...; a memory's fused
score is the sum over the signals that ranked it of ``1 / (K + rank)``. The best possible
fused score with ``n`` signals is ``n / (K + 1)`` (first in every one), so ``score = fused /
best(n)`` lies in (0, 1], and is 1 only for a memory that every signal ranked first.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

K = 60  # the constant of Cormack, Clarke and Buettcher (2009): damps the weight of the top ranks

T = TypeVar("T", bound=Hashable)


def contribution(rank: int, k: int = K) -> float:
    """What rank ``rank`` (1 = best) in one signal adds to the fused score."""
    if rank < 1:
        raise ValueError("ranks start at 1")
    return 1.0 / (k + rank)


def best(signals: int, k: int = K) -> float:
    """The highest fused score ``signals`` signals can give: first in every one."""
    if signals < 1:
        raise ValueError("at least one signal")
    return signals * contribution(1, k)


def normalize(fused: float, signals: int, k: int = K) -> float:
    """A fused score as a share of the best possible, clamped to [0, 1]."""
    return min(1.0, max(0.0, fused / best(signals, k)))


def fuse(
    rankings: Sequence[Sequence[T]], limit: int | None = None, k: int = K
) -> list[tuple[T, float]]:
    """Fuse ``rankings`` (each a list of items, best first, no item twice) into (item, score)
    pairs, best first, score normalized by the number of rankings. Ties keep the order in which
    the items were first seen (the earlier ranking, then the better rank)."""
    fused: dict[T, float] = {}
    for ranking in rankings:
        seen: set[T] = set()
        for position, item in enumerate(ranking, start=1):
            if item in seen:
                raise ValueError(f"{item!r} is ranked twice in one signal")
            seen.add(item)
            fused[item] = fused.get(item, 0.0) + contribution(position, k)
    signals = max(1, len(rankings))
    order = sorted(fused.items(), key=lambda pair: -pair[1])  # stable: first seen wins a tie
    pairs = [(item, normalize(score, signals, k)) for item, score in order]
    return pairs if limit is None else pairs[:limit]


def _lexeme(word: str) -> str:
    """``word`` as a quoted tsquery operand: nothing in it is read as an operator."""
    return "'" + word.replace("\\", "\\\\").replace("'", "\\'") + "'"


def fuzzy_tsquery(words: Sequence[tuple[str, bool, Sequence[str]]]) -> str | None:
    """The fuzzy signal's query (to_tsquery syntax) from (word, known, nearest words) triples:
    known words as they are, each unknown one as the OR of its nearest words, dropped when it has
    none; all ANDed. None when no word was unknown or nothing is left."""
    if all(known for _, known, _ in words):
        return None
    terms: list[str] = []
    for word, known, near in words:
        if known:
            terms.append(_lexeme(word))
        elif near:
            terms.append("(" + " | ".join(_lexeme(n) for n in near) + ")")
    return " & ".join(terms) if terms else None


def any_tsquery(words: Sequence[tuple[str, bool, Sequence[str]]]) -> str | None:
    """The any-word signal's query: every known word and every word nearest an unknown one, ORed.
    None when that is fewer than two words (then it is no wider than the others)."""
    terms: list[str] = []
    for word, known, near in words:
        terms.extend([word] if known else near)
    unique = list(dict.fromkeys(terms))
    return " | ".join(_lexeme(t) for t in unique) if len(unique) > 1 else None
