"""The methods `make bench-quality` (bench/quality.py) compares: aidb_memory.search as an
application calls it, and the baselines (PostgreSQL full text, BM25, dense retrieval) over the
same memories.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import locomo  # bench/locomo.py: the data, the metrics, the fusion
import psycopg
from common import say
from embedding_server import Embedder

SEARCH = 'SELECT id::text FROM aidb_memory.search(%s, %s, %s, "limit" => 10)'
# The same search given the question's vector, as an application that has it already passes it:
# no embedding call, so its time is the search's own (issue 27: within 1.5x of "ours").
SEARCH_VECTOR = (
    'SELECT id::text FROM aidb_memory.search(%s, %s, %s, "limit" => 10, query_embedding => %s)'
)
# The full-text baseline's query over quality.fts (quality.FTS_SETUP makes it): the question's
# words OR-ed, equal ranks in the order the turns were written.
FTS = """
WITH q AS (SELECT replace(plainto_tsquery('english', %(q)s)::text, '&', '|')::tsquery AS q)
SELECT f.id::text FROM quality.fts AS f, q
WHERE f.actor = %(actor)s AND f.tsv @@ q.q
ORDER BY ts_rank_cd(f.tsv, q.q) DESC, f.seq
LIMIT 10
"""


# --- the methods ------------------------------------------------------------------------------


@dataclass
class Method:
    name: str
    label: str
    namespace: str  # whose memory ids it returns (the relevant ids are that namespace's)
    run: Callable[[locomo.Question], list[str]]
    found: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)
    errors: int = 0
    embed_seconds: list[float] = field(default_factory=list)  # ours with embeddings: its call


def search_method(
    conn: psycopg.Connection[Any],
    namespace: str,
    method: Method,
    vectors: dict[str, list[float]] | None = None,
) -> Callable[[locomo.Question], list[str]]:
    """``search`` as an application calls it; a refused query (an error) counts, and finds
    nothing. ``vectors``: each question's vector, passed as query_embedding."""

    def go(q: locomo.Question) -> list[str]:
        try:
            if vectors is None:
                args: tuple[Any, ...] = (namespace, q.conversation, q.question)
                rows = conn.execute(SEARCH, args, prepare=True)
            else:
                args = (namespace, q.conversation, q.question, vectors[q.question])
                rows = conn.execute(SEARCH_VECTOR, args, prepare=True)
            return [r[0] for r in rows.fetchall()]
        except psycopg.Error as e:
            method.errors += 1
            say(f"  {method.name}: {q.conversation}#{q.index}: {e.sqlstate} {e}")
            return []

    return go


def fts_method(conn: psycopg.Connection[Any]) -> Callable[[locomo.Question], list[str]]:
    def go(q: locomo.Question) -> list[str]:
        rows = conn.execute(FTS, {"q": q.question, "actor": q.conversation}, prepare=True)
        return [r[0] for r in rows.fetchall()]

    return go


@dataclass
class Corpus:
    """One actor's memories as the Python baselines see them: the rows of NS_PLAIN, in id order."""

    ids: list[str]
    contents: list[str]
    bm25: Any
    bm25_stop: Any  # over the tokens less PostgreSQL's english stop words
    stop: frozenset[str]
    matrix: Any  # unit vectors, one row per memory


def bm25_ranking(corpus: Corpus, question: str, depth: int, *, stop: bool = False) -> list[str]:
    np = sys.modules["numpy"]
    if stop:
        scores = corpus.bm25_stop.get_scores(locomo.tokens(question, corpus.stop))
    else:
        scores = corpus.bm25.get_scores(locomo.tokens(question))
    order = np.argsort(-scores, kind="stable")[:depth]
    return [corpus.ids[i] for i in order if scores[i] > 0]


def dense_ranking(corpus: Corpus, embedder: Embedder, question: str, depth: int) -> list[str]:
    np = embedder.np
    query = embedder.encode([question])[0]
    sims = corpus.matrix @ query
    order = np.argsort(-sims, kind="stable")[:depth]
    return [corpus.ids[i] for i in order]
