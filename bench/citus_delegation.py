"""What a call costs through a Citus coordinator, delegated to the actor's worker, on that worker
itself, and on one server (issue 37's measurements before its design; bench/README.md, "Through
a Citus coordinator").

    .venv/bin/python bench/citus_delegation.py

Starts a Citus cluster (a coordinator and two workers, tests/deployments.py, with the citus
extension ../shared/citus/build.sh installs) and a single server, installs aidb_memory into each
(``install --citus`` on the cluster), writes one session of 100 turns and times ``add`` and
``session_get(limit_chars => 2000)``:

- through the coordinator, as today (each statement planned there and sent to the worker);
- delegated: ``add_at`` and ``session_get_at``, thin functions that take the actor's key first
  and call ``add`` and ``session_get``, distributed with ``create_distributed_function(...,
  'actor_key', colocate_with := 'aidb_memory.session')``, called through PL/pgSQL wrappers with
  the API's arguments that compute the key into a variable (``SET
  citus.function_opens_transaction_block = off``, so that the nested call is delegated too, and
  custom plans, so that the key is a constant in it: Citus delegates a call only then);
- on the worker that holds the actor's shards, connected to it directly (what a delegated call
  runs there);
- on a single server.

And ``add_routed``: ``add``'s writes of a plain exchange as three statements Citus routes whole to
the actor's shard (without ``add``'s validation), delegated, on the worker and on one server.

For each: the commands Citus sends to other nodes for one call (``citus.log_remote_commands``)
and the median and p90 µs of 300 calls. These functions are created here only: nothing of this
is installed by ``install --citus``.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import psycopg
from citus_latency import install  # (it puts tests/ on the path, for deployments)

from aidb_memory.throwaway import ThrowawayServer
from deployments import citus_available, citus_cluster  # the suite's cluster

NS, ACTOR, SID, DB = "delegation", "alice", "s1", "delegation"
CALLS = 300
TURNS = json.dumps(
    [{"role": "user", "content": "hello " * 20}, {"role": "assistant", "content": "hi " * 40}]
)
KEY = (
    "('x' || encode(substr(sha256(convert_to($1 || ':' || $2, 'UTF8')), 1, 8), 'hex'))"
    "::bit(64)::bigint"
)


def _add_wrapper(name: str, target: str) -> str:
    """``public.<name>`` with add's arguments: the key computed into a variable and ``target``
    (a distributed function on it) called with it, so that Citus delegates the call."""
    return f"""
CREATE FUNCTION public.{name}(namespace text, actor_id text, turns jsonb, session_id text)
RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET citus.function_opens_transaction_block = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    _key bigint := {KEY};
    _id uuid;
BEGIN
    SELECT a INTO _id FROM {target}(_key, $1, $2, $3, $4) AS a;
    RETURN _id;
END $$"""


# The thin delegated functions and the wrappers that call them (SECURITY DEFINER, as the API's).
DELEGATED = [
    """
CREATE FUNCTION aidb_memory.session_get_at(actor_key bigint, namespace text, actor_id text,
                                           session_id text, limit_chars integer)
RETURNS TABLE (items jsonb, overflow_chars bigint, compacted_entries integer, warnings text[])
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY SELECT * FROM aidb_memory.session_get($2, $3, $4, $5);
END $$""",
    """
CREATE FUNCTION aidb_memory.add_at(actor_key bigint, namespace text, actor_id text, turns jsonb,
                                   session_id text)
RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN aidb_memory.add($2, $3, $4, $5);
END $$""",
    "SELECT create_distributed_function('aidb_memory.session_get_at(bigint,text,text,text,"
    "integer)', 'actor_key', colocate_with := 'aidb_memory.session')",
    "SELECT create_distributed_function('aidb_memory.add_at(bigint,text,text,jsonb,text)', "
    "'actor_key', colocate_with := 'aidb_memory.session')",
    f"""
CREATE FUNCTION public.session_get_delegated(namespace text, actor_id text, session_id text,
                                             limit_chars integer)
RETURNS TABLE (items jsonb, overflow_chars bigint, compacted_entries integer, warnings text[])
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET citus.function_opens_transaction_block = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    _key bigint := {KEY};
BEGIN
    RETURN QUERY SELECT * FROM aidb_memory.session_get_at(_key, $1, $2, $3, $4);
END $$""",
    _add_wrapper("add_delegated", "aidb_memory.add_at"),
]
# add's writes of a plain batch as three statements Citus routes whole to the actor's shard (the
# key a parameter of each; no INSERT ... SELECT from a CTE's rows): what a Citus path of add could
# run, without add's validation. Made a distributed function on its key too.
ROUTED = [
    """
CREATE FUNCTION public.add_routed(actor_key bigint, namespace text, actor_id text, turns jsonb,
                                  session_id text)
RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    _ns bigint;
    _s record;
    _e record;
    _c1 text := turns->0->>'content';
    _c2 text := turns->1->>'content';
