-- The cool-down after a failed compaction call (issue 13, item 3): one row per (session, model)
-- whose last compaction call failed, with when. A compaction of that session that would call
-- that model within the namespace's compaction_cooldown_s of failed_at returns
-- compaction_call_failed at once instead of paying for (and waiting on) another failing call; a
-- successful compaction of the session removes its rows.
-- Like compaction_lock: no role has any privilege on it, and no foreign key to session (a
-- deletion must never wait for a compaction that wrote a row here); the trigger that removes the
-- lock rows of deleted sessions (sql/35_locks.sql) removes these too.
CREATE TABLE aidb_memory.compaction_failure (
    session_ref bigint NOT NULL,
    model_name  text NOT NULL,
    failed_at   timestamptz NOT NULL,
    PRIMARY KEY (session_ref, model_name)
);
