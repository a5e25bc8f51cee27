-- The extraction worker (SPEC §5): a queue of events worked by any number of workers.

-- Until 0.x the claim had no max_attempts and took over a lapsed lease forever. Until issue 15
-- it returned the event's id alone, which the calls after it took: an event is now known by
-- (actor_key, id), its primary key, and a claim may be limited to a range of keys. Each function
-- granted to a role is two (codebundle.BODY_SUFFIX): the body <name>_py goes with it.
DROP FUNCTION IF EXISTS aidb_memory.event_claim(integer);
DROP FUNCTION IF EXISTS aidb_memory.event_claim(integer, integer);
DROP FUNCTION IF EXISTS aidb_memory.event_claim_py(integer, integer);
DROP FUNCTION IF EXISTS aidb_memory.event_process(bigint, integer, real);
DROP FUNCTION IF EXISTS aidb_memory.event_process_py(bigint, integer, real);
DROP FUNCTION IF EXISTS aidb_memory.event_error(bigint, integer, real, text);
DROP FUNCTION IF EXISTS aidb_memory.event_error_py(bigint, integer, real, text);
DROP FUNCTION IF EXISTS aidb_memory.event_interrupted(bigint, integer, real, text);
DROP FUNCTION IF EXISTS aidb_memory.event_interrupted_py(bigint, integer, real, text);

CREATE OR REPLACE FUNCTION aidb_memory.event_claim(
    lease_s integer,
    max_attempts integer,
    key_min bigint DEFAULT NULL,
    key_max bigint DEFAULT NULL
)
RETURNS TABLE (actor_key bigint, event_id bigint, kind text)
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ eventqueue.event_claim $py$;
COMMENT ON FUNCTION aidb_memory.event_claim(integer, integer, bigint, bigint) IS
'Internal (process_events): claims the oldest claimable event (accepted and due, or processing '
'with a lapsed lease; compaction tasks before extraction events) with FOR UPDATE SKIP LOCKED, '
'for lease_s seconds, counting the attempt; with key_min and key_max (inclusive, both or '
'neither), only among events whose actor_key is in that range. Returns the event''s actor_key, '
'internal id and kind, or no row. An event with max_attempts attempts made is marked failed '
'instead (a lapsed lease: "attempt N ended without a result").';

CREATE OR REPLACE FUNCTION aidb_memory.event_process(
    actor_key bigint,
    event_id bigint,
    max_attempts integer,
    backoff_s real
)
RETURNS text
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ eventqueue.event_process $py$;
COMMENT ON FUNCTION aidb_memory.event_process(bigint, bigint, integer, real) IS
'Internal (process_events): works one claimed event, known by its actor_key and internal id: '
'the extraction call, then reconciliation under a per-(namespace, actor) lock; or, for a '
'compaction task, the session''s next summary as a read would write it (skipped: dropped '
'without a model call, nothing was due). Returns processed, skipped, retry (failed, due again '
'after backoff), failed (after max_attempts) or lost (another worker holds it).';

CREATE OR REPLACE FUNCTION aidb_memory.event_error(
    actor_key bigint,
    event_id bigint,
    max_attempts integer,
    backoff_s real,
    error text
)
RETURNS text
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ eventqueue.event_error $py$;
COMMENT ON FUNCTION aidb_memory.event_error(bigint, bigint, integer, real, text) IS
'Internal (process_events): records an attempt that ended in an unexpected error, as a retry or, '
'after max_attempts, a failure.';

CREATE OR REPLACE FUNCTION aidb_memory.event_interrupted(
    actor_key bigint,
    event_id bigint,
    max_attempts integer,
    backoff_s real,
    error text
)
RETURNS text
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ eventqueue.event_interrupted $py$;
COMMENT ON FUNCTION aidb_memory.event_interrupted(bigint, bigint, integer, real, text) IS
'Internal (process_events): records an attempt ended by a cancel (57014: statement_timeout, '
'pg_cancel_backend) as a retry after backoff or, after max_attempts, a failure.';

CREATE OR REPLACE FUNCTION aidb_memory.event_remaining()
RETURNS bigint
LANGUAGE plpython3u STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ eventqueue.event_remaining $py$;
COMMENT ON FUNCTION aidb_memory.event_remaining() IS
'Events waiting for a worker: accepted (due or not), or processing with a lapsed lease.';

