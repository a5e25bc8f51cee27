"""Registered models and the secrets they use (SPEC §2). Admin functions.

The validation (``provider_options`` and the name checks) is pure Python. A secret's value is
never put in a message, a notice or a log line: every message about a secret names the secret,
never its content, and the value is checked here before it reaches a statement that could fail
and print it.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

from aidb_memory_server import endpoints, validation
from aidb_memory_server.errors import (
    INSUFFICIENT_PRIVILEGE,
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    UNDEFINED_OBJECT,
    ApiError,
    invalid,
    required,
)

PROVIDERS = ("openai", "builtin")
NAME_MAX = 128
SECRET_VALUE_MAX = 16_384
URL_MAX = 2_048
BUILTIN_KINDS = ("extractive",)
OPENAI_KEYS = ("model", "base_url", "api_key_secret", "api_key_env", "timeout_s", "max_retries")
TIMEOUT_LIMITS = (1, 600)
RETRY_LIMITS = (0, 5)
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
# Keys that would hold a key itself: refused with a pointer to set_secret.
_KEY_LIKE = ("api_key", "apikey", "key", "secret", "token", "password", "authorization")


def name(function: str, field: str, value: str | None) -> str:
    """A model or secret name: required, 1 to 128 characters, no control characters."""
    if value is None:
        raise required(function, field)
    if validation.has_control_chars(value):
        raise invalid(function, field, "must not contain control characters")
    if not value or value != value.strip():
        raise invalid(function, field, "must be non-empty and have no surrounding spaces")
    if len(value) > NAME_MAX:
        raise invalid(function, field, f"is longer than {NAME_MAX} characters")
    return value


def provider(function: str, value: str | None) -> str:
    """``openai`` or ``builtin``."""
    if value is None:
        raise required(function, "provider")
    if value not in PROVIDERS:
        raise invalid(function, "provider", "must be one of: " + ", ".join(PROVIDERS))
    return value


def provider_options(function: str, prov: str, options: dict[str, Any]) -> dict[str, Any]:
    """Validate ``options`` for ``prov``; returns them unchanged. Values are never echoed."""
    for key in options:
        if key.lower() in _KEY_LIKE:
            raise invalid(
                function,
                f"options.{key}",
                "is refused: options never hold a key",
                hint="store the key with aidb_memory.set_secret and name it in "
                "options.api_key_secret, or name an environment variable in options.api_key_env",
            )
    if prov == "builtin":
        return _builtin_options(function, options)
    return _openai_options(function, options)


def _builtin_options(function: str, options: dict[str, Any]) -> dict[str, Any]:
    for key in options:
        if key != "kind":
            raise invalid(
                function, f"options.{key}", "is not a known key", hint='builtin accepts: "kind"'
            )
    if options.get("kind") not in BUILTIN_KINDS:
        raise invalid(
            function,
            "options.kind",
            "must be one of: " + ", ".join(BUILTIN_KINDS),
            hint='register the builtin summarizer with {"kind": "extractive"}',
        )
    return options


def _openai_options(function: str, options: dict[str, Any]) -> dict[str, Any]:
    for key in options:
        if key not in OPENAI_KEYS:
            raise invalid(
                function,
                f"options.{key}",
                "is not a known key",
                hint="openai accepts: " + ", ".join(OPENAI_KEYS),
            )
    model = options.get("model")
    if model is None:
        raise invalid(function, "options.model", "is required (the endpoint's model name)")
    if not isinstance(model, str) or not model.strip() or validation.has_control_chars(model):
        raise invalid(function, "options.model", "must be a non-empty string")
    if len(model) > 256:
        raise invalid(function, "options.model", "is longer than 256 characters")
    if "base_url" in options:
        base_url(function, options["base_url"])
    secret = options.get("api_key_secret")
    env = options.get("api_key_env")
    if secret is not None and env is not None:
        raise invalid(
            function,
            "options.api_key_secret",
            "and options.api_key_env are exclusive: name one",
        )
    if "api_key_secret" in options:
        if not isinstance(secret, str):
            raise invalid(function, "options.api_key_secret", "must be a secret name (a string)")
        name(function, "options.api_key_secret", secret)
    if "api_key_env" in options and (
        not isinstance(env, str) or len(env) > NAME_MAX or not _ENV_NAME.fullmatch(env)
    ):
        raise invalid(
            function,
            "options.api_key_env",
            "must be an environment variable name ([A-Z_][A-Z0-9_]*)",
        )
    if "timeout_s" in options:
        _number(function, "options.timeout_s", options["timeout_s"], TIMEOUT_LIMITS, True)
    if "max_retries" in options:
        _number(function, "options.max_retries", options["max_retries"], RETRY_LIMITS, False)
    return options


def base_url(function: str, value: Any) -> str:
    """An http(s) URL with a host and no credentials, query or fragment."""
    field = "options.base_url"
    if not isinstance(value, str):
        raise invalid(function, field, "must be an http or https URL (a string)")
    if len(value) > URL_MAX:
        raise invalid(function, field, f"is longer than {URL_MAX} characters")
    if any(c.isspace() for c in value) or validation.has_control_chars(value):
        raise invalid(function, field, "must not contain spaces or control characters")
    try:
        parts = urlsplit(value)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise invalid(function, field, "is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not host:
        raise invalid(function, field, "must be an http or https URL with a host")
    if parts.username is not None or parts.password is not None:
        raise invalid(
            function,
            field,
            "must not contain credentials",
            hint="store the key with aidb_memory.set_secret and name it in options.api_key_secret",
        )
    if parts.query or parts.fragment or value.endswith(("?", "#")):
        raise invalid(function, field, "must not have a query string or fragment")
    return value


def _number(
    function: str, field: str, value: Any, limits: tuple[int, int], fractional: bool
) -> None:
    lo, hi = limits
    wrong_type = isinstance(value, bool) or not isinstance(value, (int, float))
    if wrong_type or (not fractional and isinstance(value, float)):
        raise invalid(function, field, "must be a number" if fractional else "must be an integer")
    if not lo <= value <= hi:
        raise invalid(function, field, f"must be between {lo} and {hi}")


def secret_value(function: str, value: str | None) -> str:
    """A secret's value: required, non-blank, bounded. Messages never include it."""
    if value is None:
        raise required(function, "value")
    if not value.strip():
        raise invalid(function, "value", "must not be empty")
    if value != value.strip():
        raise invalid(function, "value", "must have no surrounding whitespace (a copied newline?)")
    if len(value) > SECRET_VALUE_MAX:
        raise invalid(function, "value", f"is longer than {SECRET_VALUE_MAX} characters")
    if validation.has_control_chars(value):
        raise invalid(function, "value", "must not contain control characters")
    return value


