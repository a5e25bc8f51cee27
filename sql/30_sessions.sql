-- Sessions (SPEC §3): the conversation-history API, named and shaped as EDB AIDB's.

CREATE OR REPLACE FUNCTION aidb_memory.session_start(
    namespace text,
    actor_id text,
    agent_id text,
    session_id text DEFAULT NULL
)
-- A type rather than RETURNS TABLE: the PL/pgSQL wrapper (codebundle.BODY_SUFFIX) cannot
-- have an argument and a result column of one name; migrations/0009_result_types.sql.
RETURNS SETOF aidb_memory.session_start_result
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ sessions.session_start $py$;
COMMENT ON FUNCTION aidb_memory.session_start(text, text, text, text) IS
'Open a conversation, or resume one: returns the stored row. agent_id has no default (pass NULL). '
'A NULL session_id creates a UUID. A closed session stays closed and reports closed_at. '
'prev_handoff: the handoff of the most recently closed other session of the same namespace, actor '
'and agent, fixed when the session is first started. Errors: 22004, 22023, 42704, 42501, 55000.';

-- memory_metadata (issue 34) came after 0.2's six arguments: the old signature would make a
-- call with three to six of them ambiguous.
DROP FUNCTION IF EXISTS aidb_memory.add(text, text, jsonb, text, text, text);
DROP FUNCTION IF EXISTS aidb_memory.add_py(text, text, jsonb, text, text, text);
CREATE OR REPLACE FUNCTION aidb_memory.add(
    namespace text,
    actor_id text,
    turns jsonb,
    session_id text DEFAULT NULL,
    agent_id text DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    memory_metadata jsonb DEFAULT NULL
)
RETURNS uuid
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ adding.add $py$;
COMMENT ON FUNCTION aidb_memory.add(text, text, jsonb, text, text, text, jsonb) IS
'Store a batch of turns, all or none, and record an event for long-term memory; returns the event '
'id. With session_id the turns are appended to that session (created on first use) at gap-free '
'positions. A repeated idempotency_key returns the original event id and writes nothing. '
'memory_metadata: a JSON object the worker copies onto every memory it makes of this batch. '
'Errors: 22004 NULL argument, 22023 malformed turns (message names turn index and field) or '
'memory_metadata (as remember''s metadata), 42704 unknown namespace, 42501 actor binding, 55000 '
'closed session or INACTIVE namespace, 23505 key reused with different turns.';

-- The plan's columns changed in 0.2 (summaries) and with limit_items (issue 11): an old
-- signature cannot be replaced in place.
DROP FUNCTION IF EXISTS aidb_memory.session_read_plan(text, text, text, integer, text, integer, text);
DROP FUNCTION IF EXISTS aidb_memory.session_read_plan(
    text, text, text, integer, text, integer, integer, text);
CREATE FUNCTION aidb_memory.session_read_plan(
    namespace text,
    actor_id text,
    session_id text,
    limit_chars integer,
    fallback_model text,
    limit_turns integer,
    limit_items integer,
    caller text,
    OUT actor_key bigint,
    OUT session_ref bigint,
    OUT session_version text,
    OUT summary_seq bigint,
    OUT lo_offset bigint,
    OUT lo_seq bigint,
    OUT hi_offset bigint,
    OUT hi_seq bigint,
    OUT readable_chars bigint,
    OUT summary_room bigint,
    OUT warnings text[],
    OUT compact boolean,
    OUT pin_seq bigint,
    OUT pinned jsonb,
    OUT summary_slots bigint,
    OUT by_items boolean,
    OUT empty_warning text
)
-- STABLE: its queries run in one snapshot (on one server), that of the statement that calls
-- it. The read statement that follows it runs in another, and returns nothing when the session
-- is no longer as planned (session_version; summaries newer than summary_seq it leaves out): the
-- reader plans again. So the bounds and the turns they select are one state of the session, e.g.
-- never a round's tool call without the results committed meanwhile.
LANGUAGE plpython3u STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ sessions.session_read_plan $py$;
COMMENT ON FUNCTION aidb_memory.session_read_plan(
    text, text, text, integer, text, integer, integer, text) IS
'Internal (called by the read statement of session_get and session_messages): validates a read '
'and returns the bounds, in (char_offset, seq) order, of the turns it may return, the budget left '
'for summaries, its warnings, whether it should compact, the pinned instructions (seqs '
'1..pin_seq) and how the window cuts. caller is the API function that error messages name.';

