"""What install records about the catalog, and drift between two records, in words.

Install records two lists of objects of schema ``aidb_memory`` in ``runtime_settings``:

* ``catalog_code``: what the idempotent part (``sql/``) makes and install re-applies when it
  differs: functions, view definitions, triggers and whether they fire, privileges and comments.
* ``catalog_schema``: what only migrations make: every relation (tables, indexes, sequences, and
  the existence of views), columns with their types and defaults, constraints and types. Install
  cannot recreate these; it checks them against the record *before* applying migrations (so a
  migration never runs on a schema it was not written for) and records them afterwards.

One line per object: ``kind<TAB>name<TAB>detail``; the detail is a digest except for a
trigger's, which starts with its ``tgenabled`` state so that drift can say "disabled".
The same query (:data:`QUERY`) runs in the install script and in ``verify``: the script always
carries its own copy, so an upgrade never compares with another version's idea of the catalog.
Every statement runs under the pinned search_path (``pg_catalog, pg_temp``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pglast
from pglast.enums import FunctionParameterMode
from pglast.stream import RawStream

CODE = "code"
SCHEMA_PART = "schema"

# Rows (part, kind, name, detail). Names are OID-free so that they read well in messages;
# internal (foreign key) triggers have OID-based names, so they are one row per table.
QUERY = r"""
SELECT 'code', 'function', p.oid::pg_catalog.regprocedure::pg_catalog.text,
       pg_catalog.md5(CASE WHEN p.prokind OPERATOR(pg_catalog.=) 'a' THEN p.proname::text
                           ELSE pg_catalog.pg_get_functiondef(p.oid) END
           || coalesce(p.proacl::text, '')
           || coalesce(pg_catalog.obj_description(p.oid, 'pg_proc'), ''))
FROM pg_catalog.pg_proc p
WHERE p.pronamespace OPERATOR(pg_catalog.=) 'aidb_memory'::pg_catalog.regnamespace
UNION ALL
SELECT 'code', 'privileges of ' || CASE c.relkind WHEN 'S' THEN 'sequence' ELSE 'table' END,
       'aidb_memory.' || c.relname,
       pg_catalog.md5(coalesce(c.relacl::text, '')
           || coalesce(pg_catalog.obj_description(c.oid, 'pg_class'), '')
           || coalesce((SELECT pg_catalog.string_agg(a.attname || coalesce(a.attacl::text, '')
                                   || coalesce(pg_catalog.col_description(c.oid, a.attnum), ''),
                                   ',' ORDER BY a.attnum)
                        FROM pg_catalog.pg_attribute a
                        WHERE a.attrelid OPERATOR(pg_catalog.=) c.oid
                          AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped), ''))
FROM pg_catalog.pg_class c
WHERE c.relnamespace OPERATOR(pg_catalog.=) 'aidb_memory'::pg_catalog.regnamespace
  AND c.relkind IN ('r', 'p', 'S', 'm', 'f')
UNION ALL
SELECT 'code', 'view', 'aidb_memory.' || c.relname,
       pg_catalog.md5(pg_catalog.pg_get_viewdef(c.oid) || coalesce(c.relacl::text, '')
           || coalesce(pg_catalog.obj_description(c.oid, 'pg_class'), ''))
FROM pg_catalog.pg_class c
WHERE c.relnamespace OPERATOR(pg_catalog.=) 'aidb_memory'::pg_catalog.regnamespace
  AND c.relkind OPERATOR(pg_catalog.=) 'v'
UNION ALL
SELECT 'code', 'trigger', t.tgname || ' on aidb_memory.' || c.relname,
       t.tgenabled::text || ' ' || pg_catalog.md5(pg_catalog.pg_get_triggerdef(t.oid))
FROM pg_catalog.pg_trigger t
JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.tgrelid
WHERE c.relnamespace OPERATOR(pg_catalog.=) 'aidb_memory'::pg_catalog.regnamespace
  AND NOT t.tgisinternal
UNION ALL
SELECT 'code', 'foreign key triggers', 'aidb_memory.' || c.relname,
       pg_catalog.string_agg(t.tgenabled::text, '' ORDER BY t.tgenabled::text)
