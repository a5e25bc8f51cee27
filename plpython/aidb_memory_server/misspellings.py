"""What a misspelled query word may have meant: the strings one edit away from it that ``search``
looks up among the actor's words (SPEC §5 ``search``, near words). Pure: no database.
"""

from __future__ import annotations

from collections.abc import Sequence

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
