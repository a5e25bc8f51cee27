"""Long-term memory, the database side of the API (SPEC §5, §2): ``search``, ``delete``,
``forget`` and ``namespace_drop`` (``list_memories`` is listing.py's).

The memories themselves are written by the extraction worker; these functions read them and
erase them. ``search`` is one statement: three bounded candidate lists (full text, trigram,
vector) fused by reciprocal rank in SQL, with the constant and the normalization of
``fusion``. Erasure leaves no content and no id behind: the audit log gets counts, the reason and
``sessions.subject_hash``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import plpy

from aidb_memory_server import (
    db,
    erasure,
    extensions,
    filtering,
    keys,
    misspellings,
    ranking,
    reconciliation,
    validation,
    vectors,
)
from aidb_memory_server.access import Namespace, identifier, namespace, quote
from aidb_memory_server.errors import (
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    UNDEFINED_OBJECT,
    ApiError,
    invalid,
    required,
)
from aidb_memory_server.sessions import subject_hash

SEARCH_MAX = 100
SEARCH_DEFAULT = 10
# search's offset: how many of the best it may skip (the candidates are bounded, CANDIDATES and
# config.search_max_ranked; deeper pages of a listing are list_memories' with a cursor).
SEARCH_OFFSET_MAX = 1000
# The vector signal brings at most this many candidates, so a search costs the same for an actor
# with a hundred memories or a hundred thousand.
CANDIDATES = 200
# When fewer than this many times limit memories hold every word of the query, the memories that
# hold some of them are candidates too (within config.search_max_ranked in all).
ENOUGH_HOLDING_ALL = 2
DELETE_IDS_MAX = 10_000
# The longest selector text: DELETE_IDS_MAX quoted UUIDs and their commas, with room to spare.
SELECTOR_MAX_CHARS = 50 * DELETE_IDS_MAX
SELECTOR_KEYS = ("ids", "all", "before")
PROTECTED_NAMESPACE = "pg_agents"


def _reason(fn: str, reason: str | None) -> str:
    """The reason an erasure is recorded with: required and not blank."""
    if reason is None:
        raise required(fn, "reason")
    if not reason.strip():
        raise invalid(fn, "reason", "must not be empty", hint="say why, for the audit log")
    return reason


def filters(
    fn: str, ns: Namespace, session_id: str | None, agent_id: str | None
) -> tuple[Any, Any]:
    """The optional session_id and agent_id arguments, checked as identifiers."""
    limit = ns.config["max_identifier_chars"]
    return (
        identifier(fn, "session_id", session_id, limit, optional=True),
        identifier(fn, "agent_id", agent_id, limit, optional=True),
    )


def limit_argument(fn: str, value: int | None, default: int, maximum: int) -> int:
    n = default if value is None else value
    if not 1 <= n <= maximum:
        raise invalid(fn, "limit", f"must be between 1 and {maximum}")
    return n


def memory_filter(fn: str, ns: Namespace, text: str | None, first: int) -> Any:
    """The ``filter`` argument compiled (filtering.Compiled, parameters from ``$first``), or None
    for none; refused with 22023 when it is malformed or over the namespace's bounds."""
    if text is None:
        return None
    return filtering.compile_filter(
        fn,
        "filter",
        text,
        first,
        max_chars=ns.config["memory_filter_max_chars"],
        max_nodes=ns.config["memory_filter_max_nodes"],
    )


# --- search ------------------------------------------------------------------------------------