FROM pg_catalog.pg_trigger t
JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.tgrelid
WHERE c.relnamespace OPERATOR(pg_catalog.=) 'aidb_memory'::pg_catalog.regnamespace
  AND t.tgisinternal
GROUP BY c.relname
UNION ALL
SELECT 'code', 'schema', 'aidb_memory',
       pg_catalog.md5(coalesce(n.nspacl::text, '')
           || coalesce(pg_catalog.obj_description(n.oid, 'pg_namespace'), ''))
FROM pg_catalog.pg_namespace n
WHERE n.oid OPERATOR(pg_catalog.=) 'aidb_memory'::pg_catalog.regnamespace
UNION ALL
SELECT 'schema', CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table' WHEN 'i' THEN 'index'
                                WHEN 'I' THEN 'index' WHEN 'S' THEN 'sequence'
                                WHEN 'm' THEN 'materialized view' WHEN 'c' THEN 'type'
                                WHEN 'f' THEN 'foreign table' ELSE 'relation' END,
       'aidb_memory.' || c.relname,
       pg_catalog.md5(c.relkind::text || c.relpersistence::text
           || CASE WHEN c.relkind IN ('i', 'I') THEN pg_catalog.pg_get_indexdef(c.oid) ELSE '' END
           || CASE WHEN c.relkind IN ('r', 'p', 'c', 'f') THEN
                  coalesce((SELECT pg_catalog.string_agg(
                                a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod)
                                || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
                                || a.attidentity::text || a.attgenerated::text || ' '
                                || coalesce(pg_catalog.pg_get_expr(d.adbin, d.adrelid), ''),
                                ',' ORDER BY a.attnum)
                            FROM pg_catalog.pg_attribute a
                            LEFT JOIN pg_catalog.pg_attrdef d
                              ON d.adrelid OPERATOR(pg_catalog.=) a.attrelid
                             AND d.adnum OPERATOR(pg_catalog.=) a.attnum
                            WHERE a.attrelid OPERATOR(pg_catalog.=) c.oid
                              AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped), '')
                  ELSE '' END)
FROM pg_catalog.pg_class c
WHERE c.relnamespace OPERATOR(pg_catalog.=) 'aidb_memory'::pg_catalog.regnamespace
  AND c.relkind NOT IN ('t', 'v')
UNION ALL
SELECT 'schema', 'constraint',
       k.conname || ' on ' || CASE WHEN k.conrelid OPERATOR(pg_catalog.<>) 0
                                   THEN k.conrelid::pg_catalog.regclass::text
                                   ELSE k.contypid::pg_catalog.regtype::text END,
       pg_catalog.md5(pg_catalog.pg_get_constraintdef(k.oid))
FROM pg_catalog.pg_constraint k
WHERE k.connamespace OPERATOR(pg_catalog.=) 'aidb_memory'::pg_catalog.regnamespace
UNION ALL
SELECT 'schema', 'type', ty.oid::pg_catalog.regtype::text,
       pg_catalog.md5(ty.typtype::text || coalesce(ty.typacl::text, '')
           || coalesce((SELECT pg_catalog.string_agg(e.enumlabel::text, ','
                                                     ORDER BY e.enumsortorder)
                        FROM pg_catalog.pg_enum e
                        WHERE e.enumtypid OPERATOR(pg_catalog.=) ty.oid), ''))
FROM pg_catalog.pg_type ty
WHERE ty.typnamespace OPERATOR(pg_catalog.=) 'aidb_memory'::pg_catalog.regnamespace
  AND ty.typrelid OPERATOR(pg_catalog.=) 0
  AND NOT (ty.typcategory OPERATOR(pg_catalog.=) 'A' AND ty.typelem OPERATOR(pg_catalog.<>) 0)
"""


def lines_query(part: str) -> str:
    """One text value: the part's objects as sorted lines (NULL-free: '' when there are none)."""
    return (
        "SELECT coalesce(pg_catalog.string_agg(kind || E'\\t' || name || E'\\t' || detail, E'\\n' "
        'ORDER BY kind COLLATE "C", name COLLATE "C"), \'\') '
        f"FROM ({QUERY}) AS objects(part, kind, name, detail) "
        f"WHERE part OPERATOR(pg_catalog.=) '{part}'"
    )


