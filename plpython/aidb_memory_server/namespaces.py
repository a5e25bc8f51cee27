"""Namespaces: ``init``, ``namespace_update``, ``namespace_grant`` and ``namespace_revoke``
(SPEC §2, issue 35). Admin functions."""

from __future__ import annotations

import json
from typing import Any

from aidb_memory_server import db, models, validation
from aidb_memory_server.errors import UNDEFINED_OBJECT, ApiError, invalid, required

_INSERT = """
INSERT INTO aidb_memory.namespace (name, model_spec, config)
VALUES ($1, $2::jsonb, $3::jsonb)
ON CONFLICT (name) DO NOTHING
RETURNING id
"""
_SELECT = """
SELECT id, model_spec::text, config::text, state FROM aidb_memory.namespace WHERE name = $1
"""
# The row locked by a write of it (an UPDATE that changes nothing) rather than SELECT ... FOR
# UPDATE: each db.execute is a subtransaction of its own, and a row locked by one and then
# updated by another keeps, as its old version, a tuple whose xmax is a MultiXact, which every
# later reader of the namespace (every call of every actor: the fast paths, the foreign keys)
# resolves again until a vacuum removes it (bench/README.md, issue 35). Written first, the row's
# old version has a plain xmax, which its hint bit answers.
_LOCK = """
WITH u AS (
    UPDATE aidb_memory.namespace SET state = state WHERE name = $1
    RETURNING id, model_spec, config, state
)
SELECT id, model_spec::text, config::text, state FROM u
"""
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
# call, never an application's. A namespace of more than _REINDEX_BATCH memories is re-indexed in
# batches of the memories' key (actor_key, id), the same UPDATE on each key range, so that the
# caller hears how far it got between them (_Progress, issue 36): each memory is written once,
# with what the one statement would write, and every row stays locked until the transaction ends.
_REINDEX_BATCH = 1000
_REINDEX = """
-- spans actors: namespace_update re-indexes the namespace's memories (admins)
UPDATE aidb_memory.memory
SET lexemes = pg_catalog.to_tsvector($2::pg_catalog.regconfig, content)
WHERE namespace_id = $1
"""
_REINDEX_BEFORE = """
-- spans actors: namespace_update re-indexes the namespace's memories (admins)
UPDATE aidb_memory.memory
SET lexemes = pg_catalog.to_tsvector($2::pg_catalog.regconfig, content)
WHERE namespace_id = $1 AND (actor_key, id) < ($3, $4)
"""
_REINDEX_FROM = """
-- spans actors: namespace_update re-indexes the namespace's memories (admins)
UPDATE aidb_memory.memory
SET lexemes = pg_catalog.to_tsvector($2::pg_catalog.regconfig, content)
WHERE namespace_id = $1 AND (actor_key, id) >= ($3, $4)
"""
_REINDEX_BETWEEN = """
-- spans actors: namespace_update re-indexes the namespace's memories (admins)
UPDATE aidb_memory.memory
SET lexemes = pg_catalog.to_tsvector($2::pg_catalog.regconfig, content)
WHERE namespace_id = $1 AND (actor_key, id) >= ($3, $4) AND (actor_key, id) < ($5, $6)
"""
# The key of the memory $2 memories after the first (or after the key $3, $4, itself counted).
_KEY_AFTER = """
-- spans actors: namespace_update re-indexes the namespace's memories (admins)
SELECT actor_key, id FROM aidb_memory.memory WHERE namespace_id = $1
ORDER BY actor_key, id OFFSET $2 LIMIT 1
"""
_KEY_AFTER_KEY = """
-- spans actors: namespace_update re-indexes the namespace's memories (admins)
SELECT actor_key, id FROM aidb_memory.memory
WHERE namespace_id = $1 AND (actor_key, id) >= ($3, $4)
ORDER BY actor_key, id OFFSET $2 LIMIT 1
"""
_COUNT = """
-- spans actors: namespace_update re-indexes the namespace's memories (admins)
SELECT pg_catalog.count(*) AS n FROM aidb_memory.memory WHERE namespace_id = $1
"""
# Seconds between two progress NOTICEs (default 5); a test sets it lower. SET client_min_messages
# = warning silences them (docs/operations.md).
_PROGRESS_INTERVAL = "SELECT pg_catalog.current_setting('aidb_memory.progress_interval', true) AS s"
_PROGRESS_INTERVAL_S = 5.0
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
        _reindex(int(row["id"]), name, "pg_catalog." + after)
    return [dict(updated[0])]