# --- the database functions ---------------------------------------------------------------
# db (and with it plpy) is imported where it is used, so that the validation above is importable
# outside the server (tests/unit).

# FOR SHARE, not FOR KEY SHARE: a concurrent set_secret that changes the endpoints (an UPDATE of
# the row) waits for this transaction, and then sees the model this one registered.
_LOCK_SECRET = "SELECT endpoints FROM aidb_memory.secret WHERE name = $1 FOR SHARE"
_ENV_PATTERN = "SELECT value FROM aidb_memory.runtime_settings WHERE key = $1"
_UPSERT_MODEL = """
INSERT INTO aidb_memory.model (name, provider, options)
VALUES ($1, $2, $3::jsonb)
ON CONFLICT (name) DO UPDATE
SET provider = excluded.provider, options = excluded.options, updated_at = $4
RETURNING id
"""
_LOCK_MODEL = "SELECT id FROM aidb_memory.model WHERE name = $1 FOR UPDATE"
_MODEL_USERS = """
SELECT string_agg(pg_catalog.quote_ident(name), ', ' ORDER BY name) AS names
FROM aidb_memory.namespace
WHERE model_spec ->> 'llm' = $1 OR model_spec ->> 'embedding' = $1
"""
_DELETE_MODEL = "DELETE FROM aidb_memory.model WHERE id = $1"
# NULL endpoints: a new secret goes to OpenAI's default endpoint only; a replaced one keeps the
# endpoints it had (a key rotation changes the key, not where it may go).
_UPSERT_SECRET = """
INSERT INTO aidb_memory.secret AS s (name, value, endpoints)
VALUES ($1, $2, coalesce($3, ARRAY[$4]))
ON CONFLICT (name) DO UPDATE
SET value = excluded.value, endpoints = coalesce($3, s.endpoints), updated_at = $5
RETURNING endpoints
"""
_UPSERT_SECRET_TYPES = ("text", "text", "text[]", "text", "timestamptz")
_LOCK_SECRET_FOR_DROP = "SELECT id FROM aidb_memory.secret WHERE name = $1 FOR UPDATE"
_SECRET_USERS = """
SELECT string_agg(pg_catalog.quote_ident(name), ', ' ORDER BY name) AS names
FROM aidb_memory.model WHERE options ->> 'api_key_secret' = $1
"""
_SECRET_MODELS = """
SELECT name, options ->> 'base_url' AS base_url
FROM aidb_memory.model WHERE options ->> 'api_key_secret' = $1 ORDER BY name
"""
_DELETE_SECRET = "DELETE FROM aidb_memory.secret WHERE id = $1"
_LOCK_MODELS = "SELECT name FROM aidb_memory.model WHERE name = ANY($1) FOR KEY SHARE"


