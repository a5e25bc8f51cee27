"""The vector signal of ``search`` (SPEC §5): the query's embedding and the actor's memories
nearest it by cosine similarity.

``search`` asks this module for the candidates (ids, similarities, creation times) and fuses
them with the word signals in one statement (``memories._SEARCH``), so that how vectors are
stored and compared is decided here alone. Two storages (issue 27), read from the catalog on
every search (install converts the column while backends keep running):

* **pgvector**: ``memory.embedding`` is a ``vector`` without a dimension, so one column holds the
  vectors of models of any dimension. The actor's vectors of the query's model and dimension are
  compared in C: an exact scan of the actor's rows (by ``memory_actor_idx``) while the actor has
  at most EXACT_MAX memories, else the HNSW index of that dimension that install creates
  (``memory_embedding_<d>_idx``, partial on the dimension: an HNSW index needs a fixed one) with
  iterative index scans, falling back to the exact scan when it finds too few. No window.
* **real[]** (no pgvector): the cosine is computed in SQL over the actor's newest VECTOR_WINDOW
  memories only.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from typing import Any

import plpy

from aidb_memory_server import db, extensions, filtering, llm
from aidb_memory_server.access import Namespace, quote
from aidb_memory_server.errors import OBJECT_NOT_IN_PREREQUISITE_STATE, ApiError, invalid

# Without pgvector similarity is computed for the actor's newest current memories with an
# embedding, up to this many. With pgvector every memory is compared; this many newest are still
# what tells a change of embedding model (query_embedding).
VECTOR_WINDOW = 1000
# A memory whose cosine similarity to the query is at most this is not a vector candidate.
MIN_COSINE = 0.0
# An actor with at most this many memories (of any model, current or not: a count on an index
# alone, made only when the actor has fewer current memories than this) is scanned exactly:
# ~5 ms for 5,000 vectors of 384 dimensions on the bench machine, where
# 100,000 take ~100 ms; above it the HNSW index of the dimension answers, when there is one
# (bench/README.md, (j)).
EXACT_MAX = 5000
# What the HNSW scan runs with (set for its statement only): iterative scans continue until the
# actor's rows fill the limit (hnsw.iterative_scan, pgvector 0.8), visiting at most MAX_SCAN
# index tuples, EF_SEARCH candidates per step. It asks for the rows of the page searched (limit
# plus offset), at least HNSW_CANDIDATES and at most HNSW_MAX_CANDIDATES: the scan visits about
# (rows asked) / (the actor's share of the index) tuples, so its time grows with them (bench (j),
# 100,000 of 1,000,000 memories: the HNSW statement 4.1 ms for 10 rows, 8.0 for 20, 13.5 for 40,
# whatever ef_search from 20 to 60). A memory the vector signal leaves out is still ranked by its
# words (its cosine counts 0 in the score). At 20, twice a page of 10, what search returns first
# is found by meaning on (j)'s data (m = 32, ef_construction = 128) as an exact scan finds it
# (recall@10 1.0; at 10, 0.97 with one query at 0.2).
HNSW_EF_SEARCH = 40
HNSW_MAX_SCAN = 100_000
HNSW_CANDIDATES = 20
HNSW_MAX_CANDIDATES = 100
# pgvector's vector holds up to 16,000 dimensions; an HNSW index of vector up to 2,000.
MAX_DIMENSIONS = 16_000
# Query vectors this backend computed, by model and text: the same text is embedded once.
QUERY_CACHE_SIZE = 256
_query_cache: OrderedDict[tuple[str, str, str, str], list[float]] = OrderedDict()

# How embeddings are stored: the type of memory.embedding and its schema.
_STORAGE = """
SELECT t.typname::text AS type, n.nspname::text AS schema
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
WHERE a.attrelid = 'aidb_memory.memory'::pg_catalog.regclass AND a.attname = 'embedding'
  AND NOT a.attisdropped
"""

# The actor's newest current memories with an embedding, by model: what tells a change of
# embedding model (and, without pgvector, the window).
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

# The dimension of the actor's newest memory embedded with the model ($3): what a vector the
# application gives must have. Written for both storages (a vector casts to real[]).
_STORED_DIMENSIONS = """
SELECT pg_catalog.array_length(m.embedding::real[], 1) AS dims FROM aidb_memory.memory m
WHERE m.actor_key = $4 AND m.namespace_id = $1 AND m.actor_id = $2 AND m.valid_to IS NULL
  AND m.embedding_model = $3
