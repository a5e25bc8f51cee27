"""Which namespace a call reaches and whether it may: the namespace row every API function reads
(``NS_COLUMNS``), its settings (``Namespace``), the identifier rules, and the checks of the
caller against it (existence, grants of issue 35, ``actor_binding``, state), before anything
else is read or written.
"""

from __future__ import annotations

from aidb_memory_server import db, validation
from aidb_memory_server.errors import (
    INSUFFICIENT_PRIVILEGE,
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    UNDEFINED_OBJECT,
    ApiError,
    invalid,
    required,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# What every session function reads of its namespace (alias n), which Namespace() takes.
# session_user comes with it on every call: SET SESSION AUTHORIZATION changes it within a
# connection, so it must not be remembered. restricted: the namespace has grants, which
# check_namespace asks aidb_memory.namespace_allows about in a statement of its own (issue 35): in
# a statement that reads a per-actor table, Citus would run it on a worker, as another role.
NS_COLUMNS = """n.id, n.state, n.config::text AS config, n.model_spec::text AS model_spec,
       session_user::text AS caller, n.restricted"""
_ALLOWS = "SELECT aidb_memory.namespace_allows($1) AS ok"
_NAMESPACE = f"SELECT {NS_COLUMNS}\nFROM aidb_memory.namespace n WHERE n.name = $1"
# The settings a read uses, selected as text by the read's query (Namespace.setting): a read
# parses no JSON. Values the config validation accepted only (ints, booleans, strings).
_READ_SETTINGS = (
    "max_identifier_chars",
    "actor_binding",
    "pin_instructions",
    "compaction_min_target_chars",
)
_READ_SETTING_COLUMNS = ", ".join(f"n.config->>'{k}' AS cfg_{k}" for k in _READ_SETTINGS)


class Namespace:
    """A namespace row with its effective config, parsed when first used: a read takes the few
    settings it needs from columns of its own query (:meth:`setting`), so it never parses JSON
    (nor imports json, docs/architecture.md, "Loading the code")."""

    __slots__ = ("_parsed", "_row", "caller", "id", "name", "restricted", "state")

    def __init__(self, name: str, row: Any) -> None:
        self.name = name
        self.id = int(row["id"])
        self.state = row["state"]
        self.caller = row["caller"]
        self.restricted = bool(row["restricted"])
        self._row = row
        self._parsed: tuple[dict[str, Any], dict[str, Any]] | None = None

    def _config_and_spec(self) -> tuple[dict[str, Any], dict[str, Any]]:
        if self._parsed is None:
            self._parsed = _parsed(self._row["config"], self._row["model_spec"])
        return self._parsed

    @property
    def config(self) -> dict[str, Any]:
        return self._config_and_spec()[0]

    @property
    def model_spec(self) -> dict[str, Any]:
        return self._config_and_spec()[1]

    def setting(self, key: str) -> Any:
        """One config value: from the row's ``cfg_<key>`` column when its query selected one
        (:data:`_READ_SETTINGS`; NULL: the key is not set, so its default), else the config."""
        row = self._row
        column = "cfg_" + key
        if column not in row:
            return self.config[key]
        raw = row[column]
        default = validation.CONFIG_DEFAULTS[key]
        if raw is None:
            return default
        if isinstance(default, bool):  # before int: a bool is an int
            return raw == "true"
        if isinstance(default, int):
            return int(raw)
        return raw


_parsed_cache: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]] = {}


def _parsed(config: str, model_spec: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The effective config and model_spec of a namespace, parsed once per connection and
    text (the row is read on every call, so a change is seen at once; only parsing is saved).
    Callers never mutate them."""
    key = (config, model_spec)
    hit = _parsed_cache.get(key)
    if hit is None:
        if len(_parsed_cache) > 256:
            _parsed_cache.clear()
        import json  # not at module level: a read parses no config (Namespace.setting)

        hit = (validation.effective_config(json.loads(config)), json.loads(model_spec))
        _parsed_cache[key] = hit
    return hit


def quote(text: str, limit: int = 200) -> str:
    """``text`` quoted for an error message, on one line and cut to ``limit`` characters,
    whatever the caller put in it."""
    import json  # errors only

    quoted = json.dumps(text if len(text) <= limit else text[: limit - 1] + "…", ensure_ascii=False)
    return validation.control_chars().sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)


def identifier(
    fn: str, field: str, value: str | None, limit: int, *, optional: bool = False
) -> str | None:
    """An id argument: required unless ``optional``, non-empty, bounded, no control characters."""
    if value is None:
        if optional:
            return None
        raise required(fn, field)
    if not value.strip():
        raise invalid(fn, field, "must not be empty")
    if len(value) > limit:
        raise invalid(fn, field, f"is longer than {limit} characters")
    if validation.has_control_chars(value):
        raise invalid(fn, field, "must not contain control characters")
    return value


def usable_namespace(fn: str, name: str, row: Any) -> Namespace:
    """A fetched namespace row (or None) the caller may use, or 42704 / 42501."""
    if row is None or row["id"] is None:
        raise ApiError(
            UNDEFINED_OBJECT,
            f"aidb_memory.{fn}: namespace {quote(name)} does not exist",
            hint="an admin creates it with aidb_memory.init",
        )
    if row["restricted"] and not db.execute(_ALLOWS, ("text",), (name,))[0]["ok"]:
        # Nothing of the namespace but its name: not whether the actor or a session exists.
        raise ApiError(
            INSUFFICIENT_PRIVILEGE,
            f"aidb_memory.{fn}: permission denied for namespace {quote(name)}",
            hint="an admin grants it to a role of yours with aidb_memory.namespace_grant",
        )
    return Namespace(name, row)


def check_namespace(
    fn: str, name: str, row: Any, actor_id: str | None, *, writing: bool
) -> tuple[Namespace, str]:
    """Check a fetched namespace row (or None) and the actor against it."""
    ns = usable_namespace(fn, name, row)
    actor = identifier(fn, "actor_id", actor_id, ns.setting("max_identifier_chars"))
    assert actor is not None
    if ns.setting("actor_binding") == "session_user" and actor != ns.caller:
        raise ApiError(
            INSUFFICIENT_PRIVILEGE,
            f"aidb_memory.{fn}: actor_id {quote(actor)} is not the calling role",
            hint=f"namespace {quote(name)} binds actor_id to the logged-in role "
            "(config.actor_binding)",
        )
    if writing and ns.state != "ACTIVE":
        raise ApiError(
            OBJECT_NOT_IN_PREREQUISITE_STATE,
            f"aidb_memory.{fn}: namespace {quote(name)} is INACTIVE",
            hint="an admin can reactivate it with aidb_memory.namespace_update",
        )
    return ns, actor


def namespace_of(fn: str, name: str | None) -> Namespace:
    """Resolve a namespace the caller may use, for a function that names no actor."""
    if name is None:
        raise required(fn, "namespace")
    rows = db.execute(_NAMESPACE, ("text",), (name,))
    return usable_namespace(fn, name, rows[0] if rows.nrows() else None)


def namespace(
    fn: str, name: str | None, actor_id: str | None, *, writing: bool
) -> tuple[Namespace, str]:
    """Resolve the namespace and check the actor: (namespace, actor_id) or a SQL error."""
    if name is None:
        raise required(fn, "namespace")
    rows = db.execute(_NAMESPACE, ("text",), (name,))
    return check_namespace(fn, name, rows[0] if rows.nrows() else None, actor_id, writing=writing)
