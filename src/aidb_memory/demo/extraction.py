"""Scene: long-term memory. alice and bob mention lasting facts, the extraction worker
(process_events) runs once as a worker role, and status shows what alice's event produced:
verbatim memories without a language model, a model's facts with one, or the error."""

from __future__ import annotations

import psycopg
from psycopg.types.json import Jsonb

from aidb_memory.demo.context import MODEL, Context

VERBATIM_LINE = (
    "verbatim: no OPENAI_API_KEY/OPENAI_BASE_URL — no language model, so the worker stores what "
    "the user said, as said"
)
WORKER_ROLE = "helpdesk_worker"

ALICE_FACTS = [
    (
        "user",
        "Hello again! Two things for your notes: please always email me rather than phone, I "
        "spend my days in the shops. And Alice Co runs four bakeries in Edinburgh; the 8 seats "
        "are for the shop managers.",
    ),
    (
        "assistant",
        "Noted: email only from now on, no calls. Four bakeries in Edinburgh, with a seat for "
        "each shop manager.",
    ),
]
BOB_FACTS = [
    (
        "user",
        "Hi, this is Bob from Leith Ales. Please send our February invoice to my own address, "
        "bob.m@example.net, not the company one.",
    ),
    ("assistant", "Sent: a copy of the February invoice went to bob.m@example.net."),
]


_WORKED = """
    SELECT actor_id, session_id, status, attempts, last_error
    FROM aidb_memory.events WHERE attempts > 0 ORDER BY event_id;
"""


