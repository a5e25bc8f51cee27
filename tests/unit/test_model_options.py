"""Validation of model providers, options, names and secret values (no database)."""

from __future__ import annotations

from typing import Any

import pytest

from aidb_memory_server import models
from aidb_memory_server.errors import ApiError

FN = "create_model"
SECRET = "sk-very-secret-0123456789"


def _refused(prov: str, options: dict[str, Any], sqlstate: str = "22023") -> ApiError:
    with pytest.raises(ApiError) as info:
        models.provider_options(FN, prov, options)
    assert info.value.sqlstate == sqlstate
    return info.value


@pytest.mark.parametrize(
    "options",
    [
        {"model": "gpt-4o-mini"},
        {"model": "gpt-4o-mini", "base_url": "https://api.openai.com/v1"},
        {"model": "llama3", "base_url": "http://127.0.0.1:11434/v1", "timeout_s": 600},
        {"model": "m", "base_url": "http://vllm:8000/v1", "api_key_secret": "vllm key"},
        {"model": "m", "api_key_env": "OPENAI_API_KEY", "timeout_s": 1.5, "max_retries": 0},
        {"model": "m", "api_key_env": "_K9", "max_retries": 5, "timeout_s": 1},
        {"model": "m", "base_url": "https://[::1]:8080/"},
    ],
)
def test_good_openai_options_pass_unchanged(options: dict[str, Any]) -> None:
    assert models.provider_options(FN, "openai", dict(options)) == options


def test_builtin_takes_exactly_kind_extractive() -> None:
    assert models.provider_options(FN, "builtin", {"kind": "extractive"}) == {"kind": "extractive"}
    assert "options.kind" in _refused("builtin", {}).message
    assert "options.kind" in _refused("builtin", {"kind": "abstractive"}).message
    e = _refused("builtin", {"kind": "extractive", "model": "x"})
    assert e.message == "aidb_memory.create_model: options.model is not a known key"


@pytest.mark.parametrize(
    ("options", "field", "problem"),
    [
        ({}, "options.model", "is required"),
        ({"model": ""}, "options.model", "must be a non-empty string"),
        ({"model": 3}, "options.model", "must be a non-empty string"),
        ({"model": "m", "base_url": "ftp://host/v1"}, "options.base_url", "must be an http"),
        ({"model": "m", "base_url": "https://"}, "options.base_url", "must be an http"),
        ({"model": "m", "base_url": "api.openai.com"}, "options.base_url", "must be an http"),
        ({"model": "m", "base_url": 5}, "options.base_url", "must be an http"),
        ({"model": "m", "base_url": "http://h:99999/"}, "options.base_url", "is not a valid"),
        ({"model": "m", "base_url": "http://h/ v1"}, "options.base_url", "must not contain"),
        ({"model": "m", "base_url": "http://h/?key=1"}, "options.base_url", "must not have"),
        ({"model": "m", "base_url": "http://h/#x"}, "options.base_url", "must not have"),
        ({"model": "m", "api_key_env": "lower"}, "options.api_key_env", "must be an env"),
        ({"model": "m", "api_key_env": "9X"}, "options.api_key_env", "must be an env"),
        ({"model": "m", "api_key_env": "A-B"}, "options.api_key_env", "must be an env"),
        ({"model": "m", "api_key_env": 1}, "options.api_key_env", "must be an env"),
        ({"model": "m", "api_key_secret": ""}, "options.api_key_secret", "must be non-empty"),
        ({"model": "m", "api_key_secret": 1}, "options.api_key_secret", "must be a secret"),
        (
            {"model": "m", "api_key_secret": "s", "api_key_env": "K"},
            "options.api_key_secret",
            "and options.api_key_env are exclusive",
        ),
        ({"model": "m", "timeout_s": 0}, "options.timeout_s", "must be between 1 and 600"),
        ({"model": "m", "timeout_s": 601}, "options.timeout_s", "must be between 1 and 600"),
        ({"model": "m", "timeout_s": "5"}, "options.timeout_s", "must be a number"),
        ({"model": "m", "timeout_s": True}, "options.timeout_s", "must be a number"),
        ({"model": "m", "max_retries": 6}, "options.max_retries", "must be between 0 and 5"),
        ({"model": "m", "max_retries": -1}, "options.max_retries", "must be between 0 and 5"),
        ({"model": "m", "max_retries": 1.5}, "options.max_retries", "must be an integer"),
        ({"model": "m", "temperature": 0}, "options.temperature", "is not a known key"),
    ],
)
def test_bad_openai_options_are_22023_naming_the_field(
    options: dict[str, Any], field: str, problem: str
) -> None:
    e = _refused("openai", options)
    assert e.message.startswith(f"aidb_memory.create_model: {field} {problem}"), e.message