-- The plan of the common read without Python (issue 33): session_get and session_messages run
-- this function's block themselves (@fast_read_plan@ below) and call session_read_plan only when
-- it planned nothing. It plans a read of an existing session with no tool calls waiting for
-- results, without limit_items and without pinned instructions, by plain identifiers (as
-- add_fast's) within the namespace's limits and valid budgets; anything else, and every error,
-- is session_read_plan's. It mirrors sessions.session_read_plan for those reads
-- (tests/db/test_read_plan_sql.py holds the two equal): a PL/Python call costs a read ~90 us,
-- this ~20 (bench/README.md).
CREATE OR REPLACE FUNCTION aidb_memory.session_read_plan_sql(
    namespace text,
    actor_id text,
    session_id text,
    limit_chars integer,
    fallback_model text,
    limit_turns integer,
    limit_items integer
)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
#variable_conflict use_column
DECLARE
    plan record;
    planned boolean;
BEGIN
    -- BEGIN fast_read_plan
    -- Sets plan (session_read_plan's columns, same types, and four more that only this block
    -- reads) and planned, or only planned := false. The session's row comes into plan with the
    -- plan of a read that keeps every unsummarized turn and warns of nothing; what the budget
    -- changes is then set field by field (a statement fewer than building the plan in one of
    -- its own: ~15 us of session_get, bench/README.md).
    planned := false;
    DECLARE
        _key bigint;
        _unsummarized bigint;
        _first bigint;
        _first_offset bigint;
        -- A namespace with grants: the statement below takes it only through a grant to _role,
        -- a role whose privileges the caller has (as in add_fast, sql/31_add_fast.sql).
        _hint text := current_setting('aidb_memory.granted_role', true);
        _role oid;
        _role_name name;
        _found oid;
    BEGIN
        IF $1 IS NOT NULL AND $2 IS NOT NULL AND $3 IS NOT NULL AND $7 IS NULL
           -- budget.check_limits' bounds (BUDGET_MAX, TURNS_MAX)
           AND ($4 IS NULL OR $4 BETWEEN 1 AND 100000000)
           AND ($6 IS NULL OR $6 BETWEEN 1 AND 1000000)
           -- Identifiers the Python code takes as they are (as add_fast's).
           AND $2 ~ '[!-~]' AND $2 !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]'
           AND $3 ~ '[!-~]' AND $3 !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]' THEN
            -- aidb_memory.actor_key($1, $2), written out (as in add_fast).
            _key := ('x' || encode(substr(sha256(convert_to($1 || ':' || $2, 'UTF8')), 1, 8),
                                   'hex'))::bit(64)::bigint;
            -- _role, _role_name: the hint, if the caller has its privileges (sql/31_add_fast.sql)
            @granted_role_hint@
            LOOP
                SELECT _key AS actor_key, s.id::bigint AS session_ref,
                       s.xmin::text AS session_version,
                       coalesce(m.to_seq, 0)::bigint AS summary_seq,
                       -- Summaries stand in for the turns they cover (a summary never covers
                       -- the newest round).
                       coalesce(m.to_offset, 0)::bigint AS lo_offset,
                       coalesce(m.to_seq, 0)::bigint + 1 AS lo_seq,
                       s.total_chars::bigint AS hi_offset, s.next_seq::bigint AS hi_seq,
                       s.total_chars::bigint AS readable_chars, -1::bigint AS summary_room,
                       '{}'::text[] AS warnings, false AS compact, 0::bigint AS pin_seq,
                       NULL::jsonb AS pinned, NULL::bigint AS summary_slots, false AS by_items,
                       NULL::text AS empty_warning,
                       -- (this block's own)
                       coalesce(m.chars, 0)::bigint AS newest, s.tail_round_start::bigint,
                       coalesce((n.config->>'compaction_min_target_chars')::int, 200)
                           AS min_target,
                       n.model_spec->>'llm' IS NULL AS no_llm
                INTO plan
                FROM aidb_memory.namespace AS n
                JOIN aidb_memory.session AS s
                  ON s.actor_key = _key AND s.namespace_id = n.id AND s.actor_id = $2
                     AND s.session_id = $3
                LEFT JOIN LATERAL (
                    SELECT x.to_seq, x.to_offset, x.chars FROM aidb_memory.summary AS x
                    WHERE x.actor_key = _key AND x.session_ref = s.id ORDER BY x.to_seq DESC LIMIT 1
                ) AS m ON true
                WHERE n.name = $1
                  -- (the grants' copies in the namespace row: a subquery on namespace_grant would
                  -- cost every call, of open namespaces too, its executor set-up)
                  AND (NOT n.restricted
                       OR n.grant_role_names[array_position(n.grant_role_ids, _role)] = _role_name)
                  AND greatest(length($2), length($3))
                      <= coalesce((n.config->>'max_identifier_chars')::int, 255)
                  AND (coalesce(n.config->>'actor_binding', 'none') <> 'session_user'
                       OR $2 = session_user)
                  AND s.open_calls = '{}'
                  AND (($4 IS NULL AND $6 IS NULL) OR s.pinned_seq = 0
                       OR NOT coalesce((n.config->>'pin_instructions')::boolean, false));
                planned := FOUND;
                EXIT WHEN planned;
                -- Nothing found: in a namespace with grants, the role that lets the caller in,
                -- unless the statement already tried it (sql/31_add_fast.sql).
                @granted_role_retry@
            END LOOP;
            IF planned THEN
                IF $4 IS NULL THEN
                    -- Everything, summaries or not.
                    plan.lo_offset := 0;
                    plan.lo_seq := 1;
                ELSE
                    _unsummarized := plan.hi_offset - plan.lo_offset;
                    IF _unsummarized <= $4 THEN
                        plan.summary_room := $4 - _unsummarized;
                    ELSIF 0 < plan.newest AND plan.newest <= $4 / 4 THEN  -- compaction.target_chars
                        plan.summary_room := plan.newest;
                        plan.lo_offset := plan.hi_offset - ($4 - plan.newest);
                        plan.lo_seq := 0;
                    ELSE
                        plan.lo_offset := plan.hi_offset - $4;
                        plan.lo_seq := 0;
                    END IF;
                    IF _unsummarized > 0 AND _unsummarized + plan.newest > $4 THEN  -- .needed
                        IF plan.tail_round_start <= plan.summary_seq + 1 THEN  -- .over_budget_alone
                            plan.warnings := '{newest_round_over_budget}';
                        ELSIF $4 / 4 < plan.min_target THEN
                            plan.warnings := '{compaction_budget_too_small}';
                        ELSIF plan.no_llm AND $5 IS NULL THEN
                            plan.warnings := '{compaction_model_unavailable}';
                        ELSE
                            plan.compact := true;
                        END IF;
                    END IF;
                END IF;
                -- Turns there are to return (the first unsummarized one on): an empty window
                -- means the newest round did not fit.
                IF plan.hi_seq > (CASE WHEN $4 IS NULL THEN 1 ELSE plan.summary_seq + 1 END)
                   AND plan.warnings <> '{newest_round_over_budget}' THEN
                    plan.empty_warning := 'newest_round_over_budget';
                END IF;
                _first := plan.hi_seq - $6;  -- NULL without limit_turns
                IF _first > plan.lo_seq THEN
                    SELECT o.char_offset INTO _first_offset FROM aidb_memory.turn AS o
                    WHERE o.actor_key = _key AND o.session_ref = plan.session_ref
                      AND o.seq = _first;
                    IF (_first_offset, _first) > (plan.lo_offset, plan.lo_seq) THEN
                        plan.lo_offset := _first_offset;
                        plan.lo_seq := _first;
                    END IF;
                    plan.summary_room := -1;  -- the turns before the window are left out
                END IF;
            END IF;
        END IF;
    END;
    -- END fast_read_plan
    IF planned THEN
        RETURN to_jsonb(plan) - '{newest,tail_round_start,min_target,no_llm}'::text[];
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION aidb_memory.session_read_plan_sql(
    text, text, text, integer, text, integer, integer) IS
'Internal (its block runs inside session_get and session_messages): the plan of a common read, '
'as session_read_plan would make it, without Python; NULL for any other read, which '
'session_read_plan plans.';

CREATE OR REPLACE FUNCTION aidb_memory.session_compact(
    namespace text,
    actor_id text,
    session_id text,
    limit_chars integer,
    fallback_model text
)
RETURNS text[]
-- VOLATILE, and called in a statement of its own: it writes, and the read that follows must
-- see what it wrote.
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ compactor.session_compact $py$;
COMMENT ON FUNCTION aidb_memory.session_compact(text, text, text, integer, text) IS
'Internal (called by session_get and session_messages on an over-budget read): summarizes the '
'oldest three quarters of the session''s unsummarized turns, cut at a round boundary, into one '
'summary of at most limit_chars / 4. Never waits for another compaction and never raises for a failed one: '
'returns the warnings that say why no summary was written (empty when one was, or '
'compaction_incomplete when one was and more is left to summarize).';

-- session_history (0.x to issue 14) was a PL/pgSQL layer of its own between session_get or
-- session_messages and the window query: each read now runs the window itself (issue 14).
DROP FUNCTION IF EXISTS aidb_memory.session_history(
    text, text, text, integer, text, integer, integer, text);

-- session_get and session_messages each run the same read statement (the plan, the window, the
-- summaries), at most twice. It is written once, in session_get, in parts (read_head, read_items
-- or read_rounds, read_range, read_end, read_summaries or read_no_summaries, read_tail), put
-- together four ways; session_messages holds the lines @read_head@ ... where install puts them
-- (codebundle.expand_fragments: each plans it for itself, and session_messages's plan leaves out
-- the columns it does not use).
CREATE OR REPLACE FUNCTION aidb_memory.session_get(
    namespace text,
    actor_id text,
    session_id text,
    limit_chars integer DEFAULT NULL,
    fallback_model text DEFAULT NULL,
    limit_turns integer DEFAULT NULL,
    limit_items integer DEFAULT NULL
)
RETURNS TABLE (items jsonb, overflow_chars bigint, compacted_entries integer, warnings text[])
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
-- Generic plans: the read statement's custom plan costs more than the read (its parameters
-- are the plan's values, for which the generic plan is as good). On Citus, install --citus
-- makes it plan each call (docs/scaling.md).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    compacted boolean := false;
    extra text[] := '{}';
    plan record;
    planned boolean;
    changed integer := 0;
    n bigint;
    state text;
    message text;
    detail text;
    hint text;
BEGIN
    -- BEGIN citus_read_snapshot
    -- On Citus, install --citus runs this function with citus.select_opens_transaction_block
    -- off: its reads reach the actor's worker without the transaction block (BEGIN, SAVEPOINT,
    -- RELEASE, COMMIT: three more round trips) that its error handler's subtransaction would
    -- otherwise open, each statement in a snapshot of its own, as under READ COMMITTED. A
    -- REPEATABLE READ or SERIALIZABLE caller keeps the transaction's snapshot on the worker: for
    -- it, the block again (SET LOCAL, undone when the function returns: the SET clause).
    -- (Two IFs: on one server, where the setting is NULL, one call of current_setting.)
    IF current_setting('citus.select_opens_transaction_block', true) = 'off' THEN
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            PERFORM set_config('citus.select_opens_transaction_block', 'on', true);
        END IF;
    END IF;
    -- END citus_read_snapshot
    -- An argument over 64 kB is measured before session_read_plan's PL/Python would copy it
    -- (sql/12_argument_caps.sql).
    IF pg_catalog.pg_column_size(namespace) > 65536 OR pg_catalog.pg_column_size(actor_id) > 65536
       OR pg_catalog.pg_column_size(session_id) > 65536 THEN
        PERFORM aidb_memory.refuse_oversized('session_get', 'namespace', namespace, namespace);
        PERFORM aidb_memory.refuse_oversized('session_get', 'actor_id', namespace, actor_id);
        PERFORM aidb_memory.refuse_oversized('session_get', 'session_id', namespace, session_id);
    END IF;
    -- plpgsql rather than SQL: a SQL function that is not inlined (SECURITY DEFINER never is)
    -- re-plans its body on every call; plpgsql keeps the plan for the connection. One layer:
    -- the read statement runs here, not in a function of its own that this one copies from
    -- (measured: such a function cost session_get 3% of its backend CPU, session_messages 6%).
    LOOP
        -- The plan (session_read_plan, in a statement of its own: Citus routes the read
        -- statement to the actor's shard by its key, a parameter, and the plan cannot run there)
        -- bounds the scan by the budget (an index range on (session_ref, char_offset, seq)); the
        -- read keeps the newest whole rounds: a cut is allowed before a turn whose seq equals
        -- the smallest round_start at or after it. With limit_items (plan.by_items) a cut is
        -- allowed before a turn unless a tool result at or after it belongs to a round that
        -- starts before it: the newest items, never a tool result without its call. Pinned
        -- instructions (seqs 1..plan.pin_seq) come first, then summaries when every
        -- unsummarized turn fits: the newest ones that fit in the budget left.
        @fast_read_plan@
        IF NOT planned THEN
            SELECT * INTO plan
            FROM aidb_memory.session_read_plan($1, $2, $3, $4, $5, $6, $7, 'session_get');
        END IF;
        IF plan.compact AND NOT compacted THEN
            -- Once per read: compact, then plan again (the new summary, or the history as it
            -- was with the warning that says why there is none).
            extra := aidb_memory.session_compact($1, $2, $3, $4, $5);
            compacted := true;
            CONTINUE;
        END IF;
        -- The read statement, in four, each planned once for what it needs: with the summaries'
        -- subquery only when a summary may have room (a subquery that finds nothing still costs
        -- every read its executor set-up, ~9% of (b)'s backend CPU), and the window of
        -- limit_items only for it (its running minimum costs a sort and a window node, ~11% of
        -- (b)'s time; bench/README.md).
        IF plan.summary_room >= 0 AND plan.by_items THEN
        RETURN QUERY
        -- BEGIN read_head
        SELECT coalesce(plan.pinned, '[]'::jsonb)
               || coalesce(sm.items, '[]'::jsonb) || coalesce(w.items, '[]'::jsonb) AS items,
               plan.readable_chars - coalesce(w.chars, 0) - coalesce(sm.covered, 0)
                   AS overflow_chars,
               coalesce(sm.turns, 0)::integer AS compacted_entries,
               plan.warnings || extra
               || CASE
                      -- Nothing kept of turns there were to return: the plan says why.
                      WHEN w.items IS NULL AND plan.empty_warning IS NOT NULL
                           AND NOT plan.empty_warning = ANY (extra) THEN ARRAY[plan.empty_warning]
                      WHEN plan.by_items AND w.split THEN '{limit_items_round_split}'::text[]
                  END AS warnings
        FROM (
            SELECT jsonb_agg(
                       CASE
                           -- A plain turn (most are): one object, not three joined.
                           WHEN m.tool_calls IS NULL AND m.tool_call_id IS NULL
                                AND m.name IS NULL AND m.item IS NULL
                               THEN jsonb_build_object('seq', m.seq, 'role', m.role,
                                                       'content', m.content, 'kind', m.kind,
                                                       'meta', m.meta,
                                                       'created_at', m.created_at)
                           ELSE jsonb_build_object('seq', m.seq, 'role', m.role,
                                                   'content', m.content, 'kind', m.kind,
                                                   'meta', m.meta, 'created_at', m.created_at)
                                || jsonb_strip_nulls(jsonb_build_object(
                                       'tool_calls', m.tool_calls,
                                       'tool_call_id', m.tool_call_id, 'name', m.name))
                                -- The caller's own object, as it came (not through
                                -- jsonb_strip_nulls).
                                || CASE WHEN m.item IS NOT NULL
                                        THEN jsonb_build_object('item', m.item,
                                                                'format', m.item_format)
                                        ELSE '{}'::jsonb END
                       END
                       ORDER BY m.seq) AS items,
                   sum(m.chars) AS chars, bool_or(m.split) AS split
            FROM (
        -- END read_head
        -- BEGIN read_items
                -- limit_items: a cut is allowed before a turn unless a tool result at or after
                -- it belongs to a round that starts before it. ((char_offset, seq) is in seq
                -- order: the order of the index that the scan reads backwards.)
                SELECT f.*,
                       min(CASE WHEN f.seq = greatest(f.floor, plan.pin_seq + 1) THEN f.seq END)
                           OVER () AS cut,
                       -- Rounds are contiguous (round_start never decreases with seq): the kept
                       -- turns start inside a round when the first one does not start it (the
                       -- first turn after pinned instructions always starts one). The same
                       -- window as cut's, computed once.
                       f.seq = min(CASE WHEN f.seq = greatest(f.floor, plan.pin_seq + 1)
                                        THEN f.seq END) OVER ()
                           AND f.round_start <> f.seq AND f.seq > plan.pin_seq + 1 AS split
                FROM (
                    SELECT t.seq, t.role, t.content, t.kind, t.meta, t.created_at, t.tool_calls,
                           t.tool_call_id, t.name, t.chars, t.round_start, t.item, t.item_format,
                           min(CASE WHEN t.role <> 'tool' THEN t.seq ELSE t.round_start END)
                               OVER (ORDER BY t.char_offset DESC, t.seq DESC) AS floor
        -- END read_items
        -- BEGIN read_range
                    FROM aidb_memory.turn AS t
                    WHERE t.actor_key = plan.actor_key AND t.session_ref = plan.session_ref
                      AND (t.char_offset, t.seq) >= (plan.lo_offset, plan.lo_seq)
                      AND (t.char_offset, t.seq) < (plan.hi_offset, plan.hi_seq)
        -- END read_range
                ) AS f
        -- BEGIN read_end
            ) AS m
            WHERE m.seq >= m.cut
        ) AS w
        -- END read_end
        -- BEGIN read_summaries
        CROSS JOIN (
            SELECT jsonb_agg(
                       jsonb_build_object('seq', NULL, 'role', 'system', 'content', x.content,
                                          'kind', 'summary',
                                          'meta', jsonb_build_object(
                                              'from_seq', x.from_seq, 'to_seq', x.to_seq,
                                              'turn_count', x.turn_count, 'model', x.model),
                                          'created_at', x.created_at)
                       ORDER BY x.to_seq) AS items,
                   max(x.to_offset) - min(x.from_offset) AS covered,
                   sum(x.turn_count) AS turns
            FROM (
                SELECT s.*, sum(s.chars) OVER (ORDER BY s.to_seq DESC) AS used,
                       row_number() OVER (ORDER BY s.to_seq DESC) AS rank
                FROM aidb_memory.summary AS s
                WHERE s.actor_key = plan.actor_key AND s.session_ref = plan.session_ref
                  AND s.to_seq <= plan.summary_seq AND plan.summary_room >= 0
            ) AS x
            WHERE x.used <= plan.summary_room
              AND (plan.summary_slots IS NULL OR x.rank <= plan.summary_slots)
        ) AS sm
        -- END read_summaries
        -- BEGIN read_tail
        -- Nothing when the session changed since the plan (no session: ''): the reader plans
        -- again. Not an OR with the no-session case: the planner would drop the subquery and
        -- Citus then plans its table on no shard, which it cannot with xmin.
        WHERE coalesce((SELECT s.xmin::text FROM aidb_memory.session AS s
                        WHERE s.actor_key = plan.actor_key AND s.id = plan.session_ref), '')
              = plan.session_version
        -- END read_tail
        ;
        ELSIF plan.summary_room >= 0 THEN
        RETURN QUERY
        @read_head@
        -- BEGIN read_rounds
                -- Rounds are contiguous (round_start never decreases with seq): a cut is
                -- allowed before a turn that starts one, and the read keeps the turns from the
                -- first such cut in the bounds, found by one probe of the index over the same
                -- bounds (read_range, its own t: a subquery the planner runs once and makes a
                -- bound of the scan: no window, ~4% of (b)'s time; bench/README.md). Ordered as
                -- the index is (and (char_offset, seq) is in seq order), so that the scan reads
                -- the index in order rather than through a bitmap. Kept whole, a read's rounds
                -- are never split.
                SELECT t.seq, t.role, t.content, t.kind, t.meta, t.created_at, t.tool_calls,
                       t.tool_call_id, t.name, t.chars, t.round_start, t.item, t.item_format,
                       (SELECT t.seq
        @read_range@
                          AND t.seq = greatest(t.round_start, plan.pin_seq + 1)
                        ORDER BY t.char_offset, t.seq LIMIT 1) AS cut,
                       false AS split
        -- END read_rounds
        @read_range@
                ORDER BY t.char_offset, t.seq
        @read_end@
        @read_summaries@
        @read_tail@
        ;
        ELSIF plan.by_items THEN
        RETURN QUERY
        @read_head@
        @read_items@
        @read_range@
                ) AS f
        @read_end@
        -- BEGIN read_no_summaries
        CROSS JOIN (SELECT NULL::jsonb AS items, NULL::bigint AS covered, NULL::numeric AS turns)
            AS sm
        -- END read_no_summaries
        @read_tail@
        ;
        ELSE
        RETURN QUERY
        @read_head@
        @read_rounds@
        @read_range@
                ORDER BY t.char_offset, t.seq
        @read_end@
        @read_no_summaries@
        @read_tail@
        ;
        END IF;
        GET DIAGNOSTICS n = ROW_COUNT;
        EXIT WHEN n > 0;
        changed := changed + 1;
        IF changed >= 100 THEN
            -- Writers that commit between every plan and its read: a read that cannot finish.
            RAISE EXCEPTION 'the session changed during each of % reads', changed
                USING ERRCODE = '40001', HINT = 'retry the read';
        END IF;
    END LOOP;
EXCEPTION WHEN OTHERS OR query_canceled THEN
    -- Raised again from here, the error's CONTEXT is this one line instead of the internal
    -- window query and the frames of the functions under it (docs/architecture.md, Errors).
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
        detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    message := 'aidb_memory.session_get: '
               || pg_catalog.regexp_replace(message, '^aidb_memory\.\w+: ', '');
    -- RAISE sends an empty DETAIL or HINT as one, and refuses a NULL: name only those present.
    IF detail <> '' AND hint <> '' THEN
        RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message, DETAIL = detail, HINT = hint;
    ELSIF detail <> '' THEN
        RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message, DETAIL = detail;
    ELSIF hint <> '' THEN
        RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message, HINT = hint;
    END IF;
    RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message;
END
$$;
COMMENT ON FUNCTION aidb_memory.session_get(text, text, text, integer, text, integer, integer) IS
'Read a session''s history in order. Without limit_chars: everything. With it: the newest whole '
'reasoning rounds whose chars (content plus tool-call arguments) fit; a round that does not fit is '
'dropped whole with everything older. limit_turns bounds the number of turns the same way. '
'limit_items: the newest items (one per turn), never a tool result without its call '
'(limit_items_round_split when the cut falls inside a round). With config pin_instructions, a '
'budgeted read returns the leading system/developer turns first. Returns items, overflow_chars '
'(history left out), compacted_entries, warnings. Another actor''s session reads as empty. '
'Errors: 22004, 22023 bad budget, 42704, 42501.';

CREATE OR REPLACE FUNCTION aidb_memory.session_convert(items jsonb, format text)
RETURNS jsonb
LANGUAGE plpython3u IMMUTABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ sessions.session_convert $py$;
COMMENT ON FUNCTION aidb_memory.session_convert(jsonb, text) IS
'Internal (called by session_messages): a read''s items as Chat Completions messages (format chat) '
'or a Responses API input list (format responses), converting turns stored in the other shape.';

CREATE OR REPLACE FUNCTION aidb_memory.session_messages(
    namespace text,
    actor_id text,
    session_id text,
    limit_chars integer DEFAULT NULL,
    fallback_model text DEFAULT NULL,
    limit_turns integer DEFAULT NULL,
    limit_items integer DEFAULT NULL,
    format text DEFAULT 'chat'
)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
-- Generic plans: the read statement's custom plan costs more than the read (its parameters
-- are the plan's values, for which the generic plan is as good). On Citus, install --citus
-- makes it plan each call (docs/scaling.md).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    compacted boolean := false;
    extra text[] := '{}';
    plan record;
    planned boolean;
    changed integer := 0;
    history jsonb;
    plain boolean;
    converted jsonb;
    state text;
    message text;
    detail text;
    hint text;
BEGIN
    @citus_read_snapshot@
    -- An argument over 64 kB is measured before session_read_plan's PL/Python would copy it
    -- (sql/12_argument_caps.sql).
    IF pg_catalog.pg_column_size(namespace) > 65536 OR pg_catalog.pg_column_size(actor_id) > 65536
       OR pg_catalog.pg_column_size(session_id) > 65536 THEN
        PERFORM aidb_memory.refuse_oversized('session_messages', 'namespace', namespace, namespace);
        PERFORM aidb_memory.refuse_oversized('session_messages', 'actor_id', namespace, actor_id);
        PERFORM aidb_memory.refuse_oversized('session_messages', 'session_id', namespace, session_id);
    END IF;
    -- Refused before the read: a compacting read would pay a model call first.
    IF format IS NULL OR format NOT IN ('chat', 'responses') THEN
        RAISE EXCEPTION 'format must be chat or responses'
            USING ERRCODE = '22023',
                  HINT = 'chat: Chat Completions messages; responses: a Responses API input list';
    END IF;
    -- The read of session_get, its items only.
    LOOP
        @fast_read_plan@
        IF NOT planned THEN
            SELECT * INTO plan
            FROM aidb_memory.session_read_plan($1, $2, $3, $4, $5, $6, $7, 'session_messages');
        END IF;
        IF plan.compact AND NOT compacted THEN
            -- Once per read: compact, then plan again (the new summary, or the history as it
            -- was with the warning that says why there is none).
            extra := aidb_memory.session_compact($1, $2, $3, $4, $5);
            compacted := true;
            CONTINUE;
        END IF;
        -- session_get's read statement, written there (install puts it here).
        IF plan.summary_room >= 0 AND plan.by_items THEN
        SELECT r.items INTO history FROM (
        @read_head@
        @read_items@
        @read_range@
                ) AS f
        @read_end@
        @read_summaries@
        @read_tail@
        ) AS r;
        ELSIF plan.summary_room >= 0 THEN
        SELECT r.items INTO history FROM (
        @read_head@
        @read_rounds@
        @read_range@
                ORDER BY t.char_offset, t.seq
        @read_end@
        @read_summaries@
        @read_tail@
        ) AS r;
        ELSIF plan.by_items THEN
        SELECT r.items INTO history FROM (
        @read_head@
        @read_items@
        @read_range@
                ) AS f
        @read_end@
        @read_no_summaries@
        @read_tail@
        ) AS r;
        ELSE
        SELECT r.items INTO history FROM (
        @read_head@
        @read_rounds@
        @read_range@
                ORDER BY t.char_offset, t.seq
        @read_end@
        @read_no_summaries@
        @read_tail@
        ) AS r;
        END IF;
        EXIT WHEN FOUND;
        changed := changed + 1;
        IF changed >= 100 THEN
            -- Writers that commit between every plan and its read: a read that cannot finish.
            RAISE EXCEPTION 'the session changed during each of % reads', changed
                USING ERRCODE = '40001', HINT = 'retry the read';
        END IF;
    END LOOP;
    IF format = 'responses' THEN
        -- Summaries, items stored in the Responses shape and plain messages, as
        -- items.to_responses renders them, without entering Python (issue 14); a list with
        -- anything else (tool calls or results, an item stored in the chat shape) goes there
        -- whole (tests/db/test_read_responses.py compares both).
        SELECT bool_and(
                   CASE
                       WHEN e.item->>'kind' = 'summary' THEN true
                       WHEN e.item ? 'item'
                           THEN e.item->>'format' = 'responses'
                                AND jsonb_typeof(e.item->'item') = 'object'
                       ELSE NOT e.item ? 'tool_calls'
                            AND jsonb_typeof(e.item->'content') = 'string'
                            AND (e.item->>'role' IN ('user', 'system')
                                 OR (e.item->>'role' = 'assistant'
                                     AND e.item->>'content' <> ''))
                   END),
               coalesce(jsonb_agg(
                   CASE
                       WHEN e.item->>'kind' = 'summary' THEN
                           jsonb_build_object('role', 'system', 'content', e.item->'content')
                       WHEN e.item ? 'item' THEN e.item->'item'
                       ELSE jsonb_build_object('role', e.item->'role',
                                               'content', e.item->'content')
                   END ORDER BY e.ord), '[]'::jsonb)
        INTO plain, converted
        FROM jsonb_array_elements(history) WITH ORDINALITY AS e(item, ord);
        IF plain IS NOT FALSE THEN
            RETURN converted;
        END IF;
        RETURN aidb_memory.session_convert(history, format);
    END IF;
    -- Chat turns as they have always been rendered (items.chat_message), without entering
    -- Python, in one pass that also sees whether a turn holds its caller's own object (then
    -- Python renders the list).
    SELECT bool_and(NOT e.item ? 'item'),
           coalesce(jsonb_agg(
               CASE
                   WHEN e.item->>'kind' = 'summary' THEN
                       jsonb_build_object('role', 'system', 'content', e.item->>'content')
                   WHEN e.item->>'role' = 'tool' THEN
                       jsonb_build_object('role', 'tool', 'tool_call_id', e.item->>'tool_call_id',
                                          'content', e.item->>'content')
                   WHEN e.item ? 'tool_calls' THEN
                       jsonb_build_object('role', 'assistant', 'content', e.item->'content',
                                          'tool_calls', e.item->'tool_calls')
                       || jsonb_strip_nulls(jsonb_build_object('name', e.item->'name'))
                   WHEN e.item ? 'name' THEN
                       jsonb_build_object('role', e.item->>'role', 'content', e.item->>'content',
                                          'name', e.item->'name')
                   ELSE
                       jsonb_build_object('role', e.item->>'role', 'content', e.item->>'content')
               END ORDER BY e.ord), '[]'::jsonb)
    INTO plain, converted
    FROM jsonb_array_elements(history) WITH ORDINALITY AS e(item, ord);
    IF plain IS NOT FALSE THEN
        RETURN converted;
    END IF;
    RETURN aidb_memory.session_convert(history, format);
