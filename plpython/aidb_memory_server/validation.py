"""Validation of namespace names, model specs and namespace config. Pure Python."""

from __future__ import annotations

from aidb_memory_server.errors import ApiError, invalid, required

# json and re are imported where first needed: re (which json's decoder imports too) pulls in
# enum, ~7 ms of a backend's first call, and a read needs neither (docs/architecture.md, "Loading
# the code"). What they build is kept in _built, so a hot path pays a dict lookup, not an import.
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs a first call ~4 ms (docs/architecture.md, "Loading the code")
    import json
    import re
    from typing import Any

_built: dict[str, Any] = {}

NAMESPACE_NAME_MAX = 128
NAMESPACE_STATES = ("ACTIVE", "INACTIVE")
MODEL_SPEC_KEYS = ("llm", "embedding")

# Every config key, its default and its validator. Documented in docs/reference.md.
CONFIG_DEFAULTS: dict[str, Any] = {
    "max_turn_chars": 100_000,
    "max_turns_per_add": 1_000,
    "max_identifier_chars": 255,
    "llm_timeout_s": 30,
    "compaction_min_target_chars": 200,
    "compaction_max_input_chars": 200_000,
    # Seconds after a failed compaction call during which that session's compactions do not call
    # that model again (compaction_call_failed at once); 0: every over-budget read calls it.
    "compaction_cooldown_s": 60,
    "extraction": True,
    # How the worker extracts memories (issue 26): auto, model, verbatim or verbatim_all.
    "extraction_mode": "auto",
    # The longest memory remember stores (longer content is refused) and verbatim extraction
    # stores (longer turns are cut into pieces).
    "memory_max_chars": 1_000,
    # The worker summarizes a session before its reads need it (issue 13); off: reads compact.
    "compaction_ahead": True,
    # Budgeted reads return the session's leading system/developer turns first, never summarized.
    "pin_instructions": False,
    "actor_binding": "none",
    # Absent (null): any registered model may be a read's fallback_model; a list fences it.
    "allowed_fallback_models": None,
    # Cost bounds of one call by an application role (issue 9): refused with 22023 when passed.
    "max_add_chars": 1_000_000,
    "search_max_query_chars": 4_000,
    "search_max_words": 32,
    "search_max_query_nodes": 64,
    "search_max_ranked": 2_000,
    # The PostgreSQL text search configuration (in pg_catalog) whose stemming and stop words
    # search ranks by (issue 24); "simple": words as written, no stop words.
    "text_search_config": "english",
    "extraction_max_input_chars": 200_000,
    # What an image, file or audio part of a turn counts against a read's budget (issue 11).
    "non_text_part_chars": 1_000,
    # The largest metadata of one memory, in characters of its JSON text (issue 34).
    "memory_metadata_max_chars": 4_000,
    # The largest filter of search and list_memories: characters of its JSON text, and
    # conditions (filtering.py).
    "memory_filter_max_chars": 4_000,
    "memory_filter_max_nodes": 64,
    # How long a memory lives unless remember says otherwise, in seconds (issue 34): remember's
    # and extraction's memories expire that long after they are written (a read with refresh_ttl
    # pushes it as far again). Absent (null): memories never expire.
    "memory_ttl_s": None,
}
FALLBACK_MODELS_MAX = 100
# The longest time to live of a memory, in seconds (ten years): remember's ttl_s and
# config.memory_ttl_s.
MEMORY_TTL_MAX_S = 315_360_000
ACTOR_BINDINGS = ("none", "session_user")
_INT_LIMITS: dict[str, tuple[int, int]] = {
    "max_turn_chars": (1, 10_000_000),
    "max_turns_per_add": (1, 100_000),
    "max_identifier_chars": (1, 4_096),
    "llm_timeout_s": (1, 3_600),
    "compaction_min_target_chars": (1, 1_000_000),
    "compaction_max_input_chars": (1_000, 10_000_000),
    "compaction_cooldown_s": (0, 86_400),
    "max_add_chars": (1_000, 100_000_000),
    "search_max_query_chars": (1, 1_000_000),
    "search_max_words": (1, 10_000),
    "search_max_query_nodes": (1, 100_000),
    "search_max_ranked": (10, 1_000_000),
    "extraction_max_input_chars": (1_000, 10_000_000),
    "non_text_part_chars": (0, 1_000_000),
    "memory_max_chars": (100, 100_000),
    "memory_metadata_max_chars": (2, 1_000_000),
    "memory_filter_max_chars": (2, 1_000_000),
    "memory_filter_max_nodes": (1, 10_000),
    "memory_ttl_s": (1, MEMORY_TTL_MAX_S),
}
EXTRACTION_MODES = ("auto", "model", "verbatim", "verbatim_all")


