"""A step of the install script, and how its SQL is written: string literals and DO blocks.

The script (``script``) and the trust checks it runs (``trust``) are both made of these; keeping
them here lets ``script`` import ``trust`` without ``trust`` importing ``script`` back.
"""

from __future__ import annotations

from dataclasses import dataclass

from aidb_memory.install.migrations import Migration

SCHEMA = "aidb_memory"


@dataclass(frozen=True)
class Step:
    """One statement of the script, with what it is for (shown on failure)."""

    what: str
    sql: str
    # A migration's step: install may run its statements one by one instead (its backfills in
    # batches, with progress); the script runs ``sql``, to the same result.
    migration: Migration | None = None


def literal(text: str) -> str:
    """A SQL string literal (standard_conforming_strings is on for the script)."""
    return "'" + text.replace("'", "''") + "'"


def dollar_quote(body: str) -> str:
    """``body`` between dollar quotes whose tag it does not contain."""
    n = 0
    while f"$aidb{n}$" in body:
        n += 1
    tag = f"$aidb{n}$"
    return f"{tag}\n{body}\n{tag}"


def do_block(body: str, declare: str = "") -> str:
    """An anonymous PL/pgSQL block."""
    decl = f"DECLARE\n{declare}\n" if declare else ""
    block = decl + "BEGIN\n" + body + "\nEND"
    return f"DO {dollar_quote(block)}"
