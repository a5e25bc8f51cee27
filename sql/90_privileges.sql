-- SPEC §6: nothing for PUBLIC; API roles get EXECUTE on the functions meant for them and no
-- privilege on any table. Re-applied on every install, so it covers every function.

REVOKE ALL ON SCHEMA aidb_memory FROM PUBLIC;
GRANT USAGE ON SCHEMA aidb_memory TO aidb_users, aidb_admins, aidb_workers;

REVOKE ALL ON ALL TABLES IN SCHEMA aidb_memory FROM PUBLIC, aidb_users, aidb_admins, aidb_workers;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA aidb_memory FROM PUBLIC, aidb_users, aidb_admins, aidb_workers;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA aidb_memory FROM PUBLIC, aidb_users, aidb_admins, aidb_workers;

-- Everyone who uses aidb_memory.
GRANT EXECUTE ON FUNCTION aidb_memory.version() TO aidb_users, aidb_workers;
GRANT SELECT ON aidb_memory.namespaces TO aidb_users, aidb_workers;
-- Each view reads through a function (sql/20_namespaces.sql says why): its readers execute it.
GRANT EXECUTE ON FUNCTION aidb_memory.namespaces_rows() TO aidb_users, aidb_workers;

-- The session API (SPEC §3).
GRANT EXECUTE ON FUNCTION
    aidb_memory.session_start(text, text, text, text),
    aidb_memory.add(text, text, jsonb, text, text, text, jsonb),
    aidb_memory.session_get(text, text, text, integer, text, integer, integer),
    aidb_memory.session_messages(text, text, text, integer, text, integer, integer, text),
    aidb_memory.session_end(text, text, text, text),
    aidb_memory.session_pop(text, text, text),
    aidb_memory.session_list(text, text, text, boolean, integer),
    aidb_memory.session_delete(text, text, text, text)
TO aidb_users;

-- The long-term-memory API (SPEC §5); dropping a namespace is for admins (SPEC §2).
GRANT EXECUTE ON FUNCTION
    aidb_memory.search(text, text, text, integer, text, text, double precision[], jsonb, integer),
    aidb_memory.remember(text, text, text, text, text, jsonb, text, timestamptz, integer),
    aidb_memory.list_memories(text, text, text, text, integer, boolean, jsonb, uuid),
    aidb_memory.get_memory(text, text, uuid, text, boolean),
    aidb_memory.update_memory(text, text, uuid, text, jsonb, text),
    aidb_memory.memory_history(text, text, uuid),
    aidb_memory.delete(text, text, jsonb, text, text, text),
    aidb_memory.forget(text, text, text),
    aidb_memory.list_actors(text, text, integer, text)
TO aidb_users;
GRANT EXECUTE ON FUNCTION aidb_memory.namespace_drop(text, text) TO aidb_admins;

-- Admins (aidb_admins is also a member of aidb_users).
GRANT EXECUTE ON FUNCTION
    aidb_memory.init(text, jsonb, jsonb),
    aidb_memory.namespace_update(text, jsonb, jsonb, text),
    aidb_memory.namespace_grant(text, text),
    aidb_memory.namespace_revoke(text, text),
    aidb_memory.runtime_info(),
    aidb_memory.catalog_fingerprint()
TO aidb_admins;
GRANT SELECT ON aidb_memory.sessions, aidb_memory.events TO aidb_admins;
GRANT EXECUTE ON FUNCTION aidb_memory.sessions_rows(), aidb_memory.events_rows() TO aidb_admins;

-- Models and secrets (SPEC §2): admins only. The secret and model_usage tables, like every
-- table, are readable by no API role (the REVOKE above); only a superuser reads them.
GRANT EXECUTE ON FUNCTION
    aidb_memory.create_model(text, text, jsonb),
    aidb_memory.drop_model(text),
    aidb_memory.set_secret(text, text, text[]),
    aidb_memory.drop_secret(text),
    aidb_memory.model_check(text, text)
TO aidb_admins;
GRANT SELECT ON aidb_memory.models, aidb_memory.model_calls, aidb_memory.secrets TO aidb_admins;
GRANT EXECUTE ON FUNCTION
    aidb_memory.models_rows(), aidb_memory.model_calls_rows(), aidb_memory.secrets_rows()
TO aidb_admins;
GRANT SELECT ON aidb_memory.events TO aidb_workers;
GRANT EXECUTE ON FUNCTION aidb_memory.events_rows() TO aidb_workers;

-- The extraction worker (SPEC §5): aidb_workers run process_events, which calls the internal
-- queue functions as its caller. The status of an event is the application's.
REVOKE ALL ON ALL PROCEDURES IN SCHEMA aidb_memory FROM PUBLIC, aidb_users, aidb_admins, aidb_workers;
GRANT EXECUTE ON PROCEDURE
    aidb_memory.process_events(
        integer, integer, integer, real, integer, integer, integer, jsonb, bigint, bigint)
TO aidb_workers;
GRANT EXECUTE ON FUNCTION
    aidb_memory.event_claim(integer, integer, bigint, bigint),
    aidb_memory.event_process(bigint, bigint, integer, real),
    aidb_memory.event_error(bigint, bigint, integer, real, text),
    aidb_memory.event_interrupted(bigint, bigint, integer, real, text),
    aidb_memory.event_remaining(),
    aidb_memory.event_brief(bigint, bigint),
    aidb_memory.event_batch_finished(),
    aidb_memory.expire_memories(integer, bigint, bigint)
TO aidb_workers;
-- Metrics (issue 36): for whoever runs or watches the worker; not the application, which has no
-- business with other namespaces' figures.
GRANT EXECUTE ON FUNCTION aidb_memory.metrics(integer) TO aidb_admins, aidb_workers;
GRANT EXECUTE ON FUNCTION aidb_memory.expire_memories(integer, bigint, bigint) TO aidb_admins;
GRANT EXECUTE ON FUNCTION aidb_memory.status(text, text, uuid) TO aidb_users;
-- Putting failed events back in the queue is for admins.
GRANT EXECUTE ON FUNCTION aidb_memory.events_retry(text, text, timestamptz) TO aidb_admins;
