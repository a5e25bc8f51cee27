"""The server's model client (SPEC §2, §4): registered models called with a timeout, bounded
retries, statement cancellation honoured, and the usage of every call recorded.

``openai`` is imported only on this path, when an ``openai`` model is called: the session
functions never pay for it. The HTTP call runs in a worker thread that never touches ``plpy``;
the main thread waits in short steps and between them runs a cheap statement, through which
PostgreSQL checks for interrupts: ``pg_cancel_backend`` (or ``statement_timeout``) raises
``QueryCanceled`` there and ends the statement; the abandoned worker ends by its own timeout.

A key is never put in an error, a notice, a log line or the usage table: messages are composed
here, and any provider text that makes it into one has the key blanked out first. A key is sent
only to an endpoint its secret is bound to, and only from an environment variable the allow-list
names (issue 9, item 8): checked here, at every call, not only when the model was registered.

Every failed call has two texts (issue 9, item 10): ``error``, for admins (model_check, the
usage table, doctor), with the provider's words and any URL in them stripped of userinfo, query
string and fragment; and ``public_error``, for applications (an event's last_error, search's
warning), made only of our own words: it names no URL, host or key variable.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aidb_memory_server import db, endpoints, extractive, metrics
from aidb_memory_server.errors import INSUFFICIENT_PRIVILEGE, UNDEFINED_OBJECT, ApiError

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_BASE_URL = endpoints.OPENAI_DEFAULT_URL
DEFAULT_BUILTIN_CHARS = 2_000
CHECK_REPLY_CHARS = 200
ERROR_CHARS = 300
_POLL_S = 0.05
_SLACK_S = 1.0

_MODEL = "SELECT provider, options::text AS options FROM aidb_memory.model WHERE name = $1"
_SECRET = "SELECT value, endpoints FROM aidb_memory.secret WHERE name = $1"
_BINDING = "SELECT endpoints FROM aidb_memory.secret WHERE name = $1"
_TICK = "SELECT pg_catalog.pg_sleep(0)"
# True on a hot standby and in a READ ONLY transaction: no usage row can be written there.
_READ_ONLY = "SELECT pg_catalog.current_setting('transaction_read_only')::boolean AS read_only"
_USAGE = """
INSERT INTO aidb_memory.model_usage
    (model_name, namespace_id, purpose, chars_in, chars_out, tokens_in, tokens_out, latency_ms,
     outcome, error)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