# The search statement. $1 namespace, $2 actor, $3 the actor's key (keys.actor_key: every scan of
# memory is one actor's, by it), $4 limit, $5 session_id, $6 agent_id; the query's terms
# (ranking.plan): $7 the lexemes as the index holds them (ranking.Query.keyed), $8 the lexemes, $9
# their groups, $10 how many groups; $11 the whole query as a web search reads it (NULL: no words),
# $12 what a memory must not match (-word; NULL: nothing); $13 the most memories that hold every
# word scored, and the most memories scored in all (config.search_max_ranked), $14 how many
# lexemes share what is left of it; the vector signal's candidates (vectors.candidates; empty
# arrays without it): $15 ids, $16 cosines; $17 the lexical share of the score
# (ranking.lexical_weight), $18 and $19 BM25's k1 and b, $20 what each lexeme counts for
# (ranking.Query.weights), $21 every word ANDed, each the OR of its lexemes (ranking.Query.every),
# $22 how many memories holding every word are enough (ENOUGH_HOLDING_ALL times limit), $23 how
# many of the best to skip (offset). A filter (filtering.py, its parameters from $24) is one more
# condition of every source of candidates (filtering.SLOT): the best among the memories it selects,
# never the best then filtered. Its equalities on metadata values are also asked of
# memory_lexemes_idx with the words (at _ENTRIES; filtering.Compiled.index_condition): so a filter
# that selects 1% of the actor's memories reads the memories it selects that hold the words, where
# the words alone would read up to a hundred times as many, each then tested and dropped (bench
# (l)). An expired memory is none of them (expiry.py), swept or not.
#
# BM25's statistics (how many current memories the actor has, and how many hold each lexeme) are
# read from memory_lexeme, which a trigger keeps: one primary-key probe a word, exact at any size.
# Each probe is an equality in a LATERAL subquery with LIMIT 1 (here and in _QUERY_TREE; the key
# is unique, the LIMIT keeps the planner from turning the probes into a join): with "lexeme = ANY
# (...)", or as a join, a generic plan made before ANALYZE had seen memory_lexeme read all of the
# actor's rows and tested the words on each (~25 ms for an actor with 100,000 distinct lexemes,
# bench (j)).
# The candidates: the memories that hold every word, up to $13; when fewer than $22 do, also those
# that hold some, what is left of $13 shared by the lexemes (a rare lexeme brings all of its
# memories, a common one a sample, as the index returns them); and the vector candidates. So on an
# actor with 100,000 memories the best matches are never left out of a sample.
# The memories are found on the GIN index of memory.lexeme_keys (each lexeme keyed by its
# actor), which reads one actor's entries for one word; the
# namespace and actor are tested on those rows, written "m.namespace_id + 0" and
# "m.actor_id || ''" so that they are no index key: every btree index of memory leads with
# actor_key too, and with the namespace and actor as keys the generic plan (which counts on an
# average actor, a few rows, and takes the key and actor for independent) would scan the actor's
# every current memory on a btree and test the lexemes on each: ~1 s for an actor with 100,000
# memories (bench/README.md, (e)).
# Each memory's lexical score comes from its own lexemes (tsvector positions: how often each
# occurs; length: how many distinct lexemes it has), against the average length of the candidates.
# Only the best $4 are fetched again, with their content.
_SEARCH = """
WITH counts AS (
    -- BM25's statistics: the actor's current memories (lexeme '') and those holding each lexeme.
    SELECT l.lexeme, c.memories::float8 AS n
    FROM (SELECT DISTINCT x FROM unnest(array_append($8::text[], '')) AS x) AS l(lexeme)
    CROSS JOIN LATERAL (
        SELECT c.memories FROM aidb_memory.memory_lexeme c
        WHERE c.actor_key = $3 AND c.namespace_id = $1 AND c.actor_id = $2
          AND c.lexeme = l.lexeme
        LIMIT 1) AS c
), terms AS (
    SELECT t.keyed, t.lexeme, t.grp, t.weight, coalesce(d.n, 0) AS df,
           ln(1 + (greatest(a.n, coalesce(d.n, 0)) - coalesce(d.n, 0) + 0.5)
                  / (coalesce(d.n, 0) + 0.5)) AS idf
    FROM unnest($7::text[], $8::text[], $9::int[], $20::float8[]) AS t(keyed, lexeme, grp, weight)
    CROSS JOIN (SELECT coalesce(max(c.n) FILTER (WHERE c.lexeme = ''), 0) AS n FROM counts c) a
    LEFT JOIN counts d ON d.lexeme = t.lexeme
), required AS (
    -- The lexemes a memory holding every word must hold: those of the words that have one lexeme
    -- some memory holds (a near word that no memory holds drops out of its word).
    SELECT array_agg(t.keyed) AS keyed FROM terms t
    WHERE t.df > 0
      AND t.grp IN (SELECT r.grp FROM terms r WHERE r.df > 0 GROUP BY r.grp HAVING count(*) = 1)
), holding_all AS (
    -- The memories that hold every word (each word's stem or a near word's): found by the words
    -- that have one lexeme (required), or when none has, by the rarest word's lexemes.
    (SELECT m.id, m.created_at, m.lexemes FROM aidb_memory.memory m
     WHERE (SELECT r.keyed FROM required r) IS NOT NULL AND $21::tsquery IS NOT NULL
       AND m.actor_key = $3 AND m.namespace_id + 0 = $1 AND m.actor_id || '' = $2
       AND m.valid_to IS NULL
       AND (m.expires_at IS NULL OR m.expires_at > statement_timestamp())
       AND ($5::text IS NULL OR m.session_id = $5) AND ($6::text IS NULL OR m.agent_id = $6)
       AND m.lexeme_keys @> (SELECT r.keyed FROM required r)/*entries*//*filter*/
       AND m.lexemes @@ $21::tsquery
     LIMIT $13)
    UNION ALL
    (SELECT m.id, m.created_at, m.lexemes FROM aidb_memory.memory m
     WHERE (SELECT r.keyed FROM required r) IS NULL AND $21::tsquery IS NOT NULL
       AND m.actor_key = $3 AND m.namespace_id + 0 = $1 AND m.actor_id || '' = $2
       AND m.valid_to IS NULL
       AND (m.expires_at IS NULL OR m.expires_at > statement_timestamp())
       AND ($5::text IS NULL OR m.session_id = $5) AND ($6::text IS NULL OR m.agent_id = $6)
      /*entries*//*filter*/
       AND m.lexeme_keys && (
           SELECT array_agg(t.keyed) FROM terms t
           WHERE t.df > 0
             AND t.grp = (SELECT r.grp FROM terms r WHERE r.df > 0 GROUP BY r.grp
                          ORDER BY sum(r.df), r.grp LIMIT 1))
       AND m.lexemes @@ $21::tsquery
     LIMIT $13)
), holding_some AS (
    -- When fewer than $22 hold every word: the memories holding each lexeme, sharing what is left
    -- of $13 among the $14 lexemes (a rare lexeme brings all of its memories, a common one a
    -- sample, as the index returns them).
    SELECT c.id, c.created_at, c.lexemes
    FROM terms t
    CROSS JOIN LATERAL (
        SELECT m.id, m.created_at, m.lexemes FROM aidb_memory.memory m
        WHERE m.actor_key = $3 AND m.namespace_id + 0 = $1 AND m.actor_id || '' = $2
          AND m.valid_to IS NULL
          AND (m.expires_at IS NULL OR m.expires_at > statement_timestamp())
          AND ($5::text IS NULL OR m.session_id = $5) AND ($6::text IS NULL OR m.agent_id = $6)
          AND m.lexeme_keys @> ARRAY[t.keyed]/*entries*//*filter*/
        LIMIT (SELECT greatest($13 - count(*), 0) / $14 FROM holding_all)
    ) c
    WHERE (SELECT count(*) FROM holding_all) < $22
      AND t.df > 0
), candidate AS (
    SELECT DISTINCT ON (u.id) u.id, u.created_at, u.lexemes, length(u.lexemes)::float8 AS dl
    FROM (
        SELECT h.id, h.created_at, h.lexemes FROM holding_all h
        UNION ALL
        SELECT s.id, s.created_at, s.lexemes FROM holding_some s
        UNION ALL
        SELECT m.id, m.created_at, m.lexemes
        FROM unnest($15::bigint[]) AS v(id)
        JOIN aidb_memory.memory m ON m.actor_key = $3 AND m.id = v.id
        WHERE (m.expires_at IS NULL OR m.expires_at > statement_timestamp())/*filter*/
    ) u
    WHERE $12::tsquery IS NULL OR NOT u.lexemes @@ $12::tsquery
    ORDER BY u.id
), held AS (
    -- The query's lexemes each candidate holds, how often: its lexemes cut to the query's in C
    -- (setweight marks them, ts_filter keeps the marked ones), then one hash join over them all.
    SELECT c.id, t.grp, t.weight * t.idf AS idf,
           coalesce(array_length(x.positions, 1), 1)::float8 AS tf, c.dl
    FROM candidate c
    CROSS JOIN LATERAL unnest(ts_filter(setweight(c.lexemes, 'A', $8::text[]), '{a}'))
        AS x(lexeme, positions, weights)
    JOIN terms t ON t.lexeme = x.lexeme
), lexical AS (
    SELECT c.id, c.created_at, coalesce(s.total, 0) AS total,
           CASE WHEN $11::tsquery IS NOT NULL AND c.lexemes @@ $11::tsquery THEN 1.0::float8
                ELSE coalesce(s.groups, 0)::float8 / greatest($10, 1) END AS share
    FROM candidate c
    LEFT JOIN (
        SELECT h.id,
               sum(h.idf * h.tf * ($18 + 1)
                   / (h.tf + $18 * (1 - $19 + $19 * h.dl / average.dl))) AS total,
               count(DISTINCT h.grp) AS groups
        FROM held h
        CROSS JOIN (SELECT greatest(avg(a.dl), 1.0) AS dl FROM candidate a) average
        GROUP BY h.id
    ) s ON s.id = c.id
), possible AS (
    -- What a memory holding each group's rarest lexeme once, at average length, scores (of the
    -- lexemes some memory holds: a near word's stem may be in none).
    SELECT nullif(sum(g.idf), 0) AS total
    FROM (SELECT max(t.idf) AS idf FROM terms t WHERE t.df > 0 GROUP BY t.grp) g
), best AS (
    SELECT l.id, l.created_at,
           w.lexical * least(1.0, coalesce(l.total * l.share / p.total, 0))
           + (1 - w.lexical) * greatest(coalesce(v.sim, 0), 0) AS score
    FROM lexical l
    CROSS JOIN possible p
    -- A query none of whose lexemes any memory holds is ranked by the vectors alone.
    CROSS JOIN LATERAL (SELECT CASE WHEN p.total IS NULL AND $15::bigint[] <> '{}' THEN 0.0
                                    ELSE $17 END AS lexical) w
    LEFT JOIN unnest($15::bigint[], $16::float8[]) AS v(id, sim) ON v.id = l.id
    ORDER BY score DESC, l.created_at DESC, l.id DESC
    LIMIT $4 OFFSET $23
)
SELECT m.public_id::text AS id, m.content, b.score::real AS score,
       m.agent_id, m.session_id, to_json(m.created_at) #>> '{}' AS created_at, m.metadata,
       m.key, to_json(m.expires_at) #>> '{}' AS expires_at
FROM best b
JOIN aidb_memory.memory m ON m.actor_key = $3 AND m.id = b.id
WHERE b.score > 0
ORDER BY b.score DESC, b.created_at DESC, b.id DESC
"""
_ENTRIES = "/*entries*/"
_SEARCH_TYPES = (
    *("bigint", "text", "bigint", "int", "text", "text"),
    *("text[]", "text[]", "int[]", "int", "tsquery", "tsquery", "int", "int"),
    *("bigint[]", "float8[]", "float8", "float8", "float8", "float8[]", "tsquery", "int"),
    "int",
)


