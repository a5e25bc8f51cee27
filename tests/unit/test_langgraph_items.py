"""The LangGraph store's pure rules (aidb_memory/integrations/_langgraph_items.py) without a
database: namespace layouts, the aidb key of an item and back, the key range of a namespace
prefix, the item a memory is, LangGraph's filters as the server's (what is produced, what is
refused), a value's content, namespace match conditions. What the server then does with them is
tested in tests/db/test_integration_langgraph.py and tests/db/test_langgraph_differential.py."""

from __future__ import annotations

import datetime
import json
import math
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langgraph.store.base import InvalidNamespaceError, MatchCondition

from aidb_memory.client import MemoryRecord, SearchHit
from aidb_memory.integrations._langgraph_items import (
    MAX_TTL_S,
    Layout,
    all_of,
    checked_ttl_config,
    content_of,
    decode_key,
    encode_key,
    index_fields,
    item_parts,
    key_range,
    keyless_item,
    matches,
    memory_id_of,
    translate_filter,
    ttl_seconds,
)

NOW = datetime.datetime(2025, 5, 10, 14, 0, tzinfo=datetime.UTC)
# LangGraph's labels: non-empty, no ".". Small alphabets around "." and "/" (the key range's
# bounds) so that generated labels and keys meet the edge cases often.
LABELS = st.text(alphabet="ab-./0", min_size=1, max_size=3).filter(lambda s: "." not in s)
KEYS = st.text(alphabet="ab-./0 ", max_size=5)
SUBS = st.lists(LABELS, max_size=3).map(tuple)


def _record(key: str | None = None, **changes: Any) -> MemoryRecord:
    fields: dict[str, Any] = {
        "id": uuid.UUID("00000000-0000-4000-8000-000000000001"),
        "content": "Erin prefers window seats",
        "agent_id": "travel",
        "session_id": "trip-1",
        "valid_from": NOW,
        "valid_to": None,
        "superseded_by": None,
        "created_at": NOW,
        "updated_at": None,
        "metadata": {"topic": "seats"},
        "key": key,
    }
    return MemoryRecord(**{**fields, **changes})


# --- layouts ----------------------------------------------------------------------------------


def test_the_default_layout_is_namespace_actor_then_sub_namespace() -> None:
    layout = Layout(None, 1)
    assert layout.fixed == (0, 1)
    assert layout.split(("helpdesk", "alice"), "namespace") == ("helpdesk", "alice", ())
    assert layout.split(("helpdesk", "alice", "prefs", "ui"), "namespace") == (
        "helpdesk",
        "alice",
        ("prefs", "ui"),
    )
    assert layout.join("helpdesk", "alice", ("prefs",)) == ("helpdesk", "alice", "prefs")
    with pytest.raises(InvalidNamespaceError, match="must name the actor"):
        layout.split(("helpdesk",), "namespace prefix")


def test_a_fixed_namespace_takes_langgraphs_user_id_layout() -> None:
    layout = Layout("helpdesk", 0)
    assert layout.fixed == (0,)
    assert layout.split(("alice", "memories"), "namespace") == ("helpdesk", "alice", ("memories",))
    assert layout.join("helpdesk", "alice", ("memories",)) == ("alice", "memories")
    assert layout.join("helpdesk", "alice", ()) == ("alice",)


def test_labels_before_the_actor_are_sub_namespace_labels_too() -> None:
    layout = Layout("helpdesk", 1)  # ("memories", user_id, ...)
    assert layout.labels_before_actor == 1
    assert layout.split(("memories", "alice", "x"), "namespace") == (
        "helpdesk",
        "alice",
        ("memories", "x"),
    )
    assert layout.join("helpdesk", "alice", ("memories", "x")) == ("memories", "alice", "x")
    # A root item of the actor has no label to put before the actor: no namespace of the layout.
    assert layout.join("helpdesk", "alice", ()) is None
    with pytest.raises(InvalidNamespaceError, match="actor id at 1"):
        layout.split(("memories",), "namespace")