"""
_USAGE_TYPES = (
    "text",
    "bigint",
    "text",
    "bigint",
    "bigint",
    "bigint",
    "bigint",
    "bigint",
    "text",
    "text",
)

# One client per connection per (model name, options, key): a module dict, dropped with the
# module when a new code generation loads.
_clients: dict[tuple[str, str, str], Any] = {}


@dataclass(frozen=True)
class Model:
    """A registered model."""

    name: str
    provider: str
    options: dict[str, Any]


@dataclass
class Result:
    """How one call ended. ``error`` never holds a key."""

    outcome: str  # ok | error | timeout
    text: str = ""
    error: str | None = None  # for admins: URLs redacted
    public_error: str | None = None  # for applications: our words only, never a URL
    latency_ms: int = 0
    tokens_in: int | None = None
    tokens_out: int | None = None
    vectors: list[list[float]] | None = None  # what embed() returns

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


class _Failure(Exception):
    """A failed call, with an outcome and a message that holds no key; ``public`` is what an
    application may read (default: ``message``, when that is all our own words)."""

    def __init__(self, outcome: str, message: str, public: str | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message
        self.public = public if public is not None else message


def _failure(outcome: str, error: str, public: str) -> Result:
    """A failed Result: ``error`` for admins (URLs redacted), ``public`` for applications."""
    return Result(outcome, error=endpoints.redact_urls(error), public_error=public)


def load(function: str, name: str) -> Model:
    """The registered model ``name``; 42704 if there is none."""
    rows = db.execute(_MODEL, ("text",), (name,))
    if not rows.nrows():
        raise ApiError(
            UNDEFINED_OBJECT,
            f'aidb_memory.{function}: model "{name}" does not exist',
            hint="register it with aidb_memory.create_model",
        )
    return Model(name, rows[0]["provider"], json.loads(rows[0]["options"]))


def complete(
    model: Model,
    messages: Sequence[dict[str, str]],
    *,
    purpose: str,
    namespace_id: int | None = None,
    timeout_s: float | None = None,
    max_chars: int | None = None,
    span: tuple[int, int] | None = None,
    response_format: dict[str, Any] | None = None,
) -> Result:
    """Call ``model`` once with chat ``messages``; record the usage; never raises for a failed
    call (the result says how it ended), except a cancelled statement, which ends the statement.

    The timeout is the smaller of the caller's ``timeout_s`` (a namespace's ``llm_timeout_s``)
    and the model's ``timeout_s``, else 30 s; retries are the model's ``max_retries`` (default
    0). For the builtin extractive summarizer, ``max_chars`` is the target size and ``span`` the
    turn numbers its header names. ``response_format`` (structured output, e.g. a JSON schema)
    is passed to OpenAI-compatible models as is.
    """
    chars_in = sum(len(m.get("content") or "") for m in messages)
    started = time.monotonic()
    if model.provider == "builtin":
        result = _builtin(model, messages, max_chars, span)
    else:
        result = _openai(model, messages, _timeout(model, timeout_s), response_format)
    _record(model, namespace_id, purpose, chars_in, started, result)
    return result


def _timeout(model: Model, timeout_s: float | None) -> float:
    """The smaller of the caller's and the model's timeout, else the default."""
    limits = [t for t in (timeout_s, model.options.get("timeout_s")) if t]
    return float(min(limits)) if limits else DEFAULT_TIMEOUT_S


def _record(
    model: Model,
    namespace_id: int | None,
    purpose: str,
    chars_in: int,
    started: float,
    result: Result,
) -> None:
    """Set the result's latency and record the call's usage (never any content), in
    model_usage and in the counters of :mod:`metrics`.

    In a read-only transaction (a replica: issue 10 item 8) the row is left out rather than
    failing the statement: the call is already made and paid for, and what needs no storing (a
    search's query embedding) is still good. Callers whose result must be stored (compaction,
    extraction) do not call a model there at all."""
    result.latency_ms = int((time.monotonic() - started) * 1000)
    if db.execute(_READ_ONLY)[0]["read_only"]:
        return
    db.execute(
        _USAGE,
        _USAGE_TYPES,
        (
            model.name,
            namespace_id,
            purpose,
            chars_in,
            len(result.text),
            result.tokens_in,
            result.tokens_out,
            result.latency_ms,
            result.outcome,
            result.error,
        ),
    )
    # The same call counted for aidb_memory.metrics() (a subtransaction: never fails the caller).
    metrics.model_call(
        model.name,
        purpose,
        result.outcome,
        namespace_id,
        result.tokens_in,
        result.tokens_out,
        result.latency_ms,
    )


class EmbeddingError(Exception):
    """An embedding call that failed; ``outcome``, ``message`` (for admins) and ``public`` (for
    applications: never a URL) as in Result (no key)."""

    def __init__(self, outcome: str, message: str, public: str) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message
        self.public = public


def embed(
    model: Model,
    texts: Sequence[str],
    *,
    namespace_id: int | None = None,
    timeout_s: float | None = None,
) -> list[list[float]]:
    """The embeddings of ``texts`` (one vector each, in order) from ``model``'s OpenAI-compatible
    ``/v1/embeddings``, with the same timeout, cancellation and usage recording (purpose
    ``embedding``) as :func:`complete`. A failed call raises :class:`EmbeddingError`."""
    chars_in = sum(len(t) for t in texts)
    started = time.monotonic()
    if model.provider != "openai":
        text = f"a {model.provider} model does not compute embeddings"
        result = Result("error", error=text, public_error=text)
    elif not texts:
        result = Result("ok", vectors=[])
    else:
        timeout = _timeout(model, timeout_s)

        def request(client: Any) -> Result:  # runs in the worker thread: no plpy here
            response = client.embeddings.create(
                model=model.options["model"], input=list(texts), timeout=timeout
            )
            return _parse_embeddings(response, len(texts))

        result = _call(model, timeout, request)
    _record(model, namespace_id, "embedding", chars_in, started, result)
    if not result.ok or result.vectors is None:
        raise EmbeddingError(
            result.outcome,
            result.error or "no embeddings came back",
            result.public_error or "no embeddings came back",
        )
    return result.vectors


def _parse_embeddings(response: Any, count: int) -> Result:
    """One finite vector per input, all of one dimension, ordered by ``index``."""
    import math

    try:
        items = sorted(response.data, key=lambda d: d.index)
        vectors = [[float(x) for x in item.embedding] for item in items]
    except (AttributeError, TypeError, ValueError):
        raise _Failure("error", "malformed response: no data[].embedding") from None
    if len(vectors) != count:
        raise _Failure("error", f"malformed response: {len(vectors)} embeddings for {count} inputs")
    dims = {len(v) for v in vectors}
    if len(dims) != 1 or 0 in dims:
        raise _Failure("error", "malformed response: embeddings of different or no dimensions")
    if not all(math.isfinite(x) for v in vectors for x in v):
        raise _Failure("error", "malformed response: an embedding holds a non-finite number")
    usage = getattr(response, "usage", None)
    tokens_in = getattr(usage, "prompt_tokens", None)
    return Result(
        "ok", vectors=vectors, tokens_in=tokens_in if isinstance(tokens_in, int) else None
    )


def _builtin(
    model: Model,
    messages: Sequence[dict[str, str]],
    max_chars: int | None,
    span: tuple[int, int] | None,
) -> Result:
    if model.options.get("kind") != "extractive":
        text = f"builtin kind {model.options.get('kind')!r} is unknown"
        return Result("error", error=text, public_error="the builtin model is misconfigured")
    sources = [extractive.Source(m.get("role", "user"), m.get("content") or "") for m in messages]
    first, last = span or (1, max(1, len(messages)))
    text = extractive.summarize(sources, max_chars or DEFAULT_BUILTIN_CHARS, first, last)
    return Result("ok", text=text)


_NO_KEY = "the model's key is not available"


def _target(model: Model) -> str | None:
    """The endpoint ``model``'s requests go to; None if its base_url names none we accept."""
    try:
        return endpoints.model_endpoint(model.options.get("base_url"), DEFAULT_BASE_URL)
    except endpoints.BadEndpoint:
        return None


