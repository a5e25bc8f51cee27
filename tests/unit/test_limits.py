"""The cost bounds of issue 9 without a database: validation.parse_json (hostile JSON), the
size check of an add batch, the cap of an extraction request and the new config keys."""

from __future__ import annotations

import json
from typing import Any

import pytest

from aidb_memory_server import extraction, turns, validation
from aidb_memory_server.errors import INVALID_PARAMETER_VALUE, ApiError


def _error(call: Any, *args: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(*args)
    assert info.value.sqlstate == INVALID_PARAMETER_VALUE
    return info.value


def _nested(levels: int, leaf: str = "1") -> str:
    return '{"a": ' * levels + leaf + "}" * levels


# --- parse_json ---------------------------------------------------------------------------------


def test_parse_json_reads_ordinary_json_as_json_loads_does() -> None:
    text = '{"a": [1, -2, 3.5, 1e10, "x", null, true], "b": {"c": 10000000000000000000000}}'
    assert validation.parse_json("f", "arg", text) == json.loads(text)


def test_depth_up_to_the_limit_is_accepted() -> None:
    depth = validation.JSON_MAX_DEPTH
    value = validation.parse_json("f", "arg", "[" * depth + "]" * depth)
    for _ in range(depth - 1):
        value = value[0]
    assert value == []


@pytest.mark.parametrize("levels", [validation.JSON_MAX_DEPTH + 1, 500, 5000])
def test_deeper_is_refused_naming_where(levels: int) -> None:
    # 500 is within Python's recursion limit (found by the walk), 5000 beyond it (json.loads
    # raises RecursionError and a scan of the text finds the place): the same message.
    text = '[{"role": "user", "meta": ' + _nested(levels) + "}]"
    e = _error(validation.parse_json, "add", "turns", text)
    assert e.message == (
        f"aidb_memory.add: turns[0].meta is nested deeper than {validation.JSON_MAX_DEPTH} levels"
    )
    assert e.hint is not None and str(validation.JSON_MAX_DEPTH) in e.hint


def test_a_deep_array_names_its_indexes() -> None:
    text = '{"x": 1, "ids": ["a", "b", ' + "[" * 3000 + "]" * 3000 + "]}"
    e = _error(validation.parse_json, "delete", "selector", text)
    assert e.message.startswith("aidb_memory.delete: selector.ids[2] is nested deeper")


def test_strings_full_of_brackets_are_not_nesting() -> None:
    text = json.dumps({"content": "[{" * 10_000, "k": '\\"[{'})
    assert validation.parse_json("add", "turns", text)["content"] == "[{" * 10_000


@pytest.mark.parametrize(
    ("number", "problem"),
    [
        ("9" * 5000, "has a number of 5000 characters"),
        ("-" + "1" * 100, "has a number of 101 characters"),
        ("0." + "5" * 200, "has a number of 202 characters"),
        ("1e400", "has a number out of range"),
        ("-1e400", "has a number out of range"),
    ],
)
def test_numbers_too_long_or_out_of_range_are_refused(number: str, problem: str) -> None:
    text = '{"x": [1, 2], "meta": {"n": [0, ' + number + "]}}"
    e = _error(validation.parse_json, "add", "turns", text)
    assert e.message == f"aidb_memory.add: turns.meta.n {problem}"
    assert e.hint is not None


def test_numbers_up_to_the_limit_are_kept() -> None:
    big = "9" * validation.JSON_MAX_NUMBER_CHARS
    assert validation.parse_json("f", "arg", f"[{big}, 1.5e300]") == [int(big), 1.5e300]


def test_nan_and_infinity_are_refused() -> None:
    # jsonb never holds them; text from elsewhere might.
    for constant in ("NaN", "Infinity", "-Infinity"):
        e = _error(validation.parse_json, "f", "arg", f'{{"v": {constant}}}')
        assert e.message == f"aidb_memory.f: arg.v has {constant}, which is not a JSON number"


def test_max_chars_is_checked_before_parsing() -> None:
    e = _error(validation.parse_json, "delete", "selector", "{nope" + " " * 100, 50)
    assert e.message == (
        "aidb_memory.delete: selector has 105 characters of JSON, more than the limit of 50"
    )


def test_odd_keys_are_quoted_and_cut_in_the_path() -> None:
    key = "a b\n" + "x" * 100
    text = json.dumps({key: json.loads(_nested(200))})
    e = _error(validation.parse_json, "init", "config", text)
    assert e.message.startswith('aidb_memory.init: config["a b\\nxxx')
    assert "\n" not in e.message and len(e.message) < 200


def test_json_object_uses_the_same_limits() -> None:
    e = _error(
        validation.json_object, "create_model", "options", '{"timeout_s": ' + "1" * 500 + "}"
    )
    assert e.message.startswith("aidb_memory.create_model: options.timeout_s has a number")


# --- config keys --------------------------------------------------------------------------------

_CAPS = {
    "max_add_chars": (1_000, 100_000_000, 1_000_000),
    "search_max_query_chars": (1, 1_000_000, 4_000),
    "search_max_words": (1, 10_000, 32),
    "search_max_query_nodes": (1, 100_000, 64),
    "search_max_ranked": (10, 1_000_000, 2_000),
    "extraction_max_input_chars": (1_000, 10_000_000, 200_000),
}


@pytest.mark.parametrize("key", sorted(_CAPS))
def test_cost_caps_are_config_keys_with_defaults_and_ranges(key: str) -> None:
    lo, hi, default = _CAPS[key]
    assert validation.CONFIG_DEFAULTS[key] == default
    assert validation.config("init", {key: lo}) == {key: lo}
    assert validation.config("init", {key: hi}) == {key: hi}
    for bad in (lo - 1, hi + 1):
        e = _error(validation.config, "init", {key: bad})
        assert e.message == f"aidb_memory.init: config.{key} must be between {lo} and {hi}"
    e = _error(validation.config, "init", {key: "5"})
    assert e.message == f"aidb_memory.init: config.{key} must be an integer"


# --- add batch size -----------------------------------------------------------------------------


def test_an_add_batch_over_max_add_chars_is_refused_before_parsing() -> None:
    limits = turns.Limits(100, 3, 10, max_add_chars=1_000)
    e = _error(turns.parse_turns, "add", "[" + " " * 1_000 + "]", limits)
    assert e.message == (
        "aidb_memory.add: turns has 1002 characters of JSON, more than the namespace limit of 1000"
    )
    assert e.hint is not None and "config.max_add_chars" in e.hint
    assert turns.parse_turns("add", '[{"role": "user"}]', limits) == [{"role": "user"}]


def test_turns_refuse_hostile_json_naming_the_turn() -> None:
    limits = turns.Limits(100, 3, 10)
    text = '[{"role": "user", "content": "x"}, {"role": "user", "meta": ' + _nested(3000) + "}]"
    e = _error(turns.parse_turns, "add", text, limits)
    assert e.message.startswith("aidb_memory.add: turns[1].meta is nested deeper")


# --- extraction request -------------------------------------------------------------------------


def _t(content: str, role: str = "user") -> extraction.Turn:
    return extraction.Turn(role, content)


def test_bounded_keeps_turns_that_fit_whole() -> None:
    given = [_t("a" * 10), _t("b" * 20, "assistant")]
    assert extraction.bounded(given, 30) == (given, 0)


def test_bounded_cuts_the_turn_that_crosses_and_leaves_out_the_rest() -> None:
    given = [_t("a" * 10), _t("b" * 20), _t("c" * 5)]
    kept, left_out = extraction.bounded(given, 15)
    assert kept == [_t("a" * 10), _t("b" * 5)]
    assert left_out == 15 + 5


def test_the_prompt_says_what_was_left_out_and_stays_within_the_cap() -> None:
    given = [_t("x" * 100_000) for _ in range(100)]  # the 10 MB request of issue 9, scaled
    kept, left_out = extraction.bounded(given, 200_000)
    messages = extraction.prompt(kept, [], "2026-01-01", left_out)
    assert left_out == 10_000_000 - 200_000
    user = messages[-1]["content"]
    assert "(9800000 more characters of these turns are not shown)" in user
    assert len(user) < 200_000 + 1_000
    assert "not shown" not in extraction.prompt(kept, [], "2026-01-01")[-1]["content"]
