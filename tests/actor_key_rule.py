"""The single-key rule of issue 15 (item 3), checked over the server's SQL with pglast.

Every statement on a per-actor table must touch the rows of one actor only, by the distribution
key: every occurrence of a per-actor table in a SELECT, UPDATE or DELETE (subqueries, CTEs and
joins included) has its ``actor_key`` constrained by the statement's quals (WHERE, JOIN ... ON,
USING, ``x IN (SELECT ...)``):

* ``alias.actor_key = <parameter, constant or expression of them>`` (a PL/pgSQL variable, a
  function's result row, NEW/OLD, or the ``actor_key`` of a trigger's transition table count as
  such), or
* ``alias.actor_key = other.actor_key`` where ``other``'s is itself constrained (a chain), also
  through the output columns of subqueries and CTEs (``x.actor_key IN (SELECT c.actor_key ...)``).

Only top-level AND conjuncts count; an outer join's ON constrains its nullable side only; a
subquery's WHERE constrains the subquery's own tables, never the outer ones. A range
(``actor_key BETWEEN $1 AND $2``, or ``>=`` with ``<``) counts only where ``allow_range`` is
given: the queue claim by key range. INSERTs into a per-actor table list ``actor_key`` among
their columns and name it in an ON CONFLICT target; an INSERT ... SELECT's source obeys the rule
like any query. A statement whose text holds the SQL comment ``-- spans actors: <reason>`` is
exempt (admin code only: tests/unit/test_single_key_static.py keeps such statements out of the
hot calls).

:func:`check_statement` checks one parsed statement; :func:`collect` finds every statement of the
server code: string constants of ``plpython/aidb_memory_server/*.py`` (module-level names and
f-strings resolved) and the bodies of ``sql/*.sql`` (SQL and PL/pgSQL functions, trigger
functions included, and views), each with its file, line and owner, plus the call graph that
tells which of them the hot API functions reach.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pglast
from pglast import ast as pg
from pglast.enums import A_Expr_Kind, BoolExprType, JoinType, SetOperation, SubLinkType

from aidb_memory.install.codebundle import expand_fragments, sql_fragments

SCHEMA = "aidb_memory"
KEY = "actor_key"
PER_ACTOR_TABLES = frozenset(
    {
        "session",
        "turn",
        "summary",
        "event",
        "memory",
        "memory_word",
        "memory_lexeme",
        "memory_history",
        "actor_lock",
        "compaction_lock",
        "compaction_failure",
        "compaction_ahead",
    }
)
SPANS = re.compile(r"--\s*spans actors:\s*(?P<reason>.*)")
# The hot API functions of issue 15 (item 3): no statement they reach may span actors.
HOT_FUNCTIONS = (
    "add",
    "session_get",
    "session_messages",
    "session_start",
    "session_end",
    "session_pop",
    "session_list",
    "session_delete",
    "search",
    "list_memories",
    "remember",
    "delete",
    "forget",
    "status",
)
# Set-returning functions: their rows are many values, never one key.
_SRFS = frozenset(
    {
        "unnest",
        "generate_series",
        "jsonb_array_elements",
        "jsonb_array_elements_text",
        "json_array_elements",
        "jsonb_each",
        "jsonb_each_text",
        "jsonb_to_recordset",
        "jsonb_populate_recordset",
        "regexp_split_to_table",
        "string_to_table",
        "tsvector_to_array",
    }
)


@dataclass(frozen=True)
class Violation:
    """One occurrence of a per-actor table that the rule does not hold for."""

    table: str
    alias: str
    missing: str

    def __str__(self) -> str:
        name = self.table if self.alias == self.table else f"{self.table} AS {self.alias}"
        return f"{name}: {self.missing}"


# --- the checker -------------------------------------------------------------------------------

_ANCHOR = ("<anchor>", "")  # a key node that is constrained by itself (parameter, constant)
_Key = tuple[Any, str]


@dataclass(eq=False)
class _Item:
    """One range item (FROM entry, DML target) of a query block."""

    kind: str  # table | view | cte | subquery | function | transition | other
    name: str
    alias: str
    per_actor: bool = False
    outputs: dict[str, set[_Key] | None] = field(default_factory=dict)
    ordered: list[set[_Key] | None] = field(default_factory=list)  # outputs by position
    stars: list[_Item] = field(default_factory=list)  # `*` / `x.*` targets: their sources
    source: _Item | None = None  # a CTE reference: the CTE's definition
    anchored_columns: frozenset[str] | None = None  # None: none; else these (or all: "*")
    deps_all: set[_Key] | None = None  # a function item: what its arguments depend on

    def __repr__(self) -> str:
        return f"<{self.kind} {self.name} AS {self.alias}>"


@dataclass(eq=False)
class _Block:
    parent: _Block | None
    items: list[_Item] = field(default_factory=list)
    ctes: dict[str, _Item] = field(default_factory=dict)

    def cte(self, name: str) -> _Item | None:
        block: _Block | None = self
        while block is not None:
            if name in block.ctes:
                return block.ctes[name]
            block = block.parent
        return None


class _Checker:
    def __init__(
        self,
        *,
        trigger: bool,
        variables: frozenset[str],
        allow_range: bool,
        views: frozenset[str],
    ) -> None:
        self.trigger = trigger
        self.variables = variables
        self.allow_range = allow_range
        self.views = views
        self.edges: list[tuple[frozenset[_Key], _Key]] = []
        self.occurrences: list[_Item] = []
        self.violations: list[Violation] = []
        self.checked: dict[int, _Item] = {}
        self.resolved: set[_Key] = set()

    # - the graph -
    def edge(self, deps: Iterable[_Key] | None, target: _Key) -> None:
        if deps is not None:
            self.edges.append((frozenset(deps), target))

    def anchored(self) -> set[_Key]:
        done: set[_Key] = {_ANCHOR}
        changed = True
        while changed:
            changed = False
            for deps, target in self.edges:
                if target not in done and deps <= done:
                    done.add(target)
                    changed = True
        return done

    def run(self, stmt: Any) -> list[Violation]:
        self.statement(stmt, None)
        done = self.anchored()
        for item in self.occurrences:
            if (item, KEY) not in done:
                what = " (a view over per-actor tables)" if item.kind == "view" else ""
                self.violations.append(
                    Violation(
                        item.name,
                        item.alias,
                        f"{item.alias}.{KEY} is not constrained{what}: no "
                        f"`{item.alias}.{KEY} = <key>`, nor an equality with a constrained "
                        f"{KEY}, in its WHERE/ON/USING/IN",
                    )
                )
        return self.violations

    # - columns -
    def column(self, item: _Item, name: str) -> _Key:
        """The node of ``item.name``, with the edges that feed it (once)."""
        key = (item, name)
        if key in self.resolved:
            return key
        self.resolved.add(key)
        if item.kind == "transition" and name == KEY:
            self.edge((), key)
        elif item.anchored_columns is not None and (
            "*" in item.anchored_columns or name in item.anchored_columns
        ):
            self.edge(item.deps_all or (), key)
        elif item.source is not None:
            self.edge((self.column(item.source, name),), key)
        elif name in item.outputs:
            self.edge(item.outputs[name], key)
        else:
            for star in item.stars:
                self.edge((self.column(star, name),), key)
        return key

    def has_column(self, item: _Item, name: str) -> bool | None:
        """Whether ``item`` has the column: True, False, or None (cannot tell)."""
        target = item.source or item
        if target.kind in ("subquery", "cte") and not target.stars:
            return name in target.outputs
        if target.kind == "function" and target.outputs:
            return name in target.outputs
        return None

    def resolve(self, ref: pg.ColumnRef, block: _Block) -> _Key | None:
        """The node a column reference names; _ANCHOR for a variable; None if unknown."""
        fields = [f.sval if isinstance(f, pg.String) else "*" for f in ref.fields]
        if "*" in fields:
            return None
        if len(fields) == 1:
            (name,) = fields
            if name in self.variables and name != KEY:
                return _ANCHOR  # PL/pgSQL: a variable (a name both would be an error)
            scope: _Block | None = block
            while scope is not None:
                if scope.items:
                    found = self._unqualified(scope.items, name)
                    if found is not None:
                        return self.column(found, name)
                scope = scope.parent
            return None
        qualifier, name = fields[-2], fields[-1]
        scope = block
        while scope is not None:
            for item in reversed(scope.items):
                if item.alias == qualifier:
                    return self.column(item, name)
            scope = scope.parent
        if qualifier in self.variables or (self.trigger and qualifier in ("new", "old")):
            return _ANCHOR  # a PL/pgSQL record: NEW, OLD, a row variable
        return None

    def _unqualified(self, items: list[_Item], name: str) -> _Item | None:
        if len(items) == 1:
            return items[0]
        known = [i for i in items if self.has_column(i, name)]
        if len(known) == 1:
            return known[0]
        unknown = [i for i in items if self.has_column(i, name) is None]
        if not known and len(unknown) == 1:
            return unknown[0]
        tables = [i for i in unknown if i.per_actor]
        if not known and len(tables) == 1:
            return tables[0]
        return None

    def deps(self, expr: Any, block: _Block) -> set[_Key] | None:
        """What ``expr`` depends on: the column nodes it reads (empty: a parameter or
        constant); None when it cannot be one key (a set, a subquery of many rows)."""
        if expr is None:
            return set()
        if isinstance(expr, pg.ColumnRef):
            key = self.resolve(expr, block)
            if key is None:
                return None
            return set() if key == _ANCHOR else {key}
        if isinstance(expr, pg.SubLink):
            inner = self.sublink(expr, block)
            if expr.subLinkType == SubLinkType.EXPR_SUBLINK and inner.ordered:
                return inner.ordered[0]
            return None
        if isinstance(expr, pg.A_Expr) and expr.kind != A_Expr_Kind.AEXPR_OP:
            return None  # = ANY (array), IN (list), BETWEEN: many values
        if isinstance(expr, pg.FuncCall) and _funcname(expr) in _SRFS:
            return None
        found: set[_Key] = set()
        for child in _children(expr):
            sub = self.deps(child, block)
            if sub is None:
                return None
            found |= sub
        return found

    # - statements -
    def statement(self, stmt: Any, parent: _Block | None) -> _Item:
        """Check a statement (the top level, a CTE, a subquery); its outputs as an item."""
        if isinstance(stmt, pg.SelectStmt):
            return self.select(stmt, parent)
        if isinstance(stmt, pg.InsertStmt | pg.UpdateStmt | pg.DeleteStmt):
            return self.dml(stmt, parent)
        if isinstance(stmt, pg.ViewStmt):
            return self.statement(stmt.query, parent)
        if isinstance(stmt, pg.ExplainStmt):
            return self.statement(stmt.query, parent)
        result = _Item("subquery", "", "")
        block = _Block(parent)
        self.sublinks(stmt, block)
        return result

    def with_clause(self, clause: Any, block: _Block) -> None:
        if clause is None:
            return
        for cte in clause.ctes or ():
            definition = _Item("cte", cte.ctename, cte.ctename)
            block.ctes[cte.ctename] = definition  # before its query: WITH RECURSIVE
            inner = self.statement(cte.ctequery, block)
            names = [c.sval for c in cte.aliascolnames or ()]
            definition.outputs = dict(inner.outputs)
            definition.ordered = inner.ordered
            definition.stars = inner.stars
            for i, name in enumerate(names):
                if i < len(inner.ordered):
                    definition.outputs[name] = inner.ordered[i]

    def select(self, stmt: pg.SelectStmt, parent: _Block | None) -> _Item:
        block = _Block(parent)
        self.with_clause(stmt.withClause, block)
        result = _Item("subquery", "", "")
        if stmt.op != SetOperation.SETOP_NONE:
            left = self.statement(stmt.larg, block)
            right = self.statement(stmt.rarg, block)
            result.outputs = dict(left.outputs)
            result.ordered = []
            for i, deps in enumerate(left.ordered):
                other = right.ordered[i] if i < len(right.ordered) else None
                both = None if deps is None or other is None else deps | other
                result.ordered.append(both)
            for name, deps in left.outputs.items():
                if deps is not None and name in result.outputs:
                    i = next((j for j, d in enumerate(left.ordered) if d is deps), None)
                    if i is not None:
                        result.outputs[name] = result.ordered[i]
            return result
        if stmt.valuesLists:
            for row in stmt.valuesLists:
                for i, value in enumerate(row):
                    deps = self.deps(value, block)
                    if i >= len(result.ordered):
                        result.ordered.append(deps)
                    elif deps is None or result.ordered[i] is None:
                        result.ordered[i] = None
                    else:
                        result.ordered[i] = (result.ordered[i] or set()) | deps
            result.outputs = {f"column{i + 1}": d for i, d in enumerate(result.ordered)}
            return result
        self.from_list(stmt.fromClause or (), block)
        self.quals(stmt.whereClause, block, block.items)
        self.targets(stmt.targetList or (), block, result)
        self.sublinks(stmt, block, skip=("fromClause", "withClause", "larg", "rarg"))
        return result

    def targets(self, targets: Iterable[Any], block: _Block, result: _Item) -> None:
        for target in targets:
            value = target.val
            if isinstance(value, pg.ColumnRef) and isinstance(value.fields[-1], pg.A_Star):
                if len(value.fields) == 1:
                    result.stars.extend(block.items)
                else:
                    qualifier = value.fields[-2].sval
                    result.stars.extend(i for i in block.items if i.alias == qualifier)
                continue
            name = target.name or _output_name(value)
            deps = self.deps(value, block)
            result.ordered.append(deps)
            if name is not None:
                result.outputs[name] = deps

    def dml(self, stmt: Any, parent: _Block | None) -> _Item:
        block = _Block(parent)
        self.with_clause(stmt.withClause, block)
        result = _Item("subquery", "", "")
        target = self.range_var(stmt.relation, block, occurrence=False)
        if isinstance(stmt, pg.InsertStmt):
            if target.per_actor:
                columns = [c.name for c in stmt.cols or ()]
                if KEY not in columns:
                    self.violations.append(
                        Violation(
                            target.name,
                            target.alias,
                            f"INSERT does not list {KEY} among its columns "
                            f"({', '.join(columns) or 'no column list'})",
                        )
                    )
                conflict = stmt.onConflictClause
                infer = conflict.infer if conflict is not None else None
                if infer is not None and infer.indexElems:
                    names = [e.name for e in infer.indexElems]
                    if KEY not in names:
                        self.violations.append(
                            Violation(
                                target.name,
                                target.alias,
                                f"ON CONFLICT ({', '.join(str(n) for n in names)}) "
                                f"does not name {KEY}",
                            )
                        )
            if stmt.selectStmt is not None:
                self.statement(stmt.selectStmt, block)
            block.items.append(target)
            self.sublinks(stmt, block, skip=("relation", "withClause", "selectStmt", *_RETURNING))
        else:
            if target.per_actor:
                self.occurrences.append(target)
            block.items.append(target)
            extra = stmt.fromClause if isinstance(stmt, pg.UpdateStmt) else stmt.usingClause
            self.from_list(extra or (), block)
            self.quals(stmt.whereClause, block, block.items)
            skip = ("relation", "withClause", "fromClause", "usingClause", *_RETURNING)
            self.sublinks(stmt, block, skip=skip)
        self.targets(_returning(stmt), block, result)
        return result

    # - FROM -
    def from_list(self, entries: Iterable[Any], block: _Block) -> None:
        for entry in entries:
            self.from_entry(entry, block)

    def from_entry(self, entry: Any, block: _Block) -> list[_Item]:
        """Register a FROM entry's items in ``block``; the items it added."""
        if isinstance(entry, pg.RangeVar):
            item = self.range_var(entry, block, occurrence=True)
            block.items.append(item)
            return [item]
        if isinstance(entry, pg.RangeSubselect):
            inner = self.statement(entry.subquery, block)
            alias = entry.alias.aliasname if entry.alias else ""
            item = _Item("subquery", alias, alias)
            item.outputs, item.ordered, item.stars = dict(inner.outputs), inner.ordered, inner.stars
            self._rename(item, entry.alias)
            block.items.append(item)
            return [item]
        if isinstance(entry, pg.RangeFunction):
            alias = entry.alias.aliasname if entry.alias else ""
            calls = [f[0] for f in entry.functions or ()]
            if not alias and calls and isinstance(calls[0], pg.FuncCall):
                alias = _funcname(calls[0]) or ""
            item = _Item("function", alias, alias)
            deps: set[_Key] | None = set()
            for call in calls:
                sub = self.deps(call, block)
                deps = None if sub is None or deps is None else deps | sub
            if deps is not None:
                item.anchored_columns = frozenset({"*"})
                item.deps_all = deps
            for name in entry.alias.colnames or () if entry.alias else ():
                item.outputs[name.sval] = None
            block.items.append(item)
            return [item]
        if isinstance(entry, pg.JoinExpr):
            left = self.from_entry(entry.larg, block)
            right = self.from_entry(entry.rarg, block)
            jointype = entry.jointype
            if jointype == JoinType.JOIN_INNER:
                targets = left + right
            elif jointype == JoinType.JOIN_LEFT:
                targets = right
            elif jointype == JoinType.JOIN_RIGHT:
                targets = left
            else:
                targets = []
            for name in entry.usingClause or ():
                for a in left:
                    for b in right:
                        if self.has_column(a, name.sval) is False:
                            continue
                        if self.has_column(b, name.sval) is False:
                            continue
                        ka, kb = self.column(a, name.sval), self.column(b, name.sval)
                        if b in targets:
                            self.edge((ka,), kb)
                        if a in targets:
                            self.edge((kb,), ka)
            self.quals(entry.quals, block, targets)
            self.sublinks_in(entry.quals, block)
            return left + right
        item = _Item("other", "", "")
        block.items.append(item)
        return [item]

    def _rename(self, item: _Item, alias: Any) -> None:
        for i, name in enumerate(alias.colnames or () if alias else ()):
            if i < len(item.ordered):
                item.outputs[name.sval] = item.ordered[i]

    def range_var(self, rv: pg.RangeVar, block: _Block, *, occurrence: bool) -> _Item:
        alias = rv.alias.aliasname if rv.alias else rv.relname
        schema = rv.schemaname
        if schema is None and (definition := block.cte(rv.relname)) is not None:
            item = _Item("cte", rv.relname, alias, source=definition)
            self._rename(item, rv.alias)
            return item
        if schema in (None, SCHEMA) and rv.relname in PER_ACTOR_TABLES:
            item = _Item("table", rv.relname, alias, per_actor=True)
        elif schema == SCHEMA and rv.relname in self.views:
            item = _Item("view", f"{SCHEMA}.{rv.relname}", alias, per_actor=True)
        elif schema is None and self.trigger:
            item = _Item("transition", rv.relname, alias)
        else:
            item = _Item("other", rv.relname, alias)
        if occurrence and item.per_actor:
            self.occurrences.append(item)
        return item

    # - quals -
    def quals(self, expr: Any, block: _Block, targets: list[_Item]) -> None:
        """The top-level AND conjuncts of a WHERE or ON: edges into ``targets``' columns."""
        lower: dict[_Key, list[Any]] = {}
        upper: dict[_Key, list[Any]] = {}
        for conjunct in _conjuncts(expr):
            if isinstance(conjunct, pg.A_Expr):
                op = _opname(conjunct)
                if conjunct.kind == A_Expr_Kind.AEXPR_OP and op == "=":
                    self.equate(conjunct.lexpr, conjunct.rexpr, block, targets)
                elif conjunct.kind == A_Expr_Kind.AEXPR_IN and len(conjunct.rexpr) == 1:
                    self.equate(conjunct.lexpr, conjunct.rexpr[0], block, targets)
                elif self.allow_range and conjunct.kind == A_Expr_Kind.AEXPR_BETWEEN:
                    key = self.local(conjunct.lexpr, block, targets)
                    deps = [self.deps(b, block) for b in conjunct.rexpr]
                    if key is not None and key[1] == KEY and None not in deps:
                        self.edge(set().union(*deps), key)  # type: ignore[arg-type]
                elif self.allow_range and conjunct.kind == A_Expr_Kind.AEXPR_OP:
                    for col, bound, side in _range_sides(conjunct):
                        key = self.local(col, block, targets)
                        if key is not None and key[1] == KEY:
                            (lower if side == "lower" else upper).setdefault(key, []).append(bound)
            elif isinstance(conjunct, pg.SubLink) and conjunct.subLinkType == (
                SubLinkType.ANY_SUBLINK
            ):
                inner = self.sublink(conjunct, block)
                if _opname_of(conjunct.operName) not in (None, "="):
                    continue
                tests = (
                    conjunct.testexpr.args
                    if isinstance(conjunct.testexpr, pg.RowExpr)
                    else [conjunct.testexpr]
                )
                for i, test in enumerate(tests):
                    key = self.local(test, block, targets)
                    if key is not None and i < len(inner.ordered):
                        self.edge(inner.ordered[i], key)
        for key, lows in lower.items():
            for low in lows:
                for high in upper.get(key, ()):
                    a, b = self.deps(low, block), self.deps(high, block)
                    if a is not None and b is not None:
                        self.edge(a | b, key)

    def local(self, expr: Any, block: _Block, targets: list[_Item]) -> _Key | None:
        """The column node ``expr`` names if it is a column of one of ``targets``."""
        while isinstance(expr, pg.TypeCast):
            expr = expr.arg
        if not isinstance(expr, pg.ColumnRef):
            return None
        key = self.resolve(expr, block)
        if key is None or key == _ANCHOR or key[0] not in targets:
            return None
        return key

    def equate(self, left: Any, right: Any, block: _Block, targets: list[_Item]) -> None:
        if isinstance(left, pg.RowExpr) and isinstance(right, pg.RowExpr):
            for a, b in zip(left.args, right.args, strict=False):
                self.equate(a, b, block, targets)
            return
        for this, other in ((left, right), (right, left)):
            key = self.local(this, block, targets)
            if key is not None:
                self.edge(self.deps(other, block), key)

    # - subqueries anywhere -
    def sublink(self, link: pg.SubLink, block: _Block) -> _Item:
        inner = self.checked.get(id(link))
        if inner is None:
            inner = self.checked[id(link)] = self.statement(link.subselect, block)
            self.sublinks_in(link.testexpr, block)
        return inner

    def sublinks(self, node: Any, block: _Block, skip: tuple[str, ...] = ()) -> None:
        """Check the subqueries in every expression of ``node`` (but the ``skip`` fields)."""
        for name in node:
            if name in skip:
                continue
            self.sublinks_in(getattr(node, name), block)

    def sublinks_in(self, value: Any, block: _Block) -> None:
        for link in _walk_sublinks(value):
            self.sublink(link, block)


