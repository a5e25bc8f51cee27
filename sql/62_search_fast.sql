-- The block the wrapper of aidb_memory.search runs before its PL/Python body
-- (codebundle.FAST_SUFFIX). search has no common case without Python yet; the block only keeps a
-- REPEATABLE READ caller's snapshot on Citus (sql/30_sessions.sql, citus_read_snapshot), where
-- install --citus runs search's reads without a transaction block on the worker: the
-- subtransaction of each of PL/Python's statements would otherwise make Citus open one (BEGIN,
-- SAVEPOINTs, RELEASEs, COMMIT: 8 remote commands for search's 2 statements; bench/README.md,
-- issue 37). It falls through, having read and written nothing.
CREATE OR REPLACE FUNCTION aidb_memory.search_fast(
    namespace text,
    actor_id text,
    query text,
    "limit" integer DEFAULT 10,
    session_id text DEFAULT NULL,
    agent_id text DEFAULT NULL,
    query_embedding double precision[] DEFAULT NULL,
    filter jsonb DEFAULT NULL,
    "offset" integer DEFAULT 0
)
RETURNS SETOF aidb_memory.search_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
BEGIN
    @citus_read_snapshot@
    RETURN;
END
$$;
COMMENT ON FUNCTION aidb_memory.search_fast(
    text, text, text, integer, text, text, double precision[], jsonb, integer) IS
'Internal: the block the wrapper of aidb_memory.search runs before its PL/Python body: on Citus, '
'a REPEATABLE READ caller''s reads keep the transaction''s snapshot on the worker; no rows.';
