-- Locks that only our code can take (migration 0007_locks): the compaction lock row of a session
-- goes with the session, and so do its compaction cool-downs (migration 0012_compaction_cooldown).
-- A row trigger that keeps to its row's key (issue 15): each deletion is of the deleted session's
-- own rows, by (actor_key, id), which a distributed PostgreSQL (Citus) runs on that session's
-- shard (docs/scaling.md, "Triggers"). A statement trigger with a transition table would write
-- other actors' rows (namespace_drop); per row, a deletion of many sessions pays ~25 us more per
-- session.
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
    WHERE l.actor_key = OLD.actor_key
      AND l.session_ref IN (SELECT c.session_ref
                            FROM aidb_memory.compaction_lock AS c
                            WHERE c.actor_key = OLD.actor_key AND c.session_ref = OLD.id
                            FOR UPDATE OF c SKIP LOCKED);
    -- Its compaction cool-downs (compaction_failure) too, skipping, for the same reason, a row
    -- that a failing compaction is writing at that moment.
    DELETE FROM aidb_memory.compaction_failure AS f
    WHERE f.actor_key = OLD.actor_key
      AND (f.session_ref, f.model_name) IN (SELECT c.session_ref, c.model_name
                                            FROM aidb_memory.compaction_failure AS c
                                            WHERE c.actor_key = OLD.actor_key
                                              AND c.session_ref = OLD.id
                                            FOR UPDATE OF c SKIP LOCKED);
    -- The same for what compaction ahead of reads recorded (migration 0014_compaction_ahead).
    DELETE FROM aidb_memory.compaction_ahead AS a
    WHERE a.actor_key = OLD.actor_key
      AND a.session_ref IN (SELECT c.session_ref
                            FROM aidb_memory.compaction_ahead AS c
                            WHERE c.actor_key = OLD.actor_key AND c.session_ref = OLD.id
                            FOR UPDATE OF c SKIP LOCKED);
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION aidb_memory.compaction_locks_removed() IS
'Trigger (internal): removes the compaction lock rows (compaction_lock), cool-downs '
'(compaction_failure) and compaction-ahead thresholds (compaction_ahead) of deleted sessions.';

CREATE OR REPLACE TRIGGER compaction_locks_removed AFTER DELETE ON aidb_memory.session
    FOR EACH ROW EXECUTE FUNCTION aidb_memory.compaction_locks_removed();
