"""``make demo`` / ``aidb-memory demo``: the walkthrough of SPEC §9 on a throwaway server.

It tells the help-desk story of the AIDB sessions page (``seeds/003``) as a person reads it, top
to bottom: each step says what happens, shows the SQL it runs (exactly as it runs) and prints the
result. No model is configured yet, so compaction is skipped and the demo says so.
"""

from __future__ import annotations

import datetime
import json
import textwrap
from collections.abc import Sequence
from typing import Any

import psycopg

from aidb_memory.installer import Package, install
from aidb_memory.throwaway import ThrowawayServer

Connection = psycopg.Connection[tuple[Any, ...]]
WIDTH = 100
INDENT = "   "
APP_ROLE = "helpdesk_app"

_step = 0
_after_heading = False


def _gap() -> None:
    """One blank line between the parts of a step (none right after its heading)."""
    global _after_heading
    if not _after_heading:
        print()
    _after_heading = False


# --- printing ----------------------------------------------------------------------------------


def _say(text: str) -> None:
    """Narration, wrapped."""
    _gap()
    for paragraph in textwrap.dedent(text).strip().split("\n\n"):
        print(textwrap.fill(" ".join(paragraph.split()), WIDTH))


def _heading(title: str) -> None:
    global _step, _after_heading
    _step += 1
    print(f"\n== {_step}. {title}")
    _after_heading = True


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "{" + ",".join(value) + "}"  # a text[], as psql shows it
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def pretty_json(value: Any, indent: str = "", width: int = WIDTH) -> list[str]:
    """JSON as lines no wider than ``width`` where possible: compact if it fits, else one
    element per line, recursively (a long string cannot be wrapped and stays whole)."""
    compact = json.dumps(value, ensure_ascii=False)
    if len(indent) + len(compact) <= width or not isinstance(value, (dict, list)) or not value:
        return [indent + compact]
    inner = indent + "  "
    items: list[list[str]] = []
    if isinstance(value, dict):
        for key, v in value.items():
            label = json.dumps(key, ensure_ascii=False) + ": "
            lines = pretty_json(v, inner, width - len(label))
            first = lines[0][len(inner) :]
            items.append([inner + label + first, *lines[1:]])
        opening, closing = "{", "}"
    else:
        items = [pretty_json(v, inner, width) for v in value]
        opening, closing = "[", "]"
    out = [indent + opening]
    for n, lines in enumerate(items):
        out += [*lines[:-1], lines[-1] + ("," if n < len(items) - 1 else "")]
    out.append(indent + closing)
    return out


