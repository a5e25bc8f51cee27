"""Run-once migrations: discovery, linting and checksums (with pglast).

A migration's checksum is a hash of its statements as pglast deparses them, so reformatting
(whitespace, comments, keyword case) keeps the checksum while any change of meaning, a constant
included, changes it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pglast
from pglast.stream import RawStream

_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


class SqlSourceError(Exception):
    """A SQL file of the package is malformed or breaks a rule; the message names the file."""


@dataclass(frozen=True)
class Migration:
    """One numbered, run-once migration file."""

    name: str  # file name without .sql, e.g. 0001_namespaces
    path: Path
    statements: tuple[str, ...]
    checksum: str


def parse_statements(path: Path, text: str) -> list[tuple[Any, str]]:
    """Split ``text`` into (parse tree, statement text) pairs; a syntax error names the file."""
    try:
        tree = pglast.parse_sql(text)
    except pglast.parser.ParseError as e:
        raise SqlSourceError(f"{path.name}: SQL syntax error: {e}") from e
    out: list[tuple[Any, str]] = []
    for raw in tree:
        start = raw.stmt_location or 0
        # pglast reports character offsets (it converts libpg_query's byte offsets).
        length = raw.stmt_len or (len(text) - start)
        statement = text[start : start + length].strip()
        out.append((raw.stmt, statement))
    return out


def canonical_checksum(parsed: list[tuple[Any, str]]) -> str:
    """sha256 of the deparsed statements: stable under reformatting, not under edits."""
    canonical = ";\n".join(RawStream()(stmt) for stmt, _ in parsed)
    return hashlib.sha256(canonical.encode()).hexdigest()


# Replaceable objects belong in sql/, re-applied on every install.
_REPLACEABLE = {"CreateFunctionStmt": "FUNCTION", "ViewStmt": "VIEW"}


def _outside_transaction(stmt: Any) -> str | None:
    """What in ``stmt`` cannot run inside a transaction block, if anything."""
    kind = type(stmt).__name__
    if kind == "VacuumStmt" and stmt.is_vacuumcmd:
        return "VACUUM"
    concurrent = getattr(stmt, "concurrent", False)
    if kind in ("IndexStmt", "DropStmt", "RefreshMatViewStmt") and concurrent:
        return "CONCURRENTLY"
    if kind == "ReindexStmt" and any(p.defname == "concurrently" for p in stmt.params or ()):
        return "CONCURRENTLY"
    return {
        "CreatedbStmt": "CREATE DATABASE",
        "DropdbStmt": "DROP DATABASE",
        "AlterSystemStmt": "ALTER SYSTEM",
        "CreateTableSpaceStmt": "CREATE TABLESPACE",
        "DropTableSpaceStmt": "DROP TABLESPACE",
    }.get(kind)


def lint_migration(path: Path, parsed: list[tuple[Any, str]]) -> None:
    """A migration must not define replaceable objects (those belong in sql/) nor step outside
    the install's single transaction."""
    for stmt, _ in parsed:
        kind = type(stmt).__name__
        if kind in _REPLACEABLE and getattr(stmt, "replace", False):
            what = "PROCEDURE" if getattr(stmt, "is_procedure", False) else _REPLACEABLE[kind]
            raise SqlSourceError(
                f"{path.name}: a migration must not contain CREATE OR REPLACE {what}; "
                f"put {what.lower()}s in sql/ (re-applied on every install)"
            )
        if kind == "TransactionStmt":
            raise SqlSourceError(
                f"{path.name}: a migration must not control transactions; "
                "the whole install runs in one transaction"
            )
        outside = _outside_transaction(stmt)
        if outside:
            raise SqlSourceError(
                f"{path.name}: {outside} cannot run inside a transaction block, and the whole "
                "install runs in one transaction"
            )


def load_migrations(directory: Path) -> list[Migration]:
    """Every ``NNNN_name.sql`` in ``directory``, in order, linted and checksummed.

    Any other file there (except hidden files and a README) is refused rather than ignored: a
    misnamed migration must not silently stay unapplied."""
    migrations: list[Migration] = []
    seen: dict[str, str] = {}
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or path.name.upper().startswith("README"):
            continue
        match = _NAME.match(path.name)
        if not match or not path.is_file():
            raise SqlSourceError(
                f"{path.name}: migration files are named NNNN_lowercase_name.sql (in {directory})"
            )
        if match.group(1) in seen:
            raise SqlSourceError(
                f"{path.name}: number {match.group(1)} is also used by {seen[match.group(1)]}"
            )
        seen[match.group(1)] = path.name
        parsed = parse_statements(path, path.read_text(encoding="utf-8"))
        if not parsed:
            raise SqlSourceError(f"{path.name}: the migration has no statements")
        lint_migration(path, parsed)
        migrations.append(
            Migration(
                name=path.stem,
                path=path,
                statements=tuple(text for _, text in parsed),
                checksum=canonical_checksum(parsed),
            )
        )
    return migrations
