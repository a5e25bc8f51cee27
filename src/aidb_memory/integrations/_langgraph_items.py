"""What :class:`~aidb_memory.integrations.langgraph.AidbStore` computes without a database or a
client: where a store namespace names the aidb_memory namespace and the actor (:class:`Layout`),
the aidb key of an item and back (:func:`encode_key`, :func:`decode_key`, :func:`key_range`),
the item a memory is (:func:`item_parts`), LangGraph's filter as the server's
(:func:`translate_filter`), a value's content (:func:`content_of`, :func:`index_fields`), a
namespace listing's match conditions (:func:`matches`) and LangGraph's TTL in the server's terms
(:func:`ttl_seconds`, :func:`checked_ttl_config`).

Kept apart from the store so that each rule can be read, and unit-tested (tests/unit), on its own;
the module docstring of :mod:`aidb_memory.integrations.langgraph` says what the rules are for.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, cast

from langgraph.store.base import InvalidNamespaceError, MatchCondition, TTLConfig, get_text_at_path

from aidb_memory.client import MemoryRecord, SearchHit

__all__ = [
    "BLANK_KEY_CONTENT",
    "MAX_TTL_S",
    "OPERATORS",
    "ORDER_OPERATORS",
    "Layout",
    "all_of",
    "checked_ttl_config",
    "content_of",
    "decode_key",
    "encode_key",
    "index_fields",
    "item_parts",
    "key_range",
    "keyless_item",
    "matches",
    "memory_id_of",
    "translate_filter",
    "ttl_seconds",
]

ORDER_OPERATORS = ("$gt", "$gte", "$lt", "$lte")
OPERATORS = ("$eq", "$ne", *ORDER_OPERATORS)
# What a put(index=False) item's content is when its key is blank (remember refuses a blank one).
BLANK_KEY_CONTENT = "-"
# remember's ttl_s: 1 to 315,360,000 seconds (ten years).
MAX_TTL_S = 315_360_000
# LangGraph's TTLConfig keys.
TTL_CONFIG_KEYS = ("default_ttl", "refresh_on_read", "sweep_interval_minutes", "omit_expired")


# --- namespaces and keys ----------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Where a store namespace names the aidb_memory namespace and the actor."""

    namespace: str | None
    actor: int  # the actor id's index in the tuple

    @property
    def fixed(self) -> tuple[int, ...]:
        """The tuple's positions that are no sub-namespace label."""
        return (self.actor,) if self.namespace is not None else (0, self.actor)

    @property
    def labels_before_actor(self) -> int:
        return self.actor - len(self.fixed) + 1

    def split(self, namespace: tuple[str, ...], what: str) -> tuple[str, str, tuple[str, ...]]:
        """(aidb_memory namespace, actor id, sub-namespace) of a store namespace."""
        if len(namespace) <= self.actor:
            layout = (
                f"(namespace, actor_id, ...) with the actor at {self.actor}"
                if self.namespace is None
                else f"a tuple with the actor id at {self.actor}"
            )
            raise InvalidNamespaceError(
                f"AidbStore: a {what} is {layout}, not {namespace!r}: aidb_memory reads and "
                "writes one actor's memories at a time, so it must name the actor"
            )
        aidb = self.namespace if self.namespace is not None else namespace[0]
        sub = tuple(label for i, label in enumerate(namespace) if i not in self.fixed)
        return aidb, namespace[self.actor], sub

    def join(self, aidb: str, actor: str, sub: tuple[str, ...]) -> tuple[str, ...] | None:
        """The store namespace of an actor's sub-namespace (None: too short for the layout, when
        labels come before the actor)."""
        before = self.labels_before_actor
        if len(sub) < before:
            return None
        head = () if self.namespace is not None else (aidb,)
        return (*head, *sub[:before], actor, *sub[before:])


def encode_key(sub: tuple[str, ...], key: str) -> str:
    """The aidb key of ``key`` in sub-namespace ``sub``: each label and ``.``, then ``.`` and the
    key. Labels are never empty and hold no ``.``, so the first ``..`` ends them: no two items
    share an aidb key. At the root a key without ``.`` is itself (so that the SQL API and the store
    name a memory alike); another is ``.`` and the key."""
    if sub:
        return "".join(f"{label}." for label in sub) + "." + key
    return key if "." not in key and key.strip() else "." + key


def decode_key(stored: str) -> tuple[tuple[str, ...], str]:
    """(sub-namespace, key) of an aidb key; the inverse of ``encode_key``. A key the store would
    not have written (a ``.`` but no ``..``) is the labels before its last ``.`` and the key after
    it, which is what the key ranges of ``key_range`` select it as."""
    if "." not in stored:
        return (), stored
    if stored.startswith("."):
        return (), stored[1:]
    end = stored.find("..")
    if end >= 0:
        return tuple(stored[:end].split(".")), stored[end + 2 :]
    *labels, key = stored.split(".")
    return tuple(labels), key