def _table(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Rows as an aligned table; a table too wide for the page is shown one record at a time,
    with its JSON values pretty-printed."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(n)] + [len(r[i]) for r in cells]) for i, n in enumerate(names)]
    # Numbers align right, as psql prints them.
    numeric = [
        all(isinstance(r[i], int) and not isinstance(r[i], bool) for r in rows)
        for i in range(len(names))
    ]
    if len(INDENT) + sum(widths) + 3 * (len(widths) - 1) <= WIDTH:
        print(INDENT + " | ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip())
        print(INDENT + "-+-".join("-" * w for w in widths))
        for r in cells:
            line = " | ".join(
                c.rjust(w) if num else c.ljust(w)
                for c, w, num in zip(r, widths, numeric, strict=True)
            )
            print(INDENT + line.rstrip())
        print(f"{INDENT}({len(rows)} row{'' if len(rows) == 1 else 's'})")
        return
    label = max(len(n) for n in names)
    for number, row in enumerate(rows, 1):
        if len(rows) > 1:
            print(f"{INDENT}-[ row {number} ]")
        for name, value in zip(names, row, strict=True):
            head = f"{INDENT}{name.ljust(label)} | "
            if isinstance(value, (dict, list)) and value:
                lines = pretty_json(value, " " * len(head))
                print(head + lines[0].lstrip())
                print("\n".join(lines[1:]))
            else:
                print(head + _cell(value))


def _run(
    conn: Connection, query: str, *, json_result: bool = False
) -> list[tuple[Any, ...]] | None:
    """Show a statement, run it and show its result (or its error); returns the rows."""
    _gap()
    print(textwrap.indent(textwrap.dedent(query).strip(), INDENT + "  "))
    print()
    try:
        cur = conn.execute(textwrap.dedent(query).strip().encode())
    except psycopg.Error as e:
        diag = e.diag
        print(f"{INDENT}ERROR:  {diag.sqlstate}: {diag.message_primary}")
        if diag.message_hint:
            print(f"{INDENT}HINT:  {diag.message_hint}")
        return None
    if cur.description is None:
        print(INDENT + cur.statusmessage if cur.statusmessage else INDENT + "OK")
        return []
    names = [d.name for d in cur.description]
    rows = cur.fetchall()
    if json_result:
        print("\n".join(pretty_json(rows[0][0], INDENT)))
    else:
        _table(names, rows)
    return rows


# --- the story ---------------------------------------------------------------------------------

_SEED_ADD = """
    SELECT aidb_memory.add(
      namespace       => 'helpdesk_namespace',
      actor_id        => 'alice',
      turns           => '[
        {"role": "user", "content": "my discount was not applied",
         "kind": "user_prompt", "meta": {"sequence_id": "s-01"}},
        {"role": "assistant", "content": "let me check the renewal history",
         "kind": "model_response", "meta": {"sequence_id": "s-01"}}
      ]'::jsonb,
      session_id      => 'conv-738949',
      agent_id        => 'helpdesk-agent-64849',
      idempotency_key => 'conv-738949-turn-001'
    );
"""

_TURN_COUNT = """
    SELECT session_id, turn_count, total_chars
    FROM aidb_memory.session_list(namespace => 'helpdesk_namespace', actor_id => 'alice');
"""


def _setup(admin: Connection) -> None:
    _heading("A namespace for the help-desk agent (as an admin)")
    _say(
        """
        A namespace scopes everything agent memory stores. No model is configured in it: this
        version has none, so nothing is summarized or extracted. The low
        compaction_min_target_chars (default 200) lets this short conversation reach, later, the
        point where compaction would run.
        """
    )
    _run(
        admin,
        """
        SELECT aidb_memory.init(
          name   => 'helpdesk_namespace',
          config => '{"compaction_min_target_chars": 20}'
        ) AS namespace_id;
        """,
    )
    _say(
        f"""
        The application connects as its own login role, {APP_ROLE}, a member of aidb_users: it
        may call the session functions but read no table. Every step below runs as {APP_ROLE}.
        """
    )
    _run(admin, f"CREATE ROLE {APP_ROLE} LOGIN IN ROLE aidb_users;")


def _first_session(app: Connection) -> None:
    _heading("Alice writes in: session_start")
    _say(
        """
        The help desk opens a session for the conversation. session_start is idempotent (calling
        it again resumes the session); prev_handoff is NULL because alice has no earlier
        conversation with this agent.
        """
    )
    _run(
        app,
        """
        SELECT session_id, started_at, closed_at, prev_handoff
        FROM aidb_memory.session_start(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'alice',
          agent_id   => 'helpdesk-agent-64849',
          session_id => 'conv-738949'
        );
        """,
    )

    _heading("The first two turns: add, with an idempotency key")
    _say(
        """
        add stores a batch of turns, all or none, and returns the id of the event it records for
        long-term memory. meta.sequence_id groups the turns of one reasoning round.
        """
    )
    first = _run(app, _SEED_ADD)
    _heading("The same add again, as a client retries after a lost reply")
    second = _run(app, _SEED_ADD)
    same = bool(first and second and first[0][0] == second[0][0])
    _say(
        f"""
        {"The same event id" if same else "A DIFFERENT event id (this is a bug)"}: the key
        conv-738949-turn-001 was seen before, so the retry stored nothing. The session still has
        two turns:
        """
    )
    _run(app, _TURN_COUNT)

    _heading("The agent calls a tool")
    _say(
        """
        The model answers with a tool call (an assistant turn with tool_calls and no content,
        in OpenAI's format). The application stores it before running the tool.
        """
    )
    _run(
        app,
        """
        SELECT aidb_memory.add(
          namespace       => 'helpdesk_namespace',
          actor_id        => 'alice',
          turns           => '[
            {"role": "assistant", "content": null, "meta": {"sequence_id": "s-02"},
             "tool_calls": [{"id": "call_renewal_1", "type": "function",
                             "function": {"name": "lookup_renewal_history",
                                          "arguments": "{\\"account\\": \\"alice\\"}"}}]}
          ]'::jsonb,
          session_id      => 'conv-738949',
          idempotency_key => 'conv-738949-turn-002'
        );
        """,
    )
    _say(
        """
        Until its result is stored, the call is history that no model accepts, so a read leaves
        the unfinished round out and says why:
        """
    )
    _run(
        app,
        """
        SELECT jsonb_path_query_array(items, '$[*].seq') AS seqs, warnings
        FROM aidb_memory.session_get(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'alice',
          session_id => 'conv-738949'
        );
        """,
    )

    _heading("The tool result, the answer, and a thank-you")
    _say(
        """
        The tool result answers the call by its tool_call_id; the call, its result and the answer
        built on it share sequence_id s-02: one reasoning round, which reads keep whole.
        """
    )
    _run(
        app,
        """
        SELECT aidb_memory.add(
          namespace       => 'helpdesk_namespace',
          actor_id        => 'alice',
          turns           => '[
            {"role": "tool", "tool_call_id": "call_renewal_1", "meta": {"sequence_id": "s-02"},
             "content": "renewed 2025-03-01, plan pro, discount SAVE20 not applied"},
            {"role": "assistant", "meta": {"sequence_id": "s-02"},
             "content": "SAVE20 was dropped at your March renewal; I reapplied it."}
          ]'::jsonb,
          session_id      => 'conv-738949',
          idempotency_key => 'conv-738949-turn-003'
        );
        """,
    )
    _run(
        app,
        """
        SELECT aidb_memory.add(
          namespace       => 'helpdesk_namespace',
          actor_id        => 'alice',
          turns           => '[
            {"role": "user", "content": "great, thanks!", "meta": {"sequence_id": "s-03"}},
            {"role": "assistant", "content": "You are welcome.", "meta": {"sequence_id": "s-03"}}
          ]'::jsonb,
          session_id      => 'conv-738949',
          idempotency_key => 'conv-738949-turn-004'
        );
        """,
    )


def _reads(app: Connection) -> None:
    _heading("Reading the history back: session_get without a budget")
    _say(
        """
        Everything, in order. kind defaults from the role (tool_call for an assistant turn with
        tool calls, whose content is NULL).
        """
    )
    _run(
        app,
        """
        SELECT ord, item->>'role' AS role, item->>'kind' AS kind, item->>'content' AS content
        FROM aidb_memory.session_get(
               namespace  => 'helpdesk_namespace',
               actor_id   => 'alice',
               session_id => 'conv-738949'
             ) s,
             jsonb_array_elements(s.items) WITH ORDINALITY AS t(item, ord);
        """,
    )

    _heading("session_get with a small budget")
    _say(
        """
        limit_chars => 100 keeps the newest whole rounds that fit in 100 characters (content plus
        tool-call arguments). The tool round (seqs 3 to 5) does not fit whole, so it is left out
        with everything older: only the thank-you round remains. overflow_chars counts what was
        left out.
        """
    )
    _run(
        app,
        """
        SELECT jsonb_path_query_array(items, '$[*].seq') AS seqs,
               overflow_chars, compacted_entries, warnings
        FROM aidb_memory.session_get(
               namespace   => 'helpdesk_namespace',
               actor_id    => 'alice',
               session_id  => 'conv-738949',
               limit_chars => 100
             );
        """,
    )
    _say(
        """
        No model is configured (the namespace's model_spec has no llm and no fallback_model was
        passed), so compaction is skipped: the read returns the ordinary budgeted result, and
        warnings says why. Compaction comes with models: with one, the oldest three quarters of
        the history would become one summary at the start of items.
        """
    )

    _heading("The same history as an OpenAI messages array: session_messages")
    _say(
        """
        Ready for chat.completions.create: the tool call and its result in OpenAI's format.
        """
    )
    _run(
        app,
        """
        SELECT aidb_memory.session_messages(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'alice',
          session_id => 'conv-738949'
        );
        """,
        json_result=True,
    )


def _handoff(app: Connection) -> None:
    _heading("The conversation ends: session_end with notes (the handoff)")
    _say(
        """
        session_end closes the session and stores a handoff built from what is stored (no model
        call): the notes, the ids, the times, the turn count and the last user prompt.
        """
    )
    _run(
        app,
        """
        SELECT handoff, closed_at
        FROM aidb_memory.session_end(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'alice',
          session_id => 'conv-738949',
          notes      => 'discount reapplied'
        );
        """,
    )

    _heading("Alice writes again: the next session_start shows prev_handoff")
    _run(
        app,
        """
        SELECT session_id, prev_handoff
        FROM aidb_memory.session_start(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'alice',
          agent_id   => 'helpdesk-agent-64849',
          session_id => 'conv-738950'
        );
        """,
    )
    _say(
        """
        The agent starts from the handoff of alice's last closed session with this agent, without
        reading the old transcript.
        """
    )


def _undo(app: Connection) -> None:
    _heading("Walking back an exchange: session_pop")
    _say(
        """
        In the new conversation the agent promises a refund it cannot give. The application
        withdraws the exchange: session_pop removes and returns the newest turn; popping until a
        user turn comes back walks back the whole exchange.
        """
    )
    _run(
        app,
        """
        SELECT aidb_memory.add(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'alice',
          turns      => '[
            {"role": "user", "content": "is the discount on my next invoice?"},
            {"role": "assistant", "content": "Yes: SAVE20 is active again."},
            {"role": "user", "content": "can you refund the difference for March?"},
            {"role": "assistant", "content": "Done, I refunded it."}
          ]'::jsonb,
          session_id => 'conv-738950'
        );
        """,
    )
    pop = """
        SELECT item->'seq' AS seq, item->>'role' AS role, item->>'content' AS content
        FROM aidb_memory.session_pop(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'alice',
          session_id => 'conv-738950'
        ) AS item;
    """
    rows = _run(app, pop)
    while rows and rows[0][1] != "user":
        _say("Not a user turn yet; pop again:")
        rows = _run(app, pop)


def _listing(app: Connection, admin: Connection) -> None:
    _heading("Alice's sessions: session_list")
    _say("Index rows, never transcripts; the most recently active first.")
    _run(
        app,
        """
        SELECT session_id, agent_id, closed_at IS NOT NULL AS closed, turn_count, total_chars
        FROM aidb_memory.session_list(namespace => 'helpdesk_namespace', actor_id => 'alice');
        """,
    )

    _heading("What only admins see")
    _say(
        f"""
        {APP_ROLE} reads sessions through the session functions only; the sessions view is for
        admins:
        """
    )
    _run(app, "SELECT count(*) FROM aidb_memory.sessions;")
    _say(
        """
        An admin sees the event each add recorded for long-term memory: one per add, none for the
        retry. They are skipped because the namespace has no extraction model.
        """
    )
    _run(
        admin,
        """
        SELECT session_id, idempotency_key, status
        FROM aidb_memory.events ORDER BY event_id;
        """,
    )


def main() -> int:
    """Run the walkthrough; the server is removed however it ends."""
    global _step
    _step = 0
    print(
        "aidb_memory demo: the help-desk conversation, on a throwaway PostgreSQL server ...",
        flush=True,
    )
    with ThrowawayServer() as server:
        print(f"server ready on 127.0.0.1:{server.port} (removed when the demo ends)")
        with psycopg.connect(server.dsn(), autocommit=True) as postgres:
            postgres.execute("CREATE DATABASE demo")
        with psycopg.connect(server.dsn("demo")) as admin:
            _heading("Install aidb_memory into the database demo")
            said: list[str] = []
            install(admin, Package.load(), say=said.append)
            admin.autocommit = True
            migrations = sum(line.startswith("migration ") for line in said)
            _say(
                f"""
                What `aidb-memory install` does, in one transaction: {migrations} migrations
                applied, the server-side code stored, {said[-1]}.
                """
            )
            _run(admin, "SELECT aidb_memory.version();")
            _setup(admin)
            with psycopg.connect(server.dsn("demo", APP_ROLE), autocommit=True) as app:
                _first_session(app)
                _reads(app)
                _handoff(app)
                _undo(app)
                _listing(app, admin)
    print("\ndemo finished; the server is stopped and its files removed.")
    return 0