def text_search_config_name(value: Any) -> bool:
    """Whether ``value`` looks like the name of a built-in text search configuration (lower-case
    letters, digits and underscores, a letter first, at most 63); namespaces checks that
    pg_catalog has it."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= 63
        and value.isascii()
        and value[0].isalpha()
        and value.islower()
        and value.replace("_", "").isalnum()
    )


# C0 and C1 control characters (Unicode category Cc: U+0000-001F, U+007F-009F) and the line and
# paragraph separators (Zl, Zp): what would break a one-line message or hide in a name or id.
def control_chars() -> re.Pattern[str]:
    """The pattern of those characters."""
    pattern = _built.get("control_chars")
    if pattern is None:
        import re

        pattern = _built["control_chars"] = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
    return pattern


def has_control_chars(text: str) -> bool:
    """Whether ``text`` holds one of those characters."""
    if text.isascii() and text.isprintable():
        return False  # printable ASCII (0x20-0x7e) holds none of them: no pattern needed
    return control_chars().search(text) is not None


def namespace_name(function: str, name: str | None) -> str:
    """A namespace name: required, 1 to 128 characters, no control characters."""
    if name is None:
        raise required(function, "name")
    if has_control_chars(name):
        raise invalid(function, "name", "must not contain control characters")
    if not name or name != name.strip():
        raise invalid(function, "name", "must be non-empty and have no surrounding spaces")
    if len(name) > NAMESPACE_NAME_MAX:
        raise invalid(function, "name", f"is longer than {NAMESPACE_NAME_MAX} characters")
    return name


def json_object(function: str, field: str, text: str | None) -> dict[str, Any]:
    """Parse a jsonb argument (received as text) that must be an object; NULL reads as {}."""
    if text is None:
        return {}
    value = parse_json(function, field, text)
    if not isinstance(value, dict):
        raise invalid(function, field, f"must be a JSON object, not {json_type(value)}")
    return value


def json_type(value: Any) -> str:
    """How an error message names the JSON type of ``value`` ("an array", "null", ...)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "null" if value is None else "an object"


def model_spec(function: str, spec: dict[str, Any]) -> dict[str, Any]:
    """``{"llm": name, "embedding": name}``, both optional; unknown keys refused."""
    for key, value in spec.items():
        if key not in MODEL_SPEC_KEYS:
            raise invalid(
                function,
                f"model_spec.{key}",
                "is not a known key",
                hint="model_spec accepts: " + ", ".join(MODEL_SPEC_KEYS),
            )
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise invalid(
                function, f"model_spec.{key}", "must be a model name (a non-empty string)"
            )
    return {k: v for k, v in spec.items() if v is not None}


