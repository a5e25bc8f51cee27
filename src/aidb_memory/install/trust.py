"""What install refuses to build on: a schema or roles that someone else could have prepared.

Install runs as a superuser and then trusts what is in schema ``aidb_memory``: it stores code in
``runtime_modules``, calls ``catalog_fingerprint()``, and ``status``, the API and the worker run
what is there. If a role that is not a superuser could have created or changed any of it before
install (a database owner on PostgreSQL 15 may ``CREATE SCHEMA``), that role's code would run as
the superuser or as every caller. Likewise the roles ``aidb_users``, ``aidb_admins`` and
``aidb_workers`` are cluster-wide: a role with CREATEROLE may have created or changed them, so
that every member granted later gets more than install meant to give.

The rules (docs/operations.md, "Install" and "Roles"):

* The schema, if it exists, must be owned by a superuser; nobody but a superuser may hold CREATE
  on it; every object in it that has an owner (relations, functions and procedures, types,
  operators, operator classes and families, collations, conversions, text search
  configurations and dictionaries, extended statistics, extensions) must be owned by a
  superuser; every trigger on a relation in it must run a function owned by a superuser. A
  finding is always an error (SQLSTATE 42501): install never adopts such a schema.
* Each of the three roles that exists must: not have LOGIN, SUPERUSER, CREATEROLE, CREATEDB,
  REPLICATION or BYPASSRLS; be a member of no role (except aidb_admins of aidb_users); have
  every membership in it granted by a role that is a superuser now, and none WITH ADMIN OPTION
  (PostgreSQL 16 gives the creator of a role that, granted by the bootstrap superuser); and
  neither own nor hold a privilege on (nor be named in a policy on) anything in this database
  or any shared object (database, tablespace), except the schema aidb_memory and what is in it.
  A finding is an error unless ``--accept-existing-roles`` is given; then it is a warning.

Both rules are single queries, used by the install script (so ``aidb-memory sql | psql``
refuses as well), by ``doctor``, and before anything reads the schema (``status``, ``verify``,
``uninstall``, ``install --dry-run``). They qualify every function, operator and type with
``pg_catalog``: they run as a superuser in a database whose search_path someone else may set.
"""

from __future__ import annotations

from typing import Any

import psycopg

from aidb_memory.connection import CliError
from aidb_memory.install.steps import SCHEMA, Step, do_block, literal

Connection = psycopg.Connection[tuple[Any, ...]]

ROLES = ("aidb_users", "aidb_admins", "aidb_workers")
# The only membership install itself grants (sql/00_roles.sql).
_EXPECTED_MEMBERSHIP = ("aidb_admins", "aidb_users")
# How many findings one error message lists; the rest are counted.
_LISTED = 5
REFUSED_PREFIX = "aidb_memory: install refused: "

_EQ = "OPERATOR(pg_catalog.=)"
_NE = "OPERATOR(pg_catalog.<>)"


def _cls(name: str) -> str:
    return f"'pg_catalog.{name}'::pg_catalog.regclass::pg_catalog.oid"


def _who(column: str) -> str:
    """A role's name for a message; a dangling OID (a dropped grantor) says so."""
    return f"COALESCE(pg_catalog.quote_ident({column}), 'a role that no longer exists')"


_SCHEMA_OID = (
    f"(SELECT n.oid FROM pg_catalog.pg_namespace n "
    f"WHERE n.nspname {_EQ} {literal(SCHEMA)}::pg_catalog.name)"
)

# Every catalog whose objects live in a schema and have an owner: (catalog, namespace column,
# owner column, extra condition). Indexes follow their table's owner; a relation's row type and
# an array type follow the object they belong to: listing them too would only repeat it.
_OWNED: list[tuple[str, str, str, str]] = [
    (
        "pg_class",
        "relnamespace",
        "relowner",
        f"NOT (x.relkind {_EQ} ANY ('{{i,I}}'::pg_catalog.\"char\"[]))",
    ),
    ("pg_proc", "pronamespace", "proowner", ""),
    (
        "pg_type",
        "typnamespace",
        "typowner",
        f"x.typrelid {_EQ} 0::pg_catalog.oid AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_type e "
        f"WHERE e.typarray {_EQ} x.oid)",
    ),
    ("pg_operator", "oprnamespace", "oprowner", ""),
    ("pg_opclass", "opcnamespace", "opcowner", ""),
    ("pg_opfamily", "opfnamespace", "opfowner", ""),
    ("pg_collation", "collnamespace", "collowner", ""),
    ("pg_conversion", "connamespace", "conowner", ""),
    ("pg_ts_config", "cfgnamespace", "cfgowner", ""),
    ("pg_ts_dict", "dictnamespace", "dictowner", ""),
    ("pg_statistic_ext", "stxnamespace", "stxowner", ""),
    ("pg_extension", "extnamespace", "extowner", ""),
]


