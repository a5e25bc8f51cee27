-- Registered models, the secrets (API keys) they use, and the usage of every model call
-- (SPEC §2, §4). Only admins register models; no API role can read a secret or the usage.

CREATE TABLE aidb_memory.model (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    provider    text NOT NULL CHECK (provider IN ('openai', 'builtin')),
    -- Never a key: options name a secret (api_key_secret) or an environment variable
    -- (api_key_env); the key itself lives in aidb_memory.secret or the server's environment.
    options     jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(options) = 'object'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- No constraint on value: a failing check would print the row, and with it the secret.
CREATE TABLE aidb_memory.secret (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    value       text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per model call: what went in and out, how long it took and how it ended. No content.
CREATE TABLE aidb_memory.model_usage (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    model_name   text NOT NULL,
    namespace_id bigint REFERENCES aidb_memory.namespace (id) ON DELETE SET NULL,
    purpose      text NOT NULL,
    chars_in     bigint NOT NULL DEFAULT 0,
    chars_out    bigint NOT NULL DEFAULT 0,
    tokens_in    bigint,
    tokens_out   bigint,
    latency_ms   bigint,
    outcome      text NOT NULL,
    error        text
);
CREATE INDEX model_usage_at_idx ON aidb_memory.model_usage (at);
CREATE INDEX model_usage_model_idx ON aidb_memory.model_usage (model_name, at);
CREATE INDEX model_usage_namespace_idx ON aidb_memory.model_usage (namespace_id);
