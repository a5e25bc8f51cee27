-- add's common case without Python (issue 33): a batch of plain chat messages appended to an open
-- session. The wrapper of aidb_memory.add calls this first (codebundle.FAST_SUFFIX) and the
-- PL/Python body (adding.add) only when it returns NULL, which it does, having written nothing,
-- for anything but that case: a batch that is not plain messages by turns._plain_batch's rule or
-- opens with a system turn (the instructions prefix may grow), a namespace limit exceeded, an
-- identifier that is not plainly valid (no control character, a visible ASCII character), no
-- such or a closed session, one with open tool calls, an idempotency key, memory_metadata, an
-- inactive namespace, an actor that is not the bound one. The Python code then decides and
-- refuses with its errors. For a batch it takes, it writes what adding._fast_add would
-- (tests/db/test_add_fast.py holds the two equal, and its config defaults equal to
-- validation.CONFIG_DEFAULTS).
--
-- Why: a PL/Python call with its conversions and its statement's subtransaction cost add ~40%
-- more server time than the statement itself (bench/README.md, issue 33); this costs ~10%.
DROP FUNCTION IF EXISTS aidb_memory.add_fast(text, text, jsonb, text, text, text);
CREATE OR REPLACE FUNCTION aidb_memory.add_fast(
    namespace text,
    actor_id text,
    turns jsonb,
    session_id text DEFAULT NULL,
    agent_id text DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    memory_metadata jsonb DEFAULT NULL
)
RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
BEGIN
    -- The wrapper of add runs this block as it is (codebundle.FAST_SUFFIX): it returns the
    -- event's id when it wrote the batch and falls through, having written nothing, otherwise.
    DECLARE
        _key bigint;
        _done record;
        _ahead record;
        -- A namespace with grants (issue 35): the statement below takes it only through a grant
        -- of it to _role, a role whose privileges the caller has (checked here, in expressions:
        -- on Citus the statement runs on a worker, as another role). _role is the one that let
        -- this backend in last (kept in the setting aidb_memory.granted_role: a hint, which
        -- whoever sets it can only make the statement find nothing), else namespace_role's,
        -- asked once the statement found nothing in a namespace with grants. Without the hint
        -- every call would cost a statement more (~25 us, bench/README.md).
        _hint text := current_setting('aidb_memory.granted_role', true);
        _role oid;
        _role_name name;
        _found oid;
    BEGIN
        IF $1 IS NOT NULL AND $2 IS NOT NULL AND $3 IS NOT NULL AND $4 IS NOT NULL
           AND $6 IS NULL AND $7 IS NULL AND jsonb_typeof($3) = 'array'
           -- Identifiers the Python code takes as they are: no control character, and a visible
           -- ASCII character (so not empty after strip()); any other, the Python code judges.
           AND $2 ~ '[!-~]' AND $2 !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]'
           AND $4 ~ '[!-~]' AND $4 !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]'
           AND ($5 IS NULL OR ($5 ~ '[!-~]' AND $5 !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]')) THEN
            -- aidb_memory.actor_key($1, $2), written out: a SQL function called from PL/pgSQL is
            -- planned again in every transaction (~40 us).
            _key := ('x' || encode(substr(sha256(convert_to($1 || ':' || $2, 'UTF8')), 1, 8),
                                   'hex'))::bit(64)::bigint;
            -- BEGIN granted_role_hint
            IF _hint ~ '^[1-9][0-9]{0,9}$' THEN  -- (an OID; anything else, no hint)
                IF _hint::bigint < 4294967296 THEN
                    _role := _hint::bigint::oid;
                    IF pg_has_role(coalesce(nullif(current_setting('role'), 'none'), session_user),
                                   _role, 'USAGE') THEN
                        _role_name := pg_get_userbyid(_role);
                    END IF;
                END IF;
            END IF;
            -- END granted_role_hint
            LOOP
                IF current_setting('aidb_memory.shard_routed', true) IS DISTINCT FROM 'on' THEN
                    WITH x AS (
                        -- BEGIN add_fast_rows
                        SELECT u.o, u.t->>'role' AS role, u.t->>'content' AS content,
                               length(u.t->>'content') AS chars,
                               -- turns._plain_batch: {"role", "content"}, a plain role, non-empty
                               -- string content; a batch that opens with a system turn (the
                               -- instructions prefix may grow) is the Python code's.
                               -- (NULL, for a key that is missing, is no: bool_and would skip it.)
                               coalesce(CASE WHEN jsonb_typeof(u.t) = 'object'
                                             THEN u.t - 'role' - 'content' = '{}'::jsonb
                                                  AND jsonb_typeof(u.t->'role') = 'string'
                                                  AND (u.t->>'role' IN ('user', 'assistant')
                                                       OR (u.t->>'role' = 'system' AND u.o > 1))
                                                  AND jsonb_typeof(u.t->'content') = 'string'
                                                  AND u.t->>'content' <> '' END,
                                        false) AS plain
                        FROM jsonb_array_elements($3) WITH ORDINALITY AS u(t, o)
                        -- END add_fast_rows
                    ), agg AS (
                        -- BEGIN add_fast_agg
                        SELECT count(*) AS n, coalesce(bool_and(plain), false) AS plain,
                               max(chars) AS longest, coalesce(sum(chars), 0) AS total,
                               max(o) FILTER (WHERE role = 'user') - 1 AS last_user
                        -- END add_fast_agg
                        FROM x
                    ), s AS (
                        -- BEGIN add_fast_update
                        UPDATE aidb_memory.session AS s
                        SET next_seq = s.next_seq + agg.n, total_chars = s.total_chars + agg.total,
                            updated_at = now(), tail_sequence_id = NULL,
                            tail_round_start = s.next_seq + agg.n - 1, open_calls = '{}',
                            last_user_seq = coalesce(s.next_seq + agg.last_user, s.last_user_seq),
                            tail_joinable = false, tail_item_type = NULL
                        -- END add_fast_update
                        FROM aidb_memory.namespace AS n, agg
                        -- BEGIN add_fast_where
                        WHERE n.name = $1 AND n.state = 'ACTIVE'
                          -- (the grants' copies in the namespace row: a subquery on
                          -- namespace_grant would cost every call, of open namespaces too, its
                          -- executor set-up)
                          AND (NOT n.restricted
                               OR n.grant_role_names[array_position(n.grant_role_ids, _role)]
                                  = _role_name)
                          AND agg.plain AND agg.n >= 1
                          AND agg.n <= coalesce((n.config->>'max_turns_per_add')::int, 1000)
                          AND agg.longest <= coalesce((n.config->>'max_turn_chars')::int, 100000)
                          -- parse_turns's cap on the batch's JSON text, which is made only when
                          -- the batch could be over it: a plain batch's text (jsonb's output) is
                          -- at most 38 characters a turn besides its contents, and 6 a character
                          -- of content (\uXXXX for a control character).
                          AND (40 * agg.n + 6 * agg.total
                                   <= coalesce((n.config->>'max_add_chars')::int, 1000000)
                               OR length($3::text)
                                  <= coalesce((n.config->>'max_add_chars')::int, 1000000))
                          AND greatest(length($2), length($4), length($5))
                              <= coalesce((n.config->>'max_identifier_chars')::int, 255)
                          AND (coalesce(n.config->>'actor_binding', 'none') <> 'session_user'
                               OR $2 = session_user)
                          AND s.actor_key = _key AND s.namespace_id = n.id AND s.actor_id = $2
                          AND s.session_id = $4 AND s.closed_at IS NULL AND s.open_calls = '{}'
                        RETURNING s.id, s.namespace_id, s.next_seq - agg.n AS first_seq,
                                  s.total_chars - agg.total AS first_offset, s.total_chars,
                                  -- adding._event_status and adding._ahead_on
                                  CASE WHEN NOT coalesce((n.config->>'extraction')::boolean, true)
                                         OR (coalesce(n.config->>'extraction_mode', 'auto')
                                             = 'model'
                                             AND coalesce(n.model_spec->>'llm', '') = '')
                                       THEN 'skipped' ELSE 'accepted' END AS status,
                                  coalesce((n.config->>'compaction_ahead')::boolean, true)
                                      AND coalesce(n.model_spec->>'llm', '') <> '' AS ahead_on
                        -- END add_fast_where
                    ), e AS (
                        INSERT INTO aidb_memory.event
                            (actor_key, namespace_id, actor_id, agent_id, session_id, turn_count,
                             status)
                        SELECT _key, s.namespace_id, $2, $5, $4, agg.n, s.status FROM s, agg
                        RETURNING id, public_id
                    ), t AS (
                        INSERT INTO aidb_memory.turn
                            (actor_key, session_ref, seq, round_start, char_offset, chars, role,
                             content, kind, meta, event_ref)
                        -- BEGIN add_fast_turns
                        SELECT _key AS actor_key, s.id AS session_ref, s.first_seq + x.o - 1 AS seq,
                               s.first_seq + x.o - 1 AS round_start,
                               s.first_offset + sum(x.chars) OVER (ORDER BY x.o) - x.chars
                                   AS char_offset,
                               x.chars, x.role, x.content,
                               CASE x.role WHEN 'user' THEN 'user_prompt'
                                           WHEN 'assistant' THEN 'model_response' ELSE 'system' END
                                   AS kind,
                               '{}'::jsonb AS meta, e.id AS event_ref
                        -- END add_fast_turns
                        FROM s, e, x
                    )
                    -- BEGIN add_fast_done
                    SELECT e.public_id, s.id AS ref, s.namespace_id, s.total_chars, s.ahead_on,
                           CASE WHEN s.status = 'accepted'
                                THEN pg_notify('aidb_memory_events', '') END AS woke
                    INTO _done
                    -- END add_fast_done
                    FROM e CROSS JOIN s;
                ELSE
                    -- On Citus (install --citus sets aidb_memory.shard_routed on add): the same
                    -- writes as statements Citus sends whole to the actor's shard, each with the
                    -- key a constant. The one statement above is a plan in steps there, its rows
                    -- copied to every worker as intermediate results and committed in two phases
                    -- (20 remote commands an add, against 6; docs/scaling.md).
                    DECLARE
                        agg record;
                        _s record;
                        _e record;
                        _t record;
                    BEGIN
                        @add_fast_agg@
                        INTO agg
                        FROM (
                        @add_fast_rows@
                        ) AS x;
                        SELECT NULL::uuid AS public_id INTO _done;  -- (nothing written)
                        IF agg.plain AND agg.n >= 1 THEN
                            @add_fast_update@
                            FROM aidb_memory.namespace AS n
                            @add_fast_where@
                            INTO _s;
                            IF FOUND THEN
                                INSERT INTO aidb_memory.event
                                    (actor_key, namespace_id, actor_id, agent_id, session_id,
                                     turn_count, status)
                                VALUES (_key, _s.namespace_id, $2, $5, $4, agg.n, _s.status)
                                RETURNING id, public_id INTO _e;
                                -- A row at a time: Citus sends an INSERT ... VALUES to the
                                -- shard, and copies the rows of an INSERT ... SELECT, which it
                                -- commits in two phases.
                                FOR _t IN
                                    @add_fast_turns@
                                    FROM (SELECT _s.id, _s.first_seq, _s.first_offset) AS s,
                                         (SELECT _e.id) AS e,
                                         (
                                         @add_fast_rows@
                                         ) AS x
                                LOOP
                                    INSERT INTO aidb_memory.turn
                                        (actor_key, session_ref, seq, round_start, char_offset,
                                         chars, role, content, kind, meta, event_ref)
                                    VALUES (_t.actor_key, _t.session_ref, _t.seq, _t.round_start,
                                            _t.char_offset, _t.chars, _t.role, _t.content, _t.kind,
                                            _t.meta, _t.event_ref);
                                END LOOP;
                                @add_fast_done@
                                FROM (SELECT _e.public_id) AS e,
                                     (SELECT _s.id, _s.namespace_id, _s.total_chars, _s.ahead_on,
                                             _s.status) AS s;
                            END IF;
                        END IF;
                    END;
                END IF;
                IF _done.public_id IS NOT NULL THEN
                    IF _done.ahead_on THEN
                        -- adding._ahead_budget: this add passed the session's ahead threshold; one
                        -- task pending at most (as adding._QUEUE_COMPACTION).
                        SELECT l.ahead_at, l.read_budget INTO _ahead
                        FROM aidb_memory.compaction_ahead AS l
                        WHERE l.actor_key = _key AND l.session_ref = _done.ref;
                        IF _done.total_chars > _ahead.ahead_at AND _ahead.read_budget IS NOT NULL THEN
                            INSERT INTO aidb_memory.event
                                (actor_key, namespace_id, actor_id, session_id, turn_count, status,
                                 kind, session_ref, budget)
                            VALUES (_key, _done.namespace_id, $2, $4, 0, 'accepted', 'compaction',
                                    _done.ref, _ahead.read_budget)
                            ON CONFLICT (actor_key, session_ref)
                                WHERE kind = 'compaction' AND status IN ('accepted', 'processing')
                            DO NOTHING;
                            IF FOUND THEN
                                PERFORM pg_notify('aidb_memory_events', '');
                            END IF;
                        END IF;
                    END IF;
                    RETURN _done.public_id;
                END IF;
                -- Nothing written: in a namespace with grants, the role that lets the caller in,
                -- unless the statement already tried it.
                -- BEGIN granted_role_retry
                PERFORM FROM aidb_memory.namespace AS n WHERE n.name = $1 AND n.restricted;
                EXIT WHEN NOT FOUND;
                _found := aidb_memory.namespace_role($1);
                EXIT WHEN _found IS NULL OR (_found = _role AND _role_name IS NOT NULL);
                PERFORM set_config('aidb_memory.granted_role', _found::text, false);
                _role := _found;
                _role_name := pg_get_userbyid(_found);
                -- END granted_role_retry
            END LOOP;
        END IF;
    END;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION aidb_memory.add_fast(text, text, jsonb, text, text, text, jsonb) IS
'Internal: aidb_memory.add of plain chat messages to an open session in one statement, without '
'Python (with aidb_memory.shard_routed on, as install --citus sets it: in statements Citus routes '
'to the actor''s shard); NULL (nothing written) for any other call, which the PL/Python body then '
'takes.';