# What a query costs before it runs, in two steps. First what flat scans can tell: its distinct
# words (lexemes) and its tokens (words and operators as the parser splits them; blanks, token
# type 12, aside). Only a query within the caps is then made a tsquery: websearch_to_tsquery
# builds a tree whose cleanup recurses, and a query of ~17,000 words exhausts the stack (54001)
# before its nodes could be counted. The query's length is bounded before either runs.
_QUERY_WORDS = """
SELECT length(to_tsvector('simple', $1)) AS words,
       (SELECT count(*) FROM ts_parse('default', $1) AS t WHERE t.tokid <> 12) AS tokens
"""
# With the tree (under the namespace's text search configuration, $5), the query's words as
# written ('simple'), the stems of each (its lexemes under $5, space-separated; none for a stop
# word), and the words that may be misspelled: no stop word, used by none of the actor's memories
# ($2 namespace, $3 actor, $4 its key; one probe of memory_word's primary key a word, a correlated
# subquery, which the planner cannot turn into a hash join over the whole vocabulary), and whose
# stems no current memory holds either ("seat" is no misspelling where a memory says "seats"; a
# probe of memory_lexeme's primary key a stem).
_QUERY_TREE = """
SELECT nullif(q::text, '') AS q, numnode(q) AS nodes, w.words, w.stems,
       ARRAY(SELECT u.word FROM unnest(w.words, w.stems) AS u(word, stems)
             WHERE CASE WHEN u.stems = '' THEN false
                        WHEN (SELECT true FROM aidb_memory.memory_word e
                              WHERE e.actor_key = $4 AND e.namespace_id = $2 AND e.actor_id = $3
                                AND e.word = u.word
                              LIMIT 1) THEN false
                        ELSE NOT EXISTS (
                            SELECT 1 FROM unnest(string_to_array(u.stems, ' ')) AS s(lexeme)
                            CROSS JOIN LATERAL (
                                SELECT 1 FROM aidb_memory.memory_lexeme c
                                WHERE c.actor_key = $4 AND c.namespace_id = $2
                                  AND c.actor_id = $3 AND c.lexeme = s.lexeme
                                LIMIT 1) AS c)
                   END
             ORDER BY u.word) AS unknown
FROM websearch_to_tsquery($5::regconfig, $1) AS q,
     LATERAL (
         SELECT coalesce(array_agg(u.word ORDER BY u.word), '{}') AS words,
                coalesce(array_agg(array_to_string(
                    tsvector_to_array(to_tsvector($5::regconfig, u.word)), ' ')
                    ORDER BY u.word), '{}') AS stems
         FROM unnest(tsvector_to_array(to_tsvector('simple', $1))) AS u(word)
     ) AS w
"""
_NODES_HINT = (
    "search with fewer words and operators, or an admin raises config.search_max_query_nodes"
)