class _Progress:
    """NOTICEs of a long re-index: memories done of total, rate and time left, at most one per
    interval and none for work shorter than that; the server's side of the CLI's
    aidb_memory.progress (which the server cannot import)."""

    def __init__(self, what: str, total: int) -> None:
        import time

        self.clock = time.monotonic
        self.what, self.total = what, total
        self.started = self.last = self.clock()
        setting = db.execute(_PROGRESS_INTERVAL)[0]["s"]
        try:
            interval = float(setting)
        except (TypeError, ValueError):
            interval = _PROGRESS_INTERVAL_S
        self.interval = interval if 0 <= interval < float("inf") else _PROGRESS_INTERVAL_S
        self.lines = 0

    def update(self, done: int) -> None:
        now = self.clock()
        if now - self.last < self.interval:
            return
        self.last, self.lines = now, self.lines + 1
        elapsed = now - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        left = max(self.total - done, 0)
        eta = f", about {_seconds(left / rate)} left" if rate and left else ""
        db.notice(
            f"{self.what}: {done:,} of {self.total:,} memories "
            f"({min(100, done * 100 // max(self.total, 1))}%), {rate:,.0f} memories/s{eta}"
        )

    def finish(self, done: int) -> None:
        elapsed = self.clock() - self.started
        if self.lines or elapsed >= self.interval:
            rate = f" ({done / elapsed:,.0f} memories/s)" if elapsed > 0 else ""
            db.notice(f"{self.what}: done, {done:,} memories in {_seconds(elapsed)}{rate}")


def _seconds(s: float) -> str:
    s = round(s)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s"


def _reindex(ns_id: int, name: str, config: str) -> None:
    """Every memory of the namespace gets the lexemes of ``config``; the namespace row is locked
    (namespace_update's _LOCK). Up to _REINDEX_BATCH memories in one statement; more in batches
    of the key, with progress NOTICEs."""
    key = ("bigint", "bigint")
    bound = db.execute(_KEY_AFTER, ("bigint", "bigint"), (ns_id, _REINDEX_BATCH))
    if not bound.nrows():
        db.execute(_REINDEX, ("bigint", "text"), (ns_id, config))
        return
    total = int(db.execute(_COUNT, ("bigint",), (ns_id,))[0]["n"])
    progress = _Progress(f'aidb_memory.namespace_update: re-indexing namespace "{name}"', total)
    upper = (bound[0]["actor_key"], bound[0]["id"])
    db.execute(_REINDEX_BEFORE, ("bigint", "text", *key), (ns_id, config, *upper))
    done = _REINDEX_BATCH
    while True:
        progress.update(done)
        lower = upper
        bound = db.execute(
            _KEY_AFTER_KEY, ("bigint", "bigint", *key), (ns_id, _REINDEX_BATCH, *lower)
        )
        if not bound.nrows():
            db.execute(_REINDEX_FROM, ("bigint", "text", *key), (ns_id, config, *lower))
            progress.finish(max(done, total))
            return
        upper = (bound[0]["actor_key"], bound[0]["id"])
        db.execute(
            _REINDEX_BETWEEN, ("bigint", "text", *key, *key), (ns_id, config, *lower, *upper)
        )
        done += _REINDEX_BATCH


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


# --- grants (issue 35) -------------------------------------------------------------------------

# The role by its exact name (not parsed as an identifier: "Sales" and sales are two roles).
# PUBLIC is no role: an open namespace already is every aidb_users member's.
_ROLE = (
    "SELECT oid::bigint AS oid, rolname::text AS name FROM pg_catalog.pg_roles WHERE rolname = $1"
)
# Under the namespace row's lock (_LOCK_GRANTS), with the grants' copies (_SET_COPIES): a
# concurrent grant and revoke cannot leave `restricted` or the copies saying other than the
# grants.
_GRANT = """
INSERT INTO aidb_memory.namespace_grant (namespace_id, role_id, role_name, granted_by, granted_at)
VALUES ($1, $2::bigint::oid, $3, session_user, $4)
ON CONFLICT (namespace_id, role_id) DO UPDATE
    SET role_name = EXCLUDED.role_name
    WHERE aidb_memory.namespace_grant.role_name <> EXCLUDED.role_name
RETURNING (xmax = 0) AS inserted
"""
# By the name it was granted under, or the role that has the name now (a renamed role, $3: its
# OID, looked up first: on Citus a statement on a reference table cannot read the catalog).
_REVOKE = """
DELETE FROM aidb_memory.namespace_grant
WHERE namespace_id = $1 AND (role_name = $2 OR role_id = $3::bigint::oid)
RETURNING role_id
"""
# The grants' copies in the namespace row (migrations/0029_namespace_grant_arrays.sql), which the
# fast paths read, as the grants will be: written before the grant itself, whose foreign key
# locks the row (_LOCK says why the row is written by no statement after one that locked it).
# Set from parameters: Citus plans neither a VOLATILE function nor every subquery in an UPDATE
# of a reference table.
_GRANTS = """
SELECT role_id::bigint AS role_id, role_name::text AS role_name
FROM aidb_memory.namespace_grant WHERE namespace_id = $1
"""
_SET_COPIES = """
UPDATE aidb_memory.namespace
SET restricted = cardinality($2::bigint[]) > 0, grant_role_ids = $2::bigint[]::oid[],
    grant_role_names = $3::text[]::name[]
WHERE id = $1
  AND (grant_role_ids <> $2::bigint[]::oid[] OR grant_role_names <> $3::text[]::name[]
       OR restricted <> (cardinality($2::bigint[]) > 0))
"""


