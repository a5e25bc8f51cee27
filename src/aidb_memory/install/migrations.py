"""Run-once migrations: discovery, linting and checksums (with pglast).

A migration's checksum is a hash of its statements as pglast deparses them, so reformatting
(whitespace, comments, keyword case) keeps the checksum while any change of meaning, a constant
included, changes it.

Migrations are immutable once released, with one exception that must be explicit and reviewed:
a file may declare, in header lines ``-- supersedes: <sha256>`` (before its first statement), the
checksums of earlier texts of itself that it replaces. A database that applied one of those texts
is not "edited after it was applied" and does not run the file again; fresh databases run the new
text. Only for a correction whose old and new texts leave every database in an equivalent state
(docs/architecture.md, "Migrations").

A statement may be marked as a backfill by a comment line ``-- backfill: <why it may>`` right
before it (comments leave the checksum alone): an UPDATE that ``install`` may run in batches of
the table's primary key, reporting rows done of total (:mod:`aidb_memory.install.backfill`). The
mark says that the UPDATE reads no other row of the table it writes, so that batches compute
what the one statement would; the lint checks what it can of that (an UPDATE, no WITH, no
RETURNING, the table named once).
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
_SUPERSEDES = re.compile(r"^--\s*supersedes:\s*(\S*)\s*$", re.IGNORECASE)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_BACKFILL = re.compile(r"^--\s*backfill\b", re.IGNORECASE)


class SqlSourceError(Exception):
    """A SQL file of the package is malformed or breaks a rule; the message names the file."""


@dataclass(frozen=True)
class Migration:
    """One numbered, run-once migration file."""

    name: str  # file name without .sql, e.g. 0001_namespaces
    path: Path
    statements: tuple[str, ...]
    checksum: str
    # Checksums of earlier texts of this file that a database may have applied instead.
    supersedes: tuple[str, ...] = ()
    # Indexes (in statements) of the UPDATEs marked ``-- backfill:``, which install may batch.
    backfills: tuple[int, ...] = ()

    @property
    def accepted(self) -> tuple[str, ...]:
        """Every checksum a database that applied this migration may have recorded."""
        return (self.checksum, *self.supersedes)


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


def superseded_checksums(path: Path, text: str) -> tuple[str, ...]:
    """The checksums declared by ``-- supersedes: <sha256>`` lines in the file's header (the
    comment lines and blank lines before the first statement). A malformed one, one in the body,
    or one naming the file's own checksum is refused rather than ignored."""
    found: list[str] = []
    in_header = True
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        match = _SUPERSEDES.match(stripped)
        if match:
            if not in_header:
                raise SqlSourceError(
                    f"{path.name}:{number}: a supersedes line belongs in the header, before the "
                    "first statement"
                )
            value = match.group(1).lower()
            if not _SHA256.match(value):
                raise SqlSourceError(
                    f"{path.name}:{number}: supersedes takes the 64 hex digits of a checksum "
                    f"(sha256), not {match.group(1)!r}"
                )
            if value in found:
                raise SqlSourceError(f"{path.name}:{number}: checksum {value} is superseded twice")
            found.append(value)
        elif stripped and not stripped.startswith("--"):
            in_header = False
    return tuple(found)


def backfill_statements(path: Path, text: str) -> tuple[int, ...]:
    """The indexes of the statements marked by a ``-- backfill:`` comment line between the
    previous statement and this one; each must be an UPDATE that batches cannot change
    (:func:`check_backfill`)."""
    try:
        tree = pglast.parse_sql(text)
    except pglast.parser.ParseError as e:
        raise SqlSourceError(f"{path.name}: SQL syntax error: {e}") from e
    marked: list[int] = []
    end = 0
    for index, raw in enumerate(tree):
        start = raw.stmt_location or 0
        gap = text[end:start]
        end = start + (raw.stmt_len or (len(text) - start))
        if any(_BACKFILL.match(line.strip()) for line in gap.splitlines()):
            check_backfill(path, raw.stmt)
            marked.append(index)
    return tuple(marked)


def _relations(node: Any) -> list[Any]:
    """Every RangeVar in a parse tree."""
    found: list[Any] = []
    if isinstance(node, tuple | list):
        for item in node:
            found += _relations(item)
    elif isinstance(node, pglast.ast.Node):
        if isinstance(node, pglast.ast.RangeVar):
            found.append(node)
        for name in node:
            found += _relations(getattr(node, name))
    return found


def check_backfill(path: Path, stmt: Any) -> None:
    """A statement marked ``-- backfill:`` is an UPDATE without WITH or RETURNING whose table
    appears nowhere else in it (no self-join, no subquery of it): run in batches of its primary
    key, it then writes what it would write in one statement."""
    if not isinstance(stmt, pglast.ast.UpdateStmt):
        raise SqlSourceError(
            f"{path.name}: a -- backfill: mark belongs right before an UPDATE, "
            f"not a {type(stmt).__name__}"
        )
    target: Any = stmt.relation
    returning = getattr(stmt, "returningClause", None) or getattr(stmt, "returningList", None)
    if stmt.withClause or returning:
        raise SqlSourceError(
            f"{path.name}: a backfill UPDATE of {target.relname} has no WITH and no "
            "RETURNING (install runs it in batches)"
        )
    others = [r for r in _relations(stmt) if r is not target and r.relname == target.relname]
    if others:
        raise SqlSourceError(
            f"{path.name}: a backfill UPDATE of {target.relname} reads that table again; "
            "batches would see each other's writes: drop the -- backfill: mark"
        )


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
        text = path.read_text(encoding="utf-8")
        parsed = parse_statements(path, text)
        if not parsed:
            raise SqlSourceError(f"{path.name}: the migration has no statements")
        lint_migration(path, parsed)
        checksum = canonical_checksum(parsed)
        supersedes = superseded_checksums(path, text)
        if checksum in supersedes:
            raise SqlSourceError(
                f"{path.name}: supersedes its own checksum {checksum}; name only earlier texts"
            )
        migrations.append(
            Migration(
                name=path.stem,
                path=path,
                statements=tuple(text for _, text in parsed),
                checksum=checksum,
                supersedes=supersedes,
                backfills=backfill_statements(path, text),
            )
        )
    return migrations