def _bounded_query(
    fn: str, ns: Namespace, actor: str, key: int, query: str, text_search: str
) -> Any:
    """The query's tsquery, words, stems and unknown words (the row of _QUERY_TREE), once its
    cost is known to be within the namespace's caps (22023 naming the config key otherwise).
    Runs before any model is called: a query refused costs only this."""
    cfg = ns.config
    cap = cfg["search_max_query_chars"]
    if len(query) > cap:
        raise invalid(
            fn,
            "query",
            f"has {len(query)} characters, more than the namespace limit of {cap}",
            hint="shorten the query, or an admin raises config.search_max_query_chars",
        )
    counts = db.execute(_QUERY_WORDS, ("text",), (query,))[0]
    words, cap = int(counts["words"]), cfg["search_max_words"]
    if words > cap:
        raise invalid(
            fn,
            "query",
            f"has {words} distinct words, more than the namespace limit of {cap}",
            hint="search with fewer words, or an admin raises config.search_max_words",
        )
    tokens, cap = int(counts["tokens"]), cfg["search_max_query_nodes"]
    if tokens > cap:
        raise invalid(
            fn,
            "query",
            f"has {tokens} words and operators, more than the namespace limit of {cap}",
            hint=_NODES_HINT,
        )
    tree = db.execute(
        _QUERY_TREE,
        ("text", "bigint", "text", "bigint", "text"),
        (query, ns.id, actor, key, text_search),
    )[0]
    nodes = int(tree["nodes"])
    if nodes > cap:
        raise invalid(
            fn,
            "query",
            f"makes a full-text query of {nodes} terms and operators, more than the namespace "
            f"limit of {cap}",
            hint=_NODES_HINT,
        )
    return tree


