-- Expiry (issue 34): a memory may carry the time it expires (remember's expires_at, or a time to
-- live: remember's ttl_s, or the namespace's config.memory_ttl_s). An expired memory is invisible
-- to every read from that moment, before any sweep; the worker deletes expired memories in bounded
-- batches (expire_memories). ttl_s is kept so that a read that refreshes (get_memory's
-- refresh_ttl, LangGraph's refresh_on_read) can push expires_at as far again; NULL: a fixed time
-- or none. Memories written before have neither (NULL: never).
ALTER TABLE aidb_memory.memory ADD COLUMN expires_at timestamptz;
ALTER TABLE aidb_memory.memory ADD COLUMN ttl_s integer;
-- The sweep finds the expired memories of every actor, soonest first: it spans actors, and is
-- the worker's alone (memories with no expiry are not in the index).
CREATE INDEX memory_expires_idx ON aidb_memory.memory (expires_at) WHERE expires_at IS NOT NULL;

-- list_memories, get_memory, update_memory and search return when the memory expires (NULL:
-- never).
ALTER TYPE aidb_memory.list_memories_result ADD ATTRIBUTE expires_at timestamptz;
ALTER TYPE aidb_memory.search_result ADD ATTRIBUTE expires_at timestamptz;
