"""The full bench run's JSON (bench/report.py) keeps the format of bench/results/latest.json: the
result's keys in order, the comparisons (a) to (e) that the row modules define and (h), the info
ratios, and the keys of every entry. On made-up timings: no database, no peer."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import report
from measuring import Measured

sys.path.pop(0)

BENCH = Path(__file__).resolve().parents[2] / "bench"

# Every path of the full run's table: rows (a) to (d2) (sessions.py), then (e) (search.py).
PATHS = (
    *("a_add", "a_ref", "b_get", "b_ref", "c_get", "c_ref"),
    *("d_peer", "d_ours", "d_session", "d_ours_sync"),
    *("e_search", "e_ref", "e_ref_custom"),
)


def measured(name: str, us: int) -> Measured:
    """A path that took ``us`` µs an operation, 10 operations in each of 2 rounds."""
    path = Measured(name, f"what {name} does", "a client")
    path.latencies_ns = [us * 1000] * 20
    path.wall_s = 20 * us / 1e6
    path.per_round = [1e6 / us, 1e6 / us]
    return path


def full_run(capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    args = argparse.Namespace(
        rounds=2, slice=0.3, burst=10, warmup=0.2, big_turns=2000, memories=200_000
    )
    query = {
        "query": "red Volvo",
        "ours_mean_ms": 2.0,
        "reference_mean_ms": 1.0,
        "reference_custom_plan_mean_ms": 1.0,
        "reference_rows": 3,
        "ours_best": "The user drives a red Volvo",
    }
    search = {"data": {"of_actor": 100, "total": 1000, "seconds": 1.0}, "queries": [query]}
    concurrent = {
        "clients": 8,
        "measured": 0.8,
        "by_round": [0.8, 0.8],
        "median_of_rounds": 0.8,
        "target": ">= 0.7",
        "result": "PASS",
    }
    result = report.report(
        args,
        {name: measured(name, 100 + 10 * n) for n, name in enumerate(PATHS)},
        {"small": {}, "big": {}},
        search,
        concurrent,
        "15.0",
        dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        (0.5, 0.5, 0.5),
        (0.6, 0.6, 0.6),
    )
    return result, capsys.readouterr().out


def test_the_full_run_json_has_the_format_of_the_stored_results(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result, out = full_run(capsys)
    stored = json.loads((BENCH / "results" / "latest.json").read_text())
    # run.py adds the other rows' entries after these, in the stored order.
    assert list(result) == list(stored)[: len(result)]
    assert [c["id"] for c in result["comparisons"]] == [c["id"] for c in stored["comparisons"]]
    assert [c["id"] for c in result["comparisons"]] == ["a", "b", "c", "d", "d2", "e", "h"]
    for ours, theirs in zip(result["comparisons"], stored["comparisons"], strict=True):
        assert list(ours) == list(theirs)
        assert (ours["ratio"], ours["metric"], ours["target"]) == (
            theirs["ratio"],
            theirs["metric"],
            theirs["target"],
        )
    assert [(i["ratio"], list(i)) for i in result["info"]] == [
        (i["ratio"], list(i)) for i in stored["info"]
    ]
    assert list(result["paths"]) == list(stored["paths"])
    assert all(list(p) == list(stored["paths"]["a_add"]) for p in result["paths"].values())
    for key in ("machine", "versions", "settings"):
        assert list(result[key]) == list(stored[key]), key
    # The table names each comparison, and (e)'s per-query table follows it.
    assert "(a) add of a 2-turn exchange" in out and "d_session/d_peer (throughput)" in out
    assert "(e) per query" in out and "red Volvo" in out


def test_the_report_names_a_path_with_a_slow_spell() -> None:
    steady = Measured("b_get", "session_get", "psycopg", per_round=[2300.0, 2250.0, 2400.0, 2350.0])
    spell = Measured("c_get", "session_get", "psycopg", per_round=[140.0, 135.0, 2300.0, 2400.0])
    assert report.spells({"b_get": steady}).startswith("Every path's rounds within 25%")
    text = report.spells({"b_get": steady, "c_get": spell})
    assert "c_get: rounds 135..2400 ops/s" in text and "b_get" not in text
    assert "two modes" in text
