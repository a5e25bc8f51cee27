"""The demo's runner: a throwaway server with the database demo, the scenes in order on one
page, then nothing left behind."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import ExitStack

import psycopg

from aidb_memory.demo import (
    compaction,
    extraction,
    forget,
    handoff,
    install,
    listing,
    memories,
    model,
    namespace,
    reads,
    remember,
    sessions,
    tools,
    undo,
)
from aidb_memory.demo.context import Context, Endpoint
from aidb_memory.demo.page import Page
from aidb_memory.throwaway import ThrowawayServer

Scene = Callable[[Context], None]

# The story in order. A scene may rely on what the scenes before it stored (the namespace, alice's
# sessions, the model), never on what comes after it.
SCENES: tuple[Scene, ...] = (
    install.scene,
    namespace.scene,
    sessions.scene,
    tools.scene,
    reads.scene,
    handoff.scene,
    undo.scene,
    model.scene,
    compaction.scene,
    extraction.scene,
    memories.scene,
    remember.scene,
    forget.scene,
    listing.scene,
)


def main() -> int:
    """Run the walkthrough; the server is removed however it ends."""
    endpoint = Endpoint.from_env(os.environ)
    print(
        "aidb_memory demo: the help-desk conversation, on a throwaway PostgreSQL server ...",
        flush=True,
    )
    with ThrowawayServer() as server:
        print(f"server ready on 127.0.0.1:{server.port} (removed when the demo ends)")
        with psycopg.connect(server.dsn(), autocommit=True) as postgres:
            postgres.execute("CREATE DATABASE demo")
        with psycopg.connect(server.dsn("demo")) as admin, ExitStack() as closing:
            ctx = Context(Page(), server, admin, endpoint, closing)
            for scene in SCENES:
                scene(ctx)
    print("\ndemo finished; the server is stopped and its files removed.")
    return 0