# The stems ($8, the namespace's text search configuration) of the words of the actor's memories
# nearest each misspelled query word ($3, _QUERY_TREE's unknown words): those within one
# edit of it ($4, $5: word and variant, misspellings.edit_lookups), each looked up by exact match on
# memory_word's primary key, best trigram similarity first; and only for a word with none of those,
# the words most similar to it by trigrams (above pg_trgm.similarity_threshold, pinned on the SQL
# function). At most $6 words each. pg_trgm's schema goes where "@trgm@" is (extensions.trgm_sql).
# $7 the actor's key. The namespace and actor are filters there, as in _SEARCH: as keys, the
# planner would scan the actor's whole vocabulary on the primary key and compare every word, where
# the trigram index (actor_key, word) reads only the words that share trigrams with the misspelled
# one. With the key alone the generic plan scans the vocabulary on the primary key only while the
# average actor's is a few dozen words (bench (e): ~0.3 ms for the 250 words of its actor).
_NEAR_WORDS = """
WITH hit AS (
    SELECT v.source, v.variant
    FROM unnest($4::text[], $5::text[]) AS v(source, variant)
    CROSS JOIN LATERAL (
        SELECT 1 FROM aidb_memory.memory_word x
        WHERE x.actor_key = $7 AND x.namespace_id = $1 AND x.actor_id = $2
          AND x.word = v.variant
        LIMIT 1
    ) AS x
), near AS (
    SELECT u.word,
           coalesce(
               (SELECT array_agg(h.variant ORDER BY h.sim DESC, h.variant)
                FROM (SELECT h.variant, "@trgm@".similarity(h.variant, u.word) AS sim
                      FROM hit h WHERE h.source = u.word
                      ORDER BY sim DESC, h.variant
                      LIMIT $6) h),
               (SELECT array_agg(n.word ORDER BY n.sim DESC, n.word)
                FROM (SELECT v.word, "@trgm@".similarity(v.word, u.word) AS sim
                      FROM aidb_memory.memory_word v
                      WHERE v.actor_key = $7 AND v.namespace_id + 0 = $1 AND v.actor_id || '' = $2
                        AND v.word OPERATOR("@trgm@".%) u.word
                      ORDER BY sim DESC, v.word
                      LIMIT $6) n),
               '{}') AS near
    FROM unnest($3::text[]) AS u(word)
)
SELECT n.word,
       ARRAY(SELECT DISTINCT s.stem
             FROM unnest(n.near) AS w(word),
                  unnest(tsvector_to_array(to_tsvector($8::regconfig, w.word))) AS s(stem)
             ORDER BY s.stem) AS stems
FROM near n
"""
NEAR_WORDS = 3


def _near_stems(
    namespace_id: int, actor: str, key: int, unknown: list[str], text_search: str
) -> dict[str, list[str]]:
    """For each of the query's ``unknown`` words (no memory of the actor uses them, nor their
    stems), the stems of the actor's words nearest it (none found: no entry)."""
    if not unknown:
        return {}
    sources, variants = misspellings.edit_lookups(unknown)
    rows = db.execute(
        extensions.trgm_sql(_NEAR_WORDS, "search"),
        ("bigint", "text", "text[]", "text[]", "text[]", "int", "bigint", "text"),
        (namespace_id, actor, unknown, sources, variants, NEAR_WORDS, key, text_search),
    )
    return {r["word"]: list(r["stems"]) for r in rows if r["stems"]}