-- A procedure, so that it commits after each claim and each event. PostgreSQL allows COMMIT only
-- in a SECURITY INVOKER procedure without SET: it has no rights of its own and calls only the
-- functions above, which its caller (an aidb_workers member) may execute.
-- Without SET, it runs under its caller's search_path, which the database's owner may have set
-- to put their own operators (`<`, `=`, `+`) before pg_catalog's; a superuser or pg_cron job
-- calling it would run them. So its first statement pins the search_path for the transaction,
-- and so does the statement after every COMMIT (a local setting ends with its transaction);
-- nothing is evaluated before the pin, and variables have schema-qualified types (plpgsql
-- resolves them when it compiles the body). The codebundle lint enforces all three.
-- by_kind (issue 13) came after retried, and key_min and key_max (issue 15) after by_kind (a
-- call that passes the earlier arguments by position means what it meant): an older signature
-- cannot be replaced in place.
DROP PROCEDURE IF EXISTS aidb_memory.process_events(
    integer, integer, integer, real, integer, integer, integer);
DROP PROCEDURE IF EXISTS aidb_memory.process_events(
    integer, integer, integer, real, integer, integer, integer, jsonb);
CREATE OR REPLACE PROCEDURE aidb_memory.process_events(
    max_events integer DEFAULT 100,
    lease_s integer DEFAULT 300,
    max_attempts integer DEFAULT 5,
    backoff_s real DEFAULT 10,
    INOUT processed integer DEFAULT NULL,
    INOUT failed integer DEFAULT NULL,
    INOUT retried integer DEFAULT NULL,
    INOUT by_kind jsonb DEFAULT NULL,
    key_min bigint DEFAULT NULL,
    key_max bigint DEFAULT NULL
)
LANGUAGE plpgsql
AS $$
DECLARE
    claimed_key pg_catalog.int8;
    claimed pg_catalog.int8;
    outcome pg_catalog.text;
    cancelled pg_catalog.text;
    task_kind pg_catalog.text;
    -- The compaction tasks among the counts (the rest are extraction events).
    summarized pg_catalog.int4;
    dropped pg_catalog.int4;
    task_failed pg_catalog.int4;
    task_retried pg_catalog.int4;
    -- Expired memories the call deleted (issue 34).
    expired pg_catalog.int4;
    -- Each event handled (issue 36): by_kind's "events", for the worker's logs. An array, which
    -- array_append extends in place, not a jsonb array copied at each event.
    handled pg_catalog.jsonb[];
    started pg_catalog.timestamptz;
BEGIN
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    processed := 0;
    failed := 0;
    retried := 0;
    summarized := 0;
    dropped := 0;
    task_failed := 0;
    task_retried := 0;
    IF max_events IS NULL OR max_events < 1 OR max_events > 100000 THEN
        RAISE EXCEPTION 'aidb_memory.process_events: max_events must be between 1 and 100000'
            USING ERRCODE = '22023';
    END IF;
    FOR i IN 1..max_events LOOP
        started := pg_catalog.clock_timestamp();
        -- No row: nothing claimable (in the key range, when one is given); all three NULL.
        SELECT c.actor_key, c.event_id, c.kind INTO claimed_key, claimed, task_kind
        FROM aidb_memory.event_claim(lease_s, max_attempts, key_min, key_max) AS c;
        EXIT WHEN claimed IS NULL;
        COMMIT;
        PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
        cancelled := NULL;
        BEGIN
            outcome := aidb_memory.event_process(
                claimed_key, claimed, max_attempts, backoff_s);
        EXCEPTION
            WHEN query_canceled THEN
                -- statement_timeout or pg_cancel_backend: the attempt counts (after COMMIT,
                -- below), then the cancel ends the call as the caller asked.
                -- The message names the internal function it came through (or PL/Python's
                -- exception class): the event's last_error keeps only what happened, and the
                -- error raised below names process_events, the function the caller called.
                cancelled := pg_catalog.regexp_replace(
                    SQLERRM, '^(spiexceptions|aidb_memory)\.\w+: ', '');
            WHEN admin_shutdown OR invalid_parameter_value THEN
                RAISE;
            WHEN OTHERS THEN
                outcome := aidb_memory.event_error(
                    claimed_key, claimed, max_attempts, backoff_s, SQLERRM);
        END;
        PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
        IF cancelled IS NOT NULL THEN
            PERFORM aidb_memory.event_interrupted(
                claimed_key, claimed, max_attempts, backoff_s, cancelled);
            COMMIT;
            PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
            RAISE EXCEPTION USING ERRCODE = 'query_canceled',
                MESSAGE = 'aidb_memory.process_events: ' || cancelled,
                HINT = 'aidb_memory.process_events: the event in hand counts as a failed attempt';
        END IF;
        COMMIT;
        PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
        IF outcome IN ('processed', 'skipped') THEN
            processed := processed + 1;
        ELSIF outcome = 'failed' THEN
            failed := failed + 1;
        ELSIF outcome = 'retry' THEN
            retried := retried + 1;
        END IF;
        IF outcome IN ('processed', 'skipped', 'failed', 'retry') THEN
            handled := pg_catalog.array_append(handled,
                COALESCE(aidb_memory.event_brief(claimed_key, claimed),
                         pg_catalog.jsonb_build_object('kind', task_kind))
                || pg_catalog.jsonb_build_object(
                    'outcome', outcome,
                    'duration_ms', pg_catalog.round(pg_catalog.date_part(
                        'epoch', pg_catalog.clock_timestamp() - started) * 1000)::pg_catalog.int8));
        END IF;
        IF task_kind = 'compaction' THEN
            IF outcome = 'processed' THEN
                summarized := summarized + 1;
            ELSIF outcome = 'skipped' THEN
                dropped := dropped + 1;
            ELSIF outcome = 'failed' THEN
                task_failed := task_failed + 1;
            ELSIF outcome = 'retry' THEN
                task_retried := task_retried + 1;
            END IF;
        END IF;
    END LOOP;
    -- Then a batch of the sweep (after the claims, which check the key range; its deletes commit
    -- with the call). 1000: ops/worker.py's EXPIRE_BATCH, which calls again at once after a full
    -- batch.
    expired := aidb_memory.expire_memories(1000, key_min, key_max);
    by_kind := pg_catalog.jsonb_build_object(
        'extraction', pg_catalog.jsonb_build_object(
            'processed', processed - summarized - dropped,
            'failed', failed - task_failed,
            'retried', retried - task_retried),
        'compaction', pg_catalog.jsonb_build_object(
            'summarized', summarized, 'dropped', dropped,
            'failed', task_failed, 'retried', task_retried),
        'expiry', pg_catalog.jsonb_build_object('expired', expired),
        'events', pg_catalog.to_jsonb(COALESCE(handled, ARRAY[]::pg_catalog.jsonb[])));
    -- The last-batch gauge of aidb_memory.metrics(): this call finished. Under REPEATABLE READ
    -- a worker that finished after this transaction's snapshot fails the UPDATE (40001): its
    -- time is as recent, and this call's work is done, so the error is left.
    BEGIN
        PERFORM aidb_memory.event_batch_finished();
    EXCEPTION WHEN serialization_failure THEN
        NULL;
    END;