def _grants(ns_id: int) -> dict[int, str]:
    """The namespace's grants now: role OID to the name it was granted under."""
    return {int(r["role_id"]): r["role_name"] for r in db.execute(_GRANTS, ("bigint",), (ns_id,))}


def _keep_grant_copies(ns_id: int, grants: dict[int, str]) -> None:
    """namespace.restricted and the grants' copies as ``grants`` (in role OID order) says (the
    row is locked by _locked)."""
    ids = sorted(grants)
    db.execute(
        _SET_COPIES,
        ("bigint", "bigint[]", "text[]"),
        (ns_id, ids, [grants[i] for i in ids]),
    )


# The lock of grants: NO KEY, as an UPDATE takes it. An application's open transaction that
# wrote a session or a memory holds a KEY SHARE lock on the namespace row (their foreign keys);
# a grant waits for no application.
_LOCK_GRANTS = """
UPDATE aidb_memory.namespace SET restricted = restricted WHERE name = $1 RETURNING id
"""


def _locked(fn: str, name: str | None) -> int:
    """The namespace's id, its row locked against other grants until the transaction ends; 42704
    if there is none."""
    name = validation.namespace_name(fn, name)
    rows = db.execute(_LOCK_GRANTS, ("text",), (name,))
    if not rows.nrows():
        raise ApiError(
            UNDEFINED_OBJECT,
            f'aidb_memory.{fn}: namespace "{name}" does not exist',
            hint="create it with aidb_memory.init",
        )
    return int(rows[0]["id"])


def namespace_grant(namespace: str | None, role: str | None) -> bool:
    """Let ``role`` (and the roles that have its privileges) use the namespace; from the first
    grant on, no other application role may. True when the grant is new."""
    fn = "namespace_grant"
    if role is None:
        raise required(fn, "role")
    ns_id = _locked(fn, namespace)
    found = db.execute(_ROLE, ("text",), (role,))
    if not found.nrows():
        raise ApiError(
            UNDEFINED_OBJECT,
            f"aidb_memory.{fn}: role {json.dumps(role[:200])} does not exist",
            hint="name a role as pg_roles spells it (SELECT rolname FROM pg_roles)",
        )
    r = found[0]
    grants = _grants(ns_id)
    grants[int(r["oid"])] = r["name"]  # as _GRANT's ON CONFLICT: the name it has now
    _keep_grant_copies(ns_id, grants)
    done = db.execute(
        _GRANT,
        ("bigint", "bigint", "text", "timestamptz"),
        (ns_id, r["oid"], r["name"], db.clock()),
    )
    return bool(done.nrows() and done[0]["inserted"])


def namespace_revoke(namespace: str | None, role: str | None) -> bool:
    """Take back a grant (by the role's name as granted: a role dropped since can still be
    revoked). With the last one gone the namespace is open again. True when there was one."""
    fn = "namespace_revoke"
    if role is None:
        raise required(fn, "role")
    ns_id = _locked(fn, namespace)
    found = db.execute(_ROLE, ("text",), (role,))
    oid = found[0]["oid"] if found.nrows() else None
    grants = _grants(ns_id)
    _keep_grant_copies(  # as _REVOKE deletes
        ns_id, {i: n for i, n in grants.items() if n != role and i != oid}
    )
    gone = db.execute(_REVOKE, ("bigint", "text", "bigint"), (ns_id, role, oid))
    return bool(gone.nrows())
