"""metadata.py without a database: a memory's metadata is a JSON object within the namespace's
size cap and 8 levels deep, refused with 22023 naming the argument (issue 34)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aidb_memory_server import metadata
from aidb_memory_server.errors import INVALID_PARAMETER_VALUE, ApiError


def _refused(text: str, max_chars: int = 4000) -> ApiError:
    with pytest.raises(ApiError) as info:
        metadata.parse("remember", "metadata", text, max_chars)
    assert info.value.sqlstate == INVALID_PARAMETER_VALUE
    return info.value


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for level in range(depth):
        value = {"k": value} if level % 2 else [value]
    return {"top": value} if depth else {}


def test_none_is_the_empty_object() -> None:
    assert metadata.parse("remember", "metadata", None, 4000) == "{}"


@pytest.mark.parametrize(
    "value",
    [{}, {"category": "preference", "source": "crm"}, {"n": 3, "ok": True, "tags": ["a", "b"]}],
)
def test_an_object_within_the_bounds_comes_back_as_given(value: dict[str, Any]) -> None:
    text = json.dumps(value)
    assert metadata.parse("remember", "metadata", text, 4000) == text


@pytest.mark.parametrize("text", ["[]", '"tag"', "3", "true", "null", '["a", {"b": 1}]'])
def test_anything_but_an_object_is_refused(text: str) -> None:
    e = _refused(text)
    assert e.message == "aidb_memory.remember: metadata must be a JSON object"
    assert e.hint


def test_the_size_cap_is_the_namespaces_and_is_checked_before_parsing() -> None:
    text = json.dumps({"note": "x" * 100})
    assert metadata.parse("remember", "metadata", text, len(text)) == text
    e = _refused(text, len(text) - 1)
    assert e.message == (
        f"aidb_memory.remember: metadata has {len(text)} characters of JSON, "
        f"more than the namespace limit of {len(text) - 1}"
    )
    assert e.hint == (
        "keep the memory's tags small, or an admin raises config.memory_metadata_max_chars"
    )
    # Not JSON at all, but too long: the cap answers first, nothing is parsed.
    assert "characters of JSON" in _refused("{" * 5000).message


def test_eight_levels_are_allowed_and_nine_refused_naming_the_path() -> None:
    eight = json.dumps(_nested(7))  # the object itself, then 7 more containers
    assert metadata.parse("remember", "metadata", eight, 4000) == eight
    e = _refused(json.dumps(_nested(8)))
    assert "is nested deeper than 8 levels" in e.message
    assert e.message.startswith("aidb_memory.remember: metadata.top")


def test_hostile_numbers_are_refused_as_in_every_json_argument() -> None:
    assert "number" in _refused('{"n": ' + "9" * 500 + "}").message


@given(
    st.dictionaries(
        st.text(max_size=8),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=8),
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
            max_leaves=8,
        ),
        max_size=4,
    )
)
def test_every_object_within_the_bounds_is_taken_and_no_deeper_one(value: dict[str, Any]) -> None:
    text = json.dumps(value)

    def depth(v: Any) -> int:
        if isinstance(v, dict):
            return 1 + max((depth(c) for c in v.values()), default=0)
        if isinstance(v, list):
            return 1 + max((depth(c) for c in v), default=0)
        return 0

    if depth(value) <= metadata.MAX_DEPTH:
        assert metadata.parse("remember", "metadata", text, 100_000) == text
    else:
        assert "nested deeper" in _refused(text, 100_000).message