@pytest.mark.parametrize("key", ["api_key", "API_KEY", "key", "token", "password"])
@pytest.mark.parametrize("prov", ["openai", "builtin"])
def test_a_key_in_options_is_refused_without_echoing_it(key: str, prov: str) -> None:
    e = _refused(prov, {"model": "m", key: SECRET})
    assert e.message.startswith(f"aidb_memory.create_model: options.{key} is refused")
    assert e.hint is not None and "aidb_memory.set_secret" in e.hint
    assert SECRET not in f"{e.message} {e.hint} {e.detail}"


def test_credentials_in_base_url_are_refused_without_echoing_them() -> None:
    e = _refused("openai", {"model": "m", "base_url": f"https://user:{SECRET}@host/v1"})
    assert e.message == "aidb_memory.create_model: options.base_url must not contain credentials"
    assert SECRET not in f"{e.message} {e.hint}"


def test_no_option_value_is_ever_echoed() -> None:
    for options in (
        {"model": "m", "timeout_s": SECRET},
        {"model": "m", "api_key_env": SECRET},
        {"model": "m", "base_url": SECRET},
        {"model": SECRET * 20},
        {"kind": SECRET},
    ):
        for prov in ("openai", "builtin"):
            with pytest.raises(ApiError) as info:
                models.provider_options(FN, prov, options)
            e = info.value
            assert SECRET not in f"{e.message} {e.hint} {e.detail}"


def test_provider_must_be_known() -> None:
    assert models.provider(FN, "openai") == "openai"
    for bad in ("OpenAI", "anthropic", ""):
        with pytest.raises(ApiError) as info:
            models.provider(FN, bad)
        assert info.value.sqlstate == "22023"
        assert info.value.message == (
            "aidb_memory.create_model: provider must be one of: openai, builtin"
        )
    with pytest.raises(ApiError) as info:
        models.provider(FN, None)
    assert info.value.sqlstate == "22004"


@pytest.mark.parametrize(
    ("value", "sqlstate", "problem"),
    [
        (None, "22004", "must not be NULL"),
        ("", "22023", "must be non-empty and have no surrounding spaces"),
        (" x", "22023", "must be non-empty and have no surrounding spaces"),
        ("a\nb", "22023", "must not contain control characters"),
        ("x" * 129, "22023", "is longer than 128 characters"),
    ],
)
def test_names_are_checked(value: str | None, sqlstate: str, problem: str) -> None:
    with pytest.raises(ApiError) as info:
        models.name("drop_model", "name", value)
    assert info.value.sqlstate == sqlstate
    assert info.value.message == f"aidb_memory.drop_model: name {problem}"
    assert models.name("drop_model", "name", "gpt 4o-mini/ü") == "gpt 4o-mini/ü"


@pytest.mark.parametrize(
    ("value", "sqlstate"),
    [
        (None, "22004"),
        ("", "22023"),
        ("   ", "22023"),
        (SECRET + "\n", "22023"),
        (" " + SECRET, "22023"),
        (SECRET + "\x00x", "22023"),
        (SECRET * 1000, "22023"),
    ],
)
def test_a_bad_secret_value_is_refused_without_echoing_it(value: str | None, sqlstate: str) -> None:
    with pytest.raises(ApiError) as info:
        models.secret_value("set_secret", value)
    e = info.value
    assert e.sqlstate == sqlstate
    assert e.message.startswith("aidb_memory.set_secret: value ")
    assert SECRET not in f"{e.message} {e.hint} {e.detail}"
    assert models.secret_value("set_secret", SECRET) == SECRET