_RETURNING = ("returningList", "returningClause")


def _returning(stmt: Any) -> tuple[Any, ...]:
    """A DML statement's RETURNING targets (pglast 8 on PostgreSQL 18: returningClause)."""
    clause = getattr(stmt, "returningClause", None)
    if clause is not None:
        return tuple(clause.exprs or ())
    return tuple(getattr(stmt, "returningList", None) or ())


def _walk_sublinks(value: Any) -> Iterator[pg.SubLink]:
    if isinstance(value, pg.SubLink):
        yield value
        return
    if isinstance(value, tuple | list):
        for v in value:
            yield from _walk_sublinks(v)
    elif isinstance(value, pg.Node):
        if isinstance(value, pg.SelectStmt | pg.InsertStmt | pg.UpdateStmt | pg.DeleteStmt):
            return  # a statement of its own: checked where it is met
        for name in value:
            yield from _walk_sublinks(getattr(value, name))


def _children(expr: Any) -> Iterator[Any]:
    """The nodes directly under ``expr`` (a node or a list of them)."""
    values = _flatten(expr) if isinstance(expr, tuple | list) else (getattr(expr, n) for n in expr)
    for value in values:
        if isinstance(value, pg.Node):
            yield value
        elif isinstance(value, tuple | list):
            yield from (v for v in _flatten(value) if isinstance(v, pg.Node))


