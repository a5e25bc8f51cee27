-- Locks that only our code can take (issue 9, class 5). Advisory locks live in one space that any
-- role with CONNECT can take keys in, so a foreign session could hold ours without limit and stall
-- the worker, forget, delete and session_pop, or make every compaction report compaction_busy.
-- These are row locks on tables no API role has any privilege on: only our functions lock them.

-- One row per (namespace, actor) that has had its memories changed: reconciliation, delete and
-- forget lock it FOR UPDATE (waiting) for the rest of their transaction. Created on first use;
-- forget deletes its actor's row, namespace_drop takes the namespace's with it.
CREATE TABLE aidb_memory.actor_lock (
    namespace_id bigint NOT NULL REFERENCES aidb_memory.namespace (id) ON DELETE CASCADE,
    actor_id     text NOT NULL,
    PRIMARY KEY (namespace_id, actor_id)
);

-- One row per session, created with it: a compacting read locks it FOR UPDATE SKIP LOCKED (never
-- waiting: compaction_busy), session_pop FOR UPDATE (waiting) before it locks the session row.
-- Deliberately no foreign key to session: deleting a session would then wait for this row while
-- holding the session row, and the compaction holding this row waits for that session row
-- (FOR KEY SHARE, the summary's foreign key): a deadlock. A trigger (sql/35_locks.sql) removes
-- the rows of deleted sessions, skipping one a compaction holds at that moment.
CREATE TABLE aidb_memory.compaction_lock (
    session_ref bigint PRIMARY KEY
);
INSERT INTO aidb_memory.compaction_lock (session_ref) SELECT id FROM aidb_memory.session;