def create_model(model_name: str | None, prov: str | None, options: str | None) -> int:
    """Register model ``model_name`` (or replace its provider and options); returns its id."""
    from aidb_memory_server import db

    fn = "create_model"
    model_name = name(fn, "name", model_name)
    prov = provider(fn, prov)
    opts = provider_options(fn, prov, validation.json_object(fn, "options", options))
    secret = opts.get("api_key_secret")
    if secret is not None:
        found = db.execute(_LOCK_SECRET, ("text",), (secret,))
        if not found.nrows():
            raise ApiError(
                UNDEFINED_OBJECT,
                f'aidb_memory.{fn}: options.api_key_secret names no stored secret "{secret}"',
                hint="store it first with aidb_memory.set_secret",
            )
        require_bound(fn, secret, list(found[0]["endpoints"] or []), opts.get("base_url"))
    env = opts.get("api_key_env")
    if env is not None:
        require_env_allowed(fn, env, env_pattern())
    rows = db.execute(
        _UPSERT_MODEL,
        ("text", "text", "text", "timestamptz"),
        (model_name, prov, json.dumps(opts), db.clock()),
    )
    return int(rows[0]["id"])


def drop_model(model_name: str | None) -> None:
    """Remove a model that no namespace names in its model_spec."""
    from aidb_memory_server import db

    fn = "drop_model"
    model_name = name(fn, "name", model_name)
    rows = db.execute(_LOCK_MODEL, ("text",), (model_name,))
    if not rows.nrows():
        raise ApiError(UNDEFINED_OBJECT, f'aidb_memory.{fn}: model "{model_name}" does not exist')
    users = db.execute(_MODEL_USERS, ("text",), (model_name,))[0]["names"]
    if users:
        raise ApiError(
            OBJECT_NOT_IN_PREREQUISITE_STATE,
            f'aidb_memory.{fn}: model "{model_name}" is in the model_spec of namespaces: {users}',
            hint="change their model_spec with aidb_memory.namespace_update first",
        )
    db.execute(_DELETE_MODEL, ("bigint",), (rows[0]["id"],))


def require_bound(function: str, secret: str, allowed: list[str], base_url: str | None) -> None:
    """A model whose requests go to ``base_url`` (None: OpenAI's default) may use a secret bound
    to ``allowed`` endpoints: else 42501 (issue 9, item 8)."""
    try:
        target = endpoints.model_endpoint(base_url, endpoints.OPENAI_DEFAULT_URL)
    except endpoints.BadEndpoint as e:
        raise invalid(function, "options.base_url", str(e)) from None
    if target not in allowed:
        raise ApiError(
            INSUFFICIENT_PRIVILEGE,
            f'aidb_memory.{function}: the secret "{secret}" may not be sent to {target}',
            hint="a secret goes only to the endpoints it was stored for; whoever knows the key "
            "stores it again with aidb_memory.set_secret(name, value, endpoints => ARRAY[...]) "
            "naming this endpoint",
        )


def env_pattern() -> str | None:
    """The allow-list of key variables as a superuser set it (runtime_settings
    api_key_env_pattern; None when unset): what create_model checks, and llm again at each call."""
    from aidb_memory_server import db

    rows = db.execute(_ENV_PATTERN, ("text",), (endpoints.ENV_PATTERN_SETTING,))
    return rows[0]["value"] if rows.nrows() else None


