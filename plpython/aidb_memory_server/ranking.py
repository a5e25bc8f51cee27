"""How ``search`` ranks (SPEC §5, issue 24): the query's terms, BM25 over them, and the blend with
vector similarity. Pure: no database. ``memories._SEARCH`` computes the same score in SQL;
:func:`score` states it in Python, and the tests hold the two equal.

A query is reduced to **groups** of lexemes: one group per query word that is no stop word, made
of the word's stems under the namespace's text search configuration and, for a word none of the
actor's memories uses (a misspelling), the stems of the actor's words nearest it. A memory's
lexical score is its BM25 over the lexemes it holds (the inverse document frequency from the
actor's own memories), times the share of the query's groups it matches (all of them when it
matches the whole query as a web search reads it, ``or`` included), divided by what a memory
holding each group's rarest lexeme once at average length would score: about 1 for a memory that
says everything the question asks, less for one that says part of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# BM25's constants, tuned on the development conversations (bench/README.md, quality): k1 bounds
# what repeating a word adds (short memories repeat little), b how much a long memory is
# discounted (chat turns vary in length less than documents do).
K1 = 0.9
B = 0.3
# The share of the score that is lexical when the namespace has an embedding model and the query
# has words; the rest is the cosine similarity (never below 0). Measured: a linear blend keeps a
# memory that is first by meaning and far down by words in the top 5 where rank fusion did not.
LEXICAL_WEIGHT = 0.7


def quoted(lexeme: str) -> str:
    """``lexeme`` as a tsquery operand: nothing in it is read as an operator."""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


@dataclass(frozen=True)
class Query:
    """The query's terms, as ``memories._SEARCH`` takes them."""

    lexemes: list[str]  # each once
    groups: list[int]  # the group (0, 1, ...) of each lexeme
    negated: str | None  # a tsquery of what a memory must not match (``-word``), or None

    @property
    def group_count(self) -> int:
        return len(set(self.groups))

    @property
    def operands(self) -> list[str]:
        """Each lexeme as a one-operand tsquery."""
        return [quoted(x) for x in self.lexemes]


def parse_tsquery(text: str | None, negation: bool = True) -> tuple[list[str], list[str]]:
    """The operands of a tsquery's text (as PostgreSQL prints it) outside any negation, in order,
    each once; and each negated operand or parenthesized group, as tsquery text. With
    ``negation`` false, ``!`` is ignored: every operand, and no negated part."""
    positive: list[str] = []
    negated: list[str] = []
    if not text:
        return positive, negated
    i, n = 0, len(text)
    depth = 0  # parentheses open
    negation_depth: int | None = None  # the depth at which the open negated group started
    negation_start = 0
    pending_not = False
    while i < n:
        c = text[i]
        if c == "'":
            j, chars = i + 1, []
            while j < n:
                if text[j] == "\\" and j + 1 < n:
                    chars.append(text[j + 1])
                    j += 2
                elif text[j] == "'" and j + 1 < n and text[j + 1] == "'":
                    chars.append("'")
                    j += 2
                elif text[j] == "'":
                    break
                else:
                    chars.append(text[j])
                    j += 1
            j += 1
            while j < n and text[j] not in " &|!()<":  # a :* or weight suffix
                j += 1
            word = "".join(chars)
            if pending_not:
                negated.append(text[i:j].strip())
                pending_not = False
            elif negation_depth is None and word not in positive:
                positive.append(word)
            i = j
            continue
        if c == "!":
            pending_not = negation
        elif c == "(":
            depth += 1
            if pending_not and negation_depth is None:
                negation_depth, negation_start = depth, i
                pending_not = False
        elif c == ")":
            if negation_depth == depth:
                negated.append(text[negation_start : i + 1])
                negation_depth = None
            depth -= 1
        elif c == "<":
            i = text.index(">", i)
        i += 1
    return positive, negated


def plan(
    query_tsquery: str | None,
    stems: Mapping[str, Sequence[str]],
    near_stems: Mapping[str, Sequence[str]],
) -> Query:
    """The terms of a query from its web-search tsquery (for ``-word``), the stems of each of its
    words (empty for a stop word) and the stems of the words nearest each unknown one."""
    _, negations = parse_tsquery(query_tsquery)
    excluded = {w for part in negations for w in parse_tsquery(part, negation=False)[0]}
    lexemes: list[str] = []
    groups: list[int] = []
    group = 0
    for word, own in stems.items():
        if any(s in excluded for s in own):
            continue
        fresh = [s for s in dict.fromkeys([*own, *near_stems.get(word, ())]) if s not in lexemes]
        if not fresh:
            continue
        lexemes.extend(fresh)
        groups.extend([group] * len(fresh))
        group += 1
    negated = " | ".join(f"( {p} )" for p in negations) or None
    return Query(lexemes, groups, negated)


def idf(memories: float, containing: float) -> float:
    """BM25's inverse document frequency (the +1 form, never negative)."""
    return math.log(1 + (max(memories, containing) - containing + 0.5) / (containing + 0.5))


def term(tf: float, length: float, average: float, k1: float = K1, b: float = B) -> float:
    """BM25's saturation of a lexeme seen ``tf`` times in a memory of ``length`` lexemes."""
    return tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / max(average, 1.0)))


def lexical(
    held: Mapping[str, float],
    length: float,
    average: float,
    idfs: Mapping[str, float],
    groups: Mapping[str, int],
    whole: bool,
    absent: frozenset[str] = frozenset(),
) -> float:
    """A memory's lexical score in [0, 1]: ``held`` maps the query lexemes it holds to their
    counts; ``whole``: it matches the whole query as a web search reads it; ``absent``: the
    query's lexemes no memory of the actor holds (they count in no group's best)."""
    best: dict[int, float] = {}
    for lexeme, weight in idfs.items():
        if lexeme not in absent:
            best[groups[lexeme]] = max(best.get(groups[lexeme], 0.0), weight)
    possible = sum(best.values())
    if possible <= 0:
        return 0.0
    total = sum(idfs[x] * term(tf, length, average) for x, tf in held.items())
    share = 1.0 if whole else len({groups[x] for x in held}) / len(set(groups.values()))
    return min(1.0, total * share / possible)


def score(lexical_score: float, cosine: float | None, lexical_weight: float) -> float:
    """The blend: ``lexical_weight`` of the lexical score, the rest the cosine (at least 0)."""
    return lexical_weight * lexical_score + (1 - lexical_weight) * max(cosine or 0.0, 0.0)


def lexical_weight(has_vector: bool, has_terms: bool) -> float:
    """The lexical share of the score: all of it without a query vector, none without terms
    (``has_terms``: the query has lexemes some memory of the actor holds)."""
    if not has_vector:
        return 1.0
    return LEXICAL_WEIGHT if has_terms else 0.0