ORDER BY m.created_at DESC
LIMIT 1
"""

# real[]: $1 namespace, $2 actor, $3 the query's embedding, $4 its model, $5 session_id,
# $6 agent_id, $7 the window, $8 how many, $9 the minimum cosine, $10 the actor's key. The most
# similar of the actor's newest $7 current memories embedded with the model (and of the query's
# dimension: unnest would pad a shorter one with NULLs), best first.
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
          AND (m.expires_at IS NULL OR m.expires_at > statement_timestamp())
          AND m.embedding IS NOT NULL AND m.embedding_model = $4/*filter*/
        ORDER BY m.created_at DESC
        LIMIT $7
    ) w
    WHERE ($5::text IS NULL OR w.session_id = $5) AND ($6::text IS NULL OR w.agent_id = $6)
      AND pg_catalog.array_length(w.embedding, 1) = pg_catalog.array_length($3::real[], 1)
) c
WHERE c.sim > $9
ORDER BY c.sim DESC, c.id DESC
LIMIT $8
"""
_CANDIDATES_TYPES = (
    *("bigint", "text", "real[]", "text", "text", "text"),
    *("int", "int", "float8", "bigint"),
)

# pgvector: how many memories the actor has, up to $4 (an index-only count on memory_actor_idx:
# superseded ones and those of other models or dimensions too, an upper bound of what the exact
# scan would compare), and whether the HNSW index of the dimension is there and valid ($5 its
# name). $1 namespace, $2 actor, $3 the actor's key. An actor with $4 current memories or more
# (memory_lexeme's count of them, lexeme '', one probe) has at least that many: counted only
# below, as reading up to $4 rows cost an actor of 100,000 memories ~1.7 ms of a ~9 ms search
# (bench (j)).
_SIZE = """
SELECT CASE WHEN coalesce((SELECT c.memories FROM aidb_memory.memory_lexeme c
                           WHERE c.actor_key = $3 AND c.namespace_id = $1 AND c.actor_id = $2
                             AND c.lexeme = ''
                           LIMIT 1), 0) >= $4
            THEN $4::bigint
            ELSE (SELECT count(*) FROM (
                      SELECT 1 FROM aidb_memory.memory m
                      WHERE m.actor_key = $3 AND m.namespace_id = $1 AND m.actor_id = $2
                      LIMIT $4) x)
       END AS n,
       coalesce((SELECT i.indisvalid FROM pg_catalog.pg_index i
                 WHERE i.indexrelid = pg_catalog.to_regclass($5)), false) AS indexed
"""
_SIZE_TYPES = ("bigint", "text", "bigint", "int", "text")

# pgvector, exact: every current memory of the actor with the model and the query's dimension
# ($7), nearest first (cosine distance, pgvector's <=>), at most $8; $3 the query's embedding,
# $9 the actor's key, the others as in _CANDIDATES. The distance is on the column as it is (no
# dimension), which no HNSW index computes: this plan reads the actor's rows by its key.
_EXACT = """
SELECT c.id, 1.0::float8 - c.d AS sim, c.created_at
FROM (
    SELECT m.id, m.created_at,
           m.embedding OPERATOR("@vector@".<=>) $3::real[]::"@vector@".vector AS d
    FROM aidb_memory.memory m
    WHERE m.actor_key = $9 AND m.namespace_id = $1 AND m.actor_id = $2
      AND m.valid_to IS NULL AND m.embedding_model = $4
      AND (m.expires_at IS NULL OR m.expires_at > statement_timestamp())
      AND "@vector@".vector_dims(m.embedding) = $7
      AND ($5::text IS NULL OR m.session_id = $5) AND ($6::text IS NULL OR m.agent_id = $6)
      /*filter*/
    ORDER BY d, m.id DESC
    LIMIT $8
) c
ORDER BY c.d, c.id DESC
"""
_EXACT_TYPES = (
    *("bigint", "text", "real[]", "text", "text", "text"),
    *("int", "int", "bigint"),
)