EXCEPTION WHEN OTHERS OR query_canceled THEN
    -- As in session_get: one CONTEXT line instead of our internal queries.
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
        detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    message := 'aidb_memory.session_messages: '
               || pg_catalog.regexp_replace(message, '^aidb_memory\.\w+: ', '');
    -- RAISE sends an empty DETAIL or HINT as one, and refuses a NULL: name only those present.
    IF detail <> '' AND hint <> '' THEN
        RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message, DETAIL = detail, HINT = hint;
    ELSIF detail <> '' THEN
        RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message, DETAIL = detail;
    ELSIF hint <> '' THEN
        RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message, HINT = hint;
    END IF;
    RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message;
END
$$;
COMMENT ON FUNCTION aidb_memory.session_messages(text, text, text, integer, text, integer, integer, text) IS
'The same history as session_get, ready for a model: format chat (the default) gives OpenAI chat '
'messages for chat.completions.create (summaries as system messages, tool calls and results in '
'OpenAI''s format); format responses gives a Responses API input list for responses.create. '
'Turns stored in either shape come out in the one asked for. Same parameters and errors as '
'session_get, and 22023 for another format.';

CREATE OR REPLACE FUNCTION aidb_memory.session_end(
    namespace text,
    actor_id text,
    session_id text,
    notes text DEFAULT NULL
)
RETURNS TABLE (handoff jsonb, closed_at timestamptz)
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ sessions.session_end $py$;
COMMENT ON FUNCTION aidb_memory.session_end(text, text, text, text) IS
'Close a session and store its handoff (no model call): notes, session and agent ids, times, turn '
'count, the last user prompt and the newest summary. A second call returns the stored handoff. '
'An unknown session returns no row. Errors: 22004, 22023, 42704, 42501.';