def key_range(sub_prefix: tuple[str, ...]) -> dict[str, Any] | None:
    """The filter on ``key`` that selects the items whose sub-namespace starts with
    ``sub_prefix``: the aidb keys that start with its labels and their dots, i.e. from that text
    to the same with its last ``.`` raised to ``/`` (by code point, as the server compares)."""
    if not sub_prefix:
        return None
    low = "".join(f"{label}." for label in sub_prefix)
    return {"key": {"$gte": low, "$lt": low[:-1] + "/"}}


def memory_id_of(key: str) -> uuid.UUID | None:
    """The memory id a key is, if it is one as the store shows ids (canonical text)."""
    try:
        memory_id = uuid.UUID(key)
    except ValueError:
        return None
    return memory_id if str(memory_id) == key else None


def keyless_item(record: MemoryRecord | None) -> MemoryRecord | None:
    """``record`` if it is an item addressed by its id: current, and without a key (a keyed
    memory is addressed by its key)."""
    if record is None or record.key is not None or not record.current:
        return None
    return record


def item_parts(record: MemoryRecord | SearchHit) -> tuple[tuple[str, ...], str, dict[str, Any]]:
    """(sub-namespace, key, value) of the item a memory is."""
    if record.key is None:
        value = {
            **record.metadata,
            "content": record.content,
            "agent_id": record.agent_id,
            "session_id": record.session_id,
        }
        return (), str(record.id), value
    sub, key = decode_key(record.key)
    return sub, key, dict(record.metadata)


# --- filters ----------------------------------------------------------------------------------


def _refuse(where: str, problem: str) -> ValueError:
    return ValueError(
        f"AidbStore: filter {where} {problem}; the server cannot select exactly that, and a "
        "filter is never applied in part"
    )


def _field_name(name: Any, where: str, nested: bool) -> str:
    if not isinstance(name, str) or not name:
        raise _refuse(where, "names a field by an empty or non-string name")
    if name.startswith("$"):
        raise _refuse(
            where, f"uses {name}, which is no field; operators are {', '.join(OPERATORS)}"
        )
    if "." in name:
        # The server reads a dot as a nesting of objects.
        raise _refuse(where, "names a field with a '.'")
    if nested:
        try:
            int(name)
        except ValueError:
            pass
        else:
            # The server's path reads it as an index when the value there is an array.
            raise _refuse(where, "names a nested field by a number (an array index to the server)")
    return name


def _holds_where_absent(wanted: Any) -> bool:
    """Whether LangGraph's condition ``wanted`` holds for a field that is absent."""
    if wanted is None:
        return True
    if isinstance(wanted, dict) and any(str(k).startswith("$") for k in wanted):
        return ("$eq" in wanted and wanted["$eq"] is None) or "$ne" in wanted
    return False


def _holds_object(value: Any) -> bool:
    if isinstance(value, dict):
        return True
    return isinstance(value, list | tuple) and any(_holds_object(v) for v in value)


def all_of(conditions: list[dict[str, Any]]) -> dict[str, Any]:
    """The conditions ANDed (there is at least one)."""
    return conditions[0] if len(conditions) == 1 else {"$and": conditions}


def _equals(path: str, wanted: Any) -> dict[str, Any]:
    if wanted is None:
        # Python's value.get(field) == None: absent, or a JSON null.
        return {"$or": [{path: {"$exists": False}}, {path: {"$eq": None}}]}
    return {path: {"$eq": wanted}}


def _operator(path: str, where: str, op: Any, wanted: Any) -> dict[str, Any]:
    if op == "$eq":
        return _equals(path, wanted)
    if op == "$ne":
        if wanted is None:
            return {path: {"$exists": True, "$ne": None}}
        return {path: {"$ne": wanted}}
    if op in ORDER_OPERATORS:
        if isinstance(wanted, bool) or not isinstance(wanted, int | float | str):
            raise _refuse(f"{where}.{op}", f"orders by {wanted!r}: a number or a string only")
        return {path: {op: wanted}}
    raise _refuse(f"{where}.{op}", f"is not one of LangGraph's operators ({', '.join(OPERATORS)})")


def _condition(parts: list[str], wanted: Any) -> dict[str, Any]:
    """The server's filter for LangGraph's condition ``wanted`` on the value's field at
    ``parts`` (InMemoryStore's _compare_values), on the metadata path ``metadata.<parts>``."""
    path = "metadata." + ".".join(parts)
    where = ".".join(parts)
    if isinstance(wanted, dict):
        if any(isinstance(k, str) and k.startswith("$") for k in wanted):
            return all_of([_operator(path, where, op, v) for op, v in wanted.items()])
        if not wanted:
            raise _refuse(where, "is {} (the field is an object), which has no server condition")
        conditions = []
        for name, nested in wanted.items():
            inner = f"{where}.{name}"
            _field_name(name, inner, nested=True)
            if _holds_where_absent(nested):
                # It would also select a value whose field is no object at all.
                raise _refuse(inner, "holds where the field is absent, inside a nested object")
            conditions.append(_condition([*parts, name], nested))
        return all_of(conditions)
    if isinstance(wanted, list | tuple):
        if _holds_object(wanted):
            # InMemoryStore compares an object in a list as a nested condition, not as equal.
            raise _refuse(where, "is a list holding an object")
        return {path: {"$eq": list(wanted)}}
    if wanted is None or isinstance(wanted, str | int | float | bool):
        return _equals(path, wanted)
    raise _refuse(where, f"compares with {type(wanted).__name__}, which is no JSON value")


