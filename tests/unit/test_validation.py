"""validation.py without a database: names, model specs, config, merge, state."""

from __future__ import annotations

from typing import Any

import pytest

from aidb_memory_server import validation
from aidb_memory_server.errors import (
    INVALID_PARAMETER_VALUE,
    NULL_VALUE_NOT_ALLOWED,
    ApiError,
)


def _error(call: Any, *args: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(*args)
    return info.value


# --- namespace names -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "pg_agents", "Support Desk", "é" * 128, "名前", "a-b.c"])
def test_valid_names_come_back_unchanged(name: str) -> None:
    assert validation.namespace_name("init", name) == name


def test_null_name_is_22004_naming_the_function_and_field() -> None:
    e = _error(validation.namespace_name, "init", None)
    assert e.sqlstate == NULL_VALUE_NOT_ALLOWED
    assert e.message == "aidb_memory.init: name must not be NULL"
    assert e.hint


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "must be non-empty"),
        (" a", "surrounding spaces"),
        ("a ", "surrounding spaces"),
        ("x" * 129, "longer than 128 characters"),
        ("a\x01b", "control characters"),
        ("a\nb", "control characters"),
        ("ab\n", "control characters"),
        ("\tab", "control characters"),
        ("a\x7fb", "control characters"),
        ("a\x85b", "control characters"),  # C1: NEXT LINE
        ("a\x9bb", "control characters"),  # C1: CONTROL SEQUENCE INTRODUCER
        ("a\u2028b", "control characters"),  # LINE SEPARATOR
        ("a\u2029b", "control characters"),  # PARAGRAPH SEPARATOR
    ],
)
def test_bad_names_are_22023(name: str, problem: str) -> None:
    e = _error(validation.namespace_name, "namespace_update", name)
    assert e.sqlstate == INVALID_PARAMETER_VALUE
    assert e.message.startswith("aidb_memory.namespace_update: name ")
    assert problem in e.message


def test_name_length_limit_is_exactly_128_characters() -> None:
    assert validation.NAMESPACE_NAME_MAX == 128
    assert validation.namespace_name("init", "ü" * 128) == "ü" * 128
    _error(validation.namespace_name, "init", "ü" * 129)


# --- JSON objects --------------------------------------------------------------------------


def test_json_object_parses_objects_and_reads_null_as_empty() -> None:
    assert validation.json_object("init", "config", '{"a": [1, {"b": null}]}') == {
        "a": [1, {"b": None}]
    }
    assert validation.json_object("init", "config", None) == {}


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("[]", "an array"),
        ('"x"', "a string"),
        ("1", "a number"),
        ("1.5", "a number"),
        ("true", "a boolean"),
        ("null", "null"),
    ],
)
def test_json_object_refuses_other_json(text: str, kind: str) -> None:
    e = _error(validation.json_object, "init", "model_spec", text)
    assert e.sqlstate == INVALID_PARAMETER_VALUE
    assert e.message == f"aidb_memory.init: model_spec must be a JSON object, not {kind}"


def test_parse_json_reports_bad_text_as_22023() -> None:
    assert validation.parse_json("f", "turns", "[1]") == [1]
    e = _error(validation.parse_json, "f", "turns", "{nope")
    assert e.sqlstate == INVALID_PARAMETER_VALUE
    assert e.message.startswith("aidb_memory.f: turns is not valid JSON")


# --- model_spec ----------------------------------------------------------------------------


def test_model_spec_keeps_names_and_drops_nulls() -> None:
    assert validation.model_spec("init", {}) == {}
    assert validation.model_spec("init", {"llm": "gpt", "embedding": "emb"}) == {
        "llm": "gpt",
        "embedding": "emb",
    }
    assert validation.model_spec("init", {"llm": None, "embedding": "emb"}) == {"embedding": "emb"}


def test_model_spec_unknown_key_names_the_field_and_lists_the_known_ones() -> None:
    e = _error(validation.model_spec, "init", {"lm": "gpt"})
    assert e.sqlstate == INVALID_PARAMETER_VALUE
    assert e.message == "aidb_memory.init: model_spec.lm is not a known key"
    assert e.hint is not None and "llm" in e.hint and "embedding" in e.hint


@pytest.mark.parametrize("value", ["", "   ", 5, True, ["gpt"], {"name": "gpt"}])
def test_model_spec_values_must_be_non_empty_strings(value: Any) -> None:
    e = _error(validation.model_spec, "namespace_update", {"embedding": value})
    assert e.sqlstate == INVALID_PARAMETER_VALUE
    assert e.message.startswith("aidb_memory.namespace_update: model_spec.embedding must be")


# --- config --------------------------------------------------------------------------------


def test_every_default_is_valid_config() -> None:
    # A default of None (allowed_fallback_models: no fence) is "absent", as a null key is.
    assert validation.config("init", dict(validation.CONFIG_DEFAULTS)) == {
        k: v for k, v in validation.CONFIG_DEFAULTS.items() if v is not None
    }


