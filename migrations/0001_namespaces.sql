-- Namespaces: the top-level scope of every session and memory (SPEC §2).
CREATE TABLE aidb_memory.namespace (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    model_spec  jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(model_spec) = 'object'),
    config      jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(config) = 'object'),
    state       text NOT NULL DEFAULT 'ACTIVE' CHECK (state IN ('ACTIVE', 'INACTIVE')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- AIDB creates this namespace at install, with no model.
INSERT INTO aidb_memory.namespace (name) VALUES ('pg_agents');
