-- The indexes that serve a reference (foreign keys to events and to the superseding memory) hold
-- only the rows that have one. Most memories have none (remember has no event; a memory is
-- superseded at most once), so a write skips these indexes, and, more to the point, the planner
-- can no longer take them for a scan of one actor's memories: on a table ANALYZE has not seen yet
-- (a new install, an actor's first thousands of memories) every index that leads with actor_key
-- costed the same as the primary key, and remember's exact-duplicate probe and the foreign key
-- check of its history row read all of the actor's entries of whichever came first (measured:
-- ~0.17 us more per call for every memory the actor has). An equality on the column implies it is
-- not NULL, so the foreign keys' checks and actions still use them.
DROP INDEX aidb_memory.memory_event_idx;
CREATE INDEX memory_event_idx ON aidb_memory.memory (actor_key, source_event)
    WHERE source_event IS NOT NULL;
DROP INDEX aidb_memory.memory_superseded_idx;
CREATE INDEX memory_superseded_idx ON aidb_memory.memory (actor_key, superseded_by)
    WHERE superseded_by IS NOT NULL;
DROP INDEX aidb_memory.memory_history_event_idx;
CREATE INDEX memory_history_event_idx ON aidb_memory.memory_history (actor_key, event_id)
    WHERE event_id IS NOT NULL;
