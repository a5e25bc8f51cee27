"""The server's model client (SPEC §2, §4): registered models called with a timeout, bounded
retries, statement cancellation honoured, and the usage of every call recorded.

``openai`` is imported only on this path, when an ``openai`` model is called: the session
functions never pay for it. The HTTP call runs in a worker thread that never touches ``plpy``;
the main thread waits in short steps and between them runs a cheap statement, through which
PostgreSQL checks for interrupts: ``pg_cancel_backend`` (or ``statement_timeout``) raises
``QueryCanceled`` there and ends the statement; the abandoned worker ends by its own timeout.

A key is never put in an error, a notice, a log line or the usage table: messages are composed
here, and any provider text that makes it into one has the key blanked out first.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aidb_memory_server import db, extractive
from aidb_memory_server.errors import UNDEFINED_OBJECT, ApiError

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_BUILTIN_CHARS = 2_000
CHECK_REPLY_CHARS = 200
ERROR_CHARS = 300
_POLL_S = 0.05
_SLACK_S = 1.0

_MODEL = "SELECT provider, options::text AS options FROM aidb_memory.model WHERE name = $1"
_SECRET = "SELECT value FROM aidb_memory.secret WHERE name = $1"
_TICK = "SELECT pg_catalog.pg_sleep(0)"
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
    error: str | None = None
    latency_ms: int = 0
    tokens_in: int | None = None
    tokens_out: int | None = None
    vectors: list[list[float]] | None = None  # what embed() returns

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


class _Failure(Exception):
    """A failed call, with an outcome and a message that holds no key."""

    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message


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
    """Set the result's latency and record the call's usage (never any content)."""
    result.latency_ms = int((time.monotonic() - started) * 1000)
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


class EmbeddingError(Exception):
    """An embedding call that failed; ``outcome`` and ``message`` as in Result (no key)."""

    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message


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
        result = Result("error", error=f"a {model.provider} model does not compute embeddings")
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
        raise EmbeddingError(result.outcome, result.error or "no embeddings came back")
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
        return Result("error", error=f"builtin kind {model.options.get('kind')!r} is unknown")
    sources = [extractive.Source(m.get("role", "user"), m.get("content") or "") for m in messages]
    first, last = span or (1, max(1, len(messages)))
    text = extractive.summarize(sources, max_chars or DEFAULT_BUILTIN_CHARS, first, last)
    return Result("ok", text=text)


def _api_key(model: Model) -> str:
    secret = model.options.get("api_key_secret")
    if secret is not None:
        rows = db.execute(_SECRET, ("text",), (secret,))
        if not rows.nrows():
            raise _Failure("error", f'the secret "{secret}" is not stored')
        return str(rows[0]["value"])
    env = model.options.get("api_key_env")
    if env is not None:
        value = os.environ.get(env)
        if not value:
            raise _Failure("error", f"the environment variable {env} is not set in the server")
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
        return Result(e.outcome, error=e.message)
    except Exception as e:  # e.g. openai missing from the server's packages
        return Result("error", error=_redact(f"client setup failed: {_describe(e)}", key))
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
            return Result("timeout", error=f"no answer within {timeout:g} s")
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
    if isinstance(error, _Failure):
        return Result(error.outcome, error=_redact(error.message, key))
    import openai

    if isinstance(error, openai.APITimeoutError):
        return Result("timeout", error=f"no answer within {timeout:g} s")
    if isinstance(error, openai.APIStatusError):
        return Result("error", error=_redact(f"HTTP {error.status_code}: {_describe(error)}", key))
    if isinstance(error, openai.APIConnectionError):
        return Result("error", error=_redact(f"connection failed: {_describe(error)}", key))
    if isinstance(error, ValueError):  # a body that is not JSON
        return Result("error", error=_redact(f"malformed response: {_describe(error)}", key))
    return Result("error", error=_redact(f"call failed: {_describe(error)}", key))


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
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"


def model_check(name: str | None, prompt: str | None) -> str:
    """Call model ``name`` once with ``prompt`` (purpose ``check``); a failed call is ok=false."""
    from aidb_memory_server import models

    fn = "model_check"
    name = models.name(fn, "name", name)
    if prompt is None:
        prompt = "Reply with OK."
    model = load(fn, name)
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
