-- Metrics (issue 36): what an operator's Prometheus scrapes, as rows, for the worker's exporter
-- and for postgres_exporter (docs/monitoring/). Totals come from the counters of migration
-- 0031_metrics, bumped as events finish, model calls are recorded and summaries are written
-- (plpython/aidb_memory_server/metrics.py); the queue's depth and latency from its partial
-- indexes (event_queue_idx: the pending events, few in a healthy system; event_failed_idx). So a
-- scrape reads a few small tables, however many events and model calls the database holds.

CREATE OR REPLACE FUNCTION aidb_memory.metrics(max_namespaces integer DEFAULT 20)
RETURNS TABLE (metric text, labels jsonb, value double precision)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
#variable_conflict use_column
DECLARE
    _state text;
    _message text;
BEGIN
    IF max_namespaces IS NULL OR max_namespaces < 0 OR max_namespaces > 10000 THEN
        RAISE EXCEPTION 'aidb_memory.metrics: max_namespaces must be between 0 and 10000'
            USING ERRCODE = '22023',
                  HINT = 'the namespaces with the smallest ids get a label of their own, the '
                         'others share "_other"; 20 by default';
    END IF;
    BEGIN
        RETURN QUERY
        WITH named AS (
            -- The namespaces that get their own label; any other id (a dropped namespace's too)
            -- is "_other", 0 (a model call of no namespace) is "".
            SELECT n.id, n.name FROM aidb_memory.namespace AS n ORDER BY n.id LIMIT max_namespaces
        ),
        kinds (kind) AS (VALUES ('extraction'), ('compaction'), ('embedding')),
        statuses (status) AS (VALUES ('ready'), ('waiting'), ('processing'), ('failed')),
        -- `le` as Prometheus writes it, with its bucket in metric_model_call.buckets.
        bounds (i, le) AS (
            VALUES (1, '0.1'), (2, '0.25'), (3, '0.5'), (4, '1'), (5, '2.5'), (6, '5'), (7, '10'),
                   (8, '30'), (9, '60'), (10, '120'), (11, '+Inf')
        ),
        -- The oldest pending events by id (event_queue_idx), at most 5,000: every one of them
        -- in a healthy queue. Past 5,000 the rest is estimated from a sample: 1,000 ids evenly
        -- spread from the window's last to the newest pending event, looked up in the queue's
        -- index; each pending one stands for its share of the span, with its kind and status.
        -- So a scrape reads at most ~6,000 events however far behind the workers are.
        pending AS MATERIALIZED (
            -- spans actors: metrics, the queue's oldest pending events of every actor: admins
            -- and workers
            SELECT e.id, e.kind,
                   CASE WHEN e.status = 'processing' THEN 'processing'
                        WHEN e.next_attempt_at IS NULL OR e.next_attempt_at <= now() THEN 'ready'
                        ELSE 'waiting' END AS status,
                   e.created_at
            FROM aidb_memory.event AS e
            WHERE e.status IN ('accepted', 'processing')
            ORDER BY e.id
            LIMIT 5000
        ),
        span AS MATERIALIZED (
            SELECT w.last_id,
                   CASE WHEN w.n < 5000 THEN w.last_id ELSE (
                       -- spans actors: metrics, the newest pending event (event_queue_idx):
                       -- admins and workers
                       SELECT pg_catalog.max(e.id) FROM aidb_memory.event AS e
                       WHERE e.status IN ('accepted', 'processing')) END AS newest
            FROM (SELECT pg_catalog.count(*) AS n, pg_catalog.max(p.id) AS last_id
                  FROM pending AS p) AS w
        ),
        probes AS MATERIALIZED (
            SELECT DISTINCT sp.last_id + (g * (sp.newest - sp.last_id) + 999) / 1000 AS id
            FROM span AS sp CROSS JOIN pg_catalog.generate_series(1, 1000) AS g
            WHERE sp.newest > sp.last_id
        ),
        sampled AS (
            -- spans actors: metrics, pending events at sampled ids (event_queue_idx): admins
            -- and workers
            SELECT e.kind,
                   CASE WHEN e.status = 'processing' THEN 'processing'
                        WHEN e.next_attempt_at IS NULL OR e.next_attempt_at <= now() THEN 'ready'
                        ELSE 'waiting' END AS status
            FROM aidb_memory.event AS e
            WHERE e.status IN ('accepted', 'processing')
              AND e.id = ANY (ARRAY(SELECT pr.id FROM probes AS pr))
        ),
        queue AS (
            SELECT x.kind, x.status, pg_catalog.sum(x.n) AS n
            FROM (
                SELECT p.kind, p.status, pg_catalog.count(*)::float8 AS n
                FROM pending AS p
                GROUP BY p.kind, p.status
                UNION ALL
                SELECT s.kind, s.status, pg_catalog.round(
                    pg_catalog.count(*)::float8 * (sp.newest - sp.last_id)
                    / (SELECT pg_catalog.count(*) FROM probes))
                FROM sampled AS s CROSS JOIN span AS sp
                GROUP BY s.kind, s.status, sp.newest, sp.last_id
                UNION ALL
                -- spans actors: metrics, the failed events of every actor (event_failed_idx),
                -- by kind: admins and workers
                SELECT e.kind, 'failed', pg_catalog.count(*)::float8
                FROM aidb_memory.event AS e
                WHERE e.status = 'failed'
                GROUP BY 1
            ) AS x
            GROUP BY x.kind, x.status
        ),
        -- The oldest ready event of each kind: in the window if it holds one of the kind, else
        -- (only past 5,000 pending events) found through the kind's own pending index
        -- (compaction, embedding) or the queue's.
        oldest (kind, created_at) AS (
            SELECT k.kind, COALESCE(
                (SELECT pg_catalog.min(p.created_at) FROM pending AS p
                 WHERE p.kind = k.kind AND p.status = 'ready'),
                CASE WHEN (SELECT sp.newest > sp.last_id FROM span AS sp) THEN
                    CASE k.kind
                        -- spans actors: metrics, the oldest ready event of a kind: admins and
                        -- workers
                        WHEN 'compaction' THEN (
                            SELECT e.created_at FROM aidb_memory.event AS e
                            WHERE e.kind = 'compaction' AND e.status = 'accepted'
                              AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= now())
                            ORDER BY e.id LIMIT 1)
                        WHEN 'embedding' THEN (
                            SELECT e.created_at FROM aidb_memory.event AS e
                            WHERE e.kind = 'embedding' AND e.status = 'accepted'
                              AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= now())
                            ORDER BY e.id LIMIT 1)
                        ELSE (
                            SELECT e.created_at FROM aidb_memory.event AS e
                            WHERE e.kind = 'extraction' AND e.status = 'accepted'
                              AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= now())
                            ORDER BY e.id LIMIT 1)
                    END
                END)
            FROM kinds AS k
        ),
        events AS (
            SELECT CASE x.outcome WHEN 'failed' THEN 'aidb_memory_events_failed_total'
                                  WHEN 'retry' THEN 'aidb_memory_events_retried_total'
                                  ELSE 'aidb_memory_events_processed_total' END AS m,
                   x.kind, COALESCE(named.name, '_other') AS namespace, x.events
            FROM aidb_memory.metric_event AS x
            LEFT JOIN named ON named.id = x.namespace_id
        ),
        -- The model calls by label set: the slots and the namespaces past the cap summed (a
        -- row per slot of each label set: tens of thousands with many namespaces).
        calls AS (
            SELECT c.model_name, c.purpose, c.outcome,
                   CASE WHEN c.namespace_id = 0 THEN ''
                        ELSE COALESCE(named.name, '_other') END AS namespace,
                   c.calls
            FROM aidb_memory.metric_model_call AS c
            LEFT JOIN named ON named.id = c.namespace_id
        ),
        -- Their latency and tokens by model and purpose (a row per slot).
        latency AS (
            SELECT t.model_name, t.purpose, pg_catalog.sum(t.calls) AS calls,
                   pg_catalog.sum(t.tokens_in) AS tokens_in,
                   pg_catalog.sum(t.tokens_out) AS tokens_out,
                   pg_catalog.sum(t.duration_ms) AS duration_ms,
                   ARRAY[pg_catalog.sum(t.buckets[1]), pg_catalog.sum(t.buckets[2]),
                         pg_catalog.sum(t.buckets[3]), pg_catalog.sum(t.buckets[4]),
                         pg_catalog.sum(t.buckets[5]), pg_catalog.sum(t.buckets[6]),
                         pg_catalog.sum(t.buckets[7]), pg_catalog.sum(t.buckets[8]),
                         pg_catalog.sum(t.buckets[9]), pg_catalog.sum(t.buckets[10]),
                         pg_catalog.sum(t.buckets[11])] AS buckets
            FROM aidb_memory.metric_model_latency AS t
            GROUP BY t.model_name, t.purpose
        ),
        samples (m, l, v, o) AS (
            SELECT 'aidb_memory_queue_events',
                   pg_catalog.jsonb_build_object('kind', k.kind, 'status', s.status),
                   COALESCE(q.n, 0)::float8, 0
            FROM kinds AS k CROSS JOIN statuses AS s
            LEFT JOIN queue AS q ON q.kind = k.kind AND q.status = s.status
            UNION ALL
            SELECT 'aidb_memory_queue_latency_seconds',
                   pg_catalog.jsonb_build_object('kind', o.kind),
                   COALESCE(GREATEST(
                       pg_catalog.date_part('epoch', now() - o.created_at), 0), 0)::float8, 0
            FROM oldest AS o
            UNION ALL
            SELECT 'aidb_memory_queue_events_estimated', '{}'::jsonb,
                   CASE WHEN sp.newest > sp.last_id THEN 1 ELSE 0 END::float8, 0
            FROM span AS sp
            UNION ALL
            SELECT x.m, pg_catalog.jsonb_build_object('kind', x.kind, 'namespace', x.namespace),
                   pg_catalog.sum(x.events::float8), 0
            FROM events AS x
            GROUP BY x.m, x.kind, x.namespace
            UNION ALL
            SELECT 'aidb_memory_model_calls_total',
                   pg_catalog.jsonb_build_object('model', c.model_name, 'purpose', c.purpose,
                                                 'outcome', c.outcome, 'namespace', c.namespace),
                   pg_catalog.sum(c.calls::float8), 0
            FROM calls AS c
            GROUP BY c.model_name, c.purpose, c.outcome, c.namespace
            UNION ALL
            -- Cumulative: each bucket counts the calls of its bound and every lower one.
            SELECT 'aidb_memory_model_call_duration_seconds_bucket',
                   pg_catalog.jsonb_build_object('model', t.model_name, 'purpose', t.purpose,
                                                 'le', b.le),
                   (pg_catalog.sum(t.buckets[b.i]) OVER (
                        PARTITION BY t.model_name, t.purpose ORDER BY b.i))::float8,
                   b.i
            FROM latency AS t CROSS JOIN bounds AS b
            UNION ALL
            SELECT 'aidb_memory_model_call_duration_seconds_sum',
                   pg_catalog.jsonb_build_object('model', t.model_name, 'purpose', t.purpose),
                   t.duration_ms::float8 / 1000, 0
            FROM latency AS t
            UNION ALL
            SELECT 'aidb_memory_model_call_duration_seconds_count',
                   pg_catalog.jsonb_build_object('model', t.model_name, 'purpose', t.purpose),
                   t.calls::float8, 0
            FROM latency AS t
            UNION ALL
            SELECT 'aidb_memory_model_tokens_total',
                   pg_catalog.jsonb_build_object('model', t.model_name, 'direction', d.direction),
                   pg_catalog.sum(CASE d.direction WHEN 'in' THEN t.tokens_in
                                                   ELSE t.tokens_out END)::float8, 0
            FROM latency AS t CROSS JOIN (VALUES ('in'), ('out')) AS d (direction)
            GROUP BY t.model_name, d.direction
            UNION ALL
            SELECT 'aidb_memory_compactions_total',
                   pg_catalog.jsonb_build_object(
                       'mode', x.mode, 'namespace', COALESCE(named.name, '_other')),
                   pg_catalog.sum(x.summaries)::float8, 0
            FROM aidb_memory.metric_compaction AS x
            LEFT JOIN named ON named.id = x.namespace_id
            GROUP BY x.mode, COALESCE(named.name, '_other')
            UNION ALL
            SELECT 'aidb_memory_worker_last_batch_timestamp_seconds', '{}'::jsonb,
                   COALESCE(
                       (SELECT pg_catalog.date_part('epoch', w.last_batch_at)
                        FROM aidb_memory.metric_worker AS w), 0)::float8, 0
        )
        -- Ordered by metric (byte order, whatever the database's collation), then labels; a
        -- histogram's buckets by their bound.
        SELECT s.m, s.l, s.v FROM samples AS s ORDER BY s.m COLLATE "C", s.l - 'le', s.o;
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        -- An error of the query (a lock or statement timeout, a cancel): its SQLSTATE, one line
        -- naming this function, and no internal SQL (as the wrappers of codebundle.py do).
        GET STACKED DIAGNOSTICS _state = RETURNED_SQLSTATE, _message = MESSAGE_TEXT;
        RAISE EXCEPTION USING ERRCODE = _state, MESSAGE = 'aidb_memory.metrics: ' || _message;
    END;
END
$$;
COMMENT ON FUNCTION aidb_memory.metrics(integer) IS
'Admins and workers: the figures an operator''s Prometheus scrapes, one row per sample (metric: '
'the sample''s full name; labels: a flat object of strings; value), ordered by metric and labels: '
'aidb_memory_queue_events {kind, status: ready, waiting, processing, failed}, '
'aidb_memory_queue_events_estimated (1 when past 5,000 pending events the depth is estimated from '
'a sample of ids), aidb_memory_queue_latency_seconds {kind} (age of the oldest ready event), '
'aidb_memory_events_processed_total, _failed_total, _retried_total {kind, namespace}, '
'aidb_memory_model_calls_total {model, purpose, outcome, namespace}, '
'aidb_memory_model_call_duration_seconds (histogram: _bucket {model, purpose, le}, _sum, _count), '
'aidb_memory_model_tokens_total {model, direction: in, out}, '
'aidb_memory_compactions_total {mode: ahead, inline, namespace}, '
'aidb_memory_worker_last_batch_timestamp_seconds (0 if never). The max_namespaces namespaces with '
'the smallest ids get their own namespace label, every other one "_other" ("" for a model call '
'of no namespace); never an actor id nor content. Counters count from the install or upgrade '
'that added them. Cheap: small counter tables and the queue''s partial indexes (at most ~6,000 '
'pending events read). '
'Errors: 22023.';

-- What process_events reports of each event it handled (by_kind's "events"): its public id, kind
-- and namespace, never its actor or content. Read after the event's own transaction committed.
-- PL/pgSQL, not SQL: Citus cannot plan a statement of a SQL function that has parameters.
CREATE OR REPLACE FUNCTION aidb_memory.event_brief(actor_key bigint, event_id bigint)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
BEGIN
    RETURN (SELECT pg_catalog.jsonb_build_object('event', e.public_id::text, 'kind', e.kind,
                                                 'namespace', n.name)
            FROM aidb_memory.event AS e
            JOIN aidb_memory.namespace AS n ON n.id = e.namespace_id
            WHERE e.actor_key = $1 AND e.id = $2);
END
$$;
COMMENT ON FUNCTION aidb_memory.event_brief(bigint, bigint) IS
'Internal (process_events): an event''s public id, kind and namespace name (no actor, no '
'content), by its actor_key and internal id; NULL for an event that is gone.';

-- The last-batch gauge: the start of the caller's transaction, which in process_events is the
-- last one (after its last event's COMMIT, before the expiry sweep): now(), a STABLE function,
-- which Citus evaluates on the coordinator (it refuses a VOLATILE one in an UPDATE of a reference
-- table). Never earlier than what another worker wrote. No argument: a worker cannot put the
-- gauge in the future.
CREATE OR REPLACE FUNCTION aidb_memory.event_batch_finished()
RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
UPDATE aidb_memory.metric_worker AS w
SET last_batch_at = GREATEST(w.last_batch_at, pg_catalog.now())
$$;
COMMENT ON FUNCTION aidb_memory.event_batch_finished() IS
'Internal (process_events): records that a process_events call finished now (the gauge '
'aidb_memory_worker_last_batch_timestamp_seconds of aidb_memory.metrics).';