def test_the_fallback_fence() -> None:
    assert validation.fallback_allowed(validation.effective_config({}), "any")
    fenced = validation.effective_config({"allowed_fallback_models": ["cheap"]})
    assert validation.fallback_allowed(fenced, "cheap")
    assert not validation.fallback_allowed(fenced, "premium")
    assert not validation.fallback_allowed({"allowed_fallback_models": []}, "cheap")
    assert validation.config("init", {"allowed_fallback_models": ["a", "b"]}) == {
        "allowed_fallback_models": ["a", "b"]
    }
    for bad in ("a", {"a": 1}, [None], ["a\n"], ["x"] * 101):
        with pytest.raises(ApiError) as info:
            validation.config("init", {"allowed_fallback_models": bad})
        assert info.value.message.startswith("aidb_memory.init: config.allowed_fallback_models ")


def test_config_accepts_limits_at_both_ends() -> None:
    cfg = {"max_turn_chars": 1, "llm_timeout_s": 3_600, "actor_binding": "session_user"}
    assert validation.config("init", cfg) == cfg
    assert validation.config("init", {"extraction": False}) == {"extraction": False}


def test_config_null_means_default_and_is_left_out() -> None:
    assert validation.config("init", {"max_turn_chars": None, "extraction": False}) == {
        "extraction": False
    }


def test_config_unknown_key_names_the_field_even_when_null() -> None:
    for value in (1, None):
        e = _error(validation.config, "init", {"max_turn_chrs": value})
        assert e.sqlstate == INVALID_PARAMETER_VALUE
        assert e.message == "aidb_memory.init: config.max_turn_chrs is not a known key"
        assert e.hint is not None and "max_turn_chars" in e.hint


@pytest.mark.parametrize(
    ("cfg", "problem"),
    [
        ({"max_turn_chars": "5"}, "config.max_turn_chars must be an integer"),
        ({"max_turn_chars": 5.0}, "config.max_turn_chars must be an integer"),
        ({"max_turn_chars": True}, "config.max_turn_chars must be an integer"),
        ({"max_turn_chars": 0}, "config.max_turn_chars must be between 1 and 10000000"),
        ({"max_turn_chars": 10_000_001}, "config.max_turn_chars must be between"),
        ({"max_turns_per_add": -1}, "config.max_turns_per_add must be between"),
        ({"max_identifier_chars": 4_097}, "config.max_identifier_chars must be between"),
        ({"llm_timeout_s": 0}, "config.llm_timeout_s must be between 1 and 3600"),
        ({"compaction_min_target_chars": [1]}, "config.compaction_min_target_chars must be an"),
        ({"extraction": "yes"}, "config.extraction must be true or false"),
        ({"extraction": 1}, "config.extraction must be true or false"),
        ({"actor_binding": "root"}, "config.actor_binding must be one of: none, session_user"),
        ({"actor_binding": ["none"]}, "config.actor_binding must be one of"),
        ({"actor_binding": True}, "config.actor_binding must be one of"),
        (
            {"extraction_mode": "llm"},
            "config.extraction_mode must be one of: auto, model, verbatim, verbatim_all",
        ),
        ({"extraction_mode": ["auto"]}, "config.extraction_mode must be one of"),
        ({"memory_max_chars": 99}, "config.memory_max_chars must be between 100 and 100000"),
        ({"memory_max_chars": 100_001}, "config.memory_max_chars must be between"),
        ({"memory_max_chars": 500.0}, "config.memory_max_chars must be an integer"),
    ],
)
def test_config_wrong_types_and_ranges_are_22023(cfg: dict[str, Any], problem: str) -> None:
    e = _error(validation.config, "init", cfg)
    assert e.sqlstate == INVALID_PARAMETER_VALUE
    assert e.message.startswith(f"aidb_memory.init: {problem}")


def test_effective_config_fills_defaults_and_keeps_overrides() -> None:
    eff = validation.effective_config({"max_turn_chars": 7})
    assert eff["max_turn_chars"] == 7
    assert eff["actor_binding"] == "none"
    assert set(eff) == set(validation.CONFIG_DEFAULTS)


# --- merge and state -----------------------------------------------------------------------


def test_merge_sets_replaces_and_null_removes_without_touching_the_input() -> None:
    current = {"a": 1, "b": 2}
    merged = validation.merge(current, {"b": 3, "a": None, "c": 4, "missing": None})
    assert merged == {"b": 3, "c": 4}
    assert current == {"a": 1, "b": 2}


@pytest.mark.parametrize(
    ("value", "expected"),
    [("ACTIVE", "ACTIVE"), ("inactive", "INACTIVE"), ("Active", "ACTIVE")],
)
def test_state_is_case_insensitive_on_input(value: str, expected: str) -> None:
    assert validation.state("namespace_update", value) == expected


@pytest.mark.parametrize("value", ["", "ON", "deleted", " ACTIVE"])
def test_unknown_state_is_22023(value: str) -> None:
    e = _error(validation.state, "namespace_update", value)
    assert e.sqlstate == INVALID_PARAMETER_VALUE
    assert e.message == "aidb_memory.namespace_update: state must be ACTIVE or INACTIVE"