@given(SUBS, st.sampled_from([(None, 1), (None, 2), ("ns", 0), ("ns", 1)]))
def test_split_undoes_join(sub: tuple[str, ...], where: tuple[str | None, int]) -> None:
    layout = Layout(*where)
    namespace = layout.join("ns", "alice", sub)
    if namespace is None:
        assert len(sub) < layout.labels_before_actor
    else:
        assert layout.split(namespace, "namespace") == ("ns", "alice", sub)


# --- keys -------------------------------------------------------------------------------------


def test_keys_encode_their_sub_namespace() -> None:
    assert encode_key((), "theme") == "theme"
    assert encode_key((), "a.b") == ".a.b"
    assert encode_key((), "") == "."
    assert encode_key((), " ") == ". "
    assert encode_key(("prefs",), "theme") == "prefs..theme"
    assert encode_key(("prefs", "ui"), "a..b") == "prefs.ui..a..b"


def test_a_key_the_store_would_not_write_reads_as_labels_and_a_key() -> None:
    assert decode_key("home_airport") == ((), "home_airport")
    assert decode_key("a.b") == (("a",), "b")
    assert decode_key("a.b.c") == (("a", "b"), "c")


@given(SUBS, KEYS)
def test_decode_undoes_encode(sub: tuple[str, ...], key: str) -> None:
    assert decode_key(encode_key(sub, key)) == (sub, key)


@given(SUBS, KEYS, SUBS, KEYS)
def test_no_two_items_share_an_aidb_key(
    sub: tuple[str, ...], key: str, other_sub: tuple[str, ...], other_key: str
) -> None:
    if (sub, key) != (other_sub, other_key):
        assert encode_key(sub, key) != encode_key(other_sub, other_key)


@given(SUBS.filter(bool), SUBS, KEYS)
def test_a_key_range_selects_exactly_the_items_under_the_prefix(
    prefix: tuple[str, ...], sub: tuple[str, ...], key: str
) -> None:
    condition = key_range(prefix)
    assert condition is not None
    bounds = condition["key"]
    stored = encode_key(sub, key)
    # The server compares keys by code point, as Python compares str.
    inside = bounds["$gte"] <= stored < bounds["$lt"]
    assert inside == (sub[: len(prefix)] == prefix)


def test_the_actors_root_is_no_range() -> None:
    assert key_range(()) is None
    assert key_range(("a", "b")) == {"key": {"$gte": "a.b.", "$lt": "a.b/"}}


def test_a_memory_id_is_a_key_only_as_canonical_text() -> None:
    memory_id = uuid.uuid4()
    assert memory_id_of(str(memory_id)) == memory_id
    assert memory_id_of(str(memory_id).upper()) is None
    assert memory_id_of(memory_id.hex) is None
    assert memory_id_of("theme") is None


# --- the item a memory is ---------------------------------------------------------------------


def test_a_keyless_memory_is_a_root_item_keyed_by_its_id() -> None:
    record = _record()
    assert item_parts(record) == (
        (),
        str(record.id),
        {
            "topic": "seats",
            "content": "Erin prefers window seats",
            "agent_id": "travel",
            "session_id": "trip-1",
        },
    )
    hit = SearchHit(record.id, record.content, 0.5, None, None, NOW, {}, None)
    assert item_parts(hit)[2] == {"content": record.content, "agent_id": None, "session_id": None}


def test_a_keyed_memory_is_its_keys_item_with_its_metadata_as_value() -> None:
    sub, key, value = item_parts(_record("prefs..theme", metadata={"theme": "dark"}))
    assert (sub, key, value) == (("prefs",), "theme", {"theme": "dark"})


def test_only_a_current_keyless_memory_is_addressed_by_its_id() -> None:
    current = _record()
    assert keyless_item(current) is current
    assert keyless_item(None) is None
    assert keyless_item(_record("theme")) is None
    assert keyless_item(_record(valid_to=NOW)) is None
    assert keyless_item(_record(superseded_by=uuid.uuid4())) is None


# --- filters ----------------------------------------------------------------------------------


