-- Calling a registered model once, to check its endpoint, key and answer (SPEC §2, §4).

CREATE OR REPLACE FUNCTION aidb_memory.model_check(
    name text,
    prompt text DEFAULT 'Reply with OK.'
)
RETURNS jsonb
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ llm.model_check $py$;
COMMENT ON FUNCTION aidb_memory.model_check(text, text) IS
'Admin: call model `name` once with `prompt` and return {"ok", "model", "latency_ms", "reply" '
'(first 200 characters), "error"}; the call is recorded in model_usage with purpose check. A '
'failed call (HTTP error, malformed answer, timeout, no connection) is ok=false, not an error; '
'no key ever appears in the result. Errors: 22004 NULL name, 22023 bad name, 42704 unknown '
'model, 57014 the statement was cancelled.';
