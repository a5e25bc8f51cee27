"""``make demo`` (SPEC §9): the walkthrough runs, tells its story and leaves nothing behind.

It runs as a user runs it, ``python -m aidb_memory demo`` in its own process, with its own
throwaway server (not the test run's). Compaction uses the builtin extractive summarizer unless
``OPENAI_API_KEY`` / ``OPENAI_BASE_URL`` name an endpoint; here that endpoint is the fake
OpenAI-compatible server (tests/fake_openai.py), answering or failing. Without an endpoint,
extraction is verbatim (no model, no network: the user's turns are the memories); with one, the
fake answers the extraction requests (those with a ``response_format``) with operations, or with
malformed JSON. Either way a direct ``remember`` is found by ``search`` at once.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess

import pytest

from aidb_memory.demo import _ALICE_FACTS, _BOB, BUILTIN_LINE, VERBATIM_LINE, pretty_json
from conftest import run_cli
from fake_openai import FakeOpenAI, Reply, Request, serve

UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


def _steps(output: str) -> dict[str, str]:
    """The demo's steps by title (``== N. title``), each with its text up to the next one."""
    parts = re.split(r"^== \d+\. (.*)$", output, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _step(steps: dict[str, str], word: str) -> str:
    matching = [text for title, text in steps.items() if word in title]
    assert len(matching) == 1, f"expected one step titled with {word!r}, got {list(steps)}"
    return matching[0]


# Whatever the environment of the test run, the plain demo sees no endpoint (empty counts as unset).
NO_ENDPOINT = {"OPENAI_API_KEY": "", "OPENAI_BASE_URL": "", "OPENAI_MODEL": ""}
KEY = "sk-demo-never-printed-7f3a9c"
SUMMARY = (
    "Alice (pro plan, SAVE20) gets 8 seats and annual billing from April 1.\n"
    "Invoices INV-2025-0412 to 0414 were reissued to 14 Harbour Street."
)


# What the fake model extracts from an event, by a phrase of its new turns.
FACTS = {
    "14 Harbour Street": [
        "Alice's company gets its invoices at 14 Harbour Street, Leith, Edinburgh EH6 6JJ.",
        "Alice's company has 8 seats on the pro plan, billed annually from April 1.",
    ],
    "four bakeries": [
        "Alice prefers email to phone calls.",
        "Alice Co runs four bakeries in Edinburgh.",
    ],
    "Leith Ales": ["Bob works at Leith Ales."],
}


def is_extraction(request: Request) -> bool:
    return bool(request.body.get("response_format"))


def extract(request: Request) -> Reply:
    """A valid extraction answer: an add for each fact of FACTS that the new turns state."""
    sent = request.body["messages"][-1]["content"]
    turns = sent.split("New turns:", 1)[1]
    facts = [fact for phrase, found in FACTS.items() if phrase in turns for fact in found]
    operations = [{"op": "add", "target": None, "text": fact} for fact in facts]
    return Reply(content=json.dumps({"operations": operations}))


def answer(request: Request) -> Reply:
    """The fake model: operations for extraction, the summary for compaction."""
    return extract(request) if is_extraction(request) else Reply(content=SUMMARY)


def _table_rows(text: str) -> list[list[str]]:
    """The data rows of the first aligned table in ``text`` (the lines after its ``---+---``)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.fullmatch(r" +-+(\+-+)*", line))
    rows = []
    for line in lines[start + 1 :]:
        if not line.startswith("   ") or re.fullmatch(r" +\(\d+ rows?\)", line):
            break
        rows.append([cell.strip() for cell in line.split(" | ")])
    return rows


def _after(text: str, marker: str) -> str:
    assert marker in text, text
    return text.split(marker, 1)[1]


def _worked_counts(worker: str) -> list[str]:
    """process_events' processed, failed and retried, as the demo shows its CALL (one record:
    by_kind, its counts per kind, makes the row too wide for a table)."""
    shown = _after(worker, CALL)
    return [_field(shown, name) for name in ("processed", "failed", "retried")]


def _field(record: str, name: str) -> str:
    found = re.search(rf"^ +{name} +\| (\S+)", record, re.MULTILINE)
    assert found, record
    return found.group(1)


@pytest.fixture(scope="module")
def demo() -> subprocess.CompletedProcess[str]:
    return run_cli("demo", env=NO_ENDPOINT)


def run_demo_with(
    fake: FakeOpenAI, model: str = "demo-chat-model"
) -> subprocess.CompletedProcess[str]:
    """The demo with the fake server as its OpenAI-compatible endpoint, and a key."""
    env = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_MODEL": model, "OPENAI_API_KEY": KEY}
    return run_cli("demo", env=env)


def test_demo_runs_the_walkthrough(
    demo: subprocess.CompletedProcess[str],
) -> None:
    result = demo
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "ERROR" not in result.stderr
    steps = _steps(out)
    assert len(steps) >= 10, out

    # The seed's calls, as written.
    assert "'helpdesk_namespace'" in _step(steps, "namespace")
    start = _step(steps, "Alice writes in")
    assert "conv-738949" in start and "helpdesk-agent-64849" in start

    # add with an idempotency key, and its retry: the same event id, nothing more stored.
    first = UUID.findall(_step(steps, "idempotency key"))
    retry = _step(steps, "retries")
    assert len(first) == 1 and "conv-738949-turn-001" in retry
    assert UUID.findall(retry) == first
    assert re.search(r"conv-738949 \| +2 \|", retry), retry

    # A tool call round: the pending call is withheld, then the round is read whole.
    tool = _step(steps, "calls a tool")
    assert "lookup_renewal_history" in tool and "tool_results_pending" in tool
    unbudgeted = _step(steps, "without a budget")
    assert re.search(r"\| tool_call +\| NULL", unbudgeted), unbudgeted
    assert re.search(r"\| tool +\| tool_result +\|", unbudgeted), unbudgeted
    assert "(7 rows)" in unbudgeted

    # The small budget: whole rounds only, overflow counted, compaction skipped and why.
    budgeted = _step(steps, "small budget")
    assert re.search(r"\[6, 7\] \| +[1-9]\d* \| +0 \| \{compaction_model_unavailable\}", budgeted)
    assert "No model is configured" in budgeted and "compaction is skipped" in budgeted

    messages = _step(steps, "session_messages")
    assert '"tool_call_id": "call_renewal_1"' in messages
    assert '"name": "lookup_renewal_history"' in messages

    # The handoff, and the next session starting from it.
    assert '"notes": "discount reapplied"' in _step(steps, "session_end")
    nxt = _step(steps, "prev_handoff")
    assert "conv-738950" in nxt
    assert re.search(r'prev_handoff \| \{\n\s+"notes": "discount reapplied"', nxt), nxt

    # Undo walks back to the user turn, and the listing shows both sessions.
    pops = _step(steps, "session_pop")
    assert re.search(r"4 +\| assistant \|", pops) and re.search(r"3 +\| user +\|", pops)
    listing = _step(steps, "session_list")
    assert re.search(r"conv-738950 \| helpdesk-agent-64849 \| false +\| +22 \|", listing)
    assert re.search(r"conv-738949 \| helpdesk-agent-64849 \| true +\| +7 \|", listing)

    admins = _step(steps, "admins")
    assert "42501" in admins
    assert admins.count("conv-738949-turn-001") == 1
    assert out.rstrip().endswith("the server is stopped and its files removed.")


def test_demo_leaves_nothing_running(
    demo: subprocess.CompletedProcess[str],
) -> None:
    """The server the demo started (its port is printed) is gone: nothing listens there and no
    postgres process with that port survives. (Other test runs may start servers meanwhile, so
    this looks for the demo's own server rather than comparing process lists.)"""
    result = demo
    match = re.search(r"server ready on 127\.0\.0\.1:(\d+)", result.stdout)
    assert match, result.stdout
    port = int(match.group(1))
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    lingering = subprocess.run(
        ["pgrep", "-f", f"postgres -p {port} "], capture_output=True, text=True, check=False
    )
    assert not lingering.stdout.strip(), lingering.stdout


def _summary_fields(step: str) -> dict[str, str]:
    """The single-record result of the compacting read, ``name | value`` per line (a long value
    continues on lines of its own)."""
    fields: dict[str, str] = {}
    name = ""
    for line in step.splitlines():
        match = re.match(r"^   (\w+) +\| (.*)$", line)
        if match:
            name = match.group(1)
            fields[name] = match.group(2)
        elif name and line.startswith(" " * 10) and line.strip():
            fields[name] += "\n" + line.strip()
        else:
            name = ""
    return fields


def test_demo_without_an_endpoint_compacts_with_the_builtin_summarizer(
    demo: subprocess.CompletedProcess[str],
) -> None:
    out = demo.stdout
    assert demo.returncode == 0, out + demo.stderr
    steps = _steps(out)
    model = _step(steps, "A model for compaction")
    assert BUILTIN_LINE in model
    assert "provider => 'builtin'" in model and '"kind": "extractive"' in model
    assert '"llm": "helpdesk_llm"' in model
    assert "set_secret" not in out and "api.openai.com" not in out

    grown = _step(steps, "goes on")
    assert re.search(r"^   conv-738950 \| +22 \| +\d{4}$", grown, re.M), grown
    compacting = _step(steps, "over budget")
    fields = _summary_fields(compacting)
    assert fields["first_item"] == "summary"
    assert re.fullmatch(
        r'\{"model": "helpdesk_llm", "to_seq": (\d+), "from_seq": 1, "turn_count": \1\}',
        fields["first_meta"],
    ), fields
    covered = int(re.findall(r"\d+", fields["first_meta"])[0])
    assert 10 <= covered < 22
    assert int(fields["first_chars"]) <= int(fields["target_chars"]) == 400
    assert fields["compacted_entries"] == str(covered)
    assert fields["overflow_chars"] == "0" and fields["warnings"] == "{}"
    assert fields["first_content"].startswith(
        f"[Extractive summary of turns 1-{covered}, quoted by aidb_memory's builtin"
    )
    assert f"A summary was created: turns 1 to {covered} ({covered} turns)" in compacting
    assert re.search(r"helpdesk_llm \| compaction \| ok ", compacting), compacting

    again = _step(steps, "budgeted read again")
    assert re.search(r"compaction_calls\n +-+\n +1\n", again), again
    assert "Still 1 compaction call" in again


@pytest.fixture(scope="module")
def endpoint_demo() -> tuple[subprocess.CompletedProcess[str], str, list[Request]]:
    """The demo with the fake model answering: its result, the fake's base URL and requests."""
    with serve() as fake:
        fake.default = answer
        result = run_demo_with(fake)
        return result, fake.base_url, fake.calls()


def test_demo_with_an_endpoint_compacts_with_that_model(
    endpoint_demo: tuple[subprocess.CompletedProcess[str], str, list[Request]],
) -> None:
    result, base_url, requests = endpoint_demo
    calls = [c for c in requests if not is_extraction(c)]
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert KEY not in out + result.stderr
    assert BUILTIN_LINE not in out
    steps = _steps(out)
    assert "The server's Python imports openai" in _step(steps, "Install"), out

    model = _step(steps, "A model for compaction")
    said = " ".join(model.split())
    assert f"using the OpenAI-compatible endpoint {base_url} with the model demo-chat-model" in said
    assert "set_secret(name => 'helpdesk_openai_key', value => $1, endpoints => ARRAY[$2])" in model
    assert '"api_key_secret": "helpdesk_openai_key"' in model

    # The endpoint got the one compaction request, with OPENAI_MODEL and the stored key.
    assert '"extraction": true' in model
    (request,) = calls
    assert request.body["model"] == "demo-chat-model"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    sent = request.body["messages"][-1]["content"]
    assert "14 Harbour Street" in sent and "Have a good day" not in sent, "newest round kept"

    compacting = _step(steps, "over budget")
    fields = _summary_fields(compacting)
    assert fields["first_item"] == "summary"
    assert fields["first_content"] == SUMMARY
    assert fields["first_chars"] == str(len(SUMMARY)) and fields["warnings"] == "{}"
    assert "A summary was created" in compacting
    again = _step(steps, "budgeted read again")
    assert re.search(r"compaction_calls\n +-+\n +1\n", again), again
    assert out.rstrip().endswith("the server is stopped and its files removed.")


def test_demo_with_a_failing_endpoint_completes_and_says_why() -> None:
    with serve() as fake:
        fake.default = lambda req: Reply(status=500)
        result = run_demo_with(fake)
        calls = fake.calls()
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "Traceback" not in out + result.stderr
    assert KEY not in out + result.stderr
    assert calls and all(c.body["model"] == "demo-chat-model" for c in calls)
    steps = _steps(out)
    compacting = _step(steps, "over budget")
    fields = _summary_fields(compacting)
    assert fields["first_item"] != "summary"
    assert fields["warnings"] == "{compaction_call_failed}"
    assert fields["compacted_entries"] == "0" and int(fields["overflow_chars"]) > 0
    assert "No summary was written: warnings compaction_call_failed" in compacting
    assert re.search(r"outcome +\| error\n", compacting), compacting
    assert "HTTP 500" in compacting
    again = _step(steps, "budgeted read again")
    assert "{compaction_call_failed}" in again
    # The cool-down (compaction_cooldown_s): the failing model is not called again at once.
    assert re.search(r"compaction_calls\n +-+\n +1\n", again), again
    assert "Still 1 compaction call: after a failed call" in again
    # Extraction fails too: retried, then failed with the error shown.
    worker = _step(steps, "extraction worker")
    assert _worked_counts(worker) == ["0", "3", "3"]
    assert "HTTP 500" in _after(worker, WORKED)
    assert "(0 rows)" in _step(steps, "list_memories")
    # The rest of the story runs as before.
    assert "conv-738950 | helpdesk-agent-64849 | false" in _step(steps, "session_list")
    assert out.rstrip().endswith("the server is stopped and its files removed.")


def test_pretty_json_wraps_what_does_not_fit() -> None:
    value = {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f" * 40}}]}
    assert pretty_json(value, width=200) == [
        '{"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "'
        + "f" * 40
        + '"}}]}'
    ]
    lines = pretty_json(value, width=60)
    assert all(len(line) <= 60 for line in lines), lines
    assert lines[0] == "{" and lines[-1] == "}"
    assert json.loads("\n".join(lines)) == value


# --- long-term memory ----------------------------------------------------------------------------

WORKED = "FROM aidb_memory.events WHERE attempts > 0 ORDER BY event_id;"
CALL = "CALL aidb_memory.process_events(max_events => 50, max_attempts => 2, backoff_s => 0);"
AUDIT = "FROM aidb_memory.audit_log WHERE action = 'forget';"


def _forget_checks(forget: str, memories: int) -> None:
    """forget removed bob's session, turns, event and memories; the audit row has no content."""
    removed = _table_rows(forget)[0][0]
    assert json.loads(removed) == {
        "turns": 2,
        "events": 1,
        "memories": memories,
        "sessions": 1,
        "summaries": 0,
        "memory_history": memories,  # each memory's history: its add
    }, removed
    assert _table_rows(_after(forget, "AS sessions;")) == [["0", "0"]]
    audit = _after(forget, AUDIT)
    assert re.search(r"action +\| forget\n", audit), audit
    assert re.search(r"reason +\| erasure request #4711\n", audit), audit
    for content in ("bob", "Bob", "Leith", "invoice", "example.net"):
        assert content not in audit, audit


def _said(text: str) -> str:
    """Text with its line breaks and indentation as single spaces (wrapped output, read whole)."""
    return " ".join(text.split())


def _remember_checks(remember: str) -> None:
    """remember stored the fact (an id), search found it at once, and the same call again gave
    the same id."""
    ids = UUID.findall(remember)
    assert len(ids) == 2 and ids[0] == ids[1], remember
    assert "aidb_memory.remember(" in remember
    # Found first (the result is a table, or one record at a time when too wide for one).
    found = _after(remember, "query     => 'auditor'").split("aidb_memory.remember(")[0]
    assert "The auditor of Alice Co is Priya Shah." in found, found
    other = found.find("Our auditor")  # alice's own words, when extraction kept them
    assert other == -1 or found.index("The auditor of Alice Co") < other, found
    assert "The same id: an exact duplicate" in _said(remember)


def test_demo_without_an_endpoint_extracts_verbatim(
    demo: subprocess.CompletedProcess[str],
) -> None:
    out = demo.stdout
    assert demo.returncode == 0, out + demo.stderr
    steps = _steps(out)
    # Extraction is off while the first conversations run, then on (the default mode, auto).
    assert '"extraction": false' in _step(steps, "namespace for the help-desk agent")
    model = _step(steps, "A model for compaction")
    assert '"extraction": true' in model and "cannot extract facts" in model

    told = _step(steps, "lasting facts")
    assert '"status": "accepted"' in told and '"attempts": 0' in told

    worker = _step(steps, "extraction worker")
    said = _said(worker)
    assert VERBATIM_LINE in said
    assert "extraction is verbatim" in said and "No model is called" in said
    assert "CREATE ROLE helpdesk_worker LOGIN IN ROLE aidb_workers" in worker
    assert _worked_counts(worker) == ["3", "0", "0"]
    events = _table_rows(_after(worker, WORKED))
    assert [(r[0], r[2], r[3], r[4]) for r in events] == [
        ("alice", "processed", "1", "NULL"),
        ("alice", "processed", "1", "NULL"),
        ("bob", "processed", "1", "NULL"),
    ], events
    # No model was asked: the demo had no network to ask.
    assert re.search(r"extraction_calls\n +-+\n +0\n", worker), worker

    status = _step(steps, "What an event produced")
    assert '"status": "processed"' in status
    assert "Processed: 1 memory added" in _said(status)

    # alice's memories are what she said, as she said it (her user turn; not the assistant's).
    listed = _said(_step(steps, "list_memories"))
    assert _said(_ALICE_FACTS[0][1]) in listed
    assert "the small talk too" in listed
    assert _said(_ALICE_FACTS[1][1]) not in listed and "Bob" not in listed

    search = _step(steps, "search:")
    for query in ("email", "bakerys"):
        found = _after(search, f"query     => '{query}'")
        assert "Alice Co runs four bakeries" in _said(found.split("aidb_memory.search(")[0])
    assert "The misspelling still finds the fact" in search

    _remember_checks(_step(steps, "remember"))
    _forget_checks(_step(steps, "forget"), memories=1)
    assert _said(_BOB[0][1]) not in _said(_step(steps, "forget"))
    # The events that remain: alice's only, none accepted or failed.
    admins = _step(steps, "admins")
    assert "| bob " not in admins and "accepted" not in admins and "failed" not in admins
    assert "Traceback" not in out + demo.stderr


def test_demo_with_an_endpoint_extracts_and_searches(
    endpoint_demo: tuple[subprocess.CompletedProcess[str], str, list[Request]],
) -> None:
    result, _base_url, requests = endpoint_demo
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert KEY not in out + result.stderr
    assert VERBATIM_LINE not in out
    steps = _steps(out)

    # One extraction request per event (alice's two, bob's one), with structured output.
    extraction = [r for r in requests if is_extraction(r)]
    assert len(extraction) == 3
    for request in extraction:
        assert request.body["model"] == "demo-chat-model"
        assert request.headers["authorization"] == f"Bearer {KEY}"
        assert request.body["response_format"]["type"] == "json_schema"

    worker = _step(steps, "extraction worker")
    assert _worked_counts(worker) == ["3", "0", "0"]
    events = _table_rows(_after(worker, WORKED))
    assert [(r[0], r[2], r[3], r[4]) for r in events] == [
        ("alice", "processed", "1", "NULL"),
        ("alice", "processed", "1", "NULL"),
        ("bob", "processed", "1", "NULL"),
    ], events
    assert re.search(r"extraction +\| ok +\| +3\n", worker), worker

    status = _step(steps, "What an event produced")
    assert '"status": "processed"' in status and '"added": 2' in status
    assert "Processed: 2 memories added" in " ".join(status.split())

    listed = [row[0] for row in _table_rows(_step(steps, "list_memories"))]
    assert sorted(listed) == sorted(FACTS["14 Harbour Street"] + FACTS["four bakeries"])

    search = _step(steps, "search:")
    exact = _table_rows(_after(search, "query     => 'email'"))
    assert exact[0][0] == "Alice prefers email to phone calls.", exact
    misspelled = _table_rows(_after(search, "query     => 'bakerys'"))
    assert misspelled[0][0] == "Alice Co runs four bakeries in Edinburgh.", misspelled
    assert "The misspelling still finds the fact" in search

    _remember_checks(_step(steps, "remember"))
    _forget_checks(_step(steps, "forget"), memories=1)
    assert out.rstrip().endswith("the server is stopped and its files removed.")


def test_demo_with_malformed_extraction_answers_completes_and_shows_the_error() -> None:
    def malformed(request: Request) -> Reply:
        if is_extraction(request):
            return Reply(content='{"operations": [')
        return Reply(content=SUMMARY)

    with serve() as fake:
        fake.default = malformed
        result = run_demo_with(fake)
        requests = fake.calls()
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "Traceback" not in out + result.stderr
    assert KEY not in out + result.stderr
    # Each of the three events: an attempt, its retry, then failed.
    assert sum(is_extraction(r) for r in requests) == 6
    steps = _steps(out)
    assert "A summary was created" in _step(steps, "over budget")

    worker = _step(steps, "extraction worker")
    assert _worked_counts(worker) == ["0", "3", "3"]
    events = _after(worker, WORKED)
    assert len(re.findall(r"\| failed\b", events)) == 3, events
    said = " ".join(worker.split())
    assert "malformed answer: extraction answer is not valid JSON" in said
    assert "retried after a backoff" in said

    status = _step(steps, "What an event produced")
    assert '"status": "failed"' in status and '"attempts": 2' in status
    assert '"last_error": "malformed answer: extraction answer is not valid JSON' in status
    assert "(0 rows)" in _step(steps, "list_memories")
    search = " ".join(_step(steps, "search:").split())
    assert "no memories to search (the extraction calls did not succeed" in search
    _remember_checks(_step(steps, "remember"))
    _forget_checks(_step(steps, "forget"), memories=0)
    assert out.rstrip().endswith("the server is stopped and its files removed.")