def test_filters_become_conditions_on_the_metadata() -> None:
    assert translate_filter(None) == []
    assert translate_filter({}) == []
    assert translate_filter({"a": 1, "b": "x"}) == [
        {"metadata.a": {"$eq": 1}},
        {"metadata.b": {"$eq": "x"}},
    ]
    assert translate_filter({"tags": ["a", 1]}) == [{"metadata.tags": {"$eq": ["a", 1]}}]
    assert translate_filter({"pet": {"kind": "cat", "age": {"$gt": 2}}}) == [
        {
            "$and": [
                {"metadata.pet.kind": {"$eq": "cat"}},
                {"metadata.pet.age": {"$gt": 2}},
            ]
        }
    ]
    assert translate_filter({"n": {"$gte": 1, "$lt": "z"}}) == [
        {"$and": [{"metadata.n": {"$gte": 1}}, {"metadata.n": {"$lt": "z"}}]}
    ]


def test_none_means_absent_or_null_and_ne_holds_where_absent() -> None:
    either = {"$or": [{"metadata.a": {"$exists": False}}, {"metadata.a": {"$eq": None}}]}
    assert translate_filter({"a": None}) == [either]
    assert translate_filter({"a": {"$eq": None}}) == [either]
    assert translate_filter({"a": {"$ne": None}}) == [
        {"metadata.a": {"$exists": True, "$ne": None}}
    ]
    assert translate_filter({"a": {"$ne": 3}}) == [{"metadata.a": {"$ne": 3}}]