def _flatten(values: Iterable[Any]) -> Iterator[Any]:
    for v in values:
        if isinstance(v, tuple | list):
            yield from _flatten(v)
        else:
            yield v


def _conjuncts(expr: Any) -> Iterator[Any]:
    if expr is None:
        return
    if isinstance(expr, pg.BoolExpr) and expr.boolop == BoolExprType.AND_EXPR:
        for arg in expr.args:
            yield from _conjuncts(arg)
    else:
        yield expr


def _opname_of(name: Any) -> str | None:
    if not name:
        return None
    last = name[-1]
    return last.sval if isinstance(last, pg.String) else None


def _opname(expr: pg.A_Expr) -> str | None:
    return _opname_of(expr.name)


def _range_sides(expr: pg.A_Expr) -> Iterator[tuple[Any, Any, str]]:
    op = _opname(expr)
    flip = {">=": "<=", ">": "<", "<=": ">=", "<": ">"}
    if op not in flip:
        return
    for col, bound, o in ((expr.lexpr, expr.rexpr, op), (expr.rexpr, expr.lexpr, flip[op])):
        yield col, bound, "lower" if o in (">=", ">") else "upper"


def _funcname(call: pg.FuncCall) -> str | None:
    last = call.funcname[-1]
    return last.sval if isinstance(last, pg.String) else None


