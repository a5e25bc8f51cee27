-- No parallel scans of the tables the API reads (issue 33). Every statement of the API reads one
-- actor's rows, bounded by a budget, a limit or a key, or one row of a small catalog table: tens
-- of rows, well under a millisecond. session_get and session_messages run generic plans
-- (plan_cache_mode = force_generic_plan), whose row counts come from the table's statistics
-- rather than the call's values: after an ANALYZE that saw one long session, the read
-- statement's generic plan estimated ~6,000 turns and became a Parallel Bitmap Heap Scan under a
-- Gather Merge. Starting its two workers cost ~7 ms a call, ten times the read (make bench (b)
-- and (c): 135 reads/s instead of 1,500, until the next ANALYZE changed the estimate). A worker
-- is never worth starting for such a read, so the tables say so themselves: parallel_workers = 0
-- leaves the planner no partial path of them, in every statement and under any statistics, at
-- no cost per call. Not model_usage and audit_log: only admins read them, in aggregate.
ALTER TABLE aidb_memory.session SET (parallel_workers = 0);
ALTER TABLE aidb_memory.event SET (parallel_workers = 0);
ALTER TABLE aidb_memory.turn SET (parallel_workers = 0);
ALTER TABLE aidb_memory.summary SET (parallel_workers = 0);
ALTER TABLE aidb_memory.memory SET (parallel_workers = 0);
ALTER TABLE aidb_memory.memory_word SET (parallel_workers = 0);
ALTER TABLE aidb_memory.memory_lexeme SET (parallel_workers = 0);
ALTER TABLE aidb_memory.memory_history SET (parallel_workers = 0);
ALTER TABLE aidb_memory.actor_lock SET (parallel_workers = 0);
ALTER TABLE aidb_memory.compaction_lock SET (parallel_workers = 0);
ALTER TABLE aidb_memory.compaction_failure SET (parallel_workers = 0);
ALTER TABLE aidb_memory.compaction_ahead SET (parallel_workers = 0);
ALTER TABLE aidb_memory.namespace SET (parallel_workers = 0);
ALTER TABLE aidb_memory.model SET (parallel_workers = 0);
ALTER TABLE aidb_memory.secret SET (parallel_workers = 0);
ALTER TABLE aidb_memory.audit_key SET (parallel_workers = 0);
ALTER TABLE aidb_memory.runtime_settings SET (parallel_workers = 0);
ALTER TABLE aidb_memory.runtime_modules SET (parallel_workers = 0);
ALTER TABLE aidb_memory.runtime_bytecode SET (parallel_workers = 0);