BEGIN
    SELECT n.id INTO _ns FROM aidb_memory.namespace AS n WHERE n.name = $2;
    UPDATE aidb_memory.session AS x
    SET next_seq = x.next_seq + 2, total_chars = x.total_chars + length(_c1) + length(_c2),
        updated_at = now(), tail_round_start = x.next_seq + 1
    WHERE x.actor_key = $1 AND x.namespace_id = _ns AND x.actor_id = $3 AND x.session_id = $5
    RETURNING x.id, x.next_seq - 2 AS first_seq,
              x.total_chars - length(_c1) - length(_c2) AS first_offset
    INTO _s;
    INSERT INTO aidb_memory.event (actor_key, namespace_id, actor_id, session_id, turn_count,
                                   status)
    VALUES ($1, _ns, $3, $5, 2, 'skipped')
    RETURNING id, public_id INTO _e;
    INSERT INTO aidb_memory.turn (actor_key, session_ref, seq, round_start, char_offset, chars,
                                  role, content, kind, event_ref)
    VALUES ($1, _s.id, _s.first_seq, _s.first_seq, _s.first_offset, length(_c1), 'user', _c1,
            'user_prompt', _e.id),
           ($1, _s.id, _s.first_seq + 1, _s.first_seq + 1, _s.first_offset + length(_c1),
            length(_c2), 'assistant', _c2, 'model_response', _e.id);
    RETURN _e.public_id;
END $$""",
    _add_wrapper("add_routed_delegated", "public.add_routed"),
]
DISTRIBUTE_ROUTED = (
    "SELECT create_distributed_function('public.add_routed(bigint,text,text,jsonb,text)', "
    "'actor_key', colocate_with := 'aidb_memory.session')"
)
GET = "SELECT * FROM {fn}(%s, %s, %s, 2000)"
ADD = "SELECT {fn}(%s, %s, %s::jsonb, %s)"


def fill(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT aidb_memory.init(%s, '{}', '{\"extraction\": false}')", (NS,))
        for _ in range(50):
            conn.execute("SELECT aidb_memory.add(%s, %s, %s::jsonb, %s)", (NS, ACTOR, TURNS, SID))


def remote_commands(dsn: str, sql: str, params: tuple[Any, ...]) -> list[str]:
    seen: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql, params).fetchall()  # the first call: plans, caches
        conn.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
        conn.execute("SET citus.log_remote_commands = on")
        conn.execute(sql, params).fetchall()
    return [s for s in seen if s.startswith("issuing ")]


def timed(dsn: str, sql: str, params: tuple[Any, ...]) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(30):
            conn.execute(sql, params, prepare=True).fetchall()
        us = []
        for _ in range(CALLS):
            t0 = time.perf_counter()
            conn.execute(sql, params, prepare=True).fetchall()
            us.append((time.perf_counter() - t0) * 1e6)
    us.sort()
    return f"median {statistics.median(us):6.0f} µs, p90 {us[int(0.9 * CALLS)]:6.0f}"


def main() -> None:
    with ThrowawayServer() as single, citus_cluster() as cluster:
        if not citus_available(single):
            raise SystemExit("the citus extension is not installed (../shared/citus/build.sh)")
        with psycopg.connect(single.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB}")
        cluster.create_database(DB)
        coordinator, one = cluster.dsn(DB), single.dsn(DB)
        install(one, citus=False)
        install(coordinator, citus=True)
        fill(one)
        fill(coordinator)
        with psycopg.connect(one, autocommit=True) as conn:
            conn.execute(ROUTED[0])
        with psycopg.connect(coordinator, autocommit=True) as conn:
            for statement in [*DELEGATED, *ROUTED, DISTRIBUTE_ROUTED]:
                conn.execute(statement)
            row = conn.execute(
                "SELECT k.key, p.nodeport FROM (SELECT aidb_memory.actor_key(%s, %s) AS key) AS k "
                "JOIN pg_catalog.pg_dist_shard_placement AS p "
                "ON p.shardid = pg_catalog.get_shard_id_for_distribution_column("
                "'aidb_memory.session', k.key)",
                (NS, ACTOR),
            ).fetchone()
        assert row is not None
        key, port = row
        worker = next(w for w in cluster.workers if w.port == port).dsn(DB)
        get, add = (NS, ACTOR, SID), (NS, ACTOR, TURNS, SID)
        get_sql, add_sql = (
            GET.format(fn="aidb_memory.session_get"),
            ADD.format(fn="aidb_memory.add"),
        )
        routed = "SELECT public.add_routed(%s, %s, %s, %s::jsonb, %s)"
        delegated = "delegated to the worker"
        measured = {
            "session_get": [
                ("through the coordinator", coordinator, get_sql, get),
                (delegated, coordinator, GET.format(fn="public.session_get_delegated"), get),
                ("on the actor's worker", worker, get_sql, get),
                ("on one server", one, get_sql, get),
            ],
            "add": [
                ("through the coordinator", coordinator, add_sql, add),
                (delegated, coordinator, ADD.format(fn="public.add_delegated"), add),
                ("on the actor's worker", worker, add_sql, add),
                ("on one server", one, add_sql, add),
            ],
            "add as three single-shard statements (no validation)": [
                (delegated, coordinator, ADD.format(fn="public.add_routed_delegated"), add),
                ("on the actor's worker", worker, routed, (key, *add)),
                ("on one server", one, routed, (key, *add)),
            ],
        }
        for call, ways in measured.items():
            print(f"{call}:")
            for label, dsn, sql, params in ways:
                sent = remote_commands(dsn, sql, params) if dsn != one else []
                print(f"  {label:24s} {timed(dsn, sql, params)}, {len(sent)} remote commands")
                for command in sent:
                    print(f"      {command[:110]}")


if __name__ == "__main__":
    main()
