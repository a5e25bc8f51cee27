-- TRANSITION (issue 15 work in progress; removed before merge): fills actor_key on inserts that
-- do not pass it yet.
CREATE OR REPLACE FUNCTION aidb_memory.transition_fill_key() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
BEGIN
    IF NEW.actor_key IS NULL THEN
        IF TG_TABLE_NAME IN ('session', 'event', 'memory', 'memory_word', 'memory_history',
                             'actor_lock') THEN
            NEW.actor_key := aidb_memory.actor_key(
                (SELECT n.name FROM aidb_memory.namespace AS n WHERE n.id = NEW.namespace_id),
                NEW.actor_id);
        ELSE
            SELECT s.actor_key INTO NEW.actor_key FROM aidb_memory.session AS s
            WHERE s.id = NEW.session_ref;
        END IF;
    END IF;
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION aidb_memory.transition_fill_key() IS 'transition (issue 15 work in progress)';
CREATE OR REPLACE TRIGGER a_transition BEFORE INSERT ON aidb_memory.session FOR EACH ROW EXECUTE FUNCTION aidb_memory.transition_fill_key();
CREATE OR REPLACE TRIGGER a_transition BEFORE INSERT ON aidb_memory.event FOR EACH ROW EXECUTE FUNCTION aidb_memory.transition_fill_key();
CREATE OR REPLACE TRIGGER a_transition BEFORE INSERT ON aidb_memory.memory FOR EACH ROW EXECUTE FUNCTION aidb_memory.transition_fill_key();
CREATE OR REPLACE TRIGGER a_transition BEFORE INSERT ON aidb_memory.memory_word FOR EACH ROW EXECUTE FUNCTION aidb_memory.transition_fill_key();
CREATE OR REPLACE TRIGGER a_transition BEFORE INSERT ON aidb_memory.memory_history FOR EACH ROW EXECUTE FUNCTION aidb_memory.transition_fill_key();
CREATE OR REPLACE TRIGGER a_transition BEFORE INSERT ON aidb_memory.actor_lock FOR EACH ROW EXECUTE FUNCTION aidb_memory.transition_fill_key();
CREATE OR REPLACE TRIGGER a_transition BEFORE INSERT ON aidb_memory.turn FOR EACH ROW EXECUTE FUNCTION aidb_memory.transition_fill_key();
CREATE OR REPLACE TRIGGER a_transition BEFORE INSERT ON aidb_memory.summary FOR EACH ROW EXECUTE FUNCTION aidb_memory.transition_fill_key();
CREATE OR REPLACE TRIGGER a_transition BEFORE INSERT ON aidb_memory.compaction_lock FOR EACH ROW EXECUTE FUNCTION aidb_memory.transition_fill_key();
CREATE OR REPLACE TRIGGER a_transition BEFORE INSERT ON aidb_memory.compaction_failure FOR EACH ROW EXECUTE FUNCTION aidb_memory.transition_fill_key();
CREATE OR REPLACE TRIGGER a_transition BEFORE INSERT ON aidb_memory.compaction_ahead FOR EACH ROW EXECUTE FUNCTION aidb_memory.transition_fill_key();