def _output_name(value: Any) -> str | None:
    while isinstance(value, pg.TypeCast):
        value = value.arg
    if isinstance(value, pg.ColumnRef) and isinstance(value.fields[-1], pg.String):
        return str(value.fields[-1].sval)
    if isinstance(value, pg.FuncCall):
        return _funcname(value)
    return None


def check_statement(
    stmt: Any,
    *,
    trigger: bool = False,
    variables: Iterable[str] = (),
    allow_range: bool = False,
    views: Iterable[str] = (),
) -> list[Violation]:
    """The violations of the rule in one parsed statement (a pglast node).

    ``trigger``: in a trigger function (NEW, OLD and transition tables are the trigger's rows);
    ``variables``: PL/pgSQL variable names (unqualified, they are values); ``allow_range``: a
    key range counts (the queue claim); ``views``: names of views over per-actor tables (an
    occurrence of one needs the key like a table)."""
    checker = _Checker(
        trigger=trigger,
        variables=frozenset(variables),
        allow_range=allow_range,
        views=frozenset(views),
    )
    return checker.run(stmt)


def check_sql(sql: str, **options: Any) -> list[Violation]:
    """The violations in every statement of ``sql`` (tests of the checker)."""
    found: list[Violation] = []
    for raw in pglast.parse_sql(sql):
        found.extend(check_statement(raw.stmt, **options))
    return found


