-- Embedding tasks (issue 26): a memory written directly (aidb_memory.remember) is stored at once,
-- without its vector, and the worker adds the vector when the namespace has an embedding model:
-- the call never waits for a model. A task is a row of the event queue of its own kind (as
-- compaction tasks are, 0014), naming only its actor: the worker embeds that actor's current
-- memories that have no vector yet. At most one task per actor waits to be claimed; a write while
-- the worker works on one queues the next, so no memory is left without its vector.
ALTER TABLE aidb_memory.event DROP CONSTRAINT event_kind_check;
ALTER TABLE aidb_memory.event
    ADD CONSTRAINT event_kind_check CHECK (kind IN ('extraction', 'compaction', 'embedding'));
CREATE UNIQUE INDEX event_embedding_pending_idx
    ON aidb_memory.event (actor_key, namespace_id, actor_id)
    WHERE kind = 'embedding' AND status = 'accepted';
