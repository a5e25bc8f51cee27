"""``make demo`` / ``aidb-memory demo``: the walkthrough of SPEC §9 on a throwaway server."""

from __future__ import annotations

import textwrap
from typing import Any

import psycopg

from aidb_memory.installer import Package, install
from aidb_memory.throwaway import ThrowawayServer


def _show(conn: psycopg.Connection[tuple[Any, ...]], title: str, query: str) -> None:
    print(f"\n-- {title}")
    print(textwrap.indent(query.strip(), "   "))
    cur = conn.execute(query.encode())
    names = [d.name for d in cur.description or ()]
    rows = cur.fetchall()
    widths = [max(len(n), *(len(str(r[i])) for r in rows)) for i, n in enumerate(names)]
    print("   " + " | ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)))
    print("   " + "-+-".join("-" * w for w in widths))
    for r in rows:
        print("   " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)))


def main() -> int:
    """Run the walkthrough; the server is removed however it ends."""
    print("aidb_memory demo: starting a throwaway PostgreSQL server ...", flush=True)
    with ThrowawayServer() as server:
        print(f"server ready on 127.0.0.1:{server.port} (removed when the demo ends)")
        with psycopg.connect(server.dsn(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE demo")
        with psycopg.connect(server.dsn("demo")) as conn:
            print("\n== install (what `aidb-memory install` prints)")
            install(conn, Package.load(), say=lambda line: print(f"   {line}", flush=True))
            conn.autocommit = True
            _show(conn, "the installed version", "SELECT aidb_memory.version();")
            _show(
                conn,
                "a namespace for the help-desk agent (init is idempotent: same id twice)",
                "SELECT aidb_memory.init('helpdesk_namespace') AS id, "
                "aidb_memory.init('helpdesk_namespace') AS again;",
            )
            _show(
                conn,
                "every namespace",
                "SELECT id, name, model_spec, state FROM aidb_memory.namespaces ORDER BY id;",
            )
    print("\ndemo finished; the server is stopped and its files removed.")
    return 0