# --- the server's statements -------------------------------------------------------------------


@dataclass
class Statement:
    """One statement of the server code, where it is, and how to check it."""

    file: str  # relative to the repository
    line: int
    owner: str  # graph node: "py:<module>:<name>", "sql:<function>", "view:<name>"
    text: str
    node: Any
    trigger: bool = False
    variables: frozenset[str] = frozenset()

    @property
    def first_line(self) -> str:
        for line in self.text.splitlines():
            stripped = line.strip()
            if stripped and not stripped.startswith("--"):
                return stripped if len(stripped) <= 90 else stripped[:89] + "…"
        return ""

    @property
    def spans(self) -> str | None:
        """The reason of a ``-- spans actors:`` comment, or None."""
        match = SPANS.search(self.text)
        return match.group("reason").strip() if match else None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line} [{self.owner}]"

    def touches(self) -> set[str]:
        """The per-actor tables the statement names."""
        return {
            n.relname
            for n in _nodes(self.node)
            if isinstance(n, pg.RangeVar)
            and n.schemaname in (None, SCHEMA)
            and n.relname in PER_ACTOR_TABLES
        }

    def writes(self) -> set[tuple[str, str]]:
        """(table, INSERT|UPDATE|DELETE) of every DML in the statement, CTEs included."""
        found: set[tuple[str, str]] = set()
        for n in _nodes(self.node):
            for cls, event in (
                (pg.InsertStmt, "INSERT"),
                (pg.UpdateStmt, "UPDATE"),
                (pg.DeleteStmt, "DELETE"),
            ):
                if isinstance(n, cls) and n.relation.schemaname in (None, SCHEMA):
                    found.add((n.relation.relname, event))
        return found

    def calls(self) -> set[str]:
        """The aidb_memory functions the statement calls."""
        found = set()
        for n in _nodes(self.node):
            if isinstance(n, pg.FuncCall) and len(n.funcname) == 2:
                schema, name = (f.sval for f in n.funcname)
                if schema == SCHEMA:
                    found.add(name)
        return found