# The stored server-side modules as one digest, computed the same way from the package.
MODULES_QUERY = (
    "SELECT coalesce(pg_catalog.string_agg(name || ':' || is_package::text || ':' "
    "|| pg_catalog.md5(pg_catalog.convert_to(source, 'UTF8')), E'\\n' ORDER BY name COLLATE \"C\"),"
    " '') FROM aidb_memory.runtime_modules"
)


def module_line(name: str, is_package: bool, source: str) -> str:
    digest = hashlib.md5(source.encode(), usedforsecurity=False).hexdigest()
    return f"{name}:{str(is_package).lower()}:{digest}"


def modules_digest(modules: Iterable[tuple[str, bool, str]]) -> str:
    """What :data:`MODULES_QUERY` returns when the stored modules are exactly ``modules``."""
    return "\n".join(module_line(*m) for m in sorted(modules, key=lambda m: m[0].encode()))


@dataclass(frozen=True)
class Item:
    kind: str
    name: str
    detail: str


def parse(lines: str) -> dict[tuple[str, str], Item]:
    """A recorded or current part, by (kind, name)."""
    items = {}
    for line in lines.splitlines():
        kind, name, detail = line.split("\t", 2)
        items[(kind, name)] = Item(kind, name, detail)
    return items


def differences(recorded: str, current: str, part: str) -> list[str]:
    """Each object that is missing, extra or changed, in words (sorted, one per object)."""
    want, have = parse(recorded), parse(current)
    out = []
    for key in sorted(want.keys() | have.keys()):
        kind, name = key
        if key not in have:
            out.append(f"{kind} {name} is missing")
        elif key not in want:
            out.append(f"{kind} {name} is not part of aidb_memory")
        elif want[key].detail != have[key].detail:
            out.append(_changed(want[key], have[key], part))
    return out


_TRIGGER_STATES = {"O": "enabled", "D": "disabled", "R": "enabled on replicas only",
                   "A": "enabled always"}  # fmt: skip


def _changed(want: Item, have: Item, part: str) -> str:
    if want.kind == "trigger" and want.detail[:1] != have.detail[:1]:
        state = _TRIGGER_STATES.get(have.detail[:1], have.detail[:1])
        return f"trigger {have.name} is {state}"
    if want.kind == "foreign key triggers":
        return f"foreign key triggers of {have.name} are not all enabled"
    what = "changed by hand" if part == CODE else "differs from what migrations created"
    return f"{have.kind} {have.name} {what}"


NOT_ARGUMENTS = (FunctionParameterMode.FUNC_PARAM_OUT, FunctionParameterMode.FUNC_PARAM_TABLE)


def _qualified(names: Sequence[Any]) -> str:
    return ".".join(n.sval for n in names)


@dataclass(frozen=True)
class Defined:
    """What ``sql/`` creates: functions as ``regprocedure`` input (``schema.name(type, ...)``),
    views as ``schema.name``, triggers as ``name on schema.table``."""

    functions: list[str]
    views: list[str]
    triggers: list[str]


def signature(stmt: Any) -> str:
    """A CreateFunctionStmt's ``schema.name(type, ...)``, as ``regprocedure`` input (its OUT and
    TABLE parameters are not part of it)."""
    args = [RawStream()(p.argType) for p in stmt.parameters or () if p.mode not in NOT_ARGUMENTS]
    return f"{_qualified(stmt.funcname)}({', '.join(args)})"


def defined_objects(statements: Iterable[str]) -> Defined:
    """The functions, views and triggers that ``statements`` create: what install's code part
    makes, so anything else of those kinds in the schema was added by hand."""
    functions, views, triggers = [], [], []
    for raw in pglast.parse_sql(";\n".join(statements)):
        stmt: Any = raw.stmt
        kind = type(stmt).__name__
        if kind == "CreateFunctionStmt":
            functions.append(signature(stmt))
        elif kind == "ViewStmt":
            views.append(f"{stmt.view.schemaname or 'aidb_memory'}.{stmt.view.relname}")
        elif kind == "CreateTrigStmt":
            table = f"{stmt.relation.schemaname or 'aidb_memory'}.{stmt.relation.relname}"
            triggers.append(f"{stmt.trigname} on {table}")
    return Defined(functions, views, triggers)
