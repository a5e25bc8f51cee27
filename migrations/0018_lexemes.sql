-- Search ranks by stemmed words (issue 24): memory.lexemes holds each memory's words as the
-- namespace's text search configuration (config.text_search_config, english by default) reduces
-- them, stop words left out, for the BM25 ranking of aidb_memory.search. It is written with the
-- memory (reconciliation), and again for every memory of a namespace whose configuration changes
-- (namespace_update). memory.tsv (the words as written, 'simple') stays: the vocabulary of
-- memory_word, where misspelled query words find their nearest words, is built from it.
-- Until now no namespace could name a configuration: every memory is in english.
ALTER TABLE aidb_memory.memory ADD COLUMN lexemes pg_catalog.tsvector;
UPDATE aidb_memory.memory
SET lexemes = pg_catalog.to_tsvector('pg_catalog.english'::pg_catalog.regconfig, content);
ALTER TABLE aidb_memory.memory ALTER COLUMN lexemes SET NOT NULL;
-- One actor's current memories with a word (the candidates and the word counts of a search).
CREATE INDEX memory_lexemes_idx ON aidb_memory.memory USING gin (actor_key, lexemes)
    WHERE valid_to IS NULL;