def _nodes(value: Any) -> Iterator[Any]:
    if isinstance(value, tuple | list):
        for v in value:
            yield from _nodes(v)
    elif isinstance(value, pg.Node):
        yield value
        for name in value:
            yield from _nodes(getattr(value, name))


@dataclass
class Server:
    """Every statement of the server code and the call graph between its parts."""

    statements: list[Statement]
    graph: dict[str, set[str]]  # node -> nodes it uses (statements are "stmt:<index>")
    triggers: dict[tuple[str, str], set[str]]  # (table, event) -> trigger functions
    views: frozenset[str]
    unparsed: list[str]  # what the collector could not read (reported, not ignored)
    _claim: set[int] | None = None

    def reachable(self, roots: Iterable[str]) -> set[str]:
        seen: set[str] = set()
        todo = list(roots)
        while todo:
            node = todo.pop()
            if node in seen:
                continue
            seen.add(node)
            todo.extend(self.graph.get(node, ()))
            if node.startswith("stmt:"):
                statement = self.statements[int(node[5:])]
                todo.extend(f"sql:{f}" for f in statement.calls())
                for write in statement.writes():
                    todo.extend(f"sql:{f}" for f in self.triggers.get(write, ()))
        return seen

    def hot(self) -> set[int]:
        """The statements the hot API functions reach."""
        reached = self.reachable(f"sql:{f}" for f in HOT_FUNCTIONS)
        return {int(n[5:]) for n in reached if n.startswith("stmt:")}

    def check(self, statement: Statement) -> list[Violation]:
        """The statement's violations; a key range counts in the queue claim's statements
        (those that aidb_memory.event_claim reaches)."""
        if self._claim is None:
            reached = self.reachable(["sql:event_claim"])
            self._claim = {int(n[5:]) for n in reached if n.startswith("stmt:")}
        return check_statement(
            statement.node,
            trigger=statement.trigger,
            variables=statement.variables,
            allow_range=self.statements.index(statement) in self._claim,
            views=self.views,
        )


def _first_statement(text: str) -> Any | None:
    try:
        parsed = pglast.parse_sql(text)
    except pglast.parser.ParseError:
        return None
    if len(parsed) != 1:
        return None
    return parsed[0].stmt


_DML = (pg.SelectStmt, pg.InsertStmt, pg.UpdateStmt, pg.DeleteStmt)


def _names_our_schema(node: Any) -> bool:
    return any(isinstance(n, pg.RangeVar) and n.schemaname == SCHEMA for n in _nodes(node))


# - Python -

# What an unresolved {value} of an f-string or .format() becomes: a name, which parses wherever
# an expression, a column list or a condition may be (tests match it as a wildcard).
UNRESOLVED = "__unresolved__"
_UNKNOWN = UNRESOLVED
_FORMAT_FIELD = re.compile(r"(?<!\{)\{([A-Za-z_][A-Za-z0-9_]*)\}(?!\})")


class _Module:
    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = path
        self.tree = ast.parse(path.read_text())
        self.values: dict[str, str | None] = {}
        self.imports: dict[str, tuple[str, str | None]] = {}  # alias -> (module, name | None)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    if node.module == "aidb_memory_server":
                        self.imports[a.asname or a.name] = (a.name, None)
                    elif node.module.startswith("aidb_memory_server."):
                        self.imports[a.asname or a.name] = (node.module.split(".")[-1], a.name)


