"""A memory's metadata (issue 34): the JSON object an application tags a memory with
(``{"category": "preference", "source": "crm"}``), as mem0's ``metadata`` and the value of an
item of LangGraph's store. Pure Python.

Bounded so that no call stores or later compares more than the namespace allows: at most
``config.memory_metadata_max_chars`` characters of JSON text (PostgreSQL's jsonb output, the
form it is stored and returned in) and MAX_DEPTH levels of objects and arrays, the metadata
object itself the first. Refused with 22023 naming the argument before anything is stored.
"""

from __future__ import annotations

from aidb_memory_server import validation
from aidb_memory_server.errors import invalid

MAX_DEPTH = 8
EMPTY = "{}"


def parse(function: str, field: str, text: str | None, max_chars: int) -> str:
    """The metadata ``text`` (a jsonb argument's text; None: none, ``{}``) if it is a JSON
    object within the bounds, as given."""
    if text is None:
        return EMPTY
    if len(text) > max_chars:
        raise invalid(
            function,
            field,
            f"has {len(text)} characters of JSON, more than the namespace limit of {max_chars}",
            hint="keep the memory's tags small, or an admin raises "
            "config.memory_metadata_max_chars",
        )
    value = validation.parse_json(function, field, text)
    if type(value) is not dict:
        raise invalid(
            function,
            field,
            "must be a JSON object",
            hint='e.g. {"category": "preference"}',
        )
    deep = validation.too_deep(value, MAX_DEPTH)
    if deep is not None:
        raise invalid(
            function,
            validation.json_path(field, deep),
            f"is nested deeper than {MAX_DEPTH} levels",
            hint=f"metadata nests at most {MAX_DEPTH} objects and arrays deep",
        )
    return text