CREATE OR REPLACE FUNCTION aidb_memory.session_pop(namespace text, actor_id text, session_id text)
RETURNS jsonb
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ sessions.session_pop $py$;
COMMENT ON FUNCTION aidb_memory.session_pop(text, text, text) IS
'Undo: remove and return the newest turn (NULL when the session is empty); a summary covering it '
'is removed too. Pop until a user turn comes back to walk back a whole exchange. A compaction of '
'the session in flight is waited for at most 5 s (or lock_timeout, when shorter). Errors: 22004, '
'22023, 42704, 42501, 55000 closed session, 55P03 still being compacted.';

CREATE OR REPLACE FUNCTION aidb_memory.session_list(
    namespace text,
    actor_id text,
    agent_id text DEFAULT NULL,
    include_closed boolean DEFAULT true,
    "limit" integer DEFAULT 50
)
-- A type rather than RETURNS TABLE: the PL/pgSQL wrapper (codebundle.BODY_SUFFIX) cannot
-- have an argument and a result column of one name; migrations/0009_result_types.sql.
RETURNS SETOF aidb_memory.session_list_result
LANGUAGE plpython3u STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ sessions.session_list $py$;
COMMENT ON FUNCTION aidb_memory.session_list(text, text, text, boolean, integer) IS
'An actor''s sessions, most recently active first: index rows, never transcripts. agent_id filters; '
'include_closed false leaves closed sessions out; limit 1..1000. Errors: 22004, 22023, 42704, 42501.';

