"""Where a key may be sent, which environment variables may hold one, and URLs in messages
(issue 9, items 8 and 10). Pure Python: no plpy, unit-tested in tests/unit/test_endpoints.py.

An *endpoint* is the origin a request goes to, ``scheme://host:port``: scheme and host
lower-cased, the default port filled in (80 for http, 443 for https), an IPv6 host in brackets,
a trailing dot of the host dropped. The path is not part of it: a key is bound to a server, and
anything on that server could read it anyway.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from aidb_memory_server.errors import invalid

DEFAULT_PORTS = {"http": 80, "https": 443}
# Where the openai client sends a request when a model has no base_url, and its endpoint.
OPENAI_DEFAULT_URL = "https://api.openai.com/v1"
OPENAI_DEFAULT = "https://api.openai.com:443"
ENDPOINTS_MAX = 16
URL_MAX = 2_048
# The runtime_settings key, and its value when the row is absent.
ENV_PATTERN_SETTING = "api_key_env_pattern"
ENV_PATTERN_DEFAULT = "*_API_KEY"


class BadEndpoint(ValueError):
    """A URL that names no http(s) endpoint; the message says why, never echoing the URL."""


def endpoint(url: str) -> str:
    """The normalized endpoint of an http(s) URL (``https://Host/v1`` -> ``https://host:443``).

    Raises :class:`BadEndpoint` for anything else, and for a URL with credentials: those would
    go to the server as well, and a binding is never weaker than the URL it was made for.
    """
    if any(c.isspace() for c in url) or any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise BadEndpoint("must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError:
        raise BadEndpoint("is not a valid URL") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not host:
        raise BadEndpoint("must be an http or https URL with a host")
    if parts.username is not None or parts.password is not None:
        raise BadEndpoint("must not contain credentials")
    # A percent-escaped or otherwise odd host could be read differently by the HTTP client.
    if not re.fullmatch(r"[a-z0-9._:\-\[\]]+", host):
        raise BadEndpoint("has a host that is not a plain name or address")
    if host.endswith("."):  # "api.openai.com." is "api.openai.com"
        host = host[:-1]
    if not host or host.startswith("."):
        raise BadEndpoint("must be an http or https URL with a host")
    if ":" in host:  # an IPv6 address: urlsplit took off its brackets
        host = f"[{host}]"
    return f"{scheme}://{host}:{port if port is not None else DEFAULT_PORTS[scheme]}"


def endpoints(function: str, field: str, values: list[str | None] | None) -> list[str] | None:
    """A secret's endpoints argument, normalized, sorted and without duplicates; None stays None
    (the caller decides what that means). 22023 for an empty list or a bad element."""
    if values is None:
        return None
    if not values:
        raise invalid(
            function,
            field,
            "must name at least one endpoint",
            hint="pass NULL for the default (https://api.openai.com:443, or the endpoints the "
            "secret already has)",
        )
    if len(values) > ENDPOINTS_MAX:
        raise invalid(function, field, f"has more than {ENDPOINTS_MAX} elements")
    out = set()
    for i, value in enumerate(values, start=1):
        if value is None:
            raise invalid(function, f"{field}[{i}]", "must not be NULL")
        if len(value) > URL_MAX:
            raise invalid(function, f"{field}[{i}]", f"is longer than {URL_MAX} characters")
        try:
            out.add(endpoint(value))
        except BadEndpoint as e:
            raise invalid(
                function,
                f"{field}[{i}]",
                str(e),
                hint="an endpoint is an http(s) URL such as https://api.openai.com or a model's "
                "base_url; only its scheme, host and port count",
            ) from None
    return sorted(out)


def model_endpoint(base_url: str | None, default_url: str) -> str:
    """The endpoint a model's requests go to: its base_url's, else the client's default."""
    return endpoint(base_url or default_url)


def env_patterns(setting: str | None) -> list[str]:
    """The allow-list of environment variable names: comma- or space-separated patterns in which
    ``*`` stands for any run of characters; absent means :data:`ENV_PATTERN_DEFAULT`."""
    text = ENV_PATTERN_DEFAULT if setting is None else setting
    return [p for p in re.split(r"[\s,]+", text) if p]


def env_allowed(name: str, patterns: list[str]) -> bool:
    """Whether ``name`` matches one of ``patterns`` (whole name, case-sensitive)."""
    for pattern in patterns:
        regex = ".*".join(re.escape(piece) for piece in pattern.split("*"))
        if re.fullmatch(regex, name, flags=re.DOTALL):
            return True
    return False


# A URL in free text: a scheme, "://" and everything up to a space or a quote.
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+")
REDACTED = "[redacted]"


def redact_url(url: str) -> str:
    """``url`` with its userinfo and its query string and fragment replaced by ``[redacted]``:
    what an admin may see of a URL (the scheme, host, port and path stay)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    cut = len(rest)
    for mark in "?#":
        at = rest.find(mark)
        if at != -1:
            cut = min(cut, at)
    tail = rest[cut:]
    rest = rest[:cut]
    slash = rest.find("/")
    authority, path = (rest, "") if slash == -1 else (rest[:slash], rest[slash:])
    if "@" in authority:
        authority = REDACTED + "@" + authority.rpartition("@")[2]
    if tail:
        tail = tail[0] + REDACTED
    return f"{scheme}://{authority}{path}{tail}"


def redact_urls(text: str) -> str:
    """Every URL in ``text`` through :func:`redact_url` (for admin-facing text)."""
    return _URL.sub(lambda m: redact_url(m.group(0)), text)


def strip_urls(text: str, replacement: str = "[url]") -> str:
    """Every URL in ``text`` replaced by ``replacement`` (for text an application may see; the
    server's own messages name the model instead, this is the second line of defence)."""
    return _URL.sub(replacement, text)
