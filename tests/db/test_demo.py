"""``make demo`` (SPEC §9): the walkthrough runs, tells its story and leaves nothing behind.

It runs as a user runs it, ``python -m aidb_memory demo`` in its own process, with its own
throwaway server (not the test run's).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess

import pytest

from aidb_memory.demo import pretty_json
from conftest import run_cli

UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


def _steps(output: str) -> dict[str, str]:
    """The demo's steps by title (``== N. title``), each with its text up to the next one."""
    parts = re.split(r"^== \d+\. (.*)$", output, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _step(steps: dict[str, str], word: str) -> str:
    matching = [text for title, text in steps.items() if word in title]
    assert len(matching) == 1, f"expected one step titled with {word!r}, got {list(steps)}"
    return matching[0]


@pytest.fixture(scope="module")
def demo() -> subprocess.CompletedProcess[str]:
    return run_cli("demo")


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
    assert re.search(r"conv-738950 \| helpdesk-agent-64849 \| false +\| +2 \|", listing)
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