class _Python:
    """The string constants of the server's modules, with module-level names resolved."""

    def __init__(self, directory: Path) -> None:
        self.modules = {p.stem: _Module(p.stem, p) for p in sorted(directory.glob("*.py"))}
        self.evaluating: set[tuple[str, str]] = set()

    def constant(self, module: str, name: str) -> str | None:
        mod = self.modules.get(module)
        if mod is None:
            return None
        if name in mod.values:
            return mod.values[name]
        if name in mod.imports:
            source, attr = mod.imports[name]
            return self.constant(source, attr) if attr else None
        if (module, name) in self.evaluating:
            return None
        self.evaluating.add((module, name))
        value = None
        for node in mod.tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    value = self.text(module, node.value)
        mod.values[name] = value
        return value

    def text(self, module: str, expr: ast.expr) -> str | None:
        """The string ``expr`` evaluates to, unknown parts as NULL; None if not a string."""
        if isinstance(expr, ast.Constant):
            return expr.value if isinstance(expr.value, str) else None
        if isinstance(expr, ast.JoinedStr):
            parts = []
            for value in expr.values:
                if isinstance(value, ast.Constant):
                    parts.append(str(value.value))
                elif isinstance(value, ast.FormattedValue):
                    inner = self.text(module, value.value)
                    parts.append(_UNKNOWN if inner is None else inner)
            return "".join(parts)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left, right = self.text(module, expr.left), self.text(module, expr.right)
            if left is None and right is None:
                return None
            return (left or _UNKNOWN) + (right or _UNKNOWN)
        if isinstance(expr, ast.Name):
            return self.constant(module, expr.id)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            imported = self.modules[module].imports.get(expr.value.id)
            if imported and imported[1] is None:
                return self.constant(imported[0], expr.attr)
        if (
            isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Attribute)
            and expr.func.attr == "format"
        ):
            template = self.text(module, expr.func.value)
            if template is None:
                return None
            known = {k.arg: self.text(module, k.value) for k in expr.keywords if k.arg}
            return _format(template, known)
        return None

    def statements(self) -> Iterator[tuple[str, int, str, str]]:
        """(module, line, owner name, text) of every literal string expression."""
        for name, mod in self.modules.items():
            yield from self._strings(name, mod.tree, owner=None)

    def _strings(
        self, module: str, node: ast.AST, owner: str | None
    ) -> Iterator[tuple[str, int, str, str]]:
        for child in ast.iter_child_nodes(node):
            child_owner = owner
            if owner is None and isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
            ):
                child_owner = child.name
            elif owner is None and isinstance(child, ast.Assign | ast.AnnAssign):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                child_owner = names[0] if names else None
            if isinstance(child, ast.expr) and _has_literal(child):
                text = self.text(module, child)
                if text is not None:
                    yield module, child.lineno, owner or "<module>", text
                    continue
            yield from self._strings(module, child, child_owner)


def _has_literal(expr: ast.expr) -> bool:
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, str)
    if isinstance(expr, ast.JoinedStr):
        return True
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return _has_literal(expr.left) or _has_literal(expr.right)
    return False


def _format(template: str, known: dict[str | None, str | None]) -> str:
    def field_value(match: re.Match[str]) -> str:
        value = known.get(match.group(1))
        return _UNKNOWN if value is None else value

    return _FORMAT_FIELD.sub(field_value, template).replace("{{", "{").replace("}}", "}")


def _python_graph(python: _Python) -> dict[str, set[str]]:
    """node "py:<module>:<top-level name>" -> the names of the package it refers to."""
    graph: dict[str, set[str]] = {}
    for module, mod in python.modules.items():
        top = {}
        for node in mod.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                top[node.name] = node
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        top[t.id] = node
        for name, node in top.items():
            uses: set[str] = set()
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name):
                    if sub.id in top and sub.id != name:
                        uses.add(f"py:{module}:{sub.id}")
                    elif sub.id in mod.imports and mod.imports[sub.id][1] is not None:
                        source, attr = mod.imports[sub.id]
                        uses.add(f"py:{source}:{attr}")
                elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
                    imported = mod.imports.get(sub.value.id)
                    if imported and imported[1] is None:
                        uses.add(f"py:{imported[0]}:{sub.attr}")
            graph.setdefault(f"py:{module}:{name}", set()).update(uses)
    return graph


# - SQL -


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _option(stmt: pg.CreateFunctionStmt, name: str) -> Any:
    for option in stmt.options or ():
        if option.defname == name:
            return option.arg
    return None


def _plpgsql_queries(tree: Any) -> Iterator[tuple[int, str, int]]:
    """(lineno, query, parseMode) of every PLpgSQL_expr in a parse_plpgsql tree."""

    def walk(value: Any, lineno: int) -> Iterator[tuple[int, str, int]]:
        if isinstance(value, dict):
            lineno = value.get("lineno", lineno)
            if "query" in value and isinstance(value["query"], str):
                yield lineno, value["query"], value.get("parseMode", 0)
            for v in value.values():
                yield from walk(v, lineno)
        elif isinstance(value, list):
            for v in value:
                yield from walk(v, lineno)

    yield from walk(tree, 1)


_OUR_RETURN_TYPE = re.compile(rf"(RETURNS\s+(?:SETOF\s+)?){SCHEMA}\.\w+", re.I)
_ASSIGN = re.compile(r"^\s*[\w.\[\]\s]+?:=", re.S)


def _plpgsql_statement(query: str, mode: int) -> Any | None:
    text = query
    if mode == 0:
        node = _first_statement(text)
        if node is not None:
            return node
    text = _ASSIGN.sub("", text, count=1)
    return _first_statement(f"SELECT {text}")


