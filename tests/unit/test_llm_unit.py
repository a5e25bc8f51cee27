"""The model client outside the database: key resolution, redaction, parsing, and a whole call
against the fake server with ``db.execute`` stubbed (the main thread's ticks and the usage row).
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from fake_openai import Reply, serve

SECRET = "sk-unit-Jf3Lq8Rt6Yx1"
# Imported anew with the stand-in plpy and db.execute (metrics binds db when imported).
_RELOADED = ("aidb_memory_server.db", "aidb_memory_server.metrics", "aidb_memory_server.llm")


class _Rows(list[dict[str, Any]]):
    def nrows(self) -> int:
        return len(self)


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The llm module, imported with a stand-in ``plpy`` and ``db.execute`` recording calls."""
    plpy = types.ModuleType("plpy")
    # What the usage counters (metrics.py) run their upsert in.
    plpy.subtransaction = contextlib.nullcontext
    plpy.SPIError = Exception
    monkeypatch.setitem(sys.modules, "plpy", plpy)
    for name in _RELOADED:
        monkeypatch.delitem(sys.modules, name, raising=False)
    from aidb_memory_server import db, llm, models

    executed: list[tuple[str, tuple[Any, ...]]] = []
    secrets = {"stored": SECRET, "elsewhere": SECRET}
    # Where each stored secret may be sent (the endpoints column).
    bindings: dict[str, list[str] | None] = {
        "stored": ["https://api.openai.com:443"],
        "elsewhere": ["https://other.example:443"],
    }
    env_pattern: list[str | None] = [None]
    llm.bindings = bindings
    llm.env_pattern = env_pattern

    def execute(sql: str, types: Any = (), params: Any = ()) -> _Rows:
        executed.append((sql, tuple(params)))
        if sql in (llm._SECRET, llm._BINDING):
            name = params[0]
            if name not in secrets:
                return _Rows()
            return _Rows([{"value": secrets[name], "endpoints": bindings.get(name)}])
        if sql == models._ENV_PATTERN:
            return _Rows([{"value": env_pattern[0]}] if env_pattern[0] is not None else [])
        if sql == llm._READ_ONLY:
            return _Rows([{"read_only": False}])
        return _Rows()

    monkeypatch.setattr(db, "execute", execute)
    llm.executed = executed
    llm._clients.clear()
    yield llm
    for name in _RELOADED:
        sys.modules.pop(name, None)


def _model(llm: Any, **options: Any) -> Any:
    return llm.Model("m", "openai", {"model": "fake-chat", "max_retries": 0, **options})


def test_a_key_from_a_stored_secret(llm: Any) -> None:
    assert llm._api_key(_model(llm, api_key_secret="stored")) == SECRET
    with pytest.raises(llm._Failure) as info:
        llm._api_key(_model(llm, api_key_secret="gone"))
    assert info.value.message == 'the secret "gone" is not stored'


def test_a_key_from_the_environment(llm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDB_UNIT_API_KEY", SECRET)
    assert llm._api_key(_model(llm, api_key_env="AIDB_UNIT_API_KEY")) == SECRET
    monkeypatch.delenv("AIDB_UNIT_API_KEY")
    with pytest.raises(llm._Failure) as info:
        llm._api_key(_model(llm, api_key_env="AIDB_UNIT_API_KEY"))
    assert "AIDB_UNIT_API_KEY is not set" in info.value.message
    assert llm._api_key(_model(llm)) == ""


def test_a_secret_goes_only_to_its_endpoints(llm: Any) -> None:
    with pytest.raises(llm._Failure) as info:
        llm._api_key(_model(llm, api_key_secret="elsewhere"))
    assert info.value.message == (
        'refused: the secret "elsewhere" may not be sent to https://api.openai.com:443'
    )
    assert info.value.public == "the model may not use its key"
    llm.bindings["elsewhere"] = None  # a row no binding was ever made for goes nowhere
    with pytest.raises(llm._Failure):
        llm._api_key(_model(llm, api_key_secret="elsewhere"))
    assert llm.key_refusal(_model(llm, api_key_secret="stored")) is None
    assert llm.key_refusal(_model(llm, api_key_secret="elsewhere")) is not None
    assert llm.key_refusal(_model(llm, api_key_secret="gone")) is None  # fails as "not stored"


def test_a_key_variable_must_be_on_the_allow_list(
    llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BACKUP_S3_SECRET", SECRET)
    with pytest.raises(llm._Failure) as info:
        llm._api_key(_model(llm, api_key_env="BACKUP_S3_SECRET"))
    assert info.value.message == (
        "refused: the environment variable BACKUP_S3_SECRET is not an allowed key variable "
        "(allowed: *_API_KEY)"
    )
    llm.env_pattern[0] = "*_API_KEY, BACKUP_*"
    assert llm._api_key(_model(llm, api_key_env="BACKUP_S3_SECRET")) == SECRET
    assert llm.key_refusal(_model(llm, api_key_env="BACKUP_S3_SECRET")) is None


def test_redaction_and_length(llm: Any) -> None:
    assert llm._redact(f"bad key {SECRET}!", SECRET) == "bad key [redacted]!"
    assert len(llm._redact("x" * 1000, SECRET)) == llm.ERROR_CHARS
    assert llm._redact("no key", "") == "no key"
    assert llm._redact("for url 'http://u:p@h/v1?t=1'", "") == (
        "for url 'http://[redacted]@h/v1?[redacted]'"
    )


def test_a_call_with_the_environment_key_records_usage(
    llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIDB_UNIT_API_KEY", SECRET)
    with serve() as fake:
        fake.queue(Reply(content="Hello."))
        model = _model(llm, api_key_env="AIDB_UNIT_API_KEY", base_url=fake.base_url)
        messages = [{"role": "user", "content": "Hi"}]
        result = llm.complete(model, messages, purpose="check", namespace_id=7, timeout_s=5)
        assert (result.outcome, result.text, result.error) == ("ok", "Hello.", None)
        assert fake.calls()[0].headers["authorization"] == f"Bearer {SECRET}"
        again = llm.complete(model, messages, purpose="check")
        assert again.ok
        assert len(llm._clients) == 1, "one client per model, options and key"
    usage = [params for sql, params in llm.executed if sql == llm._USAGE]
    assert usage[0][:7] == ("m", 7, "check", 2, 6, result.tokens_in, result.tokens_out)
    assert usage[0][8:] == ("ok", None)
    assert any(sql == llm._TICK for sql, _ in llm.executed), "the main thread polled"


def test_a_failed_call_never_shows_the_key(llm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDB_UNIT_API_KEY", SECRET)
    with serve() as fake:
        fake.queue(Reply(status=401, raw=f'{{"error": {{"message": "bad key {SECRET}"}}}}'))
        model = _model(llm, api_key_env="AIDB_UNIT_API_KEY", base_url=fake.base_url)
        result = llm.complete(model, [{"role": "user", "content": "Hi"}], purpose="check")
    assert result.outcome == "error"
    assert "HTTP 401" in result.error
    assert result.public_error == "HTTP 401"
    assert SECRET not in result.error
    assert all(SECRET not in str(params) for _, params in llm.executed)


def test_the_builtin_summarizer_needs_no_openai(llm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)  # any "import openai" would now fail
    model = llm.Model("b", "builtin", {"kind": "extractive"})
    turns = [{"role": "user", "content": "Please fix the invoice for order 42."}]
    result = llm.complete(model, turns, purpose="compaction", max_chars=300, span=(3, 4))
    assert result.ok and result.text.startswith("[Extractive summary of turns 3-4")
    assert len(result.text) <= 300
