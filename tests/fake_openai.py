"""A fake OpenAI-compatible HTTP server for the tests (SPEC §8).

It is a real HTTP server on 127.0.0.1 that the database calls over loopback, scripted per test:
each queued :class:`Reply` answers one request (a chat completion, a delay, a 429 or 500, malformed
JSON, an overlength answer); when the script runs out, ``default`` answers. ``POST
/v1/responses`` (the Responses API, as the OpenAI Agents SDK calls it) answers with a response
whose output is the reply's ``output`` items, or one assistant message with its ``content``. It
records every request it received, so a test can count the calls and read what the model was
sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer."""

    content: str | None = None  # the assistant message text of a chat completion
    status: int = 200
    delay: float = 0.0  # seconds to wait before answering
    raw: str | None = None  # a body sent as is (e.g. malformed JSON)
    embedding: list[float] | None = None
    output: list[dict[str, Any]] | None = None  # the output items of a Responses API answer
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Request:
    """What the server received."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]


def chat_completion(
    content: str, model: str = "fake-model", prompt_chars: int = 0
) -> dict[str, Any]:
    """An OpenAI chat.completion response body."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": max(1, prompt_chars // 4),
            "completion_tokens": max(1, len(content) // 4),
            "total_tokens": max(1, prompt_chars // 4) + max(1, len(content) // 4),
        },
    }


def response(
    reply: Reply, model: str = "fake-model", number: int = 0, prompt_chars: int = 0
) -> dict[str, Any]:
    """An OpenAI Responses API response body: ``reply.output``, or one assistant message with
    ``reply.content``."""
    output = reply.output
    if output is None:
        text = reply.content or ""
        output = [
            {
                "type": "message",
                "id": f"msg_fake_{number}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ]
    output_chars = sum(len(json.dumps(item)) for item in output)
    return {
        "id": f"resp_fake_{number}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": max(1, prompt_chars // 4),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": max(1, output_chars // 4),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": max(1, prompt_chars // 4) + max(1, output_chars // 4),
        },
    }


class FakeOpenAI:
    """The server; use :func:`serve` to run one for a test."""

    def __init__(self) -> None:
        self.script: deque[Reply] = deque()
        self.requests: list[Request] = []
        self.default: Callable[[Request], Reply] = lambda req: Reply(content="A short summary.")
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def calls(self, path_suffix: str = "/chat/completions") -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith(path_suffix)]

    def queue(self, *replies: Reply) -> None:
        with self._lock:
            self.script.extend(replies)

    def _next(self, request: Request) -> Reply:
        with self._lock:
            self.requests.append(request)
            if self.script:
                return self.script.popleft()
        return self.default(request)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                text = self.rfile.read(length).decode() if length else "{}"
                try:
                    body = json.loads(text)
                except ValueError:
                    body = {"_unparsed": text}
                request = Request(self.path, body, {k.lower(): v for k, v in self.headers.items()})
                reply = fake._next(request)
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.raw is not None:
                    payload = reply.raw.encode()
                elif reply.status != 200:
                    payload = json.dumps(
                        {"error": {"message": f"fake error {reply.status}", "type": "server_error"}}
                    ).encode()
                elif self.path.endswith("/embeddings"):
                    inputs = body.get("input")
                    items = inputs if isinstance(inputs, list) else [inputs]
                    vector = reply.embedding or [0.0, 1.0]
                    payload = json.dumps(
                        {
                            "object": "list",
                            "model": body.get("model", "fake-embedding"),
                            "data": [
                                {"object": "embedding", "index": i, "embedding": vector}
                                for i in range(len(items))
                            ],
                            "usage": {"prompt_tokens": 1, "total_tokens": 1},
                        }
                    ).encode()
                elif self.path.endswith("/responses"):
                    payload = json.dumps(
                        response(
                            reply,
                            body.get("model", "fake-model"),
                            len(fake.calls("/responses")),
                            len(json.dumps(body.get("input", ""))),
                        )
                    ).encode()
                else:
                    prompt_chars = sum(
                        len(str(m.get("content") or "")) for m in body.get("messages", [])
                    )
                    payload = json.dumps(
                        chat_completion(
                            reply.content or "", body.get("model", "fake-model"), prompt_chars
                        )
                    ).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout or a cancelled statement)

        return Handler

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def serve() -> Iterator[FakeOpenAI]:
    """Run a fake server for the duration of a ``with`` block."""
    fake = FakeOpenAI()
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


def refused_port() -> int:
    """A loopback port where nothing listens (for 'connection refused')."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
