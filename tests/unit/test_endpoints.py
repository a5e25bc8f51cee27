"""Endpoint normalization, the allow-list of key variables and URL redaction (issue 9, items 8
and 10): plain functions of aidb_memory_server.endpoints."""

from __future__ import annotations

import pytest

from aidb_memory_server import endpoints
from aidb_memory_server.errors import ApiError


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://api.openai.com/v1", "https://api.openai.com:443"),
        ("HTTPS://API.OpenAI.com:443/v1/", "https://api.openai.com:443"),
        ("http://vllm-host:8000/v1", "http://vllm-host:8000"),
        ("http://h", "http://h:80"),
        ("http://h:0080/x", "http://h:80"),
        ("http://h.:80", "http://h:80"),
        ("http://127.0.0.1:11434/v1", "http://127.0.0.1:11434"),
        ("http://[::1]:8080/v1", "http://[::1]:8080"),
        ("http://[2001:DB8::1]/v1", "http://[2001:db8::1]:80"),
        (
            "https://my-resource.openai.azure.com/openai/v1/",
            "https://my-resource.openai.azure.com:443",
        ),
    ],
)
def test_endpoint_normalization(url: str, expected: str) -> None:
    assert endpoints.endpoint(url) == expected


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://h/x", "must be an http or https URL with a host"),
        ("http:///v1", "must be an http or https URL with a host"),
        ("h:80", "must be an http or https URL with a host"),
        ("http://u:p@h/v1", "must not contain credentials"),
        ("http://h:99999/", "is not a valid URL"),
        ("http://h x/", "must not contain spaces or control characters"),
        ("http://h%2e.evil/", "has a host that is not a plain name or address"),
        ("http://./", "must be an http or https URL with a host"),
    ],
)
def test_what_is_not_an_endpoint(url: str, why: str) -> None:
    with pytest.raises(endpoints.BadEndpoint) as info:
        endpoints.endpoint(url)
    assert str(info.value) == why


def test_the_endpoints_argument() -> None:
    assert endpoints.endpoints("set_secret", "endpoints", None) is None
    assert endpoints.endpoints(
        "set_secret", "endpoints", ["https://b/v1", "http://a:80", "HTTPS://B:443/other"]
    ) == ["http://a:80", "https://b:443"]
    for bad, field in (([], "endpoints"), (["http://a", None], "endpoints[2]")):
        with pytest.raises(ApiError) as info:
            endpoints.endpoints("set_secret", "endpoints", bad)
        assert info.value.sqlstate == "22023"
        assert info.value.message.startswith(f"aidb_memory.set_secret: {field} ")
    with pytest.raises(ApiError) as info:
        endpoints.endpoints("set_secret", "endpoints", ["http://u:secretpw@h"])
    assert "secretpw" not in info.value.message and "credentials" in info.value.message
    with pytest.raises(ApiError):
        endpoints.endpoints("set_secret", "endpoints", [f"http://h{i}" for i in range(17)])


def test_a_model_without_base_url_goes_to_openai() -> None:
    assert endpoints.model_endpoint(None, endpoints.OPENAI_DEFAULT_URL) == endpoints.OPENAI_DEFAULT
    assert endpoints.model_endpoint("", endpoints.OPENAI_DEFAULT_URL) == endpoints.OPENAI_DEFAULT


@pytest.mark.parametrize(
    ("setting", "name", "allowed"),
    [
        (None, "OPENAI_API_KEY", True),
        (None, "VLLM_API_KEY", True),
        (None, "_API_KEY", True),
        (None, "BACKUP_S3_SECRET", False),
        (None, "HOME", False),
        (None, "OPENAI_API_KEY_OLD", False),
        (None, "openai_api_key", False),
        ("*_API_KEY, HOME", "HOME", True),
        ("*_API_KEY HOME", "PGPASSWORD", False),
        ("AIDB_*", "AIDB_X", True),
        ("A.B", "AXB", False),  # no regular expressions: "." is a dot
        ("", "OPENAI_API_KEY", False),  # an empty setting allows nothing
        ("*", "ANYTHING", True),
    ],
)
def test_the_allow_list_of_key_variables(setting: str | None, name: str, allowed: bool) -> None:
    assert endpoints.env_allowed(name, endpoints.env_patterns(setting)) is allowed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://h:1/v1", "http://h:1/v1"),
        ("http://u:p@h:1/v1", "http://[redacted]@h:1/v1"),
        ("http://h/v1?token=x", "http://h/v1?[redacted]"),
        ("http://h/v1#frag", "http://h/v1#[redacted]"),
        ("https://u@h?k=v", "https://[redacted]@h?[redacted]"),
        (
            "failed for url 'http://u:p@127.0.0.1:5/v1/?t=1chat/completions' (see https://x.org/a)",
            "failed for url 'http://[redacted]@127.0.0.1:5/v1/?[redacted]' (see https://x.org/a)",
        ),
        ("no url here: a@b?c", "no url here: a@b?c"),
    ],
)
def test_urls_in_admin_text_are_redacted(text: str, expected: str) -> None:
    assert endpoints.redact_urls(text) == expected
    assert endpoints.redact_urls(expected) == expected, "redacting twice changes nothing"


def test_urls_in_application_text_are_removed() -> None:
    text = "connection failed: for url 'http://u:p@h:1/v1?t=1' and http://other/x."
    assert endpoints.strip_urls(text) == "connection failed: for url '[url]' and [url]"
