"""filtering.py without a database: a memory filter compiles to one SQL condition whose values
are all parameters, bounded, and refused with 22023 naming the path of what is wrong (issue 34).
What the conditions select is held against a reference in tests/db/test_memory_filters.py."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aidb_memory_server import filtering
from aidb_memory_server.errors import INVALID_PARAMETER_VALUE, ApiError


def _compile(value: Any, first: int = 1, **caps: int) -> filtering.Compiled | None:
    limits = {"max_chars": 4000, "max_nodes": 64, **caps}
    return filtering.compile_filter(
        "search", "filter", json.dumps(value), first, max_chars=limits["max_chars"],
        max_nodes=limits["max_nodes"],
    )  # fmt: skip


def _refused(value: Any, **caps: int) -> str:
    with pytest.raises(ApiError) as info:
        _compile(value, **caps)
    assert info.value.sqlstate == INVALID_PARAMETER_VALUE
    assert info.value.message.startswith("aidb_memory.search: filter")
    return info.value.message


def test_no_filter_is_none() -> None:
    assert filtering.compile_filter("search", "filter", None, 1, max_chars=9, max_nodes=1) is None
    assert _compile({}) is None


def test_equality_on_metadata_is_a_jsonb_comparison_with_parameters() -> None:
    compiled = _compile({"category": "preference", "address.city": "Lisbon"}, first=7)
    assert compiled is not None
    assert compiled.sql == (
        "(coalesce((m.metadata #> $7::text[]) = $8::jsonb, false) AND "
        "coalesce((m.metadata #> $9::text[]) = $10::jsonb, false))"
    )
    assert compiled.types == ("text[]", "jsonb", "text[]", "jsonb")
    assert compiled.params == (["category"], '"preference"', ["address", "city"], '"Lisbon"')
    # Both equalities are asked of the index too (bench (l)), with the same values, in
    # parameters of their own (a plan is kept by its statement's text, which must tell them).
    assert compiled.index_condition("$3", 20) == (
        "m.lexeme_keys @> aidb_memory.metadata_entries($3, $20::text[], $21::jsonb[])",
        ("text[]", "jsonb[]"),
        (["category", "address.city"], ['"preference"', '"Lisbon"']),
    )


def _entries(value: Any) -> list[tuple[str, str]]:
    """(path, JSON value) of the equalities a filter asks memory_lexemes_idx for."""
    compiled = _compile(value)
    assert compiled is not None
    found = compiled.index_condition("$3", 1)
    if found is None:
        return []
    paths, values = found[2]
    return list(zip(paths, values, strict=True))


def test_the_index_is_asked_only_for_equalities_every_selected_memory_meets() -> None:
    assert _entries({"a": 1, "b": {"$eq": True}, "metadata.c.d": None}) == [
        ("a", "1"),
        ("b", "true"),
        ("c.d", "null"),
    ]
    assert _entries({"$and": [{"a": "x"}, {"$and": [{"b": 2.5}]}]}) == [("a", '"x"'), ("b", "2.5")]
    # An OR, a NOT, an order or a set, a column, an object or array value: no entry.
    assert _entries({"$or": [{"a": 1}, {"b": 2}]}) == []
    assert _entries({"$not": {"a": 1}}) == []
    assert _entries({"a": {"$ne": 1}, "b": {"$gt": 1}, "c": {"$in": [1]}}) == []
    assert _entries({"agent_id": "x", "created_at": {"$eq": "2025-01-01"}}) == []
    assert _entries({"a": {"b": 1}, "c": [1, 2]}) == []
    # A path part that #> may read as an array's index (the trigger walks no array).
    assert _entries({"tags.0": "x", "tags.-1": "y", "t. +2": "z", "n": 1}) == [("n", "1")]
    assert _entries({"a": {"$eq": 1, "$lt": 5}, "$or": [{"b": 1}]}) == [("a", "1")]


def test_columns_and_operators() -> None:
    compiled = _compile(
        {
            "$or": [
                {"created_at": {"$gte": "2025-05-10T14:00:00"}},
                {"agent_id": {"$in": ["a", "b"]}, "key": {"$exists": True}},
            ],
            "$not": {"score": {"$gt": 3}},
            "metadata.created_at": {"$ne": None},
        }
    )
    assert compiled is not None
    assert "m.created_at >= $1::timestamptz" in compiled.sql
    assert compiled.params[0] == "2025-05-10T14:00:00+00:00", "no offset: UTC"
    assert "m.agent_id = ANY ($2::text[])" in compiled.sql
    assert "(m.key IS NOT NULL)" in compiled.sql
    assert " OR " in compiled.sql and "(NOT " in compiled.sql
    assert "jsonb_typeof((m.metadata #> $3::text[])) = 'number'" in compiled.sql
    assert compiled.params[2:] == (["score"], 3, ["created_at"], "null")


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


@given(st.text(max_size=20), _VALUES)
def test_no_value_and_no_field_name_reaches_the_sql(name: str, value: Any) -> None:
    """Whatever the names and values, the SQL text is made of our words and placeholders."""
    try:
        compiled = _compile({name or "x": {"$eq": value}, "$or": [{"k": {"$in": [value]}}]})
    except ApiError:
        return
    assert compiled is not None
    leftover = re.sub(r"\$\d+::[a-z\[\]]+", "", compiled.sql)
    assert re.fullmatch(r"[a-z_.# ()=,\[\]A-Z<>'\"]*", leftover), compiled.sql


@pytest.mark.parametrize(
    ("value", "path", "problem"),
    [
        ([1], "filter", "must be a JSON object"),
        ({"$and": []}, "filter.$and", "must be a non-empty array of filters"),
        ({"$or": [{"a": 1}, 3]}, "filter.$or[1]", "must be a JSON object"),
        ({"$foo": 1}, "filter.$foo", "is not an operator here"),
        ({"a": {"$regex": "x"}}, "filter.a.$regex", "is not an operator"),
        ({"a": {"$gt": 1, "b": 2}}, "filter.a", "mixes operators and fields"),
        ({"a..b": 1}, 'filter["a..b"]', "has an empty part in its path"),
        ({"a": {"$gt": [1]}}, "filter.a.$gt", "orders numbers and strings only"),
        ({"a": {"$in": 3}}, "filter.a.$in", "must be an array of values"),
        ({"a": {"$exists": 1}}, "filter.a.$exists", "must be true or false"),
        ({"agent_id": 5}, "filter.agent_id.$eq", "must be a string"),
        ({"created_at": {"$lt": "yesterday"}}, "filter.created_at.$lt", "is not a time"),
        ({"key": {"$gt": None}}, "filter.key.$gt", "compares with null only by $eq and $ne"),
        ({"session_id": {"$in": ["a", 1]}}, "filter.session_id.$in[1]", "must be a string"),
    ],
)
def test_a_malformed_filter_names_its_path(value: Any, path: str, problem: str) -> None:
    message = _refused(value)
    assert message.startswith(f"aidb_memory.search: {path} {problem}"), message


def test_the_bounds_are_the_namespaces() -> None:
    big = {"a": {"$in": list(range(10))}}
    assert _compile(big, max_nodes=11) is not None
    assert "more than 10 conditions" in _refused(big, max_nodes=10)
    text = json.dumps({"a": "x" * 50})
    assert f"has {len(text)} characters of JSON" in _refused({"a": "x" * 50}, max_chars=40)
    deep = ".".join("k" * 9)
    assert "is a path of more than 8 keys" in _refused({deep: 1})