def translate_filter(filter: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """LangGraph's ``filter`` as the server's conditions on the metadata (ANDed)."""
    conditions = []
    for name, wanted in (filter or {}).items():
        conditions.append(_condition([_field_name(name, str(name), nested=False)], wanted))
    try:
        json.dumps(conditions, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"AidbStore: filter is not JSON: {error}") from error
    return conditions


# --- values -----------------------------------------------------------------------------------


def _strings(value: Any) -> list[str]:
    """The strings of a JSON value, depth first."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [text for v in value.values() for text in _strings(v)]
    if isinstance(value, list | tuple):
        return [text for v in value for text in _strings(v)]
    return []


def content_of(value: dict[str, Any], fields: Sequence[str]) -> str:
    """The text of ``value`` that the memory's content is: the named fields' (``$``: the whole
    value's strings), or its JSON when they have none."""
    texts: list[str] = []
    for path in fields:
        texts += _strings(value) if path == "$" else get_text_at_path(value, path)
    text = "\n".join(t for t in texts if t.strip())
    return text if text else json.dumps(value, ensure_ascii=False)


def index_fields(index: Mapping[str, Any] | None) -> tuple[str, ...]:
    if index is None:
        return ("$",)
    unknown = set(index) - {"fields"}
    if unknown:
        raise ValueError(
            f"AidbStore: index takes 'fields' only, not {sorted(unknown)}: the namespace's "
            "embedding model (model_spec.embedding) embeds the memories, not the store"
        )
    fields = index.get("fields") or ["$"]
    if isinstance(fields, str) or not all(isinstance(f, str) for f in fields):
        raise ValueError(f"AidbStore: index['fields'] is a list of paths, not {fields!r}")
    return tuple(fields)


# --- namespace listing ------------------------------------------------------------------------


def matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    """InMemoryStore's match of a namespace by a prefix or suffix condition (``*``: any label)."""
    path = condition.path
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    elif condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    else:
        raise ValueError(f"AidbStore: unknown match type {condition.match_type!r}")
    return all(want == "*" or have == want for have, want in pairs)


# --- TTL --------------------------------------------------------------------------------------


def ttl_seconds(minutes: Any, what: str = "ttl") -> int:
    """remember's ``ttl_s`` for LangGraph's ``ttl`` in minutes: ``ceil(minutes * 60)``, at least 1
    (the server's least time to live; a ttl of 0 lives a second). ``what`` names it in a refusal:
    a negative, non-finite or non-number ttl, or one over ten years (the server's most)."""
    if isinstance(minutes, bool) or not isinstance(minutes, int | float):
        raise ValueError(f"AidbStore: {what} is minutes (a number) or None, not {minutes!r}")
    if not math.isfinite(minutes) or minutes < 0:
        raise ValueError(f"AidbStore: {what} is minutes, at least 0 and finite, not {minutes!r}")
    # The float's shortest decimal, not its binary value: 0.1 minutes is 6 seconds, where
    # ceil(0.1 * 60) is ceil(6.000000000000001), 7.
    exact = Decimal(minutes) if isinstance(minutes, int) else Decimal(str(float(minutes)))
    seconds = max(1, math.ceil(exact * 60))
    if seconds > MAX_TTL_S:
        raise ValueError(
            f"AidbStore: {what} is at most {MAX_TTL_S // 60} minutes (ten years: the server's "
            f"longest time to live), not {minutes!r}"
        )
    return seconds


def checked_ttl_config(ttl: Mapping[str, Any] | None) -> TTLConfig | None:
    """LangGraph's ``TTLConfig``, checked: its keys only (``default_ttl``, ``refresh_on_read``,
    ``sweep_interval_minutes``, ``omit_expired``), each of its type, a ``default_ttl`` the
    server can store. None stays None (the store has no TTL configuration)."""
    if ttl is None:
        return None
    if not isinstance(ttl, Mapping):
        raise TypeError(f"AidbStore: ttl is a TTLConfig (a dict), not {type(ttl).__name__}")
    unknown = sorted(set(ttl) - set(TTL_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"AidbStore: ttl takes {', '.join(TTL_CONFIG_KEYS)}, not {unknown}")
    if ttl.get("default_ttl") is not None:
        ttl_seconds(ttl["default_ttl"], "ttl['default_ttl']")
    for flag in ("refresh_on_read", "omit_expired"):
        if flag in ttl and not isinstance(ttl[flag], bool):
            raise ValueError(f"AidbStore: ttl[{flag!r}] is a bool, not {ttl[flag]!r}")
    sweep = ttl.get("sweep_interval_minutes")
    if sweep is not None and (
        isinstance(sweep, bool) or not isinstance(sweep, int | float) or not sweep > 0
    ):
        raise ValueError(
            f"AidbStore: ttl['sweep_interval_minutes'] is minutes above 0 or None, not {sweep!r}"
        )
    return cast(TTLConfig, dict(ttl))