def config(function: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """Validate namespace config keys and types; unknown keys refused so typos surface.

    A key set to null means "the default" (as in ``model_spec``) and is left out of the result.
    """
    for key, value in cfg.items():
        if key not in CONFIG_DEFAULTS:
            raise invalid(
                function,
                f"config.{key}",
                "is not a known key",
                hint="config accepts: " + ", ".join(CONFIG_DEFAULTS),
            )
        if value is None:
            continue
        field = f"config.{key}"
        if key in _INT_LIMITS:
            lo, hi = _INT_LIMITS[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise invalid(function, field, "must be an integer")
            if not lo <= value <= hi:
                raise invalid(function, field, f"must be between {lo} and {hi}")
        elif key in ("extraction", "pin_instructions", "compaction_ahead"):
            if not isinstance(value, bool):
                raise invalid(function, field, "must be true or false")
        elif key == "actor_binding" and value not in ACTOR_BINDINGS:
            raise invalid(function, field, "must be one of: " + ", ".join(ACTOR_BINDINGS))
        elif key == "extraction_mode" and value not in EXTRACTION_MODES:
            raise invalid(function, field, "must be one of: " + ", ".join(EXTRACTION_MODES))
        elif key == "allowed_fallback_models":
            _model_names(function, field, value)
        elif key == "text_search_config" and not text_search_config_name(value):
            raise invalid(
                function,
                field,
                "must be the name of a text search configuration in pg_catalog",
                hint="e.g. english, simple, german; SELECT cfgname FROM pg_ts_config lists them",
            )
    return {k: v for k, v in cfg.items() if v is not None}


def _model_names(function: str, field: str, value: Any) -> None:
    # A list of model names; not checked against the registered models, like a fence that
    # names a model registered later.
    if not isinstance(value, list) or len(value) > FALLBACK_MODELS_MAX:
        raise invalid(
            function,
            field,
            f"must be a list of at most {FALLBACK_MODELS_MAX} model names",
            hint="[] allows no fallback_model; null (or no key) allows any registered model",
        )
    for item in value:
        if not isinstance(item, str) or not item.strip() or has_control_chars(item):
            raise invalid(function, field, "must hold only model names (non-empty strings)")


def fallback_allowed(cfg: dict[str, Any], model: str) -> bool:
    """Whether a read of a namespace with (effective) config ``cfg`` may use ``model`` as its
    fallback_model: any model unless ``allowed_fallback_models`` is set."""
    allowed = cfg.get("allowed_fallback_models")
    return allowed is None or model in allowed


def effective_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The namespace's config with every default filled in."""
    return {**CONFIG_DEFAULTS, **cfg}


def merge(current: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """Apply ``changes`` to ``current``; a key set to JSON null goes back to its default."""
    merged = dict(current)
    for key, value in changes.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def state(function: str, value: str) -> str:
    """A namespace state: ACTIVE or INACTIVE (case-insensitive on input)."""
    upper = value.upper()
    if upper not in NAMESPACE_STATES:
        raise invalid(function, "state", "must be ACTIVE or INACTIVE")
    return upper


# Hostile JSON (issue 9): PostgreSQL's jsonb takes any depth and any number of digits, Python's
# json does not (RecursionError past ~1000 levels, ValueError past 4300 digits), and neither is
# anything an API argument needs. Refused up front with 22023 naming the field.
JSON_MAX_DEPTH = 100
JSON_MAX_NUMBER_CHARS = 100
# A key printed after a dot (others are quoted in brackets); "$" leads a filter's operators.
_PLAIN_KEY = r"\$?[A-Za-z_][A-Za-z0-9_]{0,63}\Z"
_PATH_PARTS = 2  # how much of the path below the argument an error names: turns[3].meta


class _BadNumber(Exception):
    def __init__(self, text: str, problem: str) -> None:
        super().__init__(problem)
        self.text = text
        self.problem = problem


def _int(text: str) -> int:
    if len(text) > JSON_MAX_NUMBER_CHARS:
        raise _BadNumber(text, f"has a number of {len(text)} characters")
    return int(text)


def _float(text: str) -> float:
    if len(text) > JSON_MAX_NUMBER_CHARS:
        raise _BadNumber(text, f"has a number of {len(text)} characters")
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _BadNumber(text, "has a number out of range")
    return value


def _constant(text: str) -> Any:
    raise _BadNumber(text, f"has {text}, which is not a JSON number")


def _decoder() -> json.JSONDecoder:
    # One decoder, made once: json.loads with hooks would build a new one on every call (~3 µs).
    decoder = _built.get("decoder")
    if decoder is None:
        import json

        decoder = _built["decoder"] = json.JSONDecoder(
            parse_int=_int, parse_float=_float, parse_constant=_constant
        )
    return decoder


def json_path(field: str, parts: list[Any], depth: int = _PATH_PARTS) -> str:
    """``field`` and the first ``depth`` parts of the path below it, as an error message names
    them."""
    import json
    import re

    out = field
    for part in parts[:depth]:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.match(_PLAIN_KEY, part):
            out += f".{part}"
        else:
            key = part if len(part) <= 40 else part[:39] + "…"
            out += "[" + control_chars().sub("?", json.dumps(key, ensure_ascii=False)) + "]"
    return out


def too_deep(value: Any, max_depth: int = JSON_MAX_DEPTH) -> list[Any] | None:
    """The path to the first container nested deeper than ``max_depth``, or None. Visits
    containers only: the cost follows their number, not the size of the strings in them."""
    stack: list[tuple[Any, int, list[Any]]] = [(value, 1, [])]
    while stack:
        node, depth, path = stack.pop()
        if depth > max_depth:
            return path
        items = node.items() if type(node) is dict else enumerate(node)
        for key, child in items:
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1, [*path[:_PATH_PARTS], key]))
    return None


def _text_path(text: str, stop: int | None) -> list[Any]:
    """The path of the value at offset ``stop`` of JSON ``text``, or (``stop`` None) of the first
    container nested deeper than JSON_MAX_DEPTH. A slow scan, for error messages only: it runs
    when json.loads has already refused the text."""
    import json

    stack: list[list[Any]] = []  # [kind, index or key]
    in_string = escaped = False
    start = 0
    last_string = ""
    for i, c in enumerate(text):
        if stop is not None and i >= stop:
            break
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
                last_string = text[start:i]
            continue
        if c == '"':
            in_string, start = True, i + 1
        elif c in "[{":
            stack.append(["[", 0] if c == "[" else ["{", None])
            if stop is None and len(stack) > JSON_MAX_DEPTH:
                break
        elif c in "]}":
            stack.pop()
        elif c == ":" and stack:
            try:
                stack[-1][1] = json.loads(f'"{last_string}"')
            except ValueError:
                stack[-1][1] = last_string
        elif c == "," and stack and stack[-1][0] == "[":
            stack[-1][1] += 1
    return [entry[1] for entry in stack[:_PATH_PARTS] if entry[1] is not None]


def parse_json(function: str, field: str, text: str, max_chars: int | None = None) -> Any:
    """Parse the text of a jsonb argument, refusing (22023, naming the field) what would cost
    more than it may or would fail inside Python's json: more than ``max_chars`` characters
    (checked before parsing), containers nested deeper than JSON_MAX_DEPTH, numbers longer than
    JSON_MAX_NUMBER_CHARS or out of a float's range. Every jsonb argument goes through here."""
    if max_chars is not None and len(text) > max_chars:
        raise invalid(
            function,
            field,
            f"has {len(text)} characters of JSON, more than the limit of {max_chars}",
        )
    depth_problem = f"is nested deeper than {JSON_MAX_DEPTH} levels"
    depth_hint = f"JSON arguments nest at most {JSON_MAX_DEPTH} arrays and objects deep"
    try:
        value = _decoder().decode(text)
    except _BadNumber as e:
        where = json_path(field, _text_path(text, text.find(e.text)))
        raise invalid(
            function,
            where,
            f"{e.problem}",
            hint=f"numbers of at most {JSON_MAX_NUMBER_CHARS} "
            "characters, within the range of a double",
        ) from None
    except RecursionError:
        raise invalid(
            function, json_path(field, _text_path(text, None)), depth_problem, hint=depth_hint
        ) from None
    except ValueError as e:  # only reachable when called with text that is not from jsonb
        raise ApiError("22023", f"aidb_memory.{function}: {field} is not valid JSON: {e}") from e
    # No deeper than the number of brackets in the text: most arguments need no walk at all.
    if (type(value) is dict or type(value) is list) and (
        text.count("[") + text.count("{") > JSON_MAX_DEPTH
    ):
        deep = too_deep(value)
        if deep is not None:
            raise invalid(function, json_path(field, deep), depth_problem, hint=depth_hint)
    return value