def _owned_objects() -> str:
    parts = []
    for catalog, namespace, owner, condition in _OWNED:
        where = f"x.{namespace} {_EQ} s.oid" + (f" AND {condition}" if condition else "")
        parts.append(
            f"    SELECT {_cls(catalog)} AS classid, x.oid, x.{owner} AS owner\n"
            f"    FROM pg_catalog.{catalog} x, s WHERE {where}"
        )
    return "\n    UNION ALL\n".join(parts)


# (ord, finding): what makes schema aidb_memory untrustworthy; no rows when it is absent.
SCHEMA_FINDINGS_SQL = f"""WITH s AS (
    SELECT n.oid, n.nspowner, n.nspacl FROM pg_catalog.pg_namespace n
    WHERE n.nspname {_EQ} {literal(SCHEMA)}::pg_catalog.name
), objects AS (
{_owned_objects()}
)
SELECT 0 AS ord,
       pg_catalog.concat('schema {SCHEMA} is owned by ', {_who("r.rolname")},
                         ', not a superuser') AS finding
FROM s LEFT JOIN pg_catalog.pg_roles r ON r.oid {_EQ} s.nspowner
WHERE NOT COALESCE(r.rolsuper, false)
UNION ALL
SELECT 1, pg_catalog.concat('CREATE on schema {SCHEMA} is granted to ',
                            CASE WHEN a.grantee {_EQ} 0::pg_catalog.oid THEN 'PUBLIC'
                                 ELSE {_who("r.rolname")} END)
FROM s CROSS JOIN LATERAL pg_catalog.aclexplode(s.nspacl) a
LEFT JOIN pg_catalog.pg_roles r ON r.oid {_EQ} a.grantee
WHERE a.privilege_type {_EQ} 'CREATE'::pg_catalog.text AND a.grantee {_NE} s.nspowner
  AND NOT COALESCE(r.rolsuper, false)
UNION ALL
SELECT 2, pg_catalog.concat(pg_catalog.pg_describe_object(o.classid, o.oid, 0),
                            ' is owned by ', {_who("r.rolname")}, ', not a superuser')
FROM objects o LEFT JOIN pg_catalog.pg_roles r ON r.oid {_EQ} o.owner
WHERE NOT COALESCE(r.rolsuper, false)
UNION ALL
SELECT 3, pg_catalog.concat(pg_catalog.pg_describe_object({_cls("pg_trigger")}, t.oid, 0),
                            ' runs ', pg_catalog.pg_describe_object({_cls("pg_proc")}, p.oid, 0),
                            ', owned by ', {_who("r.rolname")}, ', not a superuser')
FROM pg_catalog.pg_trigger t
JOIN pg_catalog.pg_class c ON c.oid {_EQ} t.tgrelid
JOIN s ON c.relnamespace {_EQ} s.oid
JOIN pg_catalog.pg_proc p ON p.oid {_EQ} t.tgfoid
LEFT JOIN pg_catalog.pg_roles r ON r.oid {_EQ} p.proowner
WHERE NOT COALESCE(r.rolsuper, false)"""


def _in_our_schema(classid: str, objid: str) -> str:
    """Whether a pg_shdepend object is schema aidb_memory or lives in it (what install grants)."""

    def inside(catalog: str, namespace: str) -> str:
        return (
            f"WHEN {classid} {_EQ} {_cls(catalog)} THEN EXISTS (SELECT 1 FROM pg_catalog.{catalog} "
            f"x WHERE x.oid {_EQ} {objid} AND x.{namespace} {_EQ} {_SCHEMA_OID})"
        )

    return f"""COALESCE(CASE
        WHEN {classid} {_EQ} {_cls("pg_namespace")} THEN {objid} {_EQ} {_SCHEMA_OID}
        {inside("pg_class", "relnamespace")}
        {inside("pg_proc", "pronamespace")}
        {inside("pg_type", "typnamespace")}
        {inside("pg_default_acl", "defaclnamespace")}
        WHEN {classid} {_EQ} {_cls("pg_policy")} THEN EXISTS (
            SELECT 1 FROM pg_catalog.pg_policy p JOIN pg_catalog.pg_class c
                ON c.oid {_EQ} p.polrelid
            WHERE p.oid {_EQ} {objid} AND c.relnamespace {_EQ} {_SCHEMA_OID})
    END, false)"""


_ATTRIBUTES = [
    ("rolcanlogin", "can log in (LOGIN)"),
    ("rolsuper", "is a superuser (SUPERUSER)"),
    ("rolcreaterole", "may create roles (CREATEROLE)"),
    ("rolcreatedb", "may create databases (CREATEDB)"),
    ("rolreplication", "may replicate (REPLICATION)"),
    ("rolbypassrls", "bypasses row-level security (BYPASSRLS)"),
]


