-- Metrics (issue 36): the counters that aidb_memory.metrics() (sql/72_metrics.sql) reads, so that a
-- scrape every 15 s costs a few small tables rather than an aggregate over every event and every
-- model call (1,000,000 of each: the aggregates took seconds).
--
-- Each counter is bumped in the transaction that makes what it counts (an event's outcome, a
-- model_usage row, a summary), never on add or a read's hot path. A row is one label set and one
-- slot: the writing backend's pid modulo 8 (plpython/aidb_memory_server/metrics.py), so that
-- workers finishing events at once rarely wait on one row; metrics() sums the slots. A namespace
-- is kept by id without a foreign key: a counter outlives its namespace (metrics() counts a
-- dropped one's under "_other", so that a sum over namespaces never goes down), and
-- namespace_drop has no counter rows to cascade to. 0 is no namespace (a model call of none, e.g.
-- model_check): namespace ids start at 1. No actor and no content, ever.
--
-- Not seeded from existing rows: the counters count from this upgrade on. Prometheus reads
-- counters as rates (a counter starting at 0 is a series starting), and a seed would aggregate
-- the whole of event and model_usage inside the upgrade's transaction for a figure nobody reads.
CREATE TABLE aidb_memory.metric_event (
    kind         text NOT NULL,
    outcome      text NOT NULL CHECK (outcome IN ('processed', 'skipped', 'failed', 'retry')),
    namespace_id bigint NOT NULL,
    slot         smallint NOT NULL,
    events       bigint NOT NULL,
    PRIMARY KEY (kind, outcome, namespace_id, slot)
);

-- Model calls, in two tables that a call bumps together: how many calls per model, purpose,
-- outcome, namespace and slot (a narrow row: with many namespaces they are tens of thousands,
-- which a scrape sums); and per model, purpose and slot their tokens (NULL counts 0), the sum of
-- their latency_ms and how many fell in each bucket of the duration histogram: buckets[i] counts
-- the calls of at most BUCKETS_S[i] seconds and more than BUCKETS_S[i-1] (metrics.py; 11
-- entries, the last one the calls over 120 s). metrics() makes them cumulative.
CREATE TABLE aidb_memory.metric_model_call (
    model_name   text NOT NULL,
    purpose      text NOT NULL,
    outcome      text NOT NULL,
    namespace_id bigint NOT NULL,
    slot         smallint NOT NULL,
    calls        bigint NOT NULL,
    PRIMARY KEY (model_name, purpose, outcome, namespace_id, slot)
);
CREATE TABLE aidb_memory.metric_model_latency (
    model_name   text NOT NULL,
    purpose      text NOT NULL,
    slot         smallint NOT NULL,
    calls        bigint NOT NULL,
    tokens_in    bigint NOT NULL,
    tokens_out   bigint NOT NULL,
    duration_ms  bigint NOT NULL,
    buckets      bigint[] NOT NULL CHECK (pg_catalog.cardinality(buckets) = 11),
    PRIMARY KEY (model_name, purpose, slot)
);

-- Summaries written: by the worker's compaction task (ahead of reads) or inline by a read.
CREATE TABLE aidb_memory.metric_compaction (
    mode         text NOT NULL CHECK (mode IN ('ahead', 'inline')),
    namespace_id bigint NOT NULL,
    slot         smallint NOT NULL,
    summaries    bigint NOT NULL,
    PRIMARY KEY (mode, namespace_id, slot)
);

-- When a process_events call last finished (any worker, pg_cron too): one row, always there.
CREATE TABLE aidb_memory.metric_worker (
    id            boolean PRIMARY KEY DEFAULT true CHECK (id),
    last_batch_at timestamptz
);
INSERT INTO aidb_memory.metric_worker (id) VALUES (true);

-- The queue gauges read the pending events through event_queue_idx (few in a healthy system);
-- failed events stay until retried or forgotten and may be many: counted by kind from this
-- index alone (an index-only scan). add never writes it (its events are accepted).
CREATE INDEX event_failed_idx ON aidb_memory.event (kind) WHERE status = 'failed';

-- As 0020 says for every table an API call reads (the worker and reads write these).
ALTER TABLE aidb_memory.metric_event SET (parallel_workers = 0);
ALTER TABLE aidb_memory.metric_model_call SET (parallel_workers = 0);
ALTER TABLE aidb_memory.metric_model_latency SET (parallel_workers = 0);
ALTER TABLE aidb_memory.metric_compaction SET (parallel_workers = 0);
ALTER TABLE aidb_memory.metric_worker SET (parallel_workers = 0);