def collect(repo: Path) -> Server:
    """Every statement of ``repo``'s server code (see the module's docstring)."""
    statements: list[Statement] = []
    graph: dict[str, set[str]] = {}
    triggers: dict[tuple[str, str], set[str]] = {}
    unparsed: list[str] = []
    views: set[str] = set()

    def add(statement: Statement) -> None:
        graph.setdefault(statement.owner, set()).add(f"stmt:{len(statements)}")
        statements.append(statement)

    # SQL first: the views over per-actor tables are per-actor relations in the Python's SQL too.
    sql_dir = repo / "sql"
    written = sql_fragments(sql_dir)
    for path in sorted(sql_dir.glob("*.sql")):
        text = path.read_text()
        rel = str(path.relative_to(repo))
        for raw in pglast.parse_sql(text):
            stmt = raw.stmt
            start = raw.stmt_location
            end = start + raw.stmt_len if raw.stmt_len else len(text)
            source = text[start:end]
            line = _line_of(text, start + len(source) - len(source.lstrip()))
            if isinstance(stmt, pg.ViewStmt):
                name = stmt.view.relname
                node = Statement(rel, line, f"view:{name}", source, stmt.query)
                if node.touches():
                    views.add(name)
                    add(node)
            elif isinstance(stmt, pg.CreateTrigStmt):
                function = stmt.funcname[-1].sval
                table = stmt.relation.relname
                events = {4: "INSERT", 8: "DELETE", 16: "UPDATE", 32: "TRUNCATE"}
                for bit, event in events.items():
                    if stmt.events & bit:
                        triggers.setdefault((table, event), set()).add(function)
            elif isinstance(stmt, pg.CreateFunctionStmt):
                _function(rel, text, start, source, stmt, add, graph, unparsed, written)
    python = _Python(repo / "plpython" / "aidb_memory_server")
    for module, line, owner, text in python.statements():
        if f"{SCHEMA}." not in text:
            continue
        node = _first_statement(text)
        if node is None and _FORMAT_FIELD.search(text):  # a str.format template
            node = _first_statement(_format(text, {}))
        if node is None:
            if re.search(r"\b(SELECT|INSERT|UPDATE|DELETE)\b", text) and re.search(
                rf"\b{SCHEMA}\.({'|'.join(PER_ACTOR_TABLES)})\b", text
            ):
                unparsed.append(f"plpython/aidb_memory_server/{module}.py:{line} [{owner}]")
            continue
        if not isinstance(node, _DML) or not _names_our_schema(node):
            continue
        rel = f"plpython/aidb_memory_server/{module}.py"
        add(Statement(rel, line, f"py:{module}:{owner}", text, node))
    for node, uses in _python_graph(python).items():
        graph.setdefault(node, set()).update(uses)
    return Server(statements, graph, triggers, frozenset(views), unparsed)


def _expanded(rel: str, body: str, written: dict[str, str]) -> tuple[str, list[int]]:
    """``body`` with its ``@<name>@`` lines expanded as install does, and for each of its lines
    the line of ``body`` it comes from (an expanded statement's lines: the ``@<name>@`` line)."""
    lines: list[str] = []
    origin: list[int] = []
    for number, line in enumerate(body.split("\n"), start=1):
        piece = expand_fragments(Path(rel), line, written).split("\n")
        lines.extend(piece)
        origin.extend([number] * len(piece))
    return "\n".join(lines), origin


def _function(
    rel: str,
    text: str,
    start: int,
    source: str,
    stmt: pg.CreateFunctionStmt,
    add: Any,
    graph: dict[str, set[str]],
    unparsed: list[str],
    written: dict[str, str],
) -> None:
    name = stmt.funcname[-1].sval
    owner = f"sql:{name}"
    language = _option(stmt, "language")
    language = language.sval if language is not None else "sql"
    body_arg = _option(stmt, "as")
    body = body_arg[0].sval if body_arg else None
    returns = stmt.returnType
    trigger = bool(returns and returns.names and returns.names[-1].sval == "trigger")
    if language == "plpython3u" and body:
        module, _, function = body.strip().partition(".")
        graph.setdefault(owner, set()).add(f"py:{module}:{function}")
        return
    if body is None:
        return
    body_at = text.index(body, start)
    if language == "sql":
        for raw in pglast.parse_sql(body):
            b_start = raw.stmt_location
            b_end = b_start + raw.stmt_len if raw.stmt_len else len(body)
            piece = body[b_start:b_end]
            line = _line_of(text, body_at + b_start + len(piece) - len(piece.lstrip()))
            if isinstance(raw.stmt, _DML):
                add(Statement(rel, line, owner, piece, raw.stmt, trigger))
        return
    if language != "plpgsql":
        return
    # As install runs it: a statement the file writes once for two functions stands in each.
    body, origin = _expanded(rel, body, written)
    # libpg_query's PL/pgSQL parser resolves no type of a schema but pg_catalog and public: a
    # function that returns one of ours (get_memory_fast, a set of list_memories_result) is read
    # as returning records, which changes none of its statements.
    source = _OUR_RETURN_TYPE.sub(r"\1record", source)
    try:
        (tree,) = pglast.parse_plpgsql(source.replace(body_arg[0].sval, body, 1))
    except pglast.parser.ParseError:
        unparsed.append(f"{rel}:{_line_of(text, start)} [{owner}]")
        return
    function = tree["PLpgSQL_function"]
    variables = set()
    for datum in function.get("datums", ()):
        refname = next(iter(datum.values())).get("refname")
        if refname:
            variables.add(refname.lower())
    body_line = _line_of(text, body_at)
    for expanded_lineno, query, mode in _plpgsql_queries(function.get("action")):
        lineno = origin[expanded_lineno - 1]
        node = _plpgsql_statement(query, mode)
        if node is None:
            if re.search(rf"\b{SCHEMA}\.", query):
                unparsed.append(f"{rel}:{body_line + lineno - 1} [{owner}]")
            continue
        if not isinstance(node, _DML):
            continue
        if not _names_our_schema(node) and not (set(_calls_of(node)) - {""}):
            continue
        add(
            Statement(
                rel, body_line + lineno - 1, owner, query, node, trigger, frozenset(variables)
            )
        )


def _calls_of(node: Any) -> Iterator[str]:
    for n in _nodes(node):
        if isinstance(n, pg.FuncCall) and len(n.funcname) == 2 and n.funcname[0].sval == SCHEMA:
            yield n.funcname[1].sval


def report(server: Server) -> list[str]:
    """One line per violation: where, the statement's first line, the table, what is missing.
    Statements the hot API functions reach are marked [hot]."""
    hot = server.hot()
    lines = []
    for index, statement in enumerate(server.statements):
        if statement.spans is not None:
            continue
        for violation in server.check(statement):
            mark = " [hot]" if index in hot else ""
            lines.append(f"{statement.where}{mark} `{statement.first_line}`: {violation}")
    return lines