def _env_refusal(env: str) -> tuple[str, str] | None:
    from aidb_memory_server import models  # only a model whose key is in the environment

    patterns = endpoints.env_patterns(models.env_pattern())
    if endpoints.env_allowed(env, patterns):
        return None
    return (
        f"refused: the environment variable {env} is not an allowed key variable "
        f"(allowed: {', '.join(patterns) or 'none'})",
        "a superuser sets the allowed names in aidb_memory.runtime_settings "
        f"(key {endpoints.ENV_PATTERN_SETTING})",
    )


def _secret_refusal(model: Model, secret: str, allowed: list[str]) -> tuple[str, str] | None:
    target = _target(model)
    if target is not None and target in allowed:
        return None
    return (
        f'refused: the secret "{secret}" may not be sent to {target or "this base_url"}',
        "a secret goes only to the endpoints it was stored for; whoever knows the key stores it "
        "again with aidb_memory.set_secret(name, value, endpoints => ARRAY[...])",
    )


def key_refusal(model: Model) -> tuple[str, str] | None:
    """Why ``model`` may not use its key, as (message, hint), or None when it may (or has no
    key). The same rules as every call applies, checked without calling."""
    secret = model.options.get("api_key_secret")
    if secret is not None:
        rows = db.execute(_BINDING, ("text",), (secret,))
        if not rows.nrows():
            return None  # not stored: the call fails as "not stored"
        return _secret_refusal(model, secret, list(rows[0]["endpoints"] or []))
    env = model.options.get("api_key_env")
    return _env_refusal(env) if env is not None else None


def require_key_allowed(function: str, model: Model) -> None:
    """42501 if ``model`` may not use its key (see :func:`key_refusal`)."""
    refusal = key_refusal(model)
    if refusal is not None:
        message, hint = refusal
        raise ApiError(INSUFFICIENT_PRIVILEGE, f"aidb_memory.{function}: {message}", hint=hint)


def _api_key(model: Model) -> str:
    """The key to send with ``model``'s requests, checked against the secret's endpoints or the
    allow-list of variables first: a refused key is never read, let alone sent."""
    secret = model.options.get("api_key_secret")
    if secret is not None:
        rows = db.execute(_SECRET, ("text",), (secret,))
        if not rows.nrows():
            raise _Failure("error", f'the secret "{secret}" is not stored', _NO_KEY)
        refusal = _secret_refusal(model, secret, list(rows[0]["endpoints"] or []))
        if refusal is not None:
            raise _Failure("error", refusal[0], "the model may not use its key")
        return str(rows[0]["value"])
    env = model.options.get("api_key_env")
    if env is not None:
        refusal = _env_refusal(env)
        if refusal is not None:
            raise _Failure("error", refusal[0], "the model may not use its key")
        value = os.environ.get(env)
        if not value:
            raise _Failure(
                "error", f"the environment variable {env} is not set in the server", _NO_KEY
            )
        return value
    return ""


def _client(model: Model, key: str) -> Any:
    cache_key = (model.name, json.dumps(model.options, sort_keys=True), key)
    client = _clients.get(cache_key)
    if client is None:
        import openai  # lazily: only model calls pay for it

        client = openai.OpenAI(
            api_key=key or "none",
            base_url=model.options.get("base_url") or DEFAULT_BASE_URL,
            max_retries=int(model.options.get("max_retries", 0)),
            timeout=float(model.options.get("timeout_s") or DEFAULT_TIMEOUT_S),
        )
        _clients[cache_key] = client
    return client


