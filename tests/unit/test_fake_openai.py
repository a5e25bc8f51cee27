"""The fake OpenAI-compatible server the model tests script (a real HTTP server on loopback)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from fake_openai import Reply, refused_port, serve


def _post(url: str, body: dict[str, Any], timeout: float = 5) -> tuple[int, str]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_it_answers_in_script_order_then_by_default_and_records_requests() -> None:
    with serve() as fake:
        fake.queue(Reply(content="first"), Reply(status=500), Reply(raw="{not json"))
        url = f"{fake.base_url}/chat/completions"
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
        status, text = _post(url, body)
        assert status == 200
        assert json.loads(text)["choices"][0]["message"]["content"] == "first"
        assert _post(url, body)[0] == 500
        assert _post(url, body) == (200, "{not json")
        assert json.loads(_post(url, body)[1])["choices"][0]["message"]["content"] == (
            "A short summary."
        )
        calls = fake.calls()
        assert len(calls) == 4
        assert calls[0].body["messages"][0]["content"] == "hello"


def test_delay_and_429() -> None:
    with serve() as fake:
        fake.queue(Reply(content="slow", delay=0.3), Reply(status=429))
        url = f"{fake.base_url}/chat/completions"
        started = time.monotonic()
        assert _post(url, {"messages": []})[0] == 200
        assert time.monotonic() - started >= 0.3
        assert _post(url, {"messages": []})[0] == 429


def test_embeddings_answer_one_vector_per_input() -> None:
    with serve() as fake:
        fake.queue(Reply(embedding=[0.5, 0.5]))
        status, text = _post(f"{fake.base_url}/embeddings", {"input": ["a", "b"], "model": "e"})
        assert status == 200
        assert [d["embedding"] for d in json.loads(text)["data"]] == [[0.5, 0.5], [0.5, 0.5]]
        assert len(fake.calls("/embeddings")) == 1


def test_refused_port_refuses() -> None:
    with pytest.raises(urllib.error.URLError):
        _post(f"http://127.0.0.1:{refused_port()}/v1/chat/completions", {}, timeout=2)
