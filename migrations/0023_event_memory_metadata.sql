-- The metadata an add gives the memories the worker makes of its turns (issue 34, mem0's
-- add(metadata=)): kept on the event until the worker copies it onto each memory. NULL: none
-- (the memories get {}); existing events have none.
ALTER TABLE aidb_memory.event ADD COLUMN memory_metadata jsonb;