# pgvector, HNSW: the same through memory_embedding___dims___idx, whose expression and predicate
# this statement repeats with the dimension written in (__dims__: the planner proves a partial
# index from constants). Iterative scans return the rows of the key's actor in roughly
# ascending distance (relaxed order): ordered again outside. The filters on actor_key and the
# other columns are checked on the rows the index returns: on a distributed table the key
# routes the statement to the actor's shard. The parameters are _EXACT's ($7 unused).
_HNSW = """
SELECT c.id, 1.0::float8 - c.d AS sim, c.created_at
FROM (
    SELECT m.id, m.created_at,
           m.embedding::"@vector@".vector(__dims__)
               OPERATOR("@vector@".<=>) $3::real[]::"@vector@".vector(__dims__) AS d
    FROM aidb_memory.memory m
    WHERE m.actor_key = $9 AND m.namespace_id = $1 AND m.actor_id = $2
      AND m.valid_to IS NULL AND m.embedding_model = $4
      AND (m.expires_at IS NULL OR m.expires_at > statement_timestamp())
      AND "@vector@".vector_dims(m.embedding) = __dims__
      AND ($5::text IS NULL OR m.session_id = $5) AND ($6::text IS NULL OR m.agent_id = $6)
      /*filter*/
    ORDER BY m.embedding::"@vector@".vector(__dims__)
                 OPERATOR("@vector@".<=>) $3::real[]::"@vector@".vector(__dims__)
    LIMIT $8
) c
ORDER BY c.d, c.id DESC
"""
# The settings of the HNSW statement, for it alone (restored after it; a failure rolls them
# back with the caller's transaction or savepoint). Sorting off: a generic plan counts on an
# average actor's few rows and would sort them, scanning a large actor's every row.
_SET = """
SELECT pg_catalog.set_config(s.k, s.v, true) AS v FROM unnest($1::text[], $2::text[]) AS s(k, v)
"""
_SHOW = "SELECT s.k, pg_catalog.current_setting(s.k, true) AS v FROM unnest($1::text[]) AS s(k)"
# pgvector's defaults: what a setting goes back to that did not exist before the statement.
_DEFAULTS = {"hnsw.iterative_scan": "off", "hnsw.ef_search": "40", "hnsw.max_scan_tuples": "20000"}


def index_name(dims: int) -> str:
    """The HNSW index install creates for vectors of ``dims`` dimensions."""
    return f"memory_embedding_{int(dims)}_idx"


def storage() -> tuple[str, str | None]:
    """("pgvector", its schema) when memory.embedding is pgvector's vector, else ("real[]",
    None). Read on every search: install may convert the column while this backend runs."""
    rows = db.execute(_STORAGE)
    if rows.nrows() and rows[0]["type"] == "vector":
        return "pgvector", str(rows[0]["schema"])
    return "real[]", None


def _given(fn: str, vector: list[float]) -> list[float]:
    """A query vector the application gave, checked: 1 to MAX_DIMENSIONS finite numbers."""
    if not 1 <= len(vector) <= MAX_DIMENSIONS:
        raise invalid(
            fn,
            "query_embedding",
            f"has {len(vector)} dimensions; it must have 1 to {MAX_DIMENSIONS}",
            hint="pass the query's vector from the namespace's embedding model",
        )
    for i, x in enumerate(vector):
        if x is None or not math.isfinite(x):
            raise invalid(fn, f"query_embedding[{i + 1}]", "is not a finite number")
    return [float(x) for x in vector]


def _embed_query(fn: str, ns: Namespace, model_name: str, query: str) -> list[float] | None:
    """The query's vector by the model: from this backend's cache when the same model (name and
    options) embedded the same text before, else one call. None when the call fails (a WARNING
    says so)."""
    model = llm.load(fn, model_name)
    cache_key = (model.name, model.provider, json.dumps(model.options, sort_keys=True), query)
    cached = _query_cache.get(cache_key)
    if cached is not None:
        _query_cache.move_to_end(cache_key)
        return cached
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
        return None
    _query_cache[cache_key] = vectors[0]
    while len(_query_cache) > QUERY_CACHE_SIZE:
        _query_cache.popitem(last=False)
    return vectors[0]


def query_embedding(
    fn: str,
    ns: Namespace,
    actor: str,
    key: int,
    query: str,
    given: list[float] | None = None,
) -> tuple[list[float] | None, str | None]:
    """The query's embedding and its model when the vector signal applies, else (None, None).

    It applies when the namespace names an embedding model and the actor's newest memories
    were embedded with it. Memories embedded with another model are refused loudly (55000),
    never compared with vectors of a different model. ``given``: the query's vector, which the
    application computed with the namespace's model (no call is made; 22023 when it cannot be
    that model's).
    """
    model_name = ns.model_spec.get("embedding")
    if not model_name:
        if given is not None:
            raise invalid(
                fn,
                "query_embedding",
                f"is given, but namespace {quote(ns.name)} has no embedding model",
                hint="set model_spec.embedding with aidb_memory.namespace_update, or search "
                "without query_embedding",
            )
        return None, None
    vector = None if given is None else _given(fn, given)
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
    if vector is not None:
        dims = db.execute(
            _STORED_DIMENSIONS,
            ("bigint", "text", "text", "bigint"),
            (ns.id, actor, model_name, key),
        )
        if dims.nrows() and int(dims[0]["dims"]) != len(vector):
            raise invalid(
                fn,
                "query_embedding",
                f"has {len(vector)} dimensions, but the memories embedded with model "
                f"{quote(model_name)} have {int(dims[0]['dims'])}",
                hint="pass the query's vector from the namespace's embedding model",
            )
        return vector, model_name
    vector = _embed_query(fn, ns, model_name, query)
    return (None, None) if vector is None else (vector, model_name)


