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
-- budget its reads use (ahead_at), and that budget (read_budget). They live on the session's
-- compaction lock row because only the holders of that row write them (a compacting read, the
-- worker's task): the read path never writes the session row, which add locks.
ALTER TABLE aidb_memory.compaction_lock
    ADD COLUMN read_budget int,
    ADD COLUMN ahead_at bigint;
