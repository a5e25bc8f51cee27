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


# --- misspellings ------------------------------------------------------------------------------

# A query word no memory of the actor uses is looked up within one edit of it (Damerau-Levenshtein
# distance 1), by exact match, beside the words most similar to it by trigrams (pg_trgm, above
# 0.3). Trigrams miss one edit in a short word: typed with n characters, and the edit in the
# middle of the word, the similarity to the right word is (n - 3) / (n + 5) for two neighbouring
# letters swapped (above 0.3 from n = 7), (n - 2) / (n + 3) for a letter too many (from n = 5),
# (n - 2) / (n + 4) for a letter replaced (from n = 5) and (n - 1) / (n + 4) for a letter missing
# (from n = 4). So every word of EDIT_MIN_CHARS to EDIT_MAX_CHARS characters is looked up with
# each letter dropped and each pair swapped (about 2n variants), and only the short words where
# trigrams fall short with each letter replaced (up to SUBSTITUTE_MAX_CHARS) or a letter added (up
# to INSERT_MAX_CHARS), which cost ~26 variants a position. Words of fewer than EDIT_MIN_CHARS
# have too many neighbours to guess from.
EDIT_MIN_CHARS = 3
EDIT_MAX_CHARS = 24
SUBSTITUTE_MAX_CHARS = 4
INSERT_MAX_CHARS = 3
# The most variants one search looks up (the words of a query take them in turn, each word all
# of its own or none): bounds the cost of a query of many misspelled words.
EDIT_BUDGET = 2000
# What a missing or replaced letter may be, besides the word's own characters.
EDIT_ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def edits(word: str) -> list[str]:
    """The strings one edit away from ``word`` that search looks up (see above; no duplicates,
    not ``word`` itself), in a fixed order: deletions, transpositions, substitutions, insertions.
    Letters substituted or inserted come from :data:`EDIT_ALPHABET` and ``word`` itself."""
    n = len(word)
    if not EDIT_MIN_CHARS <= n <= EDIT_MAX_CHARS:
        return []
    letters = list(dict.fromkeys(EDIT_ALPHABET + word))
    out: dict[str, None] = {}
    for i in range(n):
        out[word[:i] + word[i + 1 :]] = None
    for i in range(n - 1):
        out[word[:i] + word[i + 1] + word[i] + word[i + 2 :]] = None
    if n <= SUBSTITUTE_MAX_CHARS:
        for i in range(n):
            for c in letters:
                out[word[:i] + c + word[i + 1 :]] = None
    if n <= INSERT_MAX_CHARS:
        for i in range(n + 1):
            for c in letters:
                out[word[:i] + c + word[i:]] = None
    out.pop(word, None)
    return list(out)


def edit_lookups(words: Sequence[str], budget: int = EDIT_BUDGET) -> tuple[list[str], list[str]]:
    """The (word, variant) pairs to look up for the unknown ``words``, as two parallel lists:
    each word's :func:`edits`, word after word, as long as all of a word's fit in ``budget``."""
    sources: list[str] = []
    variants: list[str] = []
    for word in words:
        mine = edits(word)
        if len(variants) + len(mine) > budget:
            continue
        sources.extend([word] * len(mine))
        variants.extend(mine)
    return sources, variants