def search(
    namespace_name: str | None,
    actor_id: str | None,
    query: str | None,
    limit: int | None,
    session_id: str | None,
    agent_id: str | None,
    query_embedding: list[float] | None = None,
    filter_json: str | None = None,
    offset: int | None = None,
) -> list[dict[str, Any]]:
    """The actor's current memories that best match ``query``, best first, score in [0, 1],
    among those ``filter_json`` selects, the best ``offset`` skipped. ``query_embedding``: the
    query's vector, when the application has it (no embedding call)."""
    fn = "search"
    ns, actor = namespace(fn, namespace_name, actor_id, writing=False)
    sid, agent = filters(fn, ns, session_id, agent_id)
    n = limit_argument(fn, limit, SEARCH_DEFAULT, SEARCH_MAX)
    skip = 0 if offset is None else offset
    if not 0 <= skip <= SEARCH_OFFSET_MAX:
        raise invalid(fn, "offset", f"must be between 0 and {SEARCH_OFFSET_MAX}")
    if query is None:
        raise required(fn, "query")
    if not query.strip():
        raise invalid(fn, "query", "must not be empty")
    condition = memory_filter(fn, ns, filter_json, len(_SEARCH_TYPES) + 1)
    key = keys.actor_key(ns.name, actor)
    text_search = "pg_catalog." + ns.config["text_search_config"]
    tree = _bounded_query(fn, ns, actor, key, query, text_search)
    vector, model_name = vectors.query_embedding(fn, ns, actor, key, query, query_embedding)
    stems = {w: s.split() for w, s in zip(tree["words"], tree["stems"], strict=True)}
    near = _near_stems(ns.id, actor, key, list(tree["unknown"]), text_search)
    terms = ranking.plan(tree["q"], stems, near)
    nearest: tuple[list[int], list[float], list[Any]] = ([], [], [])
    if vector is not None and model_name is not None:
        nearest = vectors.candidates(
            ns,
            actor,
            key,
            vector,
            model_name,
            sid,
            agent,
            max(CANDIDATES, n + skip),
            condition,
            page=n + skip,
        )
    if not terms.lexemes and not nearest[0]:
        return []
    ranked = ns.config["search_max_ranked"]
    statement, types, extra = _SEARCH, _SEARCH_TYPES, ()
    if condition is not None:
        statement = _SEARCH.replace(filtering.SLOT, f"\n       AND {condition.sql}")
        types, extra = types + condition.types, condition.params
        entries = condition.index_condition("$3", len(types) + 1)
        if entries is not None:
            statement = statement.replace(_ENTRIES, f"\n       AND {entries[0]}")
            types, extra = types + entries[1], extra + entries[2]
    rows = db.execute(
        statement,
        types,
        (
            *(ns.id, actor, key, n, sid, agent),
            *(terms.keyed(key), terms.lexemes, terms.groups, terms.group_count),
            *(tree["q"], terms.negated, ranked, max(1, len(terms.lexemes))),
            *(
                nearest[0],
                nearest[1],
                ranking.lexical_weight(vector is not None, bool(terms.lexemes)),
            ),
            *(ranking.K1, ranking.B, terms.weights, terms.every),
            ENOUGH_HOLDING_ALL * (n + skip),
            skip,
            *extra,
        ),
    )
    return [dict(r) for r in rows]


# --- delete ------------------------------------------------------------------------------------

_CONDITIONS = {
    "ids": "m.public_id = ANY ($5::uuid[])",
    "all": "$5::boolean",
    "before": "m.created_at < $5::timestamptz",
}
_VALUE_TYPES = {"ids": "text", "all": "boolean", "before": "text"}
_DELETES = {kind: erasure.statement(c, "delete") for kind, c in _CONDITIONS.items()}
_TIMESTAMP = "SELECT to_json($1::timestamptz) #>> '{}' AS t"


def _selector(fn: str, selector: str | None) -> tuple[str, Any]:
    """(kind, value) of a delete selector: exactly one of ids, all, before."""
    if selector is None:
        raise required(fn, "selector")
    hint = 'one of {"ids": [uuid, ...]}, {"all": true}, {"before": "timestamp"}'
    parsed = validation.parse_json(fn, "selector", selector, SELECTOR_MAX_CHARS)
    if not isinstance(parsed, dict) or len(parsed) != 1:
        raise invalid(fn, "selector", "must be an object with exactly one key", hint=hint)
    kind, value = next(iter(parsed.items()))
    if kind not in SELECTOR_KEYS:
        raise invalid(fn, f"selector.{kind}", "is not a selector", hint=hint)
    if kind == "all":
        if value is not True:
            raise invalid(fn, "selector.all", "must be true", hint=hint)
        return kind, True
    if kind == "ids":
        if not isinstance(value, list) or len(value) > DELETE_IDS_MAX:
            raise invalid(
                fn, "selector.ids", f"must be an array of at most {DELETE_IDS_MAX} memory ids"
            )
        ids = []
        for i, item in enumerate(value):
            try:
                ids.append(str(uuid.UUID(item)))
            except (TypeError, ValueError, AttributeError):
                raise invalid(fn, f"selector.ids[{i}]", "is not a memory id (a UUID)") from None
        return kind, "{" + ",".join(ids) + "}"
    if not isinstance(value, str) or not value.strip():
        raise invalid(fn, "selector.before", "must be a timestamp string", hint=hint)
    try:
        parsed_time = db.execute(_TIMESTAMP, ("text",), (value,))[0]["t"]
    except plpy.SPIError:
        raise invalid(
            fn,
            "selector.before",
            f"is not a timestamp: {quote(value, 60)}",
            hint='e.g. "2025-07-01T00:00:00Z"',
        ) from None
    return kind, parsed_time


