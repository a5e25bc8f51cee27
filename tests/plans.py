"""The plans of the statements an API call runs inside the server, by auto_explain (every nested
statement's plan, with its actual rows, sent to the client as a NOTICE)."""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg

# "m", as the statements name memory; "m_2" where a statement names it so more than once.
ALIAS = re.compile(r"m(_[0-9]+)?")


def nested_plans(
    conn: psycopg.Connection[Any], query: str, params: Any
) -> tuple[list[dict[str, Any]], list[tuple[Any, ...]]]:
    """Run ``query``; the analyzed plan of every statement it ran (nested ones too), and its
    rows. ``conn`` must be a superuser's (auto_explain is loaded into it)."""
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    for setting in (
        "LOAD 'auto_explain'",
        "SET auto_explain.log_min_duration = 0",
        "SET auto_explain.log_analyze = on",
        "SET auto_explain.log_nested_statements = on",
        "SET auto_explain.log_format = 'json'",
        "SET auto_explain.log_level = 'notice'",
    ):
        conn.execute(setting)
    rows = conn.execute(query, params).fetchall()
    plans = []
    for text in notices:
        _, sep, body = text.partition("plan:")
        if sep:
            plans.append(json.loads(body)["Plan"])
    return plans, rows


def memory_scans(conn: psycopg.Connection[Any], query: str, params: Any) -> list[dict[str, Any]]:
    """The scan nodes on aidb_memory.memory (alias m, or m_2... in a statement that names it m
    in several places) of every statement ``query`` runs, with the nodes beneath each (a bitmap
    heap scan's index scans) under "Plans"."""
    stack, scans = nested_plans(conn, query, params)[0], []
    while stack:
        node = stack.pop()
        stack.extend(node.get("Plans", ()))
        if node.get("Relation Name") == "memory" and ALIAS.fullmatch(node.get("Alias", "")):
            scans.append(node)
    return scans
