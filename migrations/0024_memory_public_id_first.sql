-- A read of one memory by its public id (get_memory, update_memory, memory_history, a listing's
-- cursor) probes this unique index. With the actor's key first, the generic plan of such a read
-- (which counts on an average actor's few rows) took memory_actor_idx instead, which also leads
-- with the key and is smaller, and scanned the actor's every memory for the id (~80 ms for an
-- actor with 20,000 memories; bench row (m)). With the id first the probe is the cheapest plan
-- whatever the estimate. The key stays in it: a distributed table's unique index holds its
-- distribution column (docs/scaling.md).
ALTER TABLE aidb_memory.memory DROP CONSTRAINT memory_public_id_key;
ALTER TABLE aidb_memory.memory ADD CONSTRAINT memory_public_id_key UNIQUE (public_id, actor_key);