def require_env_allowed(function: str, env: str, setting: str | None) -> None:
    """``env`` matches the allow-list of key variables (runtime_settings api_key_env_pattern,
    default ``*_API_KEY``): else 42501, so that no admin can read any other variable of the
    server (BACKUP_S3_SECRET, PGPASSWORD) by sending it to an endpoint of theirs."""
    patterns = endpoints.env_patterns(setting)
    if not endpoints.env_allowed(env, patterns):
        raise ApiError(
            INSUFFICIENT_PRIVILEGE,
            f"aidb_memory.{function}: options.api_key_env {env} is not an allowed key variable "
            f"(allowed: {', '.join(patterns) or 'none'})",
            hint="name a variable matching the pattern, e.g. OPENAI_API_KEY; a superuser sets the "
            f"pattern in aidb_memory.runtime_settings (key {endpoints.ENV_PATTERN_SETTING})",
        )


def set_secret(
    secret_name: str | None, value: str | None, allowed: list[str | None] | None = None
) -> None:
    """Store (or replace) secret ``secret_name``, bound to the endpoints ``allowed`` (NULL: a
    new secret gets OpenAI's default endpoint, a replaced one keeps its endpoints). Nothing ever
    echoes the value.

    Binding and value travel together: nobody can point an existing key at another endpoint
    without supplying the key. A binding that would cut off a model that uses the secret is
    refused (55000), so what create_model checked stays true.
    """
    from aidb_memory_server import db

    fn = "set_secret"
    secret_name = name(fn, "name", secret_name)
    value = secret_value(fn, value)
    bound = endpoints.endpoints(fn, "endpoints", allowed)
    rows = db.execute(
        _UPSERT_SECRET,
        _UPSERT_SECRET_TYPES,
        (secret_name, value, bound, endpoints.OPENAI_DEFAULT, db.clock()),
    )
    stored = list(rows[0]["endpoints"])
    # After the upsert: its row lock makes a concurrent create_model naming this secret commit
    # first, and this statement's snapshot then sees that model.
    cut_off = []
    for row in db.execute(_SECRET_MODELS, ("text",), (secret_name,)):
        try:
            target = endpoints.model_endpoint(row["base_url"], endpoints.OPENAI_DEFAULT_URL)
        except endpoints.BadEndpoint:
            target = None
        if target not in stored:
            cut_off.append(row["name"])
    if cut_off:
        raise ApiError(
            OBJECT_NOT_IN_PREREQUISITE_STATE,
            f'aidb_memory.{fn}: secret "{secret_name}" would no longer reach the endpoint of '
            f"models: {', '.join(cut_off)}",
            hint="name their endpoints too, or re-register those models first",
        )


def drop_secret(secret_name: str | None) -> None:
    """Remove a secret that no model names in options.api_key_secret."""
    from aidb_memory_server import db

    fn = "drop_secret"
    secret_name = name(fn, "name", secret_name)
    rows = db.execute(_LOCK_SECRET_FOR_DROP, ("text",), (secret_name,))
    if not rows.nrows():
        raise ApiError(UNDEFINED_OBJECT, f'aidb_memory.{fn}: secret "{secret_name}" does not exist')
    users = db.execute(_SECRET_USERS, ("text",), (secret_name,))[0]["names"]
    if users:
        raise ApiError(
            OBJECT_NOT_IN_PREREQUISITE_STATE,
            f'aidb_memory.{fn}: secret "{secret_name}" is the api_key_secret of models: {users}',
            hint="re-register those models with aidb_memory.create_model first",
        )
    db.execute(_DELETE_SECRET, ("bigint",), (rows[0]["id"],))


def require_registered(function: str, spec: dict[str, Any]) -> None:
    """Every model named in ``spec`` (a validated model_spec) is registered: else 42704.

    The rows are locked (FOR KEY SHARE) so a concurrent drop_model waits for this transaction.
    """
    from aidb_memory_server import db

    wanted = {key: value for key, value in spec.items() if value is not None}
    if not wanted:
        return
    rows = db.execute(_LOCK_MODELS, ("text[]",), (sorted(set(wanted.values())),))
    known = {row["name"] for row in rows}
    for key in sorted(wanted):
        model = wanted[key]
        if model not in known:
            raise ApiError(
                UNDEFINED_OBJECT,
                f'aidb_memory.{function}: model_spec.{key} names no registered model "{model}"',
                hint="register it with aidb_memory.create_model",
            )
