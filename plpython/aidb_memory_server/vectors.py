"""The vector signal of ``search`` (SPEC §5): the query's embedding and the actor's memories
nearest it by cosine similarity.

``search`` asks this module for the candidates (ids, similarities, creation times) and fuses
them with the word signals in one statement (``memories._SEARCH``), so that how vectors are
stored and compared is decided here alone.
"""

from __future__ import annotations

from typing import Any

import plpy

from aidb_memory_server import db, llm
from aidb_memory_server.errors import OBJECT_NOT_IN_PREREQUISITE_STATE, ApiError
from aidb_memory_server.sessions import Namespace, quote

# Without a vector index (no pgvector here) similarity is computed for the actor's newest
# current memories with an embedding, up to this many.
VECTOR_WINDOW = 1000
# A memory whose cosine similarity to the query is at most this is not a vector candidate.
MIN_COSINE = 0.0

# The actor's newest current memories with an embedding, by model: the window, and what tells a
# change of embedding model.
_EMBEDDED_MODELS = """
SELECT w.embedding_model AS model, count(*) AS n
FROM (
    SELECT m.embedding_model FROM aidb_memory.memory m
    WHERE m.actor_key = $4 AND m.namespace_id = $1 AND m.actor_id = $2 AND m.valid_to IS NULL
      AND m.embedding IS NOT NULL
    ORDER BY m.created_at DESC
    LIMIT $3
) w
GROUP BY w.embedding_model
"""

# $1 namespace, $2 actor, $3 the query's embedding, $4 its model, $5 session_id, $6 agent_id,
# $7 the window, $8 how many, $9 the minimum cosine, $10 the actor's key. The most similar of the
# actor's newest $7 current memories embedded with the model, best first.
_CANDIDATES = """
SELECT c.id, c.sim, c.created_at
FROM (
    SELECT w.id, w.created_at,
           (SELECT sum(x * y) / nullif(sqrt(sum(x * x)) * sqrt(sum(y * y)), 0)
            FROM unnest(w.embedding::float8[], $3::float8[]) AS u(x, y)) AS sim
    FROM (
        SELECT m.id, m.created_at, m.embedding, m.session_id, m.agent_id
        FROM aidb_memory.memory m
        WHERE m.actor_key = $10 AND m.namespace_id = $1 AND m.actor_id = $2
          AND m.valid_to IS NULL
          AND m.embedding IS NOT NULL AND m.embedding_model = $4
        ORDER BY m.created_at DESC
        LIMIT $7
    ) w
    WHERE ($5::text IS NULL OR w.session_id = $5) AND ($6::text IS NULL OR w.agent_id = $6)
) c
WHERE c.sim > $9
ORDER BY c.sim DESC, c.id DESC
LIMIT $8
"""
_CANDIDATES_TYPES = (
    *("bigint", "text", "real[]", "text", "text", "text"),
    *("int", "int", "float8", "bigint"),
)


def query_embedding(
    fn: str, ns: Namespace, actor: str, key: int, query: str
) -> tuple[list[float] | None, str | None]:
    """The query's embedding and its model when the vector signal applies, else (None, None).

    It applies when the namespace names an embedding model and the actor's memories in the
    vector window were embedded with it. Memories embedded with another model are refused
    loudly (55000), never compared with vectors of a different model.
    """
    model_name = ns.model_spec.get("embedding")
    if not model_name:
        return None, None
    rows = db.execute(
        _EMBEDDED_MODELS, ("bigint", "text", "int", "bigint"), (ns.id, actor, VECTOR_WINDOW, key)
    )
    stored = {r["model"]: int(r["n"]) for r in rows}
    others = sorted(m for m in stored if m != model_name)
    if others:
        raise ApiError(
            OBJECT_NOT_IN_PREREQUISITE_STATE,
            f"aidb_memory.{fn}: memories of actor_id {quote(actor)} were embedded with model "
            f"{quote(others[0])}, but namespace {quote(ns.name)} now embeds with "
            f"{quote(model_name)}",
            hint="an admin re-embeds those memories with the new model (or sets "
            "model_spec.embedding back): vectors of two models are never compared",
        )
    if not stored:
        return None, None
    model = llm.load(fn, model_name)
    try:
        vectors = llm.embed(
            model, [query], namespace_id=ns.id, timeout_s=ns.config["llm_timeout_s"]
        )
    except llm.EmbeddingError as e:
        # Search still answers, from the words, and says why it did without.
        plpy.warning(
            f"aidb_memory.{fn}: the embedding model {quote(model_name)} failed "
            f"({e.outcome}: {e.public}); ranked without vector similarity"
        )
        return None, None
    return vectors[0], model_name


def candidates(
    ns: Namespace,
    actor: str,
    key: int,
    vector: list[float],
    model: str,
    session_id: str | None,
    agent_id: str | None,
    limit: int,
) -> tuple[list[int], list[float], list[Any]]:
    """The actor's current memories most similar to ``vector`` (ids, cosines, creation times),
    best first, at most ``limit``, each more similar than MIN_COSINE."""
    rows = db.execute(
        _CANDIDATES,
        _CANDIDATES_TYPES,
        (ns.id, actor, vector, model, session_id, agent_id, VECTOR_WINDOW, limit, MIN_COSINE, key),
    )
    return (
        [int(r["id"]) for r in rows],
        [float(r["sim"]) for r in rows],
        [r["created_at"] for r in rows],
    )
