"""A memory filter (issue 34), compiled to one SQL condition with parameters only. Pure Python.

``search`` and ``list_memories`` take ``filter``, a JSON object in the shape mem0 and LangGraph's
store use (MongoDB's):

* ``{"field": value}``: equality; several fields are ANDed;
* ``{"field": {"$eq" | "$ne" | "$gt" | "$gte" | "$lt" | "$lte": value, "$in" | "$nin": [...],
  "$exists": true | false}}``, several operators ANDed;
* ``{"$and": [filter, ...]}``, ``{"$or": [filter, ...]}``, ``{"$not": filter}``.

A field is one of the memory's columns, ``created_at`` and ``updated_at`` (compared as times:
ISO 8601 strings, UTC when they name no offset), ``agent_id``, ``session_id`` and ``key``
(strings); any other field is a path into its metadata, dotted for nested objects
(``"address.city"``; ``"metadata.created_at"`` reaches a metadata key that has a column's name).
Metadata values compare as JSON: numbers as numbers (1 equals 1.0), strings as strings (by their
characters' code points), and the order operators compare a value only with one of the filter
value's type (a number, or a string). ``$ne`` and ``$nin`` hold where the field is absent,
``$exists`` says whether it is there (a JSON null is there). Every condition is true or false,
never NULL, so ``$not`` is the plain negation.

Bounded before anything else: the text by ``config.memory_filter_max_chars``, the nodes (each
field's operator, each logical operator, each value of ``$in``/``$nin``) by
``config.memory_filter_max_nodes``; anything malformed is 22023 naming its path
(``filter.$or[1].age.$gt``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aidb_memory_server import validation
from aidb_memory_server.errors import ApiError, invalid

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs a first call ~4 ms (docs/architecture.md, "Loading the code")
    from typing import Any

# Where a statement takes a filter: a comment (so that the statement parses as it is, unfiltered),
# replaced by " AND <the condition>" (memories.py, vectors.py).
SLOT = "/*filter*/"
# The memory's columns a filter may name, by kind.
TIME_FIELDS = ("created_at", "updated_at")
TEXT_FIELDS = ("agent_id", "session_id", "key")
METADATA_PREFIX = "metadata."
COMPARISONS = {"$eq": "=", "$ne": "<>", "$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
OPERATORS = (*COMPARISONS, "$in", "$nin", "$exists")
LOGICAL = ("$and", "$or", "$not")
# A metadata path is at most as deep as metadata nests (metadata.MAX_DEPTH).
MAX_PATH_PARTS = 8
# How much of the path to what is wrong an error names.
PATH_PARTS_SHOWN = 12
_HINT = (
    'e.g. {"category": "preference", "score": {"$gte": 3}}; see aidb_memory.search in '
    "docs/reference.md"
)


@dataclass(frozen=True)
class Compiled:
    """A filter as SQL: ``sql``, a boolean expression over the memory's row (alias ``m``) whose
    parameters are ``$first`` onwards, with these types and values."""

    sql: str
    types: tuple[str, ...]
    params: tuple[Any, ...]
    first: int
    # The filter's equalities on metadata values that every memory it selects meets, as
    # (dotted path, JSON text of the value) pairs: what index_condition asks the index for.
    entries: tuple[tuple[str, str], ...] = ()

    def at(self, first: int) -> str:
        """The SQL with its parameters numbered from ``$first`` instead (for another statement:
        its text holds no ``$`` but its placeholders')."""
        return _renumber(self.sql, first - self.first)

    def index_condition(
        self, actor_key: str, first: int
    ) -> tuple[str, tuple[str, ...], tuple[Any, ...]] | None:
        """A condition on ``m.lexeme_keys`` that every memory the filter selects meets, so that
        memory_lexemes_idx answers it with a search's words (ENTRIES), its parameters from
        ``$first`` (with their types and values): ``actor_key`` is the SQL of the actor's key.
        None when the filter has no such equality. Its parameters are apart from the filter's
        own, so that a statement's text always tells its parameter types (db.execute keeps a
        plan by its text)."""
        if not self.entries:
            return None
        sql = ENTRIES.format(actor_key=actor_key, paths=f"${first}", values=f"${first + 1}")
        paths = [p for p, _ in self.entries]
        values = [v for _, v in self.entries]
        return sql, ("text[]", "jsonb[]"), (paths, values)


def _renumber(sql: str, shift: int) -> str:
    return re.sub(r"\$(\d+)", lambda m: f"${int(m.group(1)) + shift}", sql)


# A metadata value at a path, as the trigger of memory.lexeme_keys writes it
# (aidb_memory.actor_metadata): equality of a scalar reached through objects alone. A path part
# that a JSON array could take as an index (PostgreSQL's #> reads "-1" as its last element) is
# none of them.
ENTRIES = (
    "m.lexeme_keys @> aidb_memory.metadata_entries({actor_key}, {paths}::text[], {values}::jsonb[])"
)
_SCALARS = (str, int, float, bool, type(None))


class _Compiler:
    def __init__(self, fn: str, field: str, first: int, max_nodes: int) -> None:
        self.fn, self.field = fn, field
        self.next = first
        self.nodes = 0
        self.max_nodes = max_nodes
        self.types: list[str] = []
        self.params: list[Any] = []
        # (dotted path, JSON text) of each equality on a metadata value that every selected
        # memory meets (those ANDed at the top of the filter).
        self.entries: list[tuple[str, str]] = []

    def error(self, path: list[Any], problem: str) -> ApiError:
        where = validation.json_path(self.field, path, PATH_PARTS_SHOWN)
        return invalid(self.fn, where, problem, hint=_HINT)

    def count(self, path: list[Any], n: int = 1) -> None:
        self.nodes += n
        if self.nodes > self.max_nodes:
            raise invalid(
                self.fn,
                self.field,
                f"has more than {self.max_nodes} conditions, the namespace limit",
                hint="filter on fewer fields and values, or an admin raises "
                "config.memory_filter_max_nodes",
            )

    def param(self, sql_type: str, value: Any) -> str:
        self.types.append(sql_type)
        self.params.append(value)
        self.next += 1
        return f"${self.next - 1}::{sql_type}"

    # --- the tree ---------------------------------------------------------------------------

    def node(self, value: Any, path: list[Any], every: bool = False) -> str:
        """``every``: the memories selected meet this node (it is ANDed at the top)."""
        if type(value) is not dict:
            raise self.error(path, "must be a JSON object")
        parts = []
        for name, child in value.items():
            here = [*path, name]
            if name in ("$and", "$or"):
                self.count(here)
                if type(child) is not list or not child:
                    raise self.error(here, "must be a non-empty array of filters")
                anded = every and name == "$and"
                joined = f" {name[1:].upper()} ".join(
                    self.node(c, [*here, i], anded) for i, c in enumerate(child)
                )
                parts.append(f"({joined})")
            elif name == "$not":
                self.count(here)
                parts.append(f"(NOT {self.node(child, here)})")
            elif name.startswith("$"):
                raise self.error(here, f"is not an operator here (fields and {', '.join(LOGICAL)})")
            else:
                parts.append(self.field_condition(name, child, here, every))
        if not parts:
            return "true"
        return parts[0] if len(parts) == 1 else "(" + " AND ".join(parts) + ")"

    def field_condition(self, name: str, condition: Any, path: list[Any], every: bool) -> str:
        if type(condition) is dict and any(k.startswith("$") for k in condition):
            if not all(k.startswith("$") for k in condition):
                raise self.error(path, "mixes operators and fields")
            ops = list(condition.items())
        else:
            ops = [("$eq", condition)]
        column = self.column(name, path)
        if every and column[0] == "json":
            self.entry(name, ops)
        parts = [self.leaf(column, op, v, [*path, op]) for op, v in ops]
        return parts[0] if len(parts) == 1 else "(" + " AND ".join(parts) + ")"

    def column(self, name: str, path: list[Any]) -> tuple[str, str]:
        """(kind, SQL of the value): ("time" | "text", the column) or ("json", the metadata
        value at the path, NULL where it is absent)."""
        if name in TIME_FIELDS:
            return "time", f"m.{name}"
        if name in TEXT_FIELDS:
            return "text", f"m.{name}"
        keys = name[len(METADATA_PREFIX) :] if name.startswith(METADATA_PREFIX) else name
        parts = keys.split(".")
        if not all(parts):
            raise self.error(path, "has an empty part in its path")
        if len(parts) > MAX_PATH_PARTS:
            raise self.error(path, f"is a path of more than {MAX_PATH_PARTS} keys")
        return "json", f"(m.metadata #> {self.param('text[]', parts)})"

    def entry(self, name: str, ops: list[tuple[str, Any]]) -> None:
        keys = name[len(METADATA_PREFIX) :] if name.startswith(METADATA_PREFIX) else name
        if any(_INDEX_LIKE.fullmatch(k) for k in keys.split(".")):
            return
        for op, value in ops:
            if op == "$eq" and type(value) in _SCALARS:
                self.entries.append((keys, _json(value)))

    # --- one operator on one field ------------------------------------------------------------

    def leaf(self, column: tuple[str, str], op: str, value: Any, path: list[Any]) -> str:
        if op not in OPERATORS:
            raise self.error(path, f"is not an operator (one of {', '.join(OPERATORS)})")
        self.count(path)
        kind, sql = column
        if op == "$exists":
            if type(value) is not bool:
                raise self.error(path, "must be true or false")
            return f"({sql} IS {'NOT ' if value else ''}NULL)"
        if op in ("$in", "$nin"):
            if type(value) is not list:
                raise self.error(path, "must be an array of values")
            self.count(path, len(value))
            # A column's null is its absence, which [null] names (a JSON null is a value).
            absent = kind != "json" and None in value
            values = [
                self.scalar(kind, v, [*path, i])
                for i, v in enumerate(value)
                if not (absent and v is None)
            ]
            array = self.param(_ARRAY_TYPES[kind], values)
            found = f"coalesce({sql} = ANY ({array}), false)"
            if absent:
                found = f"({sql} IS NULL OR {found})"
            return found if op == "$in" else f"(NOT {found})"
        if kind == "json":
            return self.json_comparison(sql, op, value, path)
        if value is None:
            if op not in ("$eq", "$ne"):
                raise self.error(path, "compares with null only by $eq and $ne")
            return f"({sql} IS {'NOT ' if op == '$ne' else ''}NULL)"
        given = self.param(_SCALAR_TYPES[kind], self.scalar(kind, value, path))
        if op == "$ne":
            return f"({sql} IS DISTINCT FROM {given})"
        collate = ' COLLATE "C"' if kind == "text" else ""
        return f"coalesce({sql}{collate} {COMPARISONS[op]} {given}, false)"

    def json_comparison(self, sql: str, op: str, value: Any, path: list[Any]) -> str:
        if op in ("$eq", "$ne"):
            given = self.param("jsonb", _json(value))
            if op == "$eq":
                return f"coalesce({sql} = {given}, false)"
            return f"({sql} IS DISTINCT FROM {given})"
        # Order: a number with the numbers, a string with the strings (by code point).
        if type(value) in (int, float):
            given = self.param("numeric", value)
            return (
                f"(CASE WHEN pg_catalog.jsonb_typeof({sql}) = 'number' "
                f"THEN ({sql})::numeric {COMPARISONS[op]} {given} ELSE false END)"
            )
        if type(value) is str:
            given = self.param("text", value)
            return (
                f"(CASE WHEN pg_catalog.jsonb_typeof({sql}) = 'string' "
                f"THEN ({sql} #>> '{{}}') COLLATE \"C\" {COMPARISONS[op]} {given} ELSE false END)"
            )
        raise self.error(path, "orders numbers and strings only")

    def scalar(self, kind: str, value: Any, path: list[Any]) -> Any:
        """A value of a field of ``kind``, as its parameter takes it."""
        if kind == "json":
            return _json(value)
        if type(value) is not str:
            raise self.error(
                path,
                "must be a string (a time, ISO 8601)" if kind == "time" else "must be a string",
            )
        if kind == "text":
            return value
        from datetime import UTC, datetime

        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise self.error(path, "is not a time in ISO 8601 (2025-05-10T14:00:00Z)") from None
        return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat()


# strtol's reading of an array index, as #> applies it (leading blanks, a sign, digits).
_INDEX_LIKE = re.compile(r"\s*[+-]?[0-9]+\s*")
_SCALAR_TYPES = {"text": "text", "time": "timestamptz", "json": "jsonb"}
_ARRAY_TYPES = {"text": "text[]", "time": "timestamptz[]", "json": "jsonb[]"}


def _json(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)


def compile_filter(
    fn: str,
    field: str,
    text: str | None,
    first: int,
    *,
    max_chars: int,
    max_nodes: int,
) -> Compiled | None:
    """The filter ``text`` (a jsonb argument's text) as SQL whose parameters start at
    ``$first``; None for no filter (NULL, or ``{}``: every memory)."""
    if text is None:
        return None
    if len(text) > max_chars:
        raise invalid(
            fn,
            field,
            f"has {len(text)} characters of JSON, more than the namespace limit of {max_chars}",
            hint="filter on fewer fields and values, or an admin raises "
            "config.memory_filter_max_chars",
        )
    value = validation.parse_json(fn, field, text)
    if type(value) is dict and not value:
        return None
    compiler = _Compiler(fn, field, first, max_nodes)
    sql = compiler.node(value, [], every=True)
    return Compiled(
        sql, tuple(compiler.types), tuple(compiler.params), first, tuple(compiler.entries)
    )
