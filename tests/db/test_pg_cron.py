"""The pg_cron recipe of docs/operations.md runs the worker (issue 5: "a pg_cron recipe is
documented and tested if pg_cron is installable"; bootstrap installs postgresql-15-cron).

pg_cron must be preloaded, so this test starts a server of its own; its finest schedule is a
minute, so the test waits for one run (at most about a minute).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from aidb_memory.install.installer import Package, install
from aidb_memory.throwaway import ThrowawayServer
from fake_openai import Reply, serve

RECIPE = "CALL aidb_memory.process_events(max_events => 500)"


@pytest.fixture(scope="module")
def cron_server() -> Iterator[ThrowawayServer]:
    server = ThrowawayServer(
        postgres_args="-c shared_preload_libraries=pg_cron -c cron.database_name=postgres "
        "-c cron.host=127.0.0.1"
    )
    try:
        yield server
    finally:
        server.stop()


def test_the_pg_cron_recipe_processes_queued_events(
    cron_server: ThrowawayServer, server_pylib: Path, template_db: object
) -> None:
    with psycopg.connect(cron_server.dsn()) as setup:
        install(setup, Package.load(), say=lambda _line: None)
        setup.commit()
    with serve() as fake, psycopg.connect(cron_server.dsn(), autocommit=True) as conn:
        fake.default = lambda _r: Reply(
            content=json.dumps(
                {"operations": [{"op": "add", "text": "Bo likes jazz.", "target": None}]}
            )
        )
        conn.execute(
            "INSERT INTO aidb_memory.runtime_settings (key, value) "
            "VALUES ('server_pythonpath', %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(server_pylib),),
        )
        conn.execute("CREATE ROLE cron_worker LOGIN IN ROLE aidb_workers")
        conn.execute("CREATE EXTENSION pg_cron")
        opts = {"model": "fake-chat", "base_url": fake.base_url}
        conn.execute(
            "SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),)
        )
        conn.execute("SELECT aidb_memory.init('mem', '{\"llm\": \"chat\"}')")
        conn.execute(
            "SELECT aidb_memory.add('mem', 'bo', %s::jsonb, 's')",
            (json.dumps([{"role": "user", "content": "I love jazz."}]),),
        )
        # The recipe, run as a member of aidb_workers.
        conn.execute(
            "SELECT cron.schedule_in_database('aidb-memory-worker', '* * * * *', %s, "
            "'postgres', 'cron_worker')",
            (RECIPE,),
        )
        deadline = time.monotonic() + 100
        status = None
        while time.monotonic() < deadline:
            status = conn.execute("SELECT status FROM aidb_memory.event").fetchone()
            if status == ("processed",):
                break
            time.sleep(1)
        runs = conn.execute(
            "SELECT status, return_message FROM cron.job_run_details ORDER BY runid"
        ).fetchall()
        assert status == ("processed",), runs
        assert runs and runs[0][0] == "succeeded", runs
        assert conn.execute("SELECT content FROM aidb_memory.memory").fetchall() == [
            ("Bo likes jazz.",)
        ]
        assert len(fake.calls()) == 1