def delete(
    namespace_name: str | None,
    actor_id: str | None,
    selector: str | None,
    reason: str | None,
    session_id: str | None,
    agent_id: str | None,
) -> int:
    """Delete the actor's memories the selector names (within the filters), with their
    history; audited with counts and the reason. Returns how many memories went."""
    fn = "delete"
    ns, actor = namespace(fn, namespace_name, actor_id, writing=False)
    sid, agent = filters(fn, ns, session_id, agent_id)
    kind, value = _selector(fn, selector)
    why = _reason(fn, reason)
    key = keys.actor_key(ns.name, actor)
    reconciliation.lock_actor(ns.id, actor, key)  # not while a worker reconciles this actor
    rows = db.execute(
        _DELETES[kind],
        (*erasure.TYPES[:4], _VALUE_TYPES[kind], *erasure.TYPES[5:]),
        (
            *(ns.id, actor, sid, agent, value, ns.name, subject_hash(ns.name, actor), why),
            *(kind, key),
        ),
    )
    return int(rows[0]["n"])


# --- forget ------------------------------------------------------------------------------------

# The actor's events, locked first: that waits for a worker extracting one (it holds the row), and
# only then forget takes the actor's lock, which that worker takes to reconcile: never the other
# way round. They are deleted last, after what refers to them (turns, memories and their history:
# those foreign keys are NO ACTION, migration 0015). Sessions take their turns and summaries with
# them (ON DELETE CASCADE), and with them every handoff of the actor: a session's prev_handoff only
# ever comes from the same actor's sessions.
_FORGET_LOCK_EVENTS = """
SELECT count(*) AS n FROM (
    SELECT 1 FROM aidb_memory.event
    WHERE actor_key = $3 AND namespace_id = $1 AND actor_id = $2
    FOR UPDATE
) e
"""
_FORGET_SUMMARIES = """
SELECT count(*) AS n FROM aidb_memory.summary x
JOIN aidb_memory.session s ON s.actor_key = x.actor_key AND s.id = x.session_ref
WHERE x.actor_key = $3 AND s.actor_key = $3 AND s.namespace_id = $1 AND s.actor_id = $2
"""
_FORGET_SESSIONS = """
WITH s AS (
    DELETE FROM aidb_memory.session WHERE actor_key = $3 AND namespace_id = $1 AND actor_id = $2
    RETURNING next_seq - 1 AS turns
)
SELECT count(*) AS sessions, coalesce(sum(turns), 0) AS turns FROM s
"""
_FORGET_HISTORY = """
WITH h AS (DELETE FROM aidb_memory.memory_history
           WHERE actor_key = $3 AND namespace_id = $1 AND actor_id = $2
           RETURNING 1)
SELECT count(*) AS n FROM h
"""
_FORGET_MEMORIES = """
WITH m AS (DELETE FROM aidb_memory.memory
           WHERE actor_key = $3 AND namespace_id = $1 AND actor_id = $2
           RETURNING 1)
SELECT count(*) AS n FROM m
"""
# Events hold the turns of adds without a session and every idempotency key.
_FORGET_EVENTS = """
WITH e AS (DELETE FROM aidb_memory.event
           WHERE actor_key = $3 AND namespace_id = $1 AND actor_id = $2
           RETURNING 1)
SELECT count(*) AS n FROM e
"""
_AUDIT = """
INSERT INTO aidb_memory.audit_log (by_role, action, namespace, subject_hash, counts, reason)
VALUES (session_user, $1, $2, $3, $4::jsonb, $5)
"""


def forget(namespace_name: str | None, actor_id: str | None, reason: str | None) -> str:
    """Erase every trace of the actor in the namespace; returns the counts of what went."""
    fn = "forget"
    ns, actor = namespace(fn, namespace_name, actor_id, writing=False)
    why = _reason(fn, reason)
    ids = ("bigint", "text", "bigint")
    key = keys.actor_key(ns.name, actor)
    actor_ids = (ns.id, actor, key)
    # The events' locks first, then the actor's (_FORGET_LOCK_EVENTS); the events go last.
    db.execute(_FORGET_LOCK_EVENTS, ids, actor_ids)
    reconciliation.lock_actor(ns.id, actor, key)
    summaries = int(db.execute(_FORGET_SUMMARIES, ids, actor_ids)[0]["n"])
    sessions = db.execute(_FORGET_SESSIONS, ids, actor_ids)[0]
    counts = {
        "sessions": int(sessions["sessions"]),
        "turns": int(sessions["turns"]),
        "summaries": summaries,
        "memory_history": int(db.execute(_FORGET_HISTORY, ids, actor_ids)[0]["n"]),
        "memories": int(db.execute(_FORGET_MEMORIES, ids, actor_ids)[0]["n"]),
        "events": int(db.execute(_FORGET_EVENTS, ids, actor_ids)[0]["n"]),
    }
    reconciliation.drop_actor_lock(ns.id, actor, key)
    text = json.dumps(counts)
    db.execute(
        _AUDIT,
        ("text", "text", "text", "text", "text"),
        ("forget", ns.name, subject_hash(ns.name, actor), text, why),
    )
    return text


