-- remember's duplicate lookup (one current keyless memory per text) and a put's lookup of its key
-- probe these unique indexes. Led by the actor's key, they looked no better to a generic plan
-- (which costs an actor at the average actor's few rows) than memory_actor_idx, also led by the
-- key and cheaper to scan, and the lookup read the actor's every memory on it: remember grew with
-- the actor (0.3 ms at 1,500 memories, bench row (n)). Led by the hash and by the key name, and
-- with the lookups testing the namespace and actor on the row found (no index key), the probe is
-- the cheapest plan whatever the estimate (as memory_public_id_key, migration 0024).
DROP INDEX aidb_memory.memory_current_hash_idx;
CREATE UNIQUE INDEX memory_current_hash_idx
    ON aidb_memory.memory (content_hash, actor_key, namespace_id, actor_id)
    WHERE valid_to IS NULL AND key IS NULL;
DROP INDEX aidb_memory.memory_key_idx;
CREATE UNIQUE INDEX memory_key_idx
    ON aidb_memory.memory (key, actor_key, namespace_id, actor_id)
    WHERE valid_to IS NULL AND key IS NOT NULL;
