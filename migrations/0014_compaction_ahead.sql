-- Compaction ahead of reads (issue 13): the worker writes a session's next summary before a read
-- needs it, so that the read stays a plain read and no caller waits for a model.
--
-- The task is a row of the event queue, of its own kind, so that it has the queue's claim, lease,
-- backoff and max_attempts. It names its session by id (session_ref, no foreign key: a deleted
-- session's task is dropped by the worker without a model call) and carries the read budget it
-- compacts for. At most one task per session is pending (accepted or processing): add inserts
-- one with ON CONFLICT DO NOTHING on the partial unique index.
ALTER TABLE aidb_memory.event
    ADD COLUMN kind text NOT NULL DEFAULT 'extraction',
    ADD COLUMN session_ref bigint,
    ADD COLUMN budget int,
    ADD CONSTRAINT event_kind_check CHECK (kind IN ('extraction', 'compaction')),
    ADD CONSTRAINT event_compaction_task_check
        CHECK (kind <> 'compaction' OR (session_ref IS NOT NULL AND budget > 0));
CREATE UNIQUE INDEX event_compaction_pending_idx ON aidb_memory.event (session_ref)
    WHERE kind = 'compaction' AND status IN ('accepted', 'processing');

-- What add reads to decide, in the statement that locks the session, whether a task is due: the
-- session's total_chars past which its unsummarized history passes the ahead threshold of the
-- budget its reads use (ahead_at), and that budget (read_budget). Written only by whoever holds
-- the session's compaction lock row (a compacting read, the worker's task), with an upsert: the
-- read path never writes the session row, which add locks. A table of its own rather than
-- columns of compaction_lock: that row is locked FOR UPDATE by every compaction and by
-- session_pop, and a row updated after a REPEATABLE READ transaction's snapshot cannot be locked
-- by it (40001); the lock row stays never updated, and a failed upsert here is only logged.
-- No foreign key to session, for the reason compaction_lock has none (a deletion would wait for
-- a compaction that waits for the session row); the trigger of sql/35_locks.sql removes the rows
-- of deleted sessions. A bare pair of numbers per session: no content, no identifiers.
CREATE TABLE aidb_memory.compaction_ahead (
    session_ref bigint PRIMARY KEY,
    read_budget int NOT NULL CHECK (read_budget > 0),
    ahead_at    bigint NOT NULL
);
