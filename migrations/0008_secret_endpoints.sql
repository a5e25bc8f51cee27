-- Secrets bound to the endpoints they may be sent to (issue 9, item 8): a model whose base_url
-- is elsewhere cannot use the secret, so no admin can point a model at a listener of theirs and
-- receive a key they were never given.

-- scheme://host:port, normalized as endpoints.endpoint() does (lower case, default port filled
-- in). Nullable on purpose, like value: a failing NOT NULL or CHECK would print the row, and
-- with it the secret. The code reads NULL as "may be sent nowhere".
ALTER TABLE aidb_memory.secret ADD COLUMN endpoints text[];

-- Existing secrets: the endpoints of the models that use them today, so that an upgrade breaks
-- no model; a secret no model uses gets OpenAI's default endpoint, as a new secret stored
-- without endpoints does. base_url was validated by create_model (http or https, a host, no
-- credentials, query or fragment); a model without one goes to https://api.openai.com/v1.
UPDATE aidb_memory.secret s
SET endpoints = coalesce(
    (SELECT pg_catalog.array_agg(DISTINCT u.endpoint ORDER BY u.endpoint)
     FROM (
         SELECT CASE
                    WHEN p.parts IS NULL THEN 'https://api.openai.com:443'
                    ELSE pg_catalog.lower(p.parts[1]) || '://'
                         || pg_catalog.regexp_replace(pg_catalog.lower(p.parts[2]), '\.$', '')
                         || ':'
                         || coalesce(NULLIF(p.parts[3], '')::integer::text,
                                     CASE pg_catalog.lower(p.parts[1])
                                         WHEN 'https' THEN '443' ELSE '80' END)
                END AS endpoint
         FROM aidb_memory.model m
         CROSS JOIN LATERAL (
             SELECT pg_catalog.regexp_match(
                        m.options ->> 'base_url',
                        '^([A-Za-z][A-Za-z0-9+.-]*)://(\[[^]]*\]|[^/:?#]*)(?::([0-9]*))?'
                    ) AS parts
         ) p
         WHERE m.options ->> 'api_key_secret' = s.name
     ) u),
    ARRAY['https://api.openai.com:443']
);

-- set_secret gains the endpoints (sql/40_models.sql); the two-argument version would make a
-- two-argument call ambiguous.
DROP FUNCTION IF EXISTS aidb_memory.set_secret(text, text);