def scene(ctx: Context) -> None:
    page, app, admin, endpoint = ctx.page, ctx.app, ctx.admin, ctx.endpoint
    page.heading("Long-term memory: alice and bob mention lasting facts")
    page.say(
        """
        Sessions remember a conversation; long-term memories remember the person across all of
        them. A week later alice writes in again (add creates the session conv-738951), with
        facts worth keeping; and another customer, bob, writes in too.
        """
    )
    page.say("alice's turns, $1 below:")
    rows = page.run(
        app,
        """
        SELECT aidb_memory.add(
          namespace       => 'helpdesk_namespace',
          actor_id        => 'alice',
          turns           => $1,
          session_id      => 'conv-738951',
          agent_id        => 'helpdesk-agent-64849',
          idempotency_key => 'conv-738951-turn-001'
        );
        """,
        (Jsonb(page.show_turns(ALICE_FACTS)),),
    )
    event = str(rows[0][0]) if rows else None
    page.say("bob's turns, $1 below:")
    page.run(
        app,
        """
        SELECT aidb_memory.add(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'bob',
          turns      => $1,
          session_id => 'conv-738960',
          agent_id   => 'helpdesk-agent-64849'
        );
        """,
        (Jsonb(page.show_turns(BOB_FACTS)),),
    )
    page.say(
        """
        Each add recorded an event, and since extraction is on, the events wait for the
        extraction worker: status says accepted, with no attempt yet.
        """
    )
    status = f"""
        SELECT aidb_memory.status(
          namespace => 'helpdesk_namespace',
          actor_id  => 'alice',
          event_id  => '{event}'
        );
    """
    if event is not None:
        page.run(app, status, json_result=True)

    page.heading("The extraction worker: process_events (as a worker)")
    if endpoint is None:
        how = """
            The namespace has no language model (its llm is the builtin summarizer), so
            extraction is verbatim: each user turn of the event (not the assistant's, nor a tool
            call or its result) is cut on sentence boundaries into memories of at most
            memory_max_chars characters (1000 by default) and stored as said, an exact duplicate
            of a current memory merged, in the event's own transaction. No model is called and
            nothing leaves the database.
            """
    else:
        how = """
            It makes one model call with structured output (a JSON schema of add, update and
            invalidate operations), shown the event's turns and the actor's related memories,
            and reconciles the answer with the actor's memories in the event's own transaction.
            """
    page.say(
        f"""
        The worker is the procedure process_events, for members of aidb_workers; `aidb-memory
        worker` runs it in a loop, pg_cron can run it too. Here it runs once, as its own login
        role {WORKER_ROLE}. It claims each accepted event with a lease. {" ".join(how.split())}
        max_attempts => 2 and backoff_s => 0 let a failing event be retried at once and marked
        failed within the demo (the defaults are 5 attempts and a 10 s backoff, doubling).
        """
    )
    page.run(admin, f"CREATE ROLE {WORKER_ROLE} LOGIN IN ROLE aidb_workers;")
    with psycopg.connect(ctx.server.dsn("demo", WORKER_ROLE), autocommit=True) as worker:
        page.run(
            worker,
            "CALL aidb_memory.process_events(max_events => 50, max_attempts => 2, backoff_s => 0);",
        )
        page.say("The events it worked, as the worker sees them:")
        worked = page.run(worker, _WORKED) or []
    statuses = {row[2] for row in worked}
    if statuses == {"processed"}:
        nothing = "the model found no fact worth keeping" if endpoint else "no turn had text"
    elif endpoint is None:
        nothing = "the worker did not process the events, see its step"
    else:
        nothing = "the extraction calls did not succeed, see the worker's step"
    ctx.why_no_memories = nothing
    errors = [row[4] for row in worked if row[4]]
    if endpoint is None and statuses == {"processed"}:
        page.say(VERBATIM_LINE + ".")
        page.say(
            """
            The builtin extractive summarizer quotes sentences but is not a language model, so
            with extraction_mode auto (the default) the worker kept what alice and bob said, as
            they said it, rather than facts a model would word; search below finds them all the
            same. extraction_mode verbatim_all keeps the assistant's turns too; model insists on
            a model. Set OPENAI_API_KEY or OPENAI_BASE_URL to see a model extract facts instead.
            As an admin, the extraction calls made to a model:
            """
        )
        page.run(
            admin,
            """
            SELECT count(*) AS extraction_calls
            FROM aidb_memory.model_calls WHERE purpose = 'extraction';
            """,
        )
    elif endpoint is None:
        first = f" The first error: {errors[0]}." if errors else ""
        page.say(
            f"""
            Not every event was processed (statuses {", ".join(sorted(statuses))}).{first}
            """
        )
    elif statuses == {"processed"}:
        page.say(
            f"""
            {MODEL} answered every event with operations that matched the schema, and they were
            reconciled into memories (a duplicate of a current memory is not stored twice). As
            an admin, the model calls recorded (no content):
            """
        )
    else:
        first = f" The first error: {errors[0]}." if errors else ""
        page.say(
            f"""
            Extraction did not succeed for every event (statuses
            {", ".join(sorted(statuses))}).{first} A failed attempt stores nothing: the event is
            retried after a backoff and, after max_attempts, marked failed with its error in
            last_error, where status shows it too. Sessions and reads are not affected. As an
            admin, the model calls recorded (no content; outcome is the HTTP call's, so an
            answer rejected as malformed still counts as ok):
            """
        )
    if endpoint is not None:
        page.run(
            admin,
            """
            SELECT purpose, outcome, count(*) AS calls
            FROM aidb_memory.model_calls GROUP BY purpose, outcome ORDER BY purpose, outcome;
            """,
        )

    page.heading("What an event produced: status")
    if event is not None:
        rows = page.run(app, status, json_result=True)
        answer = rows[0][0] if rows else None
        if isinstance(answer, dict):
            result = answer.get("result") or {}
            if answer.get("status") == "processed":
                added = result.get("added", 0)
                page.say(
                    f"""
                    Processed: {added} {"memory" if added == 1 else "memories"} added,
                    {result.get("updated", 0)} updated, {result.get("invalidated", 0)}
                    invalidated, {result.get("duplicates", 0)} duplicates not stored again;
                    result.memories holds the ids of the new ones.
                    """
                )
            elif answer.get("status") == "skipped":
                page.say(f"Skipped: {result.get('reason', 'extraction is not possible')}.")
            else:
                page.say(
                    f"""
                    {str(answer.get("status")).capitalize()} after {answer.get("attempts")}
                    attempts; last_error says why, and nothing of the attempts was stored.
                    """
                )
