"""The variants within one edit of a misspelled word that search looks up (misspellings.edits)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aidb_memory_server import misspellings


def _damerau(a: str, b: str) -> int:
    """Optimal-string-alignment distance (Damerau-Levenshtein with adjacent swaps)."""
    d = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        d[i][0] = i
    for j in range(len(b) + 1):
        d[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


def test_a_swap_a_letter_too_many_or_missing_or_replaced_is_undone() -> None:
    assert "email" in misspellings.edits("emial")  # swapped
    assert "kettle" not in misspellings.edits("ketle")  # missing, 5 letters: trigrams find it
    assert "cafe" in misspellings.edits("cfe")  # missing, 3 letters
    assert "peanuts" in misspellings.edits("peanutts")  # one too many
    assert "oslo" in misspellings.edits("oclo")  # replaced, 4 letters
    assert "volvo" not in misspellings.edits("vilvo")  # replaced, 5 letters: trigrams find it
    assert "favourite" not in misspellings.edits("favorite")


def test_which_edits_each_length_gets() -> None:
    # 12 letters: each letter dropped (12) and each neighbouring pair swapped (11).
    assert len(misspellings.edits("abcdefghijkl")) == 12 + 11
    # 4 letters: also each letter replaced by another of 26 (+ none of its own is new).
    assert len(misspellings.edits("wxyz")) == 4 + 3 + 4 * 25
    # Repeated letters give repeated variants, listed once; the word itself is never a variant.
    assert misspellings.edits("aaa")[0] == "aa" and len(misspellings.edits("aaa")) == len(
        set(misspellings.edits("aaa"))
    )
    assert "aaa" not in misspellings.edits("aaa")


def test_too_short_or_too_long_words_have_no_variants() -> None:
    assert misspellings.edits("to") == []
    assert misspellings.edits("x" * (misspellings.EDIT_MAX_CHARS + 1)) == []
    assert misspellings.edits("x" * misspellings.EDIT_MAX_CHARS) != []


def test_lookups_pair_each_variant_with_its_word_within_the_budget() -> None:
    sources, variants = misspellings.edit_lookups(["emial", "to", "cfe"])
    assert len(sources) == len(variants)
    assert set(sources) == {"emial", "cfe"}
    assert [
        v for s, v in zip(sources, variants, strict=True) if s == "emial"
    ] == misspellings.edits("emial")
    # A word whose variants do not all fit is left to trigrams; later ones may still fit.
    small = len(misspellings.edits("emial"))
    sources, _ = misspellings.edit_lookups(["cfe", "emial"], budget=small)
    assert set(sources) == {"emial"}
    assert misspellings.edit_lookups(["cfe"], budget=0) == ([], [])


@given(st.text(alphabet="abcdeéq", min_size=0, max_size=14))
def test_every_variant_is_one_edit_away(word: str) -> None:
    found = misspellings.edits(word)
    assert len(found) == len(set(found))
    assert word not in found
    for v in found:
        assert _damerau(word, v) == 1, v
    n = len(word)
    if misspellings.EDIT_MIN_CHARS <= n <= misspellings.EDIT_MAX_CHARS:
        assert all(word[:i] + word[i + 1 :] in found for i in range(n))
        assert all(
            word[:i] + word[i + 1] + word[i] + word[i + 2 :] in found
            for i in range(n - 1)
            if word[i] != word[i + 1]
        )
        if n <= misspellings.SUBSTITUTE_MAX_CHARS:
            assert all(word[:i] + "q" + word[i + 1 :] in found for i in range(n) if word[i] != "q")
        if n <= misspellings.INSERT_MAX_CHARS:
            assert all(word[:i] + c + word[i:] in found for i in range(n + 1) for c in "q" + word)