def _rows(rows: Any) -> tuple[list[int], list[float], list[Any]]:
    """(ids, cosines, creation times) of the rows more similar than MIN_COSINE, best first. A
    zero vector has no cosine (NaN, which PostgreSQL orders above every number): left out."""
    kept = [r for r in rows if r["sim"] is not None and not math.isnan(float(r["sim"]))]
    kept = [r for r in kept if float(r["sim"]) > MIN_COSINE]
    kept.sort(key=lambda r: (-float(r["sim"]), -int(r["id"])))
    return (
        [int(r["id"]) for r in kept],
        [float(r["sim"]) for r in kept],
        [r["created_at"] for r in kept],
    )


def _filtered(sql: str, types: tuple[str, ...], condition: Any) -> tuple[str, tuple[str, ...]]:
    """``sql`` with the filter (filtering.Compiled, or None) as one more condition of its scan
    of the actor's memories, its parameters after ``types``."""
    if condition is None:
        return sql, types
    where = f"\n      AND {condition.at(len(types) + 1)}"
    return sql.replace(filtering.SLOT, where), types + condition.types


def _hnsw(schema: str, dims: int, params: tuple[Any, ...], condition: Any = None) -> Any:
    """The HNSW statement of ``dims`` (_EXACT's parameters), under its settings alone."""
    statement, types = _filtered(_HNSW.replace("__dims__", str(dims)), _EXACT_TYPES, condition)
    sql = extensions.vector_sql(statement, schema)
    extra = () if condition is None else condition.params
    settings = {
        "hnsw.iterative_scan": "relaxed_order",
        "hnsw.ef_search": str(HNSW_EF_SEARCH),
        "hnsw.max_scan_tuples": str(HNSW_MAX_SCAN),
        "enable_sort": "off",
    }
    names = list(settings)
    before = {r["k"]: r["v"] for r in db.execute(_SHOW, ("text[]",), (names,))}
    db.execute(_SET, ("text[]", "text[]"), (names, [settings[k] for k in names]))
    try:
        return db.execute(sql, types, (*params, *extra))
    finally:
        # A setting that did not exist before (pgvector's, before its library loaded in this
        # backend) goes back to pgvector's default, not to ours.
        old = [_DEFAULTS[k] if before.get(k) is None else before[k] for k in names]
        db.execute(_SET, ("text[]", "text[]"), (names, old))


def candidates(
    ns: Namespace,
    actor: str,
    key: int,
    vector: list[float],
    model: str,
    session_id: str | None,
    agent_id: str | None,
    limit: int,
    condition: Any = None,
    *,
    page: int,
) -> tuple[list[int], list[float], list[Any]]:
    """The actor's current memories most similar to ``vector`` (ids, cosines, creation times),
    best first, at most ``limit``, each more similar than MIN_COSINE; only memories embedded
    with ``model`` in the vector's dimension are compared; with ``condition`` (a compiled
    filter, filtering.Compiled), only those it selects. ``page``: how many the search returns
    and skips; from the HNSW index, as many are asked for (within its bounds, above)."""
    kind, schema = storage()
    extra = () if condition is None else condition.params
    if kind != "pgvector" or schema is None:
        window = (ns.id, actor, vector, model, session_id, agent_id, VECTOR_WINDOW, limit)
        sql, types = _filtered(_CANDIDATES, _CANDIDATES_TYPES, condition)
        return _rows(db.execute(sql, types, (*window, MIN_COSINE, key, *extra)))
    dims = len(vector)
    size = db.execute(
        _SIZE, _SIZE_TYPES, (ns.id, actor, key, EXACT_MAX + 1, f"aidb_memory.{index_name(dims)}")
    )[0]
    params = (ns.id, actor, vector, model, session_id, agent_id, dims, limit, key)
    if int(size["n"]) > EXACT_MAX and size["indexed"]:
        asked = min(limit, max(HNSW_CANDIDATES, min(page, HNSW_MAX_CANDIDATES)))
        rows = _hnsw(schema, dims, (*params[:7], asked, key), condition)
        # Too few from the index (filters that leave few of the actor's rows, or more of other
        # actors' rows than the scan may visit): the exact scan answers.
        if rows.nrows() >= asked:
            return _rows(rows)
    statement, types = _filtered(_EXACT, _EXACT_TYPES, condition)
    exact = extensions.vector_sql(statement, schema)
    return _rows(db.execute(exact, types, (*params, *extra)))