@pytest.mark.parametrize(
    ("langgraph_filter", "refusal"),
    [
        ({"a": {"$in": [1]}}, "a.$in is not one of LangGraph's operators"),
        ({"$or": [{"a": 1}]}, "which is no field"),
        ({"a.b": 1}, "with a '.'"),
        ({"": 1}, "empty or non-string"),
        ({"a": {}}, "is {}"),
        ({"a": {"b": None}}, "where the field is absent"),
        ({"a": {"b": {"$ne": 1}}}, "where the field is absent"),
        ({"a": {"0": 1}}, "by a number"),
        ({"a": [{"b": 1}]}, "a list holding an object"),
        ({"a": {"$gt": True}}, "a number or a string only"),
        ({"a": {"$lt": [1]}}, "a number or a string only"),
        ({"a": {"$gt": None}}, "a number or a string only"),
        ({"a": object()}, "no JSON value"),
    ],
)
def test_what_the_server_cannot_select_exactly_is_refused(
    langgraph_filter: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(ValueError, match="never applied in part") as info:
        translate_filter(langgraph_filter)
    assert refusal in str(info.value)


def test_a_filter_that_is_not_json_is_refused() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        translate_filter({"a": math.nan})


def test_conditions_are_anded_only_when_there_are_several() -> None:
    one = {"key": {"$exists": True}}
    assert all_of([one]) is one
    assert all_of([one, one]) == {"$and": [one, one]}


# --- content ----------------------------------------------------------------------------------


def test_the_content_is_the_values_text() -> None:
    value = {"text": "Alice prefers chat", "meta": {"note": "  ", "n": 2}, "tags": ["a", "b"]}
    assert content_of(value, ("$",)) == "Alice prefers chat\na\nb"
    assert content_of(value, ("text",)) == "Alice prefers chat"
    assert content_of(value, ("meta.n", "tags[*]")) == "2\na\nb"
    # An object at a path is its JSON (LangGraph's get_text_at_path: keys sorted).
    assert content_of(value, ("meta",)) == '{"n": 2, "note": "  "}'
    # No text at the paths: the value's JSON.
    assert content_of({"n": 3, "é": True}, ("$",)) == '{"n": 3, "é": true}'
    assert content_of(value, ("missing",)) == json.dumps(value, ensure_ascii=False)


def test_index_takes_fields_only() -> None:
    assert index_fields(None) == ("$",)
    assert index_fields({"fields": ["text", "tags[*]"]}) == ("text", "tags[*]")
    assert index_fields({"fields": []}) == ("$",)
    with pytest.raises(ValueError, match=r"model_spec\.embedding"):
        index_fields({"fields": ["text"], "dims": 3})
    with pytest.raises(ValueError, match="list of paths"):
        index_fields({"fields": "text"})


# --- namespace listing ------------------------------------------------------------------------


def test_match_conditions_as_in_memory_store() -> None:
    namespace = ("ns", "alice", "prefs", "ui")
    assert matches(MatchCondition("prefix", ("ns", "alice")), namespace)
    assert matches(MatchCondition("prefix", ("ns", "*", "prefs")), namespace)
    assert not matches(MatchCondition("prefix", ("ns", "bob")), namespace)
    assert matches(MatchCondition("suffix", ("prefs", "ui")), namespace)
    assert matches(MatchCondition("suffix", ("*", "ui")), namespace)
    assert not matches(MatchCondition("suffix", ("ui", "prefs")), namespace)
    assert not matches(MatchCondition("prefix", (*namespace, "more")), namespace)
    with pytest.raises(ValueError, match="unknown match type"):
        matches(MatchCondition("infix", ("ns",)), namespace)  # type: ignore[arg-type]


# --- TTL --------------------------------------------------------------------------------------


def test_a_ttl_in_minutes_is_whole_seconds_rounded_up() -> None:
    assert ttl_seconds(5) == 300
    assert ttl_seconds(0.1) == 6, "the decimal 0.1, not the float's 6.000000000000001"
    assert ttl_seconds(1 / 3) == 20
    assert ttl_seconds(0.501) == 31
    assert ttl_seconds(0.001) == 1
    assert ttl_seconds(0) == 1, "the server's least time to live"
    assert ttl_seconds(MAX_TTL_S // 60) == MAX_TTL_S


@given(st.floats(min_value=0, max_value=MAX_TTL_S / 60, allow_nan=False))
def test_a_ttl_lives_at_least_as_long_as_asked_and_less_than_a_second_more(
    minutes: float,
) -> None:
    seconds = ttl_seconds(minutes)
    assert 1 <= seconds <= MAX_TTL_S
    assert seconds >= minutes * 60 - 1e-6
    # Less than a second more, or the least time to live.
    assert seconds < minutes * 60 + 1 or seconds == 1


@pytest.mark.parametrize(
    ("minutes", "refusal"),
    [
        (-0.5, "at least 0"),
        (math.inf, "finite"),
        (math.nan, "finite"),
        (MAX_TTL_S // 60 + 1, "at most 5256000 minutes"),
        (True, "a number"),
        ("5", "a number"),
    ],
)
def test_a_ttl_the_server_cannot_store_is_refused(minutes: Any, refusal: str) -> None:
    with pytest.raises(ValueError, match=refusal) as info:
        ttl_seconds(minutes, "put's ttl")
    assert "put's ttl" in str(info.value)


def test_a_ttl_configuration_is_langgraphs_checked() -> None:
    assert checked_ttl_config(None) is None
    assert checked_ttl_config({}) == {}
    config = {
        "default_ttl": 1.5,
        "refresh_on_read": False,
        "sweep_interval_minutes": 60,
        "omit_expired": True,
    }
    checked = checked_ttl_config(config)
    assert checked == config and checked is not config
    with pytest.raises(ValueError, match=r"not \['strategy'\]"):
        checked_ttl_config({"strategy": "delete"})
    with pytest.raises(ValueError, match=r"ttl\['default_ttl'\] is minutes"):
        checked_ttl_config({"default_ttl": -1})
    with pytest.raises(ValueError, match="is a bool"):
        checked_ttl_config({"refresh_on_read": 1})
    with pytest.raises(ValueError, match="is a bool"):
        checked_ttl_config({"omit_expired": None})
    for sweep in (0, -1, True, "5"):
        with pytest.raises(ValueError, match="above 0"):
            checked_ttl_config({"sweep_interval_minutes": sweep})
    with pytest.raises(TypeError, match="TTLConfig"):
        checked_ttl_config(10)  # type: ignore[arg-type]