def _attribute_findings() -> str:
    return "\nUNION ALL\n".join(
        f"SELECT 0 AS ord, pg_catalog.concat(o.rolname, ' {text}') AS finding "
        f"FROM ours o WHERE o.{column}"
        for column, text in _ATTRIBUTES
    )


_ROLE_NAMES = ", ".join(literal(r) for r in ROLES)

# (ord, finding): what about the roles of SPEC §6 install did not do and a superuser did not
# grant; no rows when they are absent or as install left them.
ROLE_FINDINGS_SQL = f"""WITH ours AS (
    SELECT r.oid, r.rolname, r.rolcanlogin, r.rolsuper, r.rolcreaterole, r.rolcreatedb,
           r.rolreplication, r.rolbypassrls
    FROM pg_catalog.pg_roles r
    WHERE r.rolname {_EQ} ANY (ARRAY[{_ROLE_NAMES}]::pg_catalog.name[])
), here AS (
    SELECT d.oid FROM pg_catalog.pg_database d
    WHERE d.datname {_EQ} pg_catalog.current_database()
)
{_attribute_findings()}
UNION ALL
SELECT 0, pg_catalog.concat(o.rolname, ' is a member of ', pg_catalog.quote_ident(g.rolname),
                            ' (granted by ', {_who("gr.rolname")}, ')')
FROM ours o
JOIN pg_catalog.pg_auth_members m ON m.member {_EQ} o.oid
JOIN pg_catalog.pg_roles g ON g.oid {_EQ} m.roleid
LEFT JOIN pg_catalog.pg_roles gr ON gr.oid {_EQ} m.grantor
WHERE NOT (o.rolname {_EQ} {literal(_EXPECTED_MEMBERSHIP[0])}::pg_catalog.name
           AND g.rolname {_EQ} {literal(_EXPECTED_MEMBERSHIP[1])}::pg_catalog.name)
UNION ALL
SELECT 0, pg_catalog.concat(o.rolname, ' has member ',
                            {_who("mem.rolname")}, ' granted by ', {_who("gr.rolname")},
                            ', not a superuser')
FROM ours o
JOIN pg_catalog.pg_auth_members m ON m.roleid {_EQ} o.oid
LEFT JOIN pg_catalog.pg_roles mem ON mem.oid {_EQ} m.member
LEFT JOIN pg_catalog.pg_roles gr ON gr.oid {_EQ} m.grantor
WHERE NOT COALESCE(gr.rolsuper, false)
UNION ALL
SELECT 0, pg_catalog.concat(o.rolname, ' has member ', {_who("mem.rolname")},
                            ' WITH ADMIN OPTION (it may grant ', o.rolname, ' to anyone)')
FROM ours o
JOIN pg_catalog.pg_auth_members m ON m.roleid {_EQ} o.oid
LEFT JOIN pg_catalog.pg_roles mem ON mem.oid {_EQ} m.member
WHERE m.admin_option
UNION ALL
SELECT 0, pg_catalog.concat(
    o.rolname,
    CASE WHEN d.deptype {_EQ} 'o'::pg_catalog."char" THEN ' owns '
         WHEN d.deptype {_EQ} 'a'::pg_catalog."char" THEN ' holds privileges on '
         WHEN d.deptype {_EQ} 'r'::pg_catalog."char" THEN ' is named in '
         ELSE ' is referenced by ' END,
    pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid))
FROM ours o
JOIN pg_catalog.pg_shdepend d
    ON d.refclassid {_EQ} {_cls("pg_authid")} AND d.refobjid {_EQ} o.oid
WHERE (d.dbid {_EQ} (SELECT oid FROM here) OR d.dbid {_EQ} 0::pg_catalog.oid)
  AND NOT {_in_our_schema("d.classid", "d.objid")}"""

SCHEMA_HINT = (
    f"a role that is not a superuser could have put code there that install, status and the "
    f"API would run; unless it is a previous install, inspect it and, as a superuser, "
    f"DROP SCHEMA {SCHEMA} CASCADE (or change the owners and REVOKE CREATE) and install again"
)
ROLE_HINT = (
    "every member of these roles would get what they hold; undo it as a superuser (ALTER ROLE "
    "... NOLOGIN, REVOKE ..., or REVOKE and GRANT a membership again as a superuser), or run "
    "install with --accept-existing-roles (aidb-memory sql --accept-existing-roles) to proceed "
    "with them as they are"
)
SCHEMA_WHAT = f"schema {SCHEMA} was not created by install and cannot be trusted"
ROLE_WHAT = "roles aidb_users, aidb_admins, aidb_workers were changed outside install"


