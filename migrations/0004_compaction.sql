-- Compaction (SPEC §3): a summary records the char offsets of the range it covers, so that a
-- budgeted read can account for the history a summary stands in for without reading its turns.
-- Summaries always start where the previous one ended; the unique index makes a second summary
-- of the same range (two compactions racing under REPEATABLE READ) fail instead of doubling up.

ALTER TABLE aidb_memory.summary
    ADD COLUMN from_offset bigint NOT NULL DEFAULT 0,
    ADD COLUMN to_offset bigint NOT NULL DEFAULT 0;
ALTER TABLE aidb_memory.summary
    ALTER COLUMN from_offset DROP DEFAULT,
    ALTER COLUMN to_offset DROP DEFAULT,
    ADD CHECK (from_offset <= to_offset),
    ADD CHECK (chars > 0);

CREATE UNIQUE INDEX summary_start_idx ON aidb_memory.summary (session_ref, from_seq);
