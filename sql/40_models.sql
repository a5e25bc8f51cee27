-- Models and secrets (SPEC §2): registered by admins; no API role can read a secret.

CREATE OR REPLACE FUNCTION aidb_memory.create_model(
    name text,
    provider text,
    options jsonb DEFAULT '{}'::jsonb
)
RETURNS bigint
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ models.create_model $py$;
COMMENT ON FUNCTION aidb_memory.create_model(text, text, jsonb) IS
'Admin: register model `name` and return its id; an existing name keeps its id and gets the new '
'provider and options. provider openai (any OpenAI-compatible endpoint; options model, base_url, '
'api_key_secret or api_key_env, timeout_s, max_retries) or builtin ({"kind": "extractive"}). '
'Options never hold a key: store it with set_secret. Errors: 22004 NULL argument, 22023 bad '
'name, provider or options, 42704 unknown api_key_secret.';

CREATE OR REPLACE FUNCTION aidb_memory.drop_model(name text)
RETURNS void
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ models.drop_model $py$;
COMMENT ON FUNCTION aidb_memory.drop_model(text) IS
'Admin: remove model `name`. Errors: 42704 unknown model, 55000 a namespace''s model_spec names '
'it (change that first with namespace_update).';

-- The two-argument set_secret of 0.x is dropped by migrations/0008_secret_endpoints.sql.
CREATE OR REPLACE FUNCTION aidb_memory.set_secret(
    name text,
    value text,
    endpoints text[] DEFAULT NULL
)
RETURNS void
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ models.set_secret $py$;
COMMENT ON FUNCTION aidb_memory.set_secret(text, text, text[]) IS
'Admin: store (or replace) the secret `name`, e.g. an API key that a model names in '
'options.api_key_secret, bound to `endpoints` (http(s) URLs; only scheme, host and port count): '
'no model whose base_url is elsewhere can use it. NULL endpoints: https://api.openai.com:443 for '
'a new secret, the endpoints it had for a replaced one. No API role can read it back; no message '
'ever shows it. Errors: 22004 NULL name or value, 22023 bad name, value or endpoint, 55000 a '
'model using it would be cut off.';

CREATE OR REPLACE FUNCTION aidb_memory.drop_secret(name text)
RETURNS void
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ models.drop_secret $py$;
COMMENT ON FUNCTION aidb_memory.drop_secret(text) IS
'Admin: remove the secret `name`. Errors: 42704 unknown secret, 55000 a model names it in '
'options.api_key_secret (re-register that model first).';

-- Read through a function, as every view: sql/20_namespaces.sql says why.
CREATE OR REPLACE FUNCTION aidb_memory.models_rows()
RETURNS TABLE (name text, provider text, options jsonb, created_at timestamptz,
                updated_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
SELECT name, provider, options, created_at, updated_at
FROM aidb_memory.model
$$;
COMMENT ON FUNCTION aidb_memory.models_rows() IS
'Internal: the rows of the view aidb_memory.models (its owner''s privileges).';

CREATE OR REPLACE VIEW aidb_memory.models AS
SELECT name, provider, options, created_at, updated_at
FROM aidb_memory.models_rows();
COMMENT ON VIEW aidb_memory.models IS
'Admin: every registered model with its provider and options (which never hold a key).';

-- Read through a function, as every view: sql/20_namespaces.sql says why.
CREATE OR REPLACE FUNCTION aidb_memory.secrets_rows()
RETURNS TABLE (name text, endpoints text[], created_at timestamptz, updated_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
SELECT name, endpoints, created_at, updated_at
FROM aidb_memory.secret
$$;
COMMENT ON FUNCTION aidb_memory.secrets_rows() IS
'Internal: the rows of the view aidb_memory.secrets (its owner''s privileges; never a secret''s value).';

CREATE OR REPLACE VIEW aidb_memory.secrets AS
SELECT name, endpoints, created_at, updated_at
FROM aidb_memory.secrets_rows();
COMMENT ON VIEW aidb_memory.secrets IS
'Admin: every stored secret''s name and the endpoints it may be sent to; never its value.';

-- Read through a function, as every view: sql/20_namespaces.sql says why.
CREATE OR REPLACE FUNCTION aidb_memory.model_calls_rows()
RETURNS TABLE (id bigint, at timestamptz, model_name text, namespace_id bigint, purpose text,
                chars_in bigint, chars_out bigint, tokens_in bigint, tokens_out bigint,
                latency_ms bigint, outcome text, error text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
SELECT id, at, model_name, namespace_id, purpose, chars_in, chars_out, tokens_in, tokens_out,
       latency_ms, outcome, error
FROM aidb_memory.model_usage
$$;
COMMENT ON FUNCTION aidb_memory.model_calls_rows() IS
'Internal: the rows of the view aidb_memory.model_calls (its owner''s privileges).';

CREATE OR REPLACE VIEW aidb_memory.model_calls AS
SELECT id, at, model_name, namespace_id, purpose, chars_in, chars_out, tokens_in, tokens_out,
       latency_ms, outcome, error
FROM aidb_memory.model_calls_rows();
COMMENT ON VIEW aidb_memory.model_calls IS
'Admin: one row per model call (model, namespace, purpose, chars and tokens in and out, latency, '
'outcome, error without secrets). No content.';