# --- namespace_drop ----------------------------------------------------------------------------

_LOCK_NAMESPACE = "SELECT id FROM aidb_memory.namespace WHERE name = $1 FOR UPDATE"
_NAMESPACE_COUNTS = """
-- spans actors: namespace_drop
SELECT (SELECT count(*) FROM aidb_memory.session WHERE namespace_id = $1) AS sessions,
       (SELECT coalesce(sum(next_seq - 1), 0) FROM aidb_memory.session
        WHERE namespace_id = $1) AS turns,
       (SELECT count(*) FROM aidb_memory.event WHERE namespace_id = $1) AS events,
       (SELECT count(*) FROM aidb_memory.memory WHERE namespace_id = $1) AS memories,
       (SELECT count(*) FROM (
            SELECT actor_id FROM aidb_memory.session WHERE namespace_id = $1
            UNION SELECT actor_id FROM aidb_memory.event WHERE namespace_id = $1
            UNION SELECT actor_id FROM aidb_memory.memory WHERE namespace_id = $1) a) AS actors
"""
# What refers to an event by a NO ACTION foreign key goes first, in this order: sessions (their
# turns and summaries by ON DELETE CASCADE), then the history of memories and the memories. On
# one server the cascade from the namespace alone would do, whatever order its triggers fire in;
# on Citus each shard's cascade statement checks the NO ACTION keys on its own, and one that
# deleted events before the turns that refer to them fails (turn_event_ref_fkey).
_DROP_REFERRERS = (
    """
-- spans actors: namespace_drop
DELETE FROM aidb_memory.session WHERE namespace_id = $1
""",
    """
-- spans actors: namespace_drop
DELETE FROM aidb_memory.memory_history WHERE namespace_id = $1
""",
    """
-- spans actors: namespace_drop
DELETE FROM aidb_memory.memory WHERE namespace_id = $1
""",
)
# Events and the rest go by ON DELETE CASCADE; model_usage keeps its rows (no content) with
# namespace_id set to NULL.
_DROP = """
-- spans actors: namespace_drop
DELETE FROM aidb_memory.namespace WHERE id = $1
"""


# On Citus, the deletion of the namespace row (a reference table) must not follow a statement of
# the transaction that read the distributed tables over several connections per node (the
# counts): one connection per node for the rest of the transaction (docs/scaling.md). A
# placeholder setting without Citus, gone at the end of the transaction.
_SEQUENTIAL = "SELECT pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true)"


def namespace_drop(name: str | None, reason: str | None) -> str:
    """Admin: erase a namespace and everything in it; audited. Returns the counts."""
    fn = "namespace_drop"
    if name is None:
        raise required(fn, "name")
    why = _reason(fn, reason)
    if name == PROTECTED_NAMESPACE:
        raise ApiError(
            OBJECT_NOT_IN_PREREQUISITE_STATE,
            f"aidb_memory.{fn}: namespace {quote(name)} belongs to the installation and is "
            "never dropped",
            hint="erase an actor in it with aidb_memory.forget, or deactivate it with "
            "aidb_memory.namespace_update",
        )
    db.execute(_SEQUENTIAL)
    rows = db.execute(_LOCK_NAMESPACE, ("text",), (name,))
    if not rows.nrows():
        raise ApiError(
            UNDEFINED_OBJECT,
            f"aidb_memory.{fn}: namespace {quote(name)} does not exist",
            hint="aidb_memory.namespaces lists them",
        )
    ident = int(rows[0]["id"])
    row = db.execute(_NAMESPACE_COUNTS, ("bigint",), (ident,))[0]
    counts = {k: int(row[k]) for k in ("actors", "sessions", "turns", "events", "memories")}
    for statement in _DROP_REFERRERS:
        db.execute(statement, ("bigint",), (ident,))
    db.execute(_DROP, ("bigint",), (ident,))
    text = json.dumps(counts)
    db.execute(
        _AUDIT, ("text", "text", "text", "text", "text"), ("namespace_drop", name, None, text, why)
    )
    return text