END
$$;
COMMENT ON PROCEDURE aidb_memory.process_events(
    integer, integer, integer, real, integer, integer, integer, jsonb, bigint, bigint) IS
'The worker (aidb_workers): claims up to max_events events one at a time (FOR UPDATE SKIP '
'LOCKED, with a lease of lease_s seconds; compaction tasks first), works each in its own '
'transaction (an extraction event: extract and reconcile; a compaction task: the session''s next '
'summary, written ahead of its reads), retries a failed one after backoff_s doubling per '
'attempt, and marks it failed after max_attempts. Then it deletes up to 1000 expired memories '
'(expire_memories). Returns how many were processed (or skipped), failed and retried, and '
'by_kind: {"extraction": {processed, failed, retried}, "compaction": {summarized, dropped, '
'failed, retried}, "expiry": {expired}, "events": [{event, kind, namespace, outcome, '
'duration_ms}, ...] (each event handled: its public id, never its actor or content)}. With '
'key_min and key_max (inclusive, both or neither), only events whose actor_key is in that range: workers with disjoint ranges split the '
'queue. Safe to run from several sessions at once, and from pg_cron.';

CREATE OR REPLACE FUNCTION aidb_memory.status(namespace text, actor_id text, event_id uuid)
RETURNS jsonb
LANGUAGE plpython3u STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ eventqueue.status $py$;
COMMENT ON FUNCTION aidb_memory.status(text, text, uuid) IS
'An event''s status (accepted, processing, processed, failed, skipped), attempts, last error, '
'kind (extraction, or compaction for a task that compacts a session ahead of its reads) and what '
'it produced (counts and the ids of new memories; a task''s summary range, or why it was '
'dropped); NULL for an unknown event or another actor''s. Errors: 22004, 22023, 42704, 42501.';

CREATE OR REPLACE FUNCTION aidb_memory.events_retry(
    namespace text,
    actor_id text DEFAULT NULL,
    failed_since timestamptz DEFAULT NULL
)
RETURNS bigint
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ eventqueue.events_retry $py$;
COMMENT ON FUNCTION aidb_memory.events_retry(text, text, timestamptz) IS
'Admins: puts the namespace''s failed extraction events (only actor_id''s, only those failed at or after '
'failed_since, when given) back in the queue, due now with attempts reset, and wakes the '
'workers; returns how many. Errors: 22004, 42704.';