def _openai(
    model: Model,
    messages: Sequence[dict[str, str]],
    timeout: float,
    response_format: dict[str, Any] | None = None,
) -> Result:
    def request(client: Any) -> Result:  # runs in the worker thread: no plpy here
        extra: dict[str, Any] = {}
        if response_format is not None:
            extra["response_format"] = response_format
        response = client.chat.completions.create(
            model=model.options["model"], messages=list(messages), timeout=timeout, **extra
        )
        return _parse(response)

    return _call(model, timeout, request)


def _call(model: Model, timeout: float, request: Callable[[Any], Result]) -> Result:
    """Run ``request(client)`` for an ``openai`` model in a worker thread, cancellably.

    The worker never touches ``plpy``; the main thread waits in short steps and ticks between
    them (a cancel raises ``QueryCanceled`` there). Every failure comes back as a Result.
    """
    key = ""
    try:
        key = _api_key(model)
        client = _client(model, key)
    except _Failure as e:
        return _failure(e.outcome, e.message, e.public)
    except Exception as e:  # e.g. openai missing from the server's packages
        text = _redact(f"client setup failed: {_describe(e)}", key)
        return _failure("error", text, "client setup failed")
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = request(client)
        except BaseException as e:  # every failure goes to the main thread
            box["error"] = e

    worker = threading.Thread(target=work, name="aidb_memory-llm", daemon=True)
    worker.start()
    retries = int(model.options.get("max_retries", 0))
    deadline = time.monotonic() + timeout * (retries + 1) + _SLACK_S
    while True:
        worker.join(_POLL_S)
        # Lets PostgreSQL check for interrupts: a cancel raises QueryCanceled here.
        db.execute(_TICK)
        if not worker.is_alive():
            break
        if time.monotonic() > deadline:
            text = f"no answer within {timeout:g} s"
            return Result("timeout", error=text, public_error=text)
    if "result" in box:
        result: Result = box["result"]
        return result
    return _failed(box.get("error"), timeout, key)


def _parse(response: Any) -> Result:
    try:
        text = response.choices[0].message.content
    except (AttributeError, IndexError, KeyError, TypeError):
        raise _Failure("error", "malformed response: no choices[0].message") from None
    if not isinstance(text, str):
        raise _Failure("error", "malformed response: the message has no text content")
    usage = getattr(response, "usage", None)
    tokens_in = getattr(usage, "prompt_tokens", None)
    tokens_out = getattr(usage, "completion_tokens", None)
    return Result(
        "ok",
        text=text,
        tokens_in=tokens_in if isinstance(tokens_in, int) else None,
        tokens_out=tokens_out if isinstance(tokens_out, int) else None,
    )


def _failed(error: BaseException | None, timeout: float, key: str) -> Result:
    # The provider's text (httpx puts the request URL in it) is only ever in ``error``, and
    # only with its URLs redacted; ``public_error`` is composed of our words alone.
    if isinstance(error, _Failure):
        return _failure(error.outcome, _redact(error.message, key), error.public)
    import openai

    if isinstance(error, openai.APITimeoutError):
        text = f"no answer within {timeout:g} s"
        return Result("timeout", error=text, public_error=text)
    if isinstance(error, openai.APIStatusError):
        text = _redact(f"HTTP {error.status_code}: {_describe(error)}", key)
        return _failure("error", text, f"HTTP {error.status_code}")
    if isinstance(error, openai.APIConnectionError):
        text = _redact(f"connection failed: {_describe(error)}", key)
        return _failure("error", text, "connection failed")
    if isinstance(error, ValueError):  # a body that is not JSON
        text = _redact(f"malformed response: {_describe(error)}", key)
        return _failure("error", text, "malformed response")
    text = _redact(f"call failed: {_describe(error)}", key)
    return _failure("error", text, f"call failed ({type(error).__name__})")


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "unknown error"
    text = " ".join(str(error).split())
    cause = error.__cause__ or error.__context__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" ({type(cause).__name__}: {' '.join(str(cause).split())})"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _redact(text: str, key: str) -> str:
    if key:
        text = text.replace(key, "[redacted]")
    # Before the cut: a URL cut short could lose the "?" that marks what must go.
    text = endpoints.redact_urls(text)
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"


def model_check(name: str | None, prompt: str | None) -> str:
    """Call model ``name`` once with ``prompt`` (purpose ``check``); a failed call is ok=false."""
    from aidb_memory_server import models

    fn = "model_check"
    name = models.name(fn, "name", name)
    if prompt is None:
        prompt = "Reply with OK."
    model = load(fn, name)
    require_key_allowed(fn, model)  # 42501 with a hint, rather than an ok=false
    result = complete(
        model, [{"role": "user", "content": prompt}], purpose="check", max_chars=CHECK_REPLY_CHARS
    )
    return json.dumps(
        {
            "ok": result.ok,
            "model": name,
            "latency_ms": result.latency_ms,
            "reply": result.text[:CHECK_REPLY_CHARS] if result.ok else None,
            "error": result.error,
        }
    )
