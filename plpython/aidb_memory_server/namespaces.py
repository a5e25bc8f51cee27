"""Namespaces: ``init`` and ``namespace_update`` (SPEC §2). Admin functions."""

from __future__ import annotations

import json
from typing import Any

from aidb_memory_server import db, models, validation
from aidb_memory_server.errors import UNDEFINED_OBJECT, ApiError

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
# Timestamps travel to Python and back as text: ISO 8601 with a numeric offset (what to_json
# writes whatever DateStyle is) reads back exactly, where DateStyle's output may not (under
# DateStyle Postgres, Asia/Kolkata prints "IST", which reads back as Israel time).


def init(name: str | None, model_spec: str | None, config: str | None) -> int:
    """Create namespace ``name`` and return its id; an existing name returns its id unchanged."""
    fn = "init"
    name = validation.namespace_name(fn, name)
    spec = validation.model_spec(fn, validation.json_object(fn, "model_spec", model_spec))
    cfg = validation.config(fn, validation.json_object(fn, "config", config))
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
        cfg = validation.merge(cfg, cfg_changes)
    new_state = validation.state(fn, state) if state is not None else row["state"]
    models.require_registered(fn, new_models)  # only what changes: the rest was checked
    updated = db.execute(
        _UPDATE,
        ("bigint", "text", "text", "text", "timestamptz"),
        (row["id"], json.dumps(spec), json.dumps(cfg), new_state, db.clock()),
    )
    return [dict(updated[0])]
