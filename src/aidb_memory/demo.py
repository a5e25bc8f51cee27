"""``make demo`` / ``aidb-memory demo``: the walkthrough of SPEC §9 on a throwaway server.

It tells the help-desk story of the AIDB sessions page (``seeds/003``) as a person reads it, top
to bottom: each step says what happens, shows the SQL it runs (exactly as it runs) and prints the
result. The namespace starts without a model, so the first budgeted read skips compaction and says
why; later an admin gives it one and a long conversation is compacted. That model is the
OpenAI-compatible endpoint of ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` / ``OPENAI_MODEL`` when
either of the first two is set (the key goes into the database with ``set_secret`` and is never
printed), else the builtin extractive summarizer, which is not a model, and the demo says so.

Long-term memory follows (extraction is off until then, so the earlier conversations stay out of
it): alice and bob mention lasting facts, a worker role runs the extraction worker
(``process_events``) once, and the demo shows the events' statuses, ``status``,
``list_memories``, ``search`` (an exact word and a misspelled one), a direct ``remember`` that
``search`` finds at once, and ``forget`` with its audit row. With the builtin summarizer, which
is not a language model, extraction is verbatim (``extraction_mode`` ``auto``, the default): the
worker stores what the user said, as said, with no model and no network, and the demo says so
(``VERBATIM_LINE``). With an endpoint the model extracts the facts; when it fails or answers
malformed JSON, the events are retried and failed, and the demo shows their ``last_error`` and
goes on.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from aidb_memory.connection import CliError, first_line
from aidb_memory.install.installer import Package, install
from aidb_memory.ops.deps import SERVER_MODULE, default_target, make_readable, pip_command
from aidb_memory.ops.doctor import probe_server_python
from aidb_memory.throwaway import ThrowawayServer

Connection = psycopg.Connection[tuple[Any, ...]]
WIDTH = 100
INDENT = "   "
APP_ROLE = "helpdesk_app"
MODEL = "helpdesk_llm"
SECRET = "helpdesk_openai_key"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"
BUDGET = 1600  # limit_chars of the reads that compact; a summary may use a quarter of it
BUILTIN_LINE = (
    "no OPENAI_API_KEY/OPENAI_BASE_URL: using the builtin extractive summarizer (not a model)"
)

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
            print((INDENT + line).rstrip())
        print(f"{INDENT}({len(rows)} row{'' if len(rows) == 1 else 's'})")
        return
    label = max(len(n) for n in names)
    for number, row in enumerate(rows, 1):
        if len(rows) > 1:
            print(f"{INDENT}-[ row {number} ]")
        for name, value in zip(names, row, strict=True):
            head = f"{INDENT}{name.ljust(label)} | "
            text_array = isinstance(value, list) and all(isinstance(v, str) for v in value)
            if isinstance(value, (dict, list)) and value and not text_array:
                lines = pretty_json(value, " " * len(head))
                print(head + lines[0].lstrip())
                if lines[1:]:
                    print("\n".join(lines[1:]))
            elif isinstance(value, str) and len(head) + len(value) > WIDTH:
                print(head + f"\n{' ' * len(head)}".join(_wrap(value, WIDTH - len(head))))
            else:
                print(head + _cell(value))


def _wrap(text: str, width: int) -> list[str]:
    """Long text as lines of at most ``width`` (its own line breaks kept)."""
    out: list[str] = []
    for line in text.splitlines() or [""]:
        out += textwrap.wrap(line, max(20, width), break_on_hyphens=False) or [""]
    return out


def _run(
    conn: Connection,
    query: str,
    params: Sequence[Any] | None = None,
    *,
    json_result: bool = False,
) -> list[tuple[Any, ...]] | None:
    """Show a statement, run it and show its result (or its error); returns the rows.

    A statement with ``params`` names them ``$1``, ``$2``... as the server sees them, and the
    narration says what they are: their values are never shown (a key is one of them)."""
    _gap()
    text = textwrap.dedent(query).strip()
    print(textwrap.indent(text, INDENT + "  "))
    print()
    try:
        if params is None:
            cur = conn.execute(text.encode())
        else:
            for n in range(len(params), 0, -1):
                text = text.replace(f"${n}", "%s")
            cur = conn.execute(text, params)
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
        A namespace scopes everything agent memory stores. It starts without a model, so nothing
        is summarized yet; later in the story an admin gives it one. The low
        compaction_min_target_chars (default 200) lets this short conversation reach, soon, the
        point where compaction would run. Long-term memory comes later in the story too:
        extraction is off until then, so these first conversations stay out of it.
        """
    )
    _run(
        admin,
        """
        SELECT aidb_memory.init(
          name   => 'helpdesk_namespace',
          config => '{"compaction_min_target_chars": 20, "extraction": false}'
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
        warnings says why. Compaction comes with a model: with one, the oldest three quarters of
        the history become one summary at the start of items, as a later step shows.
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


# --- compaction --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """The OpenAI-compatible endpoint the demo's environment names."""

    base_url: str
    model: str
    api_key: str | None  # never printed

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Endpoint | None:
        """The endpoint of ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL`` (``OPENAI_MODEL``), or None
        when neither is set (an empty value counts as unset)."""
        key = env.get("OPENAI_API_KEY", "").strip() or None
        base_url = env.get("OPENAI_BASE_URL", "").strip()
        if key is None and not base_url:
            return None
        model = env.get("OPENAI_MODEL", "").strip() or DEFAULT_OPENAI_MODEL
        return cls(base_url or DEFAULT_BASE_URL, model, key)


def _sql_json(value: dict[str, Any], indent: int) -> str:
    """A JSON object as a SQL string literal, one key per line (continuation lines indented by
    ``indent`` spaces)."""
    members = [json.dumps({k: v})[1:-1] for k, v in value.items()]
    text = "{" + (",\n" + " " * (indent + 2)).join(members) + "}"
    return "'" + text.replace("'", "''") + "'"


def _server_packages(admin: Connection, server: ThrowawayServer) -> str:
    """Make ``openai`` importable by the server's Python, as ``aidb-memory deps`` does (into the
    throwaway server's directory, unless a ``deps`` directory already exists on this host).
    Returns a sentence saying how it went; never raises."""
    try:
        info = probe_server_python(admin, SERVER_MODULE)
        if "module_version" in info:
            return f"{SERVER_MODULE} {info['module_version']} already imports in the server."
        version = ".".join(str(info.get("python", "")).split(".")[:2])
        directory = default_target(version)
        where = f"{directory}, where `aidb-memory deps` installed it"
        if not (directory / SERVER_MODULE / "__init__.py").is_file():
            directory = server.workdir / "site-packages"
            where = f"{directory}, removed with the server"
            print(
                f"{INDENT}(installing {SERVER_MODULE} for the server's Python {version}; "
                "this takes a little while)",
                flush=True,
            )
            env = {**os.environ, "PIP_ROOT_USER_ACTION": "ignore"}
            pip = subprocess.run(
                pip_command(None, version, directory),
                capture_output=True,
                text=True,
                env=env,
                check=False,
                timeout=900,
            )
            if pip.returncode != 0:
                lines = [ln for ln in pip.stderr.splitlines() if ln.strip()]
                reason = lines[-1].strip() if lines else f"exit {pip.returncode}"
                return f"pip could not install {SERVER_MODULE} for the server: {reason}."
            make_readable(directory)
        with admin.transaction():
            admin.execute(
                "INSERT INTO aidb_memory.runtime_settings (key, value) "
                "VALUES ('server_pythonpath', %s) "
                "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                (str(directory),),
            )
            info = probe_server_python(admin, SERVER_MODULE)
            if "module_version" not in info:
                raise CliError(str(info.get("module_error") or "it does not import"))
        return f"The server's Python imports {SERVER_MODULE} {info['module_version']} from {where}."
    except (psycopg.Error, CliError, OSError, subprocess.SubprocessError) as e:
        return f"{SERVER_MODULE} does not import in the server ({first_line(e)})."


def _model(admin: Connection, endpoint: Endpoint | None) -> None:
    _heading("A model for compaction (as an admin)")
    if endpoint is None:
        _say(
            f"""
            {BUILTIN_LINE}. It quotes whole sentences of the turns (the first goal, the latest
            state, decisions, numbers, names): deterministic and offline, and its output says what
            it is. Set OPENAI_API_KEY, or OPENAI_BASE_URL for another OpenAI-compatible endpoint
            (and OPENAI_MODEL), to see a model summarize instead.
            """
        )
        _run(
            admin,
            f"""
            SELECT aidb_memory.create_model(
              name     => '{MODEL}',
              provider => 'builtin',
              options  => '{{"kind": "extractive"}}'
            ) AS model_id;
            """,
        )
    else:
        _say(
            f"""
            {"OPENAI_API_KEY" if endpoint.api_key else "OPENAI_BASE_URL"} is set: using the
            OpenAI-compatible endpoint {endpoint.base_url} with the model {endpoint.model}
            (OPENAI_MODEL). Models are registered by admins only, so a caller can never make the
            server contact a URL of its choosing.
            """
        )
        options: dict[str, Any] = {"model": endpoint.model, "base_url": endpoint.base_url}
        if endpoint.api_key:
            _say(
                """
                The key goes into the database with set_secret, where no API role can read it
                and no message shows it; $1 is the value of OPENAI_API_KEY (not shown), and $2
                the endpoint above: the only one the key may ever be sent to:
                """
            )
            _run(
                admin,
                f"SELECT aidb_memory.set_secret(name => '{SECRET}', value => $1, "
                "endpoints => ARRAY[$2]);",
                (endpoint.api_key, endpoint.base_url),
            )
            options["api_key_secret"] = SECRET
        options |= {"timeout_s": 30, "max_retries": 1}
        # Built line by line: the options literal spans lines of its own indentation.
        create = (
            "SELECT aidb_memory.create_model(\n"
            f"  name     => '{MODEL}',\n"
            "  provider => 'openai',\n"
            f"  options  => {_sql_json(options, len('  options  => '))}\n"
            ") AS model_id;"
        )
        _run(admin, create)
    if endpoint is None:
        later = """
            The builtin summarizer is not a language model, though: it cannot extract facts, so
            with extraction_mode auto (the default) the worker stores what the user says, as
            said, with no model at all, as a later step shows.
            """
    else:
        later = "Extraction into long-term memory uses it too; a later step runs the worker."
    _say(
        """
        The namespace's model_spec names it as its llm, the model that compaction uses. config
        turns extraction on (its default): from now on each add's event is accepted for the
        extraction worker.
        """
        + " ".join(later.split())
    )
    _run(
        admin,
        f"""
        SELECT name, model_spec, config
        FROM aidb_memory.namespace_update(
          name       => 'helpdesk_namespace',
          model_spec => '{{"llm": "{MODEL}"}}',
          config     => '{{"extraction": true}}'
        );
        """,
    )


# The rest of alice's second conversation: long enough that a read with BUDGET chars compacts.
_MORE = [
    (
        "One more thing: we are growing. Can you add three seats to our pro plan, starting with "
        "the next billing cycle?",
        "Sure. Your pro plan has 5 seats at $25 each; from the renewal on April 1 it will have 8 "
        "seats, so the monthly total goes from $125 to $200 before the SAVE20 discount.",
    ),
    (
        "With SAVE20 that makes what, exactly? Finance needs the number for their forecast.",
        "SAVE20 takes 20% off: 8 seats at $25 is $200, minus $40, so $160 a month. I added a "
        "note with that figure to the account for your finance team.",
    ),
    (
        "Good. Also, our company moved: invoices should go to 14 Harbour Street, Leith, "
        "Edinburgh EH6 6JJ.",
        "I updated the billing address to 14 Harbour Street, Leith, Edinburgh EH6 6JJ. Invoices "
        "from April 1 on show it; past invoices keep the old address.",
    ),
    (
        "Can past invoices be reissued with the new address? Our auditor, Priya Shah, asked for "
        "that.",
        "Yes, I can reissue the invoices for January to March. They get new numbers "
        "(INV-2025-0412 to INV-2025-0414) and the originals are marked as replaced. Shall I?",
    ),
    (
        "Yes please, go ahead with all three.",
        "Done: INV-2025-0412, INV-2025-0413 and INV-2025-0414 are reissued with the new address "
        "and emailed to billing@alice-co.example. The originals are marked as replaced.",
    ),
    (
        "We also need our VAT number on every invoice: GB 123 4567 89.",
        "I added VAT number GB 123 4567 89 to the account. It appears on every invoice from now "
        "on, including the three I just reissued, which I regenerated.",
    ),
    (
        "Can we pay annually instead of monthly? Priya says it is easier for the audit.",
        "Yes: annual billing charges 10 months for 12, so $1,600 a year for 8 seats after "
        "SAVE20. You can switch at the April 1 renewal; I cannot switch mid-cycle.",
    ),
    (
        "Let's do that: switch us to annual billing at the April renewal.",
        "Scheduled: from April 1 your plan bills annually, $1,600 for 8 seats with SAVE20. "
        "You get a confirmation email today and a reminder a week before.",
    ),
    (
        "Last question: can I export all our invoices as a CSV for Priya?",
        "Yes: Billing > Invoices > Export gives a CSV of every invoice with its number, date, "
        "amount, VAT and status. I also emailed you the export for 2024 and 2025.",
    ),
    (
        "Perfect, that is everything. Thanks for sorting all of this out!",
        "My pleasure, Alice: 8 seats and annual billing from April 1, the new address and VAT "
        "number on every invoice, three invoices reissued. Have a good day!",
    ),
]

_BUDGETED = f"""
    SELECT items->0->>'kind' AS first_item, items->0->'meta' AS first_meta,
           length(items->0->>'content') AS first_chars, {BUDGET} / 4 AS target_chars,
           jsonb_path_query_array(items, '$[*].seq') AS seqs,
           compacted_entries, overflow_chars, warnings, items->0->>'content' AS first_content
    FROM aidb_memory.session_get(
           namespace   => 'helpdesk_namespace',
           actor_id    => 'alice',
           session_id  => 'conv-738950',
           limit_chars => {BUDGET}
         );
"""

_CALLS = """
    SELECT model_name, purpose, outcome, latency_ms, chars_in, chars_out, error
    FROM aidb_memory.model_calls ORDER BY id;
"""

_COMPACTION_CALLS = """
    SELECT count(*) AS compaction_calls
    FROM aidb_memory.model_calls WHERE purpose = 'compaction';
"""

# What each warning of a budgeted read means, for the narration.
_WARNINGS = {
    "compaction_call_failed": (
        "the model call failed (now, or less than compaction_cooldown_s ago: then no call was"
        " made); model_calls below has the error"
    ),
    "compaction_summary_overlength": (
        "the model's summary was still longer than the target after one retry"
    ),
    "compaction_model_unavailable": "the namespace's model is not registered",
    "compaction_budget_too_small": "a quarter of the budget is too small for a summary",
    "compaction_busy": "another read was compacting this session",
}


def _compaction(app: Connection, admin: Connection) -> None:
    _heading("The conversation goes on, past the agent's budget")
    _say(
        """
        Alice stays in conv-738950 with more requests. The application stores the exchange
        with one add; $1 is these turns as a jsonb array:
        """
    )
    turns = _show_turns([(r, t) for q, a in _MORE for r, t in (("user", q), ("assistant", a))])
    _run(
        app,
        """
        SELECT aidb_memory.add(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'alice',
          turns      => $1,
          session_id => 'conv-738950'
        );
        """,
        (Jsonb(turns),),
    )
    _run(
        app,
        """
        SELECT session_id, turn_count, total_chars
        FROM aidb_memory.session_list(namespace => 'helpdesk_namespace', actor_id => 'alice')
        WHERE session_id = 'conv-738950';
        """,
    )
    _say(
        f"""
        The agent reads its history with limit_chars => {BUDGET}, less than the session holds.
        """
    )

    _heading("session_get over budget: compaction")
    _say(
        f"""
        This read finds the turns over its budget and compacts once: the oldest three quarters
        of the turns not yet summarized, cut at a round boundary, become one summary of at most
        a quarter of limit_chars ({BUDGET // 4} chars), written by {MODEL}. The summary comes
        first in items (kind summary, role system, no seq; meta says what it covers), then the
        newest rounds that fit.
        """
    )
    rows = _run(app, _BUDGETED)
    summarized = False
    if rows:
        kind, meta, chars, target, _seqs, compacted, overflow, warnings, _text = rows[0]
        if kind == "summary" and isinstance(meta, dict):
            summarized = not warnings
            _say(
                f"""
                A summary was created: turns {meta.get("from_seq")} to {meta.get("to_seq")}
                ({meta.get("turn_count")} turns) in {chars} chars, within the target of {target};
                compacted_entries {compacted} (the turns it stands for), overflow_chars
                {overflow}, warnings {_cell(warnings)}.
                """
            )
        else:
            codes = ", ".join(warnings or []) or "none"
            why = "; ".join(_WARNINGS.get(w, w) for w in warnings or [])
            _say(
                f"""
                No summary was written: warnings {codes}{f": {why}" if why else ""}. The read is
                answered all the same, with the newest whole rounds that fit (overflow_chars
                {overflow} left out), as without a model: compaction never fails a read.
                """
            )
    _say("As an admin, the model call as recorded (no content, never a key):")
    _run(admin, _CALLS)

    _heading("The same budgeted read again")
    _run(
        app,
        f"""
        SELECT items->0->>'kind' AS first_item, items->0->'meta' AS first_meta,
               compacted_entries, overflow_chars, warnings
        FROM aidb_memory.session_get(
               namespace   => 'helpdesk_namespace',
               actor_id    => 'alice',
               session_id  => 'conv-738950',
               limit_chars => {BUDGET}
             );
        """,
    )
    calls = _run(admin, _COMPACTION_CALLS)
    count = calls[0][0] if calls else "?"
    if summarized:
        _say(
            f"""
            Still {count} compaction call: the summary and the newest turns fit the budget
            together, so the read returns the stored summary and calls no model. The turns it
            stands for are still stored, unchanged; an unbudgeted read returns them all.
            """
        )
    else:
        _say(
            f"""
            Still {count} compaction call: after a failed call, this session's reads do not
            call that model again for compaction_cooldown_s (60 s by default); they answer at
            once with compaction_call_failed and the newest rounds that fit. The first
            over-budget read after the cool-down tries again.
            """
        )


# --- long-term memory --------------------------------------------------------------------------

VERBATIM_LINE = (
    "verbatim: no OPENAI_API_KEY/OPENAI_BASE_URL — no language model, so the worker stores what "
    "the user said, as said"
)
WORKER_ROLE = "helpdesk_worker"

_ALICE_FACTS = [
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
_BOB = [
    (
        "user",
        "Hi, this is Bob from Leith Ales. Please send our February invoice to my own address, "
        "bob.m@example.net, not the company one.",
    ),
    ("assistant", "Sent: a copy of the February invoice went to bob.m@example.net."),
]


def _show_turns(turns: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    """Print turns as a person reads them; returns them as add takes them."""
    _gap()
    for role, text in turns:
        lines = textwrap.wrap(text, WIDTH - len(INDENT) - 11)
        print(f"{INDENT}{role:10} {lines[0]}")
        for line in lines[1:]:
            print(f"{INDENT}{'':10} {line}")
    return [{"role": role, "content": text} for role, text in turns]


_WORKED = """
    SELECT actor_id, session_id, status, attempts, last_error
    FROM aidb_memory.events WHERE attempts > 0 ORDER BY event_id;
"""

_REMEMBER = """
    SELECT aidb_memory.remember(
      namespace => 'helpdesk_namespace',
      actor_id  => 'alice',
      content   => 'The auditor of Alice Co is Priya Shah.',
      agent_id  => 'helpdesk-agent-64849'
    ) AS memory_id;
"""

_SEARCH = """
    SELECT content, round(score::numeric, 2) AS score
    FROM aidb_memory.search(
      namespace => 'helpdesk_namespace',
      actor_id  => 'alice',
      query     => '{query}',
      "limit"   => 3
    );
"""


def _long_term_memory(
    app: Connection, admin: Connection, server: ThrowawayServer, endpoint: Endpoint | None
) -> None:
    _heading("Long-term memory: alice and bob mention lasting facts")
    _say(
        """
        Sessions remember a conversation; long-term memories remember the person across all of
        them. A week later alice writes in again (add creates the session conv-738951), with
        facts worth keeping; and another customer, bob, writes in too.
        """
    )
    _say("alice's turns, $1 below:")
    rows = _run(
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
        (Jsonb(_show_turns(_ALICE_FACTS)),),
    )
    event = str(rows[0][0]) if rows else None
    _say("bob's turns, $1 below:")
    _run(
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
        (Jsonb(_show_turns(_BOB)),),
    )
    _say(
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
        _run(app, status, json_result=True)

    _heading("The extraction worker: process_events (as a worker)")
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
    _say(
        f"""
        The worker is the procedure process_events, for members of aidb_workers; `aidb-memory
        worker` runs it in a loop, pg_cron can run it too. Here it runs once, as its own login
        role {WORKER_ROLE}. It claims each accepted event with a lease. {" ".join(how.split())}
        max_attempts => 2 and backoff_s => 0 let a failing event be retried at once and marked
        failed within the demo (the defaults are 5 attempts and a 10 s backoff, doubling).
        """
    )
    _run(admin, f"CREATE ROLE {WORKER_ROLE} LOGIN IN ROLE aidb_workers;")
    with psycopg.connect(server.dsn("demo", WORKER_ROLE), autocommit=True) as worker:
        _run(
            worker,
            "CALL aidb_memory.process_events(max_events => 50, max_attempts => 2, backoff_s => 0);",
        )
        _say("The events it worked, as the worker sees them:")
        worked = _run(worker, _WORKED) or []
    statuses = {row[2] for row in worked}
    if statuses == {"processed"}:
        nothing = "the model found no fact worth keeping" if endpoint else "no turn had text"
    elif endpoint is None:
        nothing = "the worker did not process the events, see its step"
    else:
        nothing = "the extraction calls did not succeed, see the worker's step"
    errors = [row[4] for row in worked if row[4]]
    if endpoint is None and statuses == {"processed"}:
        _say(VERBATIM_LINE + ".")
        _say(
            """
            The builtin extractive summarizer quotes sentences but is not a language model, so
            with extraction_mode auto (the default) the worker kept what alice and bob said, as
            they said it, rather than facts a model would word; search below finds them all the
            same. extraction_mode verbatim_all keeps the assistant's turns too; model insists on
            a model. Set OPENAI_API_KEY or OPENAI_BASE_URL to see a model extract facts instead.
            As an admin, the extraction calls made to a model:
            """
        )
        _run(
            admin,
            """
            SELECT count(*) AS extraction_calls
            FROM aidb_memory.model_calls WHERE purpose = 'extraction';
            """,
        )
    elif endpoint is None:
        first = f" The first error: {errors[0]}." if errors else ""
        _say(
            f"""
            Not every event was processed (statuses {", ".join(sorted(statuses))}).{first}
            """
        )
    elif statuses == {"processed"}:
        _say(
            f"""
            {MODEL} answered every event with operations that matched the schema, and they were
            reconciled into memories (a duplicate of a current memory is not stored twice). As
            an admin, the model calls recorded (no content):
            """
        )
    else:
        first = f" The first error: {errors[0]}." if errors else ""
        _say(
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
        _run(
            admin,
            """
            SELECT purpose, outcome, count(*) AS calls
            FROM aidb_memory.model_calls GROUP BY purpose, outcome ORDER BY purpose, outcome;
            """,
        )

    _heading("What an event produced: status")
    if event is not None:
        rows = _run(app, status, json_result=True)
        answer = rows[0][0] if rows else None
        if isinstance(answer, dict):
            result = answer.get("result") or {}
            if answer.get("status") == "processed":
                added = result.get("added", 0)
                _say(
                    f"""
                    Processed: {added} {"memory" if added == 1 else "memories"} added,
                    {result.get("updated", 0)} updated, {result.get("invalidated", 0)}
                    invalidated, {result.get("duplicates", 0)} duplicates not stored again;
                    result.memories holds the ids of the new ones.
                    """
                )
            elif answer.get("status") == "skipped":
                _say(f"Skipped: {result.get('reason', 'extraction is not possible')}.")
            else:
                _say(
                    f"""
                    {str(answer.get("status")).capitalize()} after {answer.get("attempts")}
                    attempts; last_error says why, and nothing of the attempts was stored.
                    """
                )

    _heading("Alice's memories: list_memories")
    memories = _run(
        app,
        """
        SELECT content, session_id
        FROM aidb_memory.list_memories(namespace => 'helpdesk_namespace', actor_id => 'alice');
        """,
    )
    if memories and endpoint is None:
        _say(
            """
            The current memories, newest first: every user turn since extraction was turned on,
            as alice wrote it, the small talk too. Verbatim extraction keeps what was said, not
            what matters; a model would pick and word the facts, and merge a changed fact with
            the old one.
            """
        )
    elif memories:
        _say(
            """
            The current memories, newest first. A memory that a later fact supersedes keeps its
            row (valid_to, superseded_by) and leaves this list; include_superseded => true shows
            it, and memory_history keeps every change with the event that caused it.
            """
        )
    else:
        _say(f"None: {nothing}. The worker writes memories, and remember (below).")

    _heading("search: an exact word and a misspelled one")
    if not memories:
        _say(f"skipped: alice has no memories to search ({nothing}).")
    else:
        _say(
            """
            search ranks alice's current memories by BM25 over their stemmed words (rare words
            weigh more), a misspelled word standing for the words nearest it, and, with an
            embedding model, vectors. An exact word first:
            """
        )
        _run(app, _SEARCH.format(query="email"))
        _say(
            """
            Then a misspelled one: bakerys is no word of any memory, but its trigrams are close
            to those of bakeries.
            """
        )
        found = _run(app, _SEARCH.format(query="bakerys"))
        if found:
            _say("The misspelling still finds the fact, through its trigrams.")
        else:
            _say("Nothing found: the model worded the facts without a word close to bakerys.")

    _heading("A fact stored at once: remember")
    _say(
        """
        The worker makes memories of conversations, later. remember stores one fact now, in the
        caller's transaction, with no model and no worker, and returns the memory's id. The
        help-desk agent notes who alice's auditor is:
        """
    )
    stored = _run(app, _REMEMBER)
    _say("search finds it at once, by its words:")
    _run(app, _SEARCH.format(query="auditor"))
    _say("The same call again, as a client retries after a lost reply:")
    again = _run(app, _REMEMBER)
    same = bool(stored and again and stored[0][0] == again[0][0])
    _say(
        f"""
        {"The same id" if same else "A DIFFERENT id (this is a bug)"}: an exact duplicate of a
        current memory of the actor is not stored twice.
        """
    )

    _heading("Erasure: forget")
    _say(
        """
        bob asks the help desk to erase what it knows of him. forget removes every trace of an
        actor in the namespace (sessions, turns, summaries, handoffs, events, memories and
        their history, idempotency keys) and returns the counts:
        """
    )
    _run(
        app,
        """
        SELECT aidb_memory.forget(
          namespace => 'helpdesk_namespace',
          actor_id  => 'bob',
          reason    => 'erasure request #4711'
        ) AS removed;
        """,
    )
    _run(
        app,
        """
        SELECT (SELECT count(*) FROM aidb_memory.list_memories(
                  namespace => 'helpdesk_namespace', actor_id => 'bob')) AS memories,
               (SELECT count(*) FROM aidb_memory.session_list(
                  namespace => 'helpdesk_namespace', actor_id => 'bob')) AS sessions;
        """,
    )
    _say(
        """
        One audit row remains, readable by superusers: who, when, what, the counts and the
        reason, with an HMAC of namespace and actor instead of bob's id, and no content:
        """
    )
    _run(
        admin,
        """
        SELECT by_role, action, namespace, counts, reason, left(subject_hash, 16) AS subject_hash
        FROM aidb_memory.audit_log WHERE action = 'forget';
        """,
    )


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
        retry. Those of the adds made while extraction was off are skipped; the later ones went
        through the worker above. bob's are gone with everything else of his.
        """
    )
    _run(
        admin,
        """
        SELECT actor_id, session_id, idempotency_key, status, attempts
        FROM aidb_memory.events ORDER BY event_id;
        """,
    )


def main() -> int:
    """Run the walkthrough; the server is removed however it ends."""
    global _step
    _step = 0
    endpoint = Endpoint.from_env(os.environ)
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
            if endpoint is not None:
                _say(
                    f"""
                    A model endpoint is configured, so the server's Python needs the
                    {SERVER_MODULE} package, which `aidb-memory deps` installs:
                    """
                )
                _say(_server_packages(admin, server))
            _setup(admin)
            with psycopg.connect(server.dsn("demo", APP_ROLE), autocommit=True) as app:
                _first_session(app)
                _reads(app)
                _handoff(app)
                _undo(app)
                _model(admin, endpoint)
                _compaction(app, admin)
                _long_term_memory(app, admin, server, endpoint)
                _listing(app, admin)
    print("\ndemo finished; the server is stopped and its files removed.")
    return 0
