"""The worker's exporter and JSON logs (issue 36): whatever the actor ids, the turns, the model's
answers and errors hold, and whatever the key the model is called with, none of it reaches
``/metrics``, ``/healthz``, the JSON log lines or ``aidb-memory status``; and an actor id or a turn
written as a log object cannot add a line of its own to the log.

The attacker is an application (aidb_users): it chooses actor ids, session ids and the content
of turns, and through the content what the model is asked (a provider may echo it in an error).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from conftest import APP_USER, WORKER_USER, Database, run_cli
from fake_openai import FakeOpenAI, Reply, Request, serve

NS = "exported_ns"
KEY = "sk-live-Qx81Zt0PcM4vW7"
FAIL = "FAIL-EVERY-TIME"  # in the first actor's turn: the model fails it, every attempt
# Actor ids and a turn that try to forge a log object of their own, or a sample.
ACTORS = (
    'mallory-9c2e@example.com","forged":true,"x":"',  # actor ids cannot hold a newline
    'eve-51b0 aidb_memory_worker_up{x="1"} 0',
    "carol-0d77",
)
SESSION = "session-8e1f"
CONTENT = 'my passport is X7741902\n{"msg":"event","forged":true}'
ANSWER = "passport X7741902 belongs to carol-0d77"
ERROR_TEXT = "upstream rejected: my passport is X7741902"
SECRETS = (
    *ACTORS,
    "mallory-9c2e",
    "eve-51b0",
    "carol-0d77",
    SESSION,
    "X7741902",
    "passport",
    KEY,
    "forged",
    FAIL,
    "upstream",
)


def _answer(request: Request) -> Reply:
    """The first actor's event fails with the content in the error (a provider echoing the
    prompt); the others are answered with a fact that repeats the content and an actor id."""
    if FAIL in json.dumps(request.body):
        return Reply(status=500, raw=json.dumps({"error": {"message": ERROR_TEXT}}))
    fact = {"operations": [{"op": "add", "text": ANSWER, "target": None}]}
    return Reply(content=json.dumps(fact))


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with serve() as server:
        server.default = _answer
        yield server


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            return str(response.read().decode())
    except urllib.error.HTTPError as e:
        return str(e.read().decode())


def _wait_until(condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_no_actor_content_or_key_reaches_the_exporter_or_the_json_log(
    db: Database, fake: FakeOpenAI
) -> None:
    base = f"http://127.0.0.1:{fake.port}"
    db.sql("SELECT aidb_memory.set_secret('prod', %s, ARRAY[%s])", (KEY, base))
    opts = {
        "model": "fake-chat",
        "base_url": fake.base_url,
        "max_retries": 0,
        "api_key_secret": "prod",
    }
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\')', (NS,))
    for i, actor in enumerate(ACTORS):
        content = f"{FAIL} {CONTENT}" if i == 0 else CONTENT
        db.sql(
            "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s)",
            (NS, actor, json.dumps([{"role": "user", "content": content}]), SESSION),
            user=APP_USER,
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aidb_memory",
            "worker",
            "--dsn",
            db.dsn(WORKER_USER),
            "--metrics-port",
            "0",
            "--log-format",
            "json",
            "--progress",
            "--max-attempts",
            "2",
            "--backoff",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stderr is not None
        first = json.loads(proc.stderr.readline())
        assert first["msg"] == "metrics"
        url = first["url"]
        _wait_until(
            lambda: (
                db.value(
                    "SELECT count(*) FROM aidb_memory.event WHERE status IN ('processed', 'failed')"
                )
                == len(ACTORS)
            )
        )
        assert db.value("SELECT count(*) FROM aidb_memory.event WHERE status = 'failed'") == 1
        exposed = _get(f"{url}/metrics") + _get(f"{url}/healthz")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out == ""
    objects = [json.loads(line) for line in err.splitlines()]  # each line one object
    assert any(o["msg"] == "event" and o["outcome"] == "failed" for o in objects)
    assert "aidb_memory_events_failed_total" in exposed and NS in exposed
    status = (
        run_cli("status", dsn=db.dsn()).stdout + run_cli("status", "--json", dsn=db.dsn()).stdout
    )
    # The model did see the content and the key: the test would notice them if they leaked.
    assert any("X7741902" in json.dumps(r.body) for r in fake.requests)
    assert any(KEY in r.headers.get("authorization", "") for r in fake.requests)
    keys = [str(k) for (k,) in db.sql("SELECT DISTINCT actor_key FROM aidb_memory.event")]
    for where, text in (("/metrics and /healthz", exposed), ("the log", err), ("status", status)):
        for secret in (*SECRETS, *keys):
            assert secret not in text, f"{secret!r} in {where}"
    # No sample of the exposition is an actor's: every line is a comment or one of ours.
    for line in exposed.splitlines():
        assert not line or line.startswith("#") or re.match(r"^(aidb_memory_|process_|\{)", line)