def _ordered(query: str) -> str:
    return f"SELECT q.ord, q.finding FROM ({query}) q ORDER BY q.ord, q.finding"


def _refuse_block(query: str, what: str, hint: str) -> str:
    """A DO block that raises 42501 listing the first findings of ``query``, if it has any."""
    body = f"""SELECT pg_catalog.string_agg(f.finding, '; ' ORDER BY f.n)
           FILTER (WHERE f.n OPERATOR(pg_catalog.<=) {_LISTED}),
       pg_catalog.count(*)
  INTO aidb_listed, aidb_total
  FROM (SELECT q.finding, pg_catalog.row_number() OVER (ORDER BY q.ord, q.finding) AS n
        FROM ({query}) q) f;
IF aidb_total OPERATOR(pg_catalog.>) {_LISTED} THEN
    aidb_listed := pg_catalog.concat(aidb_listed, '; and ',
                                     aidb_total OPERATOR(pg_catalog.-) {_LISTED}, ' more');
END IF;
IF aidb_total OPERATOR(pg_catalog.>) 0 THEN
    RAISE EXCEPTION '{REFUSED_PREFIX}{what}: %', aidb_listed
        USING ERRCODE = 'insufficient_privilege', HINT = {literal(hint)};
END IF;"""
    return do_block(
        body, declare="    aidb_listed pg_catalog.text;\n    aidb_total pg_catalog.int8;"
    )


def _warn_block(query: str) -> str:
    """A DO block that warns once per finding of ``query`` (install's progress lines).

    The variables are named so that no column or alias of the queries (``r`` is one) is taken
    for them."""
    body = f"""FOR aidb_row IN {_ordered(query)} LOOP
    RAISE WARNING 'aidb_memory: warning: %', aidb_row.finding;
END LOOP;"""
    return do_block(body, declare="    aidb_row record;")


def trust_steps(*, accept_existing_roles: bool = False) -> list[Step]:
    """The checks that go before ``CREATE SCHEMA IF NOT EXISTS``: the schema, then the roles."""
    roles = (
        Step("existing roles", _warn_block(ROLE_FINDINGS_SQL))
        if accept_existing_roles
        else Step("existing roles", _refuse_block(ROLE_FINDINGS_SQL, ROLE_WHAT, ROLE_HINT))
    )
    return [schema_check_step(), roles]


def schema_check_step() -> Step:
    """The schema check. Also run right after ``CREATE SCHEMA IF NOT EXISTS``: a schema created
    by someone else between the first check and that statement would otherwise be adopted."""
    return Step("existing schema", _refuse_block(SCHEMA_FINDINGS_SQL, SCHEMA_WHAT, SCHEMA_HINT))


def final_steps(*, accept_existing_roles: bool = False) -> list[Step]:
    """The role check once more at the end: a role created by someone else while install ran
    (before sql/00_roles.sql would have created it) is refused too."""
    if accept_existing_roles:
        return []
    return [Step("existing roles", _refuse_block(ROLE_FINDINGS_SQL, ROLE_WHAT, ROLE_HINT))]


def _findings(conn: Connection, query: str) -> list[str]:
    return [str(row[1]) for row in conn.execute(_ordered(query).encode()).fetchall()]


def schema_findings(conn: Connection) -> list[str]:
    """What makes an existing schema aidb_memory untrustworthy (empty: absent or trusted)."""
    return _findings(conn, SCHEMA_FINDINGS_SQL)


def role_findings(conn: Connection) -> list[str]:
    """What about the three roles install did not do and no superuser granted."""
    return _findings(conn, ROLE_FINDINGS_SQL)


def summary(findings: list[str]) -> str:
    """The findings on one line, the first few listed and the rest counted."""
    listed = "; ".join(findings[:_LISTED])
    more = len(findings) - _LISTED
    return listed + (f"; and {more} more" if more > 0 else "")


def require_trusted_schema(conn: Connection) -> None:
    """Refuse (before reading anything from it) a schema aidb_memory that is not trustworthy:
    its tables could be views and its functions anybody's code, run as the caller."""
    findings = schema_findings(conn)
    if findings:
        raise CliError(
            f"aidb-memory: refused: {SCHEMA_WHAT}: {summary(findings)} (hint: {SCHEMA_HINT})"
        )


def refusal_line(error: psycopg.Error) -> str | None:
    """The CLI's one line for a refusal raised by the install script, else None."""
    message = error.diag.message_primary or ""
    if not message.startswith(REFUSED_PREFIX):
        return None
    line = "aidb-memory: install refused: " + message[len(REFUSED_PREFIX) :]
    if error.diag.message_hint:
        line += f" (hint: {error.diag.message_hint})"
    return " ".join(line.split())
