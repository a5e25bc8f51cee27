"""The ``aidb-memory`` command (SPEC §7). Exit 0 success, 1 failure, 2 usage error, 141 when
standard output was closed before the command finished writing (``aidb-memory sql | head -1``)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from aidb_memory import __version__
from aidb_memory.connection import (
    CliError,
    Connection,
    connect,
    connection_failure,
    first_line,
    resolve_dsn,
)
from aidb_memory.install.migrations import SqlSourceError
from aidb_memory.install.sources import SourceTree, default_tree

if TYPE_CHECKING:
    from aidb_memory.ops import worker as ops_worker

_N = TypeVar("_N", int, float)

# 128 + SIGPIPE: what a shell reports for a program that a closed pipe stopped.
EXIT_CLOSED_PIPE = 141


class _Stdout:
    closed = False


def _stdout_closed() -> None:
    """The reader of standard output went away: send the rest of the output nowhere, the final
    flush at interpreter exit included (it would print "Exception ignored ... BrokenPipeError")."""
    _Stdout.closed = True
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _say(line: str) -> None:
    # Also called from psycopg's notice handler, which would log (with a traceback) any
    # exception raised here and go on: so a closed pipe is noted here, not raised.
    if _Stdout.closed:
        return
    try:
        print(line, flush=True)
    except BrokenPipeError:
        _stdout_closed()


def _package(args: argparse.Namespace) -> Any:
    from aidb_memory.install.installer import Package

    tree = SourceTree(Path(args.source)).check() if args.source else default_tree()
    return Package.load(tree)


WITHOUT_PGVECTOR = (
    "keep embeddings as real[] even where the vector extension (pgvector) is available "
    "(docs/operations.md); a database already moved to pgvector stays there"
)


def _quiet_say(line: str) -> None:
    """``install --quiet``: no line per step; a warning (a role accepted by
    --accept-existing-roles, a missing citus extension) still goes to standard error."""
    if line.startswith("warning: ") or ": warning: " in line:
        print(line, file=sys.stderr, flush=True)


def cmd_install(args: argparse.Namespace) -> int:
    from aidb_memory.install.installer import install
    from aidb_memory.progress import Reporter

    package = _package(args)
    with connect(args.dsn) as conn:
        install(
            conn,
            package,
            say=_quiet_say if args.quiet else _say,
            dry_run=args.dry_run,
            accept_existing_roles=args.accept_existing_roles,
            citus=args.citus,
            pgvector=not args.without_pgvector,
            progress=Reporter.from_flags(progress=args.progress, quiet=args.quiet),
        )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from aidb_memory.install.installer import compare, read_state

    package = _package(args)
    with connect(args.dsn) as conn:
        state = read_state(conn, package)
        report = compare(state, package)
        queue, queue_note = _queue(conn) if state.installed else (None, None)
    result = {
        "installed": state.installed,
        "installed_version": state.version,
        "package_version": __version__,
        "applied": report.applied,
        "pending": report.pending,
        "drift": report.problems,
        # Per kind: events by status and the age of the oldest ready one (issue 36); null from
        # a database without aidb_memory.metrics().
        "queue": {q.kind: q.as_json() for q in queue} if queue is not None else None,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"package version:   {__version__}")
    print(f"installed version: {state.version or 'not installed'}")
    print(f"applied migrations ({len(report.applied)}): {', '.join(report.applied) or 'none'}")
    print(f"pending migrations ({len(report.pending)}): {', '.join(report.pending) or 'none'}")
    if report.problems:
        print("drift:")
        for p in report.problems:
            print(f"  - {p}")
    else:
        print("drift: none")
    if queue is not None:
        for kind in queue:
            print(kind.line())
    elif queue_note:
        print(queue_note)
    return 0


def _queue(conn: Connection) -> tuple[list[ops_worker.QueueState] | None, str | None]:
    """status: the queue per kind from aidb_memory.metrics(), or (None, one line saying why not:
    a version from before it, or an error). Never a failure of status itself."""
    from aidb_memory.ops import worker

    try:
        with conn.transaction():  # a savepoint: an error here leaves status' reads intact
            queue = worker.read_queue(conn)
    except psycopg.Error as e:
        return None, f"queue: cannot read aidb_memory.metrics(): {first_line(e)}"
    if queue is None:
        return None, (
            "queue: this database's aidb_memory has no aidb_memory.metrics() (it is older than "
            "this package): run `aidb-memory install` to upgrade it; `aidb-memory events list` "
            "counts its events"
        )
    return queue, None


def cmd_sql(args: argparse.Namespace) -> int:
    from aidb_memory.install.script import render

    steps = _package(args).steps(
        accept_existing_roles=args.accept_existing_roles, pgvector=not args.without_pgvector
    )
    sys.stdout.write(render(steps))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from aidb_memory.install.installer import compare, read_state

    package = _package(args)
    with connect(args.dsn) as conn:
        state = read_state(conn, package)
    if not state.installed:
        print(
            "aidb-memory: aidb_memory is not installed in this database; "
            "run `aidb-memory install` (or check --dsn / DATABASE_URL / PG* point at it)",
            file=sys.stderr,
        )
        return 1
    report = compare(state, package)
    problems = report.problems + [f"migration {n} is not applied" for n in report.pending]
    if problems:
        for p in problems:
            print(f"drift: {p}", file=sys.stderr)
        return 1
    print(
        f"ok: version {__version__}, {len(report.applied)} migrations, "
        "code and catalog as installed"
    )
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    from aidb_memory.install.installer import uninstall

    if not args.yes:
        print(
            "aidb-memory: uninstall erases every session and memory in this database; "
            "run `aidb-memory uninstall --yes` to confirm",
            file=sys.stderr,
        )
        return 1
    with connect(args.dsn) as conn:
        uninstall(conn, say=_say)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from aidb_memory.ops import doctor

    with connect(args.dsn, autocommit=True) as conn:
        checks = doctor.run(conn, accept_existing_roles=args.accept_existing_roles)
    for check in checks:
        print(check.line())
    return 0 if all(c.ok for c in checks) else 1


def cmd_deps(args: argparse.Namespace) -> int:
    from aidb_memory.ops import deps

    with connect(args.dsn, autocommit=True) as conn:
        deps.run(
            conn, python=args.python, target=Path(args.target) if args.target else None, say=_say
        )
    return 0


def _key_range(text: str) -> tuple[int, int]:
    """--key-range MIN:MAX, checked (argparse reports the error and exits 2)."""
    from aidb_memory.ops import worker

    try:
        return worker.parse_key_range(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _checked(
    convert: Callable[[str], _N], ok: Callable[[_N], bool], what: str
) -> Callable[[str], _N]:
    """An argparse ``type``: ``convert`` the text and check it with ``ok``, else an error saying
    that it is not ``what`` (argparse reports it and exits 2)."""

    def parse(text: str) -> _N:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse


# --split-key-space N
_workers = _checked(int, lambda n: n >= 1, "a number of workers (1 or more)")
# --metrics-port (0: any free port), --metrics-namespaces, --health-max-latency
_port = _checked(int, lambda n: 0 <= n <= 65535, "a port (0 to 65535)")
_count_arg = _checked(int, lambda n: n >= 0, "a count (0 or more)")
_seconds = _checked(float, lambda s: 0 < s < math.inf, "a number of seconds (more than 0)")


METRICS_EXTRA_MISSING = (
    "aidb-memory worker: --metrics-port needs prometheus-client, which the package installs only "
    "with the metrics extra: pip install 'aidb-memory[metrics]'"
)


def _worker_error(log: ops_worker.Log, line: str) -> None:
    """The line the worker ends with (exit 2): a JSON object with --log-format json."""
    if log.json_format:
        log("exit", line, level="error", error=line.removeprefix("aidb-memory: "))
    else:
        print(line, file=sys.stderr)


def cmd_worker(args: argparse.Namespace) -> int:
    from aidb_memory.ops import worker
    from aidb_memory.progress import Reporter

    if args.split_key_space is not None:
        for low, high in worker.key_ranges(args.split_key_space):
            _say(f"--key-range={low}:{high}")
        return 0
    options = worker.Options(
        once=args.once,
        batch=args.batch,
        lease_s=args.lease,
        max_attempts=args.max_attempts,
        backoff_s=args.backoff,
        key_range=args.key_range,
    )
    log = worker.Log(_say, json_format=args.log_format == "json", quiet=args.quiet)
    # A backlog's progress: on a terminal unless --quiet; elsewhere (a service's log) only with
    # --progress. As JSON objects with --log-format json.
    progress = Reporter.from_flags(
        progress=args.progress,
        quiet=args.quiet,
        stream=worker.ProgressObjects(log) if log.json_format else None,
    )
    stats = None
    server = None
    if args.metrics_port is not None:
        # prometheus-client only now: a worker without --metrics-port needs no extra.
        try:
            from aidb_memory.ops import metrics
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] != "prometheus_client":
                raise
            _worker_error(log, METRICS_EXTRA_MISSING)
            return 2

        def on_database(error: str | None) -> None:
            if error is None:
                log("metrics database up", "worker: metrics: the database answers again")
            else:
                log(
                    "metrics database down",
                    f"worker: metrics: cannot read aidb_memory.metrics() ({error}); scrapes "
                    "answer aidb_memory_worker_database_up 0",
                    level="warning",
                    error=error,
                )

        stats = worker.WorkerStats()
        exporter = metrics.Exporter(
            metrics.connector(args.dsn),
            stats,
            max_namespaces=args.metrics_namespaces,
            max_latency_s=args.health_max_latency,
            dsn=resolve_dsn(args.dsn),
            on_database=on_database,
        )
        try:
            server = metrics.serve(exporter, args.metrics_address, args.metrics_port)
        except OSError as e:
            where = f"{args.metrics_address}:{args.metrics_port}"
            _worker_error(
                log,
                f"aidb-memory: worker: cannot serve metrics on {where}: {e.strerror or e}; "
                "choose another --metrics-port or --metrics-address",
            )
            return 2
        log(
            "metrics",
            f"worker: metrics on {server.url}/metrics, health on {server.url}/healthz",
            url=server.url,
        )
    stop = worker.Stop()
    worker.install_signal_handlers(stop)
    try:
        worker.run(
            lambda: connect(args.dsn, autocommit=True),
            options,
            say=_say,
            stop=stop,
            log=log,
            stats=stats,
            progress=progress,
        )
    except CliError as e:  # the first connection: a wrong --dsn, not a passing outage
        _worker_error(log, str(e))
        return 2
    except worker.ConfigError as e:
        _worker_error(log, database_error("worker", e.error))
        return 2
    finally:
        if server is not None:
            server.close()
    return 0


def cmd_events_list(args: argparse.Namespace) -> int:
    from aidb_memory.ops import events

    with connect(args.dsn, autocommit=True) as conn:
        counts = events.list_counts(conn, args.namespace)
    if args.json:
        print(json.dumps(events.as_json(counts), indent=2))
        return 0
    if not counts:
        where = f' in namespace "{args.namespace}"' if args.namespace else ""
        print(f"no events{where}")
        return 0
    for line in events.table(counts):
        print(line)
    return 0


def cmd_events_retry(args: argparse.Namespace) -> int:
    from aidb_memory.ops import events

    with connect(args.dsn, autocommit=True) as conn:
        n = events.retry(conn, args.namespace, args.actor, args.failed_since)
    noun = "event" if n == 1 else "events"
    print(f'put {n} failed {noun} of namespace "{args.namespace}" back in the queue')
    return 0


DEMO_EXTRA_MISSING = (
    "aidb-memory demo: the throwaway server needs testing.postgresql, which the package installs "
    "only with the demo extra: pip install 'aidb-memory[demo]'"
)


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        from aidb_memory import demo
    except ModuleNotFoundError as e:
        # testing.postgresql is not a runtime dependency (applications don't need it).
        if (e.name or "").split(".")[0] == "testing":
            raise CliError(DEMO_EXTRA_MISSING) from e
        raise

    return demo.main()


MCP_EXTRA_MISSING = (
    "aidb-memory mcp: the MCP server needs the mcp package, which the package installs only with "
    "the mcp extra: pip install 'aidb-memory[mcp]'"
)


def _mcp_actor(args: argparse.Namespace) -> str:
    """The actor of ``--actor`` or ``--actor-from-env``; the empty string if there is none."""
    if args.actor is not None:
        return str(args.actor)
    return os.environ.get(args.actor_from_env, "")


def cmd_mcp(args: argparse.Namespace) -> int:
    actor = _mcp_actor(args)
    if not actor:
        where = "--actor" if args.actor is not None else f"${args.actor_from_env}"
        print(f"aidb-memory mcp: no actor: {where} is empty or not set", file=sys.stderr)
        return 2
    try:
        from aidb_memory.integrations import mcp_server
    except ModuleNotFoundError as e:
        # mcp is not a runtime dependency (only the MCP server needs it).
        if (e.name or "").split(".")[0] in ("mcp", "pydantic"):
            raise CliError(MCP_EXTRA_MISSING) from e
        raise
    from aidb_memory.client import AidbMemoryError, ConnectionFailed

    dsn = resolve_dsn(args.dsn)
    try:
        return mcp_server.main(dsn, args.namespace, actor)
    except ConnectionFailed as e:  # before serving: a wrong --dsn
        raise CliError(connection_failure(str(e.pgerror or e.message), dsn)) from None
    except AidbMemoryError as e:  # before serving: a wrong namespace or actor
        # The message of the check the server makes before it serves, without its function.
        reason = e.message.removeprefix(f"aidb_memory.{e.function}: ") if e.function else e.message
        line = f"aidb-memory: mcp: {reason}"
        raise CliError(line + (f" (hint: {e.hint})" if e.hint else "")) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aidb-memory",
        description="Install, upgrade and check aidb_memory, agent memory inside PostgreSQL.",
    )
    parser.add_argument("--version", action="version", version=f"aidb-memory {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dsn", help="connection string (default: $DATABASE_URL, else libpq's PG* variables)"
    )
    common.add_argument("--source", help=argparse.SUPPRESS)  # developers: install from another tree
    accept = argparse.ArgumentParser(add_help=False)
    accept.add_argument(
        "--accept-existing-roles",
        action="store_true",
        help="proceed although aidb_users/aidb_admins/aidb_workers were changed outside install "
        "(LOGIN, attributes, memberships or grants no superuser made); each is printed as a "
        "warning",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "install", parents=[common, accept], help="install, or upgrade to this version"
    )
    p.add_argument("--dry-run", action="store_true", help="print what would run; change nothing")
    p.add_argument(
        "--citus",
        action="store_true",
        help="then distribute the tables over Citus (on its coordinator; docs/scaling.md)",
    )
    p.add_argument("--without-pgvector", action="store_true", help=WITHOUT_PGVECTOR)
    p.add_argument(
        "--progress",
        action="store_true",
        help="report the progress of migrations that backfill rows on stderr even when it is "
        "not a terminal (every 5 s; $AIDB_MEMORY_PROGRESS_INTERVAL seconds)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="print neither progress nor a line per step; errors and warnings still go to stderr",
    )
    p.set_defaults(func=cmd_install)
    p = sub.add_parser("status", parents=[common], help="installed version, migrations, drift")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser(
        "sql", parents=[common, accept], help="the install/upgrade script, for psql -f"
    )
    p.add_argument("--without-pgvector", action="store_true", help=WITHOUT_PGVECTOR)
    p.set_defaults(func=cmd_sql)
    p = sub.add_parser(
        "verify", parents=[common], help="exit 1 if the database drifted from this package"
    )
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser(
        "uninstall", parents=[common], help="remove the schema and what install created"
    )
    p.add_argument("--yes", action="store_true", help="confirm: every session and memory is erased")
    p.set_defaults(func=cmd_uninstall)
    p = sub.add_parser(
        "doctor", parents=[common], help="check the server: plpython3u, its Python, openai"
    )
    p.add_argument(
        "--accept-existing-roles",
        action="store_true",
        help="report roles changed outside install as accepted (ok), as install would proceed",
    )
    p.set_defaults(func=cmd_doctor)
    p = sub.add_parser(
        "deps", parents=[common], help="install the server's Python packages (openai)"
    )
    p.add_argument(
        "--python", help="the server's interpreter (default: fetch wheels for its version)"
    )
    p.add_argument(
        "--target", help="directory for the packages (default: /var/lib/aidb_memory/pythonX.Y)"
    )
    p.set_defaults(func=cmd_deps)
    p = sub.add_parser(
        "worker",
        parents=[common],
        help="run the queue (extraction, compaction ahead of reads) until stopped",
    )
    p.add_argument("--once", action="store_true", help="process what is queued, then exit")
    p.add_argument("--batch", type=int, default=1, help="events per call (default 1)")
    p.add_argument("--lease", type=int, default=300, help="seconds an event is held (default 300)")
    p.add_argument(
        "--max-attempts", type=int, default=5, help="attempts before an event fails (default 5)"
    )
    p.add_argument(
        "--backoff", type=float, default=10.0, help="first retry delay in s, doubling (default 10)"
    )
    p.add_argument(
        "--key-range",
        type=_key_range,
        metavar="MIN:MAX",
        help="claim only the events of actors whose actor_key is in MIN..MAX (inclusive); "
        "write --key-range=MIN:MAX when MIN is negative (default: every key)",
    )
    p.add_argument(
        "--split-key-space",
        type=_workers,
        metavar="N",
        help="print the --key-range of each of N workers that split the key space equally, "
        "and exit",
    )
    p.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve Prometheus metrics on /metrics and a health check on /healthz at this port "
        "(0: any free one; needs pip install 'aidb-memory[metrics]'; default: no server)",
    )
    p.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address the metrics server listens on (default 127.0.0.1; 0.0.0.0 or :: for "
        "every interface)",
    )
    p.add_argument(
        "--metrics-namespaces",
        type=_count_arg,
        default=20,
        metavar="N",
        help="namespaces that get their own namespace label, the N with the smallest ids; the "
        'others share "_other" (default 20)',
    )
    p.add_argument(
        "--health-max-latency",
        type=_seconds,
        default=600.0,
        metavar="SECONDS",
        help="/healthz fails when the oldest ready event is older than this (default 600)",
    )
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text: lines on stdout (default); json: one JSON object per line on stderr, per "
        "batch and per failed or retried event, never content, keys or actor ids",
    )
    p.add_argument(
        "--progress",
        action="store_true",
        help="report a backlog's progress on stderr even when it is not a terminal",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress and no line per batch (starts, stops and errors still print)",
    )
    p.set_defaults(func=cmd_worker)
    p = sub.add_parser(
        "events", help="the queue (extraction, compaction): counts by status, retry failed"
    )
    events_sub = p.add_subparsers(dest="events_command", required=True, metavar="ACTION")
    q = events_sub.add_parser(
        "list",
        parents=[common],
        help="events by status per namespace and kind (admins, workers)",
    )
    q.add_argument("--namespace", help="only this namespace")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.set_defaults(func=cmd_events_list)
    q = events_sub.add_parser(
        "retry", parents=[common], help="put failed events back in the queue (admins)"
    )
    q.add_argument("--namespace", required=True, help="the namespace whose failed events to retry")
    q.add_argument("--actor", help="only this actor's events")
    q.add_argument(
        "--failed-since",
        metavar="TIMESTAMP",
        help="only events that failed at or after this time (e.g. '2026-05-01 12:00+00')",
    )
    q.set_defaults(func=cmd_events_retry)
    p = sub.add_parser("demo", help="the walkthrough on a throwaway server")
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser(
        "mcp",
        parents=[common],
        help="serve an actor's long-term memory to an agent over MCP (stdio)",
        description="An MCP server on stdin/stdout with the tools search_memories, remember, "
        "list_memories, get_memory, update_memory, memory_history and forget_memory, bound to "
        "one namespace and actor. Needs the mcp extra: pip install 'aidb-memory[mcp]'.",
    )
    p.add_argument("--namespace", required=True, help="the namespace of the memories")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--actor", help="the actor whose memories the tools read and write")
    who.add_argument(
        "--actor-from-env",
        metavar="VAR",
        help="take the actor from this environment variable (set by the host)",
    )
    p.set_defaults(func=cmd_mcp)
    return parser


def database_error(command: str, error: psycopg.Error) -> str:
    """One line for an error the server raised while a command ran."""
    line = f"aidb-memory: {command} failed: {first_line(error)}"
    if isinstance(error, psycopg.errors.InsufficientPrivilege) and command == "events":
        line += "; connect as a member of aidb_admins (list: also aidb_workers) or a superuser"
    elif isinstance(error, psycopg.errors.InsufficientPrivilege):
        line += (
            f"; {command} reads aidb_memory's own tables: connect as a superuser "
            "(e.g. user=postgres in --dsn, or PGUSER)"
        )
    elif error.diag.message_hint:
        line += f" (hint: {error.diag.message_hint})"
    return line


def main(argv: list[str] | None = None) -> int:
    """Run one command; a closed standard output ends it quietly with 141. The command itself
    is not interrupted by it (an install still commits or rolls back as a whole): only the rest
    of its output is lost."""
    code = EXIT_CLOSED_PIPE
    try:
        code = _run(argv)
        sys.stdout.flush()  # a closed pipe shows here, not in the flush at interpreter exit
    except BrokenPipeError:
        _stdout_closed()
    return EXIT_CLOSED_PIPE if _Stdout.closed else code


def _run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (CliError, SqlSourceError) as e:
        print(str(e), file=sys.stderr)
        return 1
    except psycopg.Error as e:
        print(database_error(args.command, e), file=sys.stderr)
        return 1
    except BrokenPipeError:
        raise  # main's, quietly
    except OSError as e:
        print(f"aidb-memory: {args.command} failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("aidb-memory: interrupted", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
