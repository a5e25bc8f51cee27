-- Locks that only our code can take (migration 0007_locks): the compaction lock row of a session
-- goes with the session, and so do its compaction cool-downs (migration 0012_compaction_cooldown).
-- A statement trigger, so that forget or namespace_drop costs one statement however many sessions
-- go. Each row is found by the deleted session's own key (actor_key, id): on session_delete and
-- forget, the one actor's rows (issue 15).
CREATE OR REPLACE FUNCTION aidb_memory.compaction_locks_removed()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
BEGIN
    -- SKIP LOCKED: never wait here for a compaction in flight, which waits for the session row
    -- this deletion holds (a deadlock). Such a row stays behind: a bare number, no content.
    DELETE FROM aidb_memory.compaction_lock AS l
    WHERE (l.actor_key, l.session_ref) IN (
        SELECT c.actor_key, c.session_ref
        FROM aidb_memory.compaction_lock AS c
        JOIN removed AS r ON r.actor_key = c.actor_key AND r.id = c.session_ref
        FOR UPDATE OF c SKIP LOCKED);
    -- Their compaction cool-downs (compaction_failure) too, skipping, for the same reason, a row
    -- that a failing compaction is writing at that moment.
    DELETE FROM aidb_memory.compaction_failure AS f
    WHERE (f.actor_key, f.session_ref, f.model_name) IN (
        SELECT c.actor_key, c.session_ref, c.model_name
        FROM aidb_memory.compaction_failure AS c
        JOIN removed AS r ON r.actor_key = c.actor_key AND r.id = c.session_ref
        FOR UPDATE OF c SKIP LOCKED);
    -- The same for what compaction ahead of reads recorded (migration 0014_compaction_ahead).
    DELETE FROM aidb_memory.compaction_ahead AS a
    WHERE (a.actor_key, a.session_ref) IN (
        SELECT c.actor_key, c.session_ref
        FROM aidb_memory.compaction_ahead AS c
        JOIN removed AS r ON r.actor_key = c.actor_key AND r.id = c.session_ref
        FOR UPDATE OF c SKIP LOCKED);
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION aidb_memory.compaction_locks_removed() IS
'Trigger (internal): removes the compaction lock rows (compaction_lock), cool-downs '
'(compaction_failure) and compaction-ahead thresholds (compaction_ahead) of deleted sessions.';

CREATE OR REPLACE TRIGGER compaction_locks_removed AFTER DELETE ON aidb_memory.session
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT
    EXECUTE FUNCTION aidb_memory.compaction_locks_removed();
