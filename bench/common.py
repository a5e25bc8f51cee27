"""What every row of bench/run.py shares: the database, namespace and actor it measures, its
connections, and the checks that stop a run before anything is timed."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.string import TextLoader

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NS = "bench"
ACTOR = "alice"
# The references pass the actor's distribution key as the server code does: a parameter
# (keys.py, the server's own definition; pure Python).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plpython"))
from aidb_memory_server.keys import actor_key  # noqa: E402

sys.path.pop(0)
KEY = actor_key(NS, ACTOR)
DB = "bench"

# The bench namespace: extraction off, so that an add records a skipped event, as the plain-SQL
# references do and as a namespace without a model did before verbatim extraction (issue 26:
# by default such a namespace now queues its events for the worker, and wakes it).
INIT = "SELECT aidb_memory.init(%s, '{}', '{\"extraction\": false}')"


def say(msg: str) -> None:
    print(msg, flush=True)


def connect(dsn: str, *, raw_jsonb: bool = False) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, autocommit=True)
    if raw_jsonb:
        # Reads of (b)/(c) compare server work: jsonb comes back as text, unparsed, on both sides.
        conn.adapters.register_loader("jsonb", TextLoader)
    return conn


class VerifyError(RuntimeError):
    pass


def check(ok: bool, what: str) -> None:
    if not ok:
        raise VerifyError(f"verification failed: {what}")
    say(f"  ok: {what}")


def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "missing"