CREATE OR REPLACE FUNCTION aidb_memory.session_delete(
    namespace text,
    actor_id text,
    session_id text,
    reason text
)
RETURNS bigint
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ sessions.session_delete $py$;
COMMENT ON FUNCTION aidb_memory.session_delete(text, text, text, text) IS
'Delete a session with its turns and summaries; returns the number of turns removed. The reason is '
'required and recorded in the audit log, which keeps no content. Errors: 22004 NULL reason, 22023 '
'empty reason, 42704, 42501.';

-- Read through a function, as every view: sql/20_namespaces.sql says why.
CREATE OR REPLACE FUNCTION aidb_memory.sessions_rows()
RETURNS TABLE (namespace text, actor_id text, session_id text, agent_id text,
                started_at timestamptz, closed_at timestamptz, turn_count bigint,
                total_chars bigint, prev_handoff jsonb, handoff jsonb, updated_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
SELECT n.name AS namespace, s.actor_id, s.session_id, s.agent_id, s.started_at, s.closed_at,
       s.next_seq - 1 AS turn_count, s.total_chars, s.prev_handoff, s.handoff, s.updated_at
-- spans actors: admin view
FROM aidb_memory.session AS s
JOIN aidb_memory.namespace AS n ON n.id = s.namespace_id
$$;
COMMENT ON FUNCTION aidb_memory.sessions_rows() IS
'Internal: the rows of the view aidb_memory.sessions (its owner''s privileges).';

CREATE OR REPLACE VIEW aidb_memory.sessions AS
SELECT namespace, actor_id, session_id, agent_id, started_at, closed_at, turn_count, total_chars,
       prev_handoff, handoff, updated_at
FROM aidb_memory.sessions_rows();
COMMENT ON VIEW aidb_memory.sessions IS
'Admins: every session with its counts and handoffs. API roles cannot read it.';

-- Read through a function, as every view: sql/20_namespaces.sql says why.
CREATE OR REPLACE FUNCTION aidb_memory.events_rows()
RETURNS TABLE (event_id bigint, public_id uuid, correlation_id uuid, namespace_id bigint,
                actor_id text, agent_id text, session_id text, idempotency_key text,
                status text, attempts integer, last_error text, created_at timestamptz,
                processed_at timestamptz, kind text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
SELECT e.id AS event_id, e.public_id, e.correlation_id, e.namespace_id, e.actor_id, e.agent_id,
       e.session_id, e.idempotency_key, e.status, e.attempts, e.last_error, e.created_at,
       e.processed_at, e.kind
-- spans actors: admin view
FROM aidb_memory.event AS e
$$;
COMMENT ON FUNCTION aidb_memory.events_rows() IS
'Internal: the rows of the view aidb_memory.events (its owner''s privileges).';

CREATE OR REPLACE VIEW aidb_memory.events AS
SELECT event_id, public_id, correlation_id, namespace_id, actor_id, agent_id, session_id,
       idempotency_key, status, attempts, last_error, created_at, processed_at, kind
FROM aidb_memory.events_rows();
COMMENT ON VIEW aidb_memory.events IS
'Admins and workers: the queue. The long-term-memory event each add recorded (kind extraction) '
'and the compaction tasks add queued for the worker (kind compaction: a session''s next summary, '
'written ahead of its reads), with their status (accepted, processing, processed, failed, '
'skipped; a compaction task is skipped when dropped without a model call).';
