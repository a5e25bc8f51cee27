"""The Prometheus alerting rules we ship (issue 36 item 4; docs/operations.md, "Monitoring"):
``promtool check rules`` accepts docs/monitoring/aidb_memory_rules.yml, ``promtool test rules``
passes tests/monitoring/aidb_memory_rules_test.yml (each alert fires on series shaped as the
worker exports them and stays silent on healthy ones), and docs/operations.md quotes the file as
it is, so that the documented rules cannot drift from the tested ones.

promtool comes with Debian's ``prometheus`` package, which scripts/bootstrap.sh installs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "docs" / "monitoring" / "aidb_memory_rules.yml"
RULES_TEST = REPO / "tests" / "monitoring" / "aidb_memory_rules_test.yml"
OPERATIONS = REPO / "docs" / "operations.md"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool, (
        "promtool is not installed: apt-get install -y prometheus (scripts/bootstrap.sh)"
    )
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, timeout=120, check=False, cwd=REPO
    )


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_check_rules_accepts_the_rules() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout, result.stdout


def test_promtool_test_rules_passes() -> None:
    result = _promtool("test", "rules", str(RULES_TEST))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


def test_promtool_test_rules_fails_when_an_alert_would_not_fire(tmp_path: Path) -> None:
    """The promtool tests can fail: the same cases on rules whose latency threshold is
    unreachable must not pass (a test file that expected nothing would)."""
    text = RULES.read_text(encoding="utf-8")
    broken = text.replace(
        "max by (kind) (aidb_memory_queue_latency_seconds) > 300", "vector(0) > 1"
    )
    assert broken != text
    rules = tmp_path / "docs" / "monitoring" / "aidb_memory_rules.yml"
    rules.parent.mkdir(parents=True)
    rules.write_text(broken, encoding="utf-8")
    cases = tmp_path / "tests" / "monitoring" / RULES_TEST.name
    cases.parent.mkdir(parents=True)
    cases.write_text(RULES_TEST.read_text(encoding="utf-8"), encoding="utf-8")
    result = _promtool("test", "rules", str(cases))
    assert result.returncode != 0, result.stdout
    assert "AidbMemoryQueueLatencyHigh" in result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_silent() -> None:
    """Each alert has a promtool case where it fires and one where it stays silent."""
    cases = yaml.safe_load(RULES_TEST.read_text(encoding="utf-8"))
    fires: set[str] = set()
    silent: set[str] = set()
    for test in cases["tests"]:
        for case in test.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else silent).add(case["alertname"])
    names = {alert["alert"] for alert in _alerts()}
    assert names, "no alerts in the rules file"
    assert names - fires == set(), "alerts never tested firing"
    assert names - silent == set(), "alerts never tested silent"


def test_every_alert_has_for_severity_and_annotations() -> None:
    for alert in _alerts():
        name = alert["alert"]
        assert alert.get("for"), f"{name}: no for:"
        assert alert["labels"]["severity"] in {"warning", "critical"}, name
        assert set(alert["annotations"]) == {"summary", "description", "runbook"}, name
        # The runbook hint is the heading of the alert in docs/operations.md (GitHub's anchor
        # of a one-word heading is the word in lower case).
        assert alert["annotations"]["runbook"] == f"docs/operations.md#{name.lower()}", name
        headings = re.findall(r"^#+ (\S+)$", OPERATIONS.read_text(encoding="utf-8"), re.M)
        assert name in headings, f"docs/operations.md has no heading {name}"


def test_operations_md_quotes_the_rules_file_as_it_is() -> None:
    text = OPERATIONS.read_text(encoding="utf-8")
    blocks = re.findall(r"^```yaml\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)
    rules = RULES.read_text(encoding="utf-8")
    assert rules in blocks, (
        "docs/operations.md must quote docs/monitoring/aidb_memory_rules.yml in a ```yaml block, "
        "unchanged"
    )
