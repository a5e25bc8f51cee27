-- Search ranks by stemmed words (issue 24): memory.lexemes holds each memory's words as the
-- namespace's text search configuration reduces them, stop words left out, for the BM25 ranking
-- of aidb_memory.search. It is written with the memory (reconciliation), and again for every
-- memory of a namespace whose configuration changes (namespace_update). memory.tsv (the words as
-- written, 'simple') stays: the vocabulary of memory_word, where misspelled query words find their
-- nearest words, is built from it. Until now no namespace could name a configuration: every
-- memory is in english.
ALTER TABLE aidb_memory.memory ADD COLUMN lexemes pg_catalog.tsvector;
-- backfill: each memory's lexemes from its own content (install batches it, with progress)
UPDATE aidb_memory.memory
SET lexemes = pg_catalog.to_tsvector('pg_catalog.english'::pg_catalog.regconfig, content);
ALTER TABLE aidb_memory.memory ALTER COLUMN lexemes SET NOT NULL;

-- Each lexeme keyed by its actor ("<actor_key>:<lexeme>"): an index of these finds one actor's
-- memories with a word by reading that word's entries for that actor only, where an index on
-- (actor_key, lexemes) intersects them with all of the actor's memories (~4 ms for an actor with
-- 100,000; bench/README.md, (e)). sql/60_memories.sql defines the same function again (install
-- keeps only the functions sql/ defines); the index needs it before that runs.
CREATE FUNCTION aidb_memory.actor_lexemes(actor_key bigint, lexemes pg_catalog.tsvector)
RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
SELECT pg_catalog.array_agg(($1)::pg_catalog.text OPERATOR(pg_catalog.||) ':'
                            OPERATOR(pg_catalog.||) l.lexeme)
FROM pg_catalog.unnest(pg_catalog.tsvector_to_array($2)) AS l(lexeme)
$$;
-- The keyed lexemes are kept in a column (a BEFORE row trigger of sql/60_memories.sql writes it
-- from lexemes), not only as an index expression: a plan that tests them on an actor's rows (a
-- generic plan made before ANALYZE has seen the rows) then tests an array, where calling the
-- function on each row cost ~4 us a row.
ALTER TABLE aidb_memory.memory ADD COLUMN lexeme_keys text[];
-- backfill: each memory's keyed lexemes from its own key and lexemes
UPDATE aidb_memory.memory
SET lexeme_keys = COALESCE(aidb_memory.actor_lexemes(actor_key, lexemes), '{}');
ALTER TABLE aidb_memory.memory ALTER COLUMN lexeme_keys SET NOT NULL;
-- One actor's current memories holding a lexeme (search's candidates). The key is a column too:
-- with the statement's "actor_key = $k" answered by this index, the planner does not AND it with
-- a btree scan of all the actor's memories (~6 ms for 100,000).
CREATE INDEX memory_lexemes_idx ON aidb_memory.memory
    USING gin (actor_key, lexeme_keys) WHERE valid_to IS NULL;

-- How many of each actor's current memories hold each lexeme, and (lexeme '', which no tsvector
-- holds) how many current memories the actor has: BM25's statistics, read by search with one
-- primary-key probe a word. Row triggers keep it (sql/60_memories.sql) as memories are written,
-- closed, re-indexed and erased; a count that reaches 0 is deleted with its row, so that erasure
-- leaves no word behind. Writers of one actor already take the actor's lock (reconciliation), so
-- keeping these counts makes none of them wait on another.
CREATE TABLE aidb_memory.memory_lexeme (
    actor_key    bigint NOT NULL,
    namespace_id bigint NOT NULL REFERENCES aidb_memory.namespace (id) ON DELETE CASCADE,
    actor_id     text NOT NULL,
    lexeme       text NOT NULL,
    memories     integer NOT NULL CHECK (memories > 0),
    PRIMARY KEY (actor_key, namespace_id, actor_id, lexeme)
);
INSERT INTO aidb_memory.memory_lexeme (actor_key, namespace_id, actor_id, lexeme, memories)
SELECT m.actor_key, m.namespace_id, m.actor_id, l.lexeme, pg_catalog.count(*)
FROM aidb_memory.memory AS m
CROSS JOIN LATERAL pg_catalog.unnest(
    pg_catalog.array_append(pg_catalog.tsvector_to_array(m.lexemes), '')) AS l(lexeme)
WHERE m.valid_to IS NULL
GROUP BY m.actor_key, m.namespace_id, m.actor_id, l.lexeme;
