"""Backfills in batches, with progress (issue 36, item 6).

A migration's UPDATE marked ``-- backfill:`` (:func:`aidb_memory.install.migrations.
check_backfill`) is run by ``install`` as a series of statements, each on the next
``batch_rows`` rows of the table in primary-key order, so that it can report rows done of total
(counted from the table) between them. What each row gets is what the one statement gives it:
the mark says that the UPDATE reads no other row of its table, and the batches follow the key
from the lowest to the highest, each on the rows after the last batch's key, so that every row
is written once (a row's new version keeps its key). A table without a primary key, or an
UPDATE that sets a column of it, runs as the one statement.

Failure half-way leaves nothing half-done: the batches run in the install's single transaction
(installer.install), which a failure rolls back whole, the migration's schema_migrations row with
it; the next install runs the migration again from its first statement. ``aidb-memory sql``'s
script (psql) runs the same UPDATE as one statement, without progress, to the same result.

The batches read the table's rows in key order, not in the order the heap holds them: on a table
far larger than the server's memory that costs random reads a sequential scan would not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pglast
import psycopg
from pglast import ast
from pglast.enums import BoolExprType
from pglast.stream import RawStream

from aidb_memory.progress import Reporter

Connection = psycopg.Connection[tuple[Any, ...]]
# Rows per statement: a fraction of a second of work for the backfills of migrations/, so that
# progress moves between lines, and few enough statements for the overhead not to count.
BATCH_ROWS = 10_000

# The table's primary key columns, in the key's order, with their types (search_path is pinned
# to pg_catalog by the install script's first step).
_PRIMARY_KEY = """
SELECT a.attname::text, format_type(a.atttypid, a.atttypmod)
FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey::int2[])
WHERE i.indrelid = $1::regclass AND i.indisprimary
ORDER BY array_position(i.indkey::int2[], a.attnum)
"""


def _tree(statement: str) -> Any:
    """The parse tree of one statement (pglast's types say a node or None)."""
    (raw,) = pglast.parse_sql(statement)
    return raw.stmt


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class Backfill:
    """One marked UPDATE: its text, its parse tree and the table it writes."""

    statement: str
    tree: Any  # pglast.ast.UpdateStmt
    table: str  # schema-qualified and quoted, as the statement names it
    name: str  # the table's name, for progress lines
    ref: str  # how the statement refers to the table's columns (its alias, or its name)
    columns: tuple[str, ...]  # what it sets

    @classmethod
    def parse(cls, statement: str) -> Backfill:
        tree = _tree(statement)
        relation = tree.relation
        table = _ident(relation.relname)
        if relation.schemaname:
            table = f"{_ident(relation.schemaname)}.{table}"
        ref = relation.alias.aliasname if relation.alias else relation.relname
        columns = tuple(target.name for target in tree.targetList)
        return cls(statement, tree, table, relation.relname, ref, columns)

    def batch(self, key: Sequence[tuple[str, str]], lower: bool, upper: bool) -> str:
        """The UPDATE restricted to the keys after the first key of parameters (``lower``) and up
        to and including the next (``upper``), for a key of (column, type) pairs: parameters
        ``$1..$n`` are the lower bound's, or the upper's when there is no lower."""
        columns = ", ".join(f"{_ident(self.ref)}.{_ident(c)}" for c, _ in key)
        n = len(key) if lower else 0
        conditions = []
        if lower:
            params = ", ".join(f"${i + 1}::{t}" for i, (_, t) in enumerate(key))
            conditions.append(f"ROW({columns}) > ROW({params})")
        if upper:
            params = ", ".join(f"${n + i + 1}::{t}" for i, (_, t) in enumerate(key))
            conditions.append(f"ROW({columns}) <= ROW({params})")
        tree = _tree(self.statement)  # a copy to change
        if conditions:
            bound = _tree("SELECT WHERE " + " AND ".join(conditions)).whereClause
            if tree.whereClause is None:
                tree.whereClause = bound
            else:  # the statement's own condition, whole, AND each bound
                args: tuple[Any, ...] = (
                    tuple(bound.args or ()) if isinstance(bound, ast.BoolExpr) else (bound,)
                )
                tree.whereClause = ast.BoolExpr(
                    boolop=BoolExprType.AND_EXPR, args=(tree.whereClause, *args)
                )
        return str(RawStream()(tree))


def primary_key(conn: Connection, table: str) -> list[tuple[str, str]]:
    """(column, type) of ``table``'s primary key, empty if it has none."""
    cur = psycopg.RawCursor(conn)
    return [(str(c), str(t)) for c, t in cur.execute(_PRIMARY_KEY, (table,)).fetchall()]


def run(
    conn: Connection,
    statement: str,
    *,
    what: str,
    reporter: Reporter,
    batch_rows: int = BATCH_ROWS,
) -> None:
    """Run the marked UPDATE ``statement`` in batches of ``batch_rows`` rows of its table's
    primary key, reporting rows done of the table's rows on ``reporter`` as ``what``."""
    backfill = Backfill.parse(statement)
    key = primary_key(conn, backfill.table)
    names = [c for c, _ in key]
    if not key or set(names) & set(backfill.columns):
        conn.execute(statement.encode())  # no key to follow, or one that moves: as it is
        return
    cur = psycopg.RawCursor(conn)
    # Qualified: an ORDER BY of a bare name would sort by the output column (the key as text).
    order = ", ".join(f"k.{_ident(c)}" for c in names)
    as_text = ", ".join(f"k.{_ident(c)}::text" for c in names)
    row = ", ".join(f"${i + 1}::{t}" for i, (_, t) in enumerate(key))
    first_bound = (
        f"SELECT {as_text} FROM {backfill.table} AS k "
        f"ORDER BY {order} OFFSET {batch_rows - 1} LIMIT 1"
    )
    next_bound = (
        f"SELECT {as_text} FROM {backfill.table} AS k WHERE ROW({order}) > ROW({row}) "
        f"ORDER BY {order} OFFSET {batch_rows - 1} LIMIT 1"
    )
    total_row = cur.execute(f"SELECT pg_catalog.count(*) FROM {backfill.table}").fetchone()
    total = int(total_row[0]) if total_row else 0
    with reporter.task(f"{what}: {backfill.name}.{', '.join(backfill.columns)}", total) as task:
        lower: tuple[str, ...] | None = None
        done = 0
        while True:
            if lower is None:
                upper = cur.execute(first_bound).fetchone()
            else:
                upper = cur.execute(next_bound, lower).fetchone()
            # (lower, upper]: the next batch_rows rows of the key; no upper: the rest.
            params = (*(lower or ()), *(upper or ()))
            cur.execute(backfill.batch(key, lower is not None, upper is not None), params)
            if upper is None:
                task.update(max(done, total))
                return
            done += batch_rows
            task.update(done)
            lower = tuple(upper)
