"""Namespaces: ``init`` and ``namespace_update`` (SPEC §2). Admin functions."""

from __future__ import annotations

import json
from typing import Any

from aidb_memory_server import db, models, validation
from aidb_memory_server.errors import UNDEFINED_OBJECT, ApiError, invalid

_INSERT = """
INSERT INTO aidb_memory.namespace (name, model_spec, config)
VALUES ($1, $2::jsonb, $3::jsonb)
ON CONFLICT (name) DO NOTHING
RETURNING id
"""
_SELECT = """
SELECT id, model_spec::text, config::text, state FROM aidb_memory.namespace WHERE name = $1
"""
_LOCK = _SELECT + "FOR UPDATE"
# The time is a parameter (db.clock) and the timestamps are formatted outside the UPDATE: Citus
# takes neither a VOLATILE function in an UPDATE of a reference table nor a STABLE one (to_json)
# in its RETURNING.
_UPDATE = """
WITH u AS (
    UPDATE aidb_memory.namespace
    SET model_spec = $2::jsonb, config = $3::jsonb, state = $4, updated_at = $5
    WHERE id = $1
    RETURNING id, name, model_spec, config, state, created_at, updated_at
)
SELECT id, name, model_spec::text, config::text, state,
       to_json(created_at) #>> '{}' AS created_at, to_json(updated_at) #>> '{}' AS updated_at
FROM u
"""
# The built-in text search configurations (config.text_search_config): only pg_catalog's, which
# no user can replace, so that what memory.lexemes holds is made by code the server owns.
_TEXT_SEARCH_CONFIG = """
SELECT 1 FROM pg_catalog.pg_ts_config
WHERE cfgname = $1 AND cfgnamespace = 'pg_catalog'::pg_catalog.regnamespace
"""
# A namespace's memories are re-indexed when its text search configuration changes: an admin's
# call, never an application's.
_REINDEX = """
-- spans actors: namespace_update re-indexes the namespace's memories (admins)
UPDATE aidb_memory.memory
SET lexemes = pg_catalog.to_tsvector($2::pg_catalog.regconfig, content)
WHERE namespace_id = $1
"""
# Timestamps travel to Python and back as text: ISO 8601 with a numeric offset (what to_json
# writes whatever DateStyle is) reads back exactly, where DateStyle's output may not (under
# DateStyle Postgres, Asia/Kolkata prints "IST", which reads back as Israel time).


def init(name: str | None, model_spec: str | None, config: str | None) -> int:
    """Create namespace ``name`` and return its id; an existing name returns its id unchanged."""
    fn = "init"
    name = validation.namespace_name(fn, name)
    spec = validation.model_spec(fn, validation.json_object(fn, "model_spec", model_spec))
    cfg = validation.config(fn, validation.json_object(fn, "config", config))
    _require_text_search_config(fn, cfg)
    models.require_registered(fn, spec)
    spec_text, cfg_text = json.dumps(spec), json.dumps(cfg)
    rows = db.execute(_INSERT, ("text", "text", "text"), (name, spec_text, cfg_text))
    if rows.nrows():
        return int(rows[0]["id"])
    existing = db.execute(_SELECT, ("text",), (name,))[0]
    if json.loads(existing["model_spec"]) != spec or json.loads(existing["config"]) != cfg:
        db.notice(
            f'aidb_memory.init: namespace "{name}" already exists; its model_spec and config '
            "were left unchanged (use aidb_memory.namespace_update to change them)"
        )
    return int(existing["id"])


def namespace_update(
    name: str | None, model_spec: str | None, config: str | None, state: str | None
) -> list[dict[str, Any]]:
    """Change a namespace's model_spec and config (merged; null resets a key) or state."""
    fn = "namespace_update"
    name = validation.namespace_name(fn, name)
    rows = db.execute(_LOCK, ("text",), (name,))
    if not rows.nrows():
        raise ApiError(
            UNDEFINED_OBJECT,
            f'aidb_memory.namespace_update: namespace "{name}" does not exist',
            hint="create it with aidb_memory.init",
        )
    row = rows[0]
    spec = json.loads(row["model_spec"])
    new_models: dict[str, Any] = {}
    if model_spec is not None:
        spec_changes = validation.json_object(fn, "model_spec", model_spec)
        new_models = validation.model_spec(fn, spec_changes)
        spec = validation.merge(spec, spec_changes)
    cfg = json.loads(row["config"])
    if config is not None:
        cfg_changes = validation.json_object(fn, "config", config)
        validation.config(fn, cfg_changes)  # the changes themselves: a typo set to null too
        _require_text_search_config(fn, cfg_changes)
        cfg = validation.merge(cfg, cfg_changes)
    new_state = validation.state(fn, state) if state is not None else row["state"]
    models.require_registered(fn, new_models)  # only what changes: the rest was checked
    updated = db.execute(
        _UPDATE,
        ("bigint", "text", "text", "text", "timestamptz"),
        (row["id"], json.dumps(spec), json.dumps(cfg), new_state, db.clock()),
    )
    before = validation.effective_config(json.loads(row["config"]))["text_search_config"]
    after = validation.effective_config(cfg)["text_search_config"]
    if after != before:
        db.execute(_REINDEX, ("bigint", "text"), (row["id"], "pg_catalog." + after))
    return [dict(updated[0])]


def _require_text_search_config(fn: str, cfg: dict[str, Any]) -> None:
    """22023 unless config.text_search_config, when set, is a configuration of pg_catalog."""
    name = cfg.get("text_search_config")
    if name is not None and not db.execute(_TEXT_SEARCH_CONFIG, ("text",), (name,)).nrows():
        raise invalid(
            fn,
            "config.text_search_config",
            f'names no text search configuration of pg_catalog ("{name}")',
            hint="SELECT cfgname FROM pg_catalog.pg_ts_config lists them (english, simple, ...)",
        )
