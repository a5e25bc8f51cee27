"""Distributing the schema over a Citus cluster (docs/scaling.md; issue 15).

Three kinds of tables, and every table of the schema is of exactly one:

- **per actor** (:data:`PER_ACTOR_TABLES`): the tables with an ``actor_key`` column,
  hash-distributed by it and all co-located with ``session``, so that every row of one
  (namespace, actor) is on one shard and every hot call touches one shard;
- **reference** (:data:`REFERENCE_TABLES`): small tables every node needs whole (namespaces,
  models, secrets, the installer's own tables), replicated to every node; and the counters of
  ``aidb_memory.metrics()`` (issue 36), a few rows per label set that the worker bumps with an
  upsert (an upsert needs its whole key on one shard, and they belong to no actor) and a scrape
  reads whole;
- **by id** (:data:`BY_ID_TABLES`): the append-only logs ``model_usage`` and ``audit_log``.
  They grow with use (one row per model call, one per erasure), so not reference tables (every
  write would go to every node); they belong to no actor and must not carry its key (an erasure
  leaves no trace of the actor: ``audit_log`` keeps only an HMAC under the database's own key,
  and ``model_usage`` keeps its rows after ``forget``), so they are distributed by their own
  ``id``, each a co-location group of its own: an insert goes to one shard.

:func:`statements` is the exact list ``aidb-memory install --citus`` runs; :func:`violations`
checks a schema against the Citus rules that list relies on (tests/db/test_citus_schema.py runs
each check on the installed schema and on a table built to break it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import psycopg

from aidb_memory.connection import CliError
from aidb_memory.install import catalog

Connection = psycopg.Connection[tuple[Any, ...]]

SCHEMA = "aidb_memory"
KEY = "actor_key"
ANCHOR = "session"  # the first per-actor table: the co-location group of every other one

REFERENCE_TABLES = (
    "namespace",
    "namespace_grant",
    "model",
    "secret",
    "audit_key",
    "runtime_settings",
    "runtime_modules",
    "runtime_bytecode",
    "schema_migrations",
    "metric_event",
    "metric_model_call",
    "metric_model_latency",
    "metric_compaction",
    "metric_worker",
)
# In the order the foreign keys between them need: a referenced table before its referencing ones
# (turn references session and event; memory_history references memory and event).
PER_ACTOR_TABLES = (
    "session",
    "event",
    "turn",
    "summary",
    "memory",
    "memory_word",
    "memory_lexeme",
    "memory_history",
    "actor_lock",
    "compaction_lock",
    "compaction_failure",
    "compaction_ahead",
)
BY_ID_TABLES = ("model_usage", "audit_log")
BY_ID_COLUMN = "id"

# The triggers on per-actor tables (tests/db/test_citus_schema.py holds the catalog to this list,
# so that a new one is looked at against the Citus rules for triggers).
PER_ACTOR_TRIGGERS = (
    ("memory", "memory_words_added"),
    ("memory", "memory_words_removed"),
    ("memory", "memory_lexemes_counted"),
    ("memory", "memory_lexeme_keys"),
    ("session", "compaction_locks_removed"),
)

# Citus documentation the rules come from (docs/scaling.md quotes them).
DOCS = "https://docs.citusdata.com/en/stable/develop/reference_ddl.html"


@dataclass(frozen=True)
class Statement:
    table: str
    kind: str  # "reference", "per actor" or "by id"
    sql: str


def _qualified(table: str) -> str:
    return f"{SCHEMA}.{table}"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _name(table: str) -> str:
    return f"{_ident(SCHEMA)}.{_ident(table)}"


def statements() -> list[Statement]:
    """The calls that distribute every table: reference tables first (per-actor tables reference
    ``namespace``), then the per-actor tables in foreign-key order, ``session`` starting their
    co-location group, then the logs by id."""
    out = [
        Statement(t, "reference", f"SELECT pg_catalog.create_reference_table('{_qualified(t)}')")
        for t in REFERENCE_TABLES
    ]
    for t in PER_ACTOR_TABLES:
        colocate = "none" if t == ANCHOR else _qualified(ANCHOR)
        out.append(
            Statement(
                t,
                "per actor",
                f"SELECT pg_catalog.create_distributed_table('{_qualified(t)}', '{KEY}', "
                f"colocate_with => '{colocate}')",
            )
        )
    out += [
        Statement(
            t,
            "by id",
            f"SELECT pg_catalog.create_distributed_table('{_qualified(t)}', '{BY_ID_COLUMN}', "
            "colocate_with => 'none')",
        )
        for t in BY_ID_TABLES
    ]
    return out


# --- The catalog, read once --------------------------------------------------------------------

_TABLES = """
SELECT c.relname::text,
       EXISTS (SELECT 1 FROM pg_catalog.pg_constraint k
               WHERE k.conrelid = c.oid AND k.contype = 'p')
       OR c.relreplident = 'i'
FROM pg_catalog.pg_class c
WHERE c.relnamespace = pg_catalog.to_regnamespace(%(schema)s)::oid AND c.relkind IN ('r', 'p')
ORDER BY 1
"""
_COLUMNS = """
SELECT c.relname::text, a.attname::text, a.attnum, pg_catalog.format_type(a.atttypid, NULL),
       a.attnotnull, a.attidentity::text, a.attgenerated::text
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
WHERE c.relnamespace = pg_catalog.to_regnamespace(%(schema)s)::oid AND c.relkind IN ('r', 'p')
  AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY 1, 3
"""
_UNIQUE = """
SELECT c.relname::text, i.relname::text,
       (SELECT pg_catalog.array_agg(u.k ORDER BY u.n)
        FROM pg_catalog.unnest(x.indkey::int2[]) WITH ORDINALITY AS u(k, n)
        WHERE u.n <= x.indnkeyatts),
       x.indpred IS NOT NULL
FROM pg_catalog.pg_index x
JOIN pg_catalog.pg_class c ON c.oid = x.indrelid
JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
WHERE c.relnamespace = pg_catalog.to_regnamespace(%(schema)s)::oid
  AND (x.indisunique OR x.indisexclusion)
ORDER BY 1, 2
"""
_FOREIGN_KEYS = """
SELECT c.relname::text, k.conname::text, f.relname::text,
       k.conkey::int[], k.confkey::int[], k.confdeltype::text, k.confupdtype::text,
       coalesce(k.confdelsetcols::int[], '{}'), pg_catalog.pg_get_constraintdef(k.oid)
FROM pg_catalog.pg_constraint k
JOIN pg_catalog.pg_class c ON c.oid = k.conrelid
JOIN pg_catalog.pg_class f ON f.oid = k.confrelid
WHERE k.contype = 'f' AND c.relnamespace = pg_catalog.to_regnamespace(%(schema)s)::oid
ORDER BY 1, 2
"""
_TRIGGERS = """
SELECT c.relname::text, t.tgname::text, (t.tgtype::int & 1) = 1
FROM pg_catalog.pg_trigger t
JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = pg_catalog.to_regnamespace(%(schema)s)::oid AND NOT t.tgisinternal
ORDER BY 1, 2
"""
_SEQUENCES = """
SELECT c.relname::text, pg_catalog.format_type(s.seqtypid, NULL)
FROM pg_catalog.pg_sequence s
JOIN pg_catalog.pg_class c ON c.oid = s.seqrelid
WHERE c.relnamespace = pg_catalog.to_regnamespace(%(schema)s)::oid
ORDER BY 1
"""

_ACTIONS = {"a": "NO ACTION", "r": "RESTRICT", "c": "CASCADE", "n": "SET NULL", "d": "SET DEFAULT"}


@dataclass(frozen=True)
class ForeignKey:
    table: str
    name: str
    references: str
    columns: list[str]
    referenced: list[str]
    on_delete: str  # pg_constraint.confdeltype
    on_update: str
    delete_set: list[str]  # PG15's ON DELETE SET NULL (columns); empty: every column
    definition: str


@dataclass
class Catalog:
    """What the checks look at, for the tables of one schema."""

    schema: str
    primary: dict[str, bool]  # table -> has a primary key (or a replica identity index)
    columns: dict[str, dict[str, tuple[int, str, bool, str, str]]]  # name -> (num, type, ...)
    unique: list[tuple[str, str, list[str], bool]]  # table, index, key columns, partial
    foreign_keys: list[ForeignKey]
    triggers: list[tuple[str, str, bool]]  # table, trigger, row-level
    sequences: list[tuple[str, str]]  # sequence, type

    @property
    def tables(self) -> list[str]:
        return sorted(self.primary)

    @property
    def per_actor(self) -> list[str]:
        """The tables with an actor_key column: the ones distributed by it."""
        return [t for t in self.tables if KEY in self.columns[t]]

    def distribution_column(self, table: str) -> str | None:
        if KEY in self.columns.get(table, {}):
            return KEY
        if self.schema == SCHEMA and table in BY_ID_TABLES:
            return BY_ID_COLUMN
        return None


def read_catalog(conn: Connection, schema: str = SCHEMA) -> Catalog:
    p = {"schema": schema}
    primary = {str(r[0]): bool(r[1]) for r in conn.execute(_TABLES, p).fetchall()}
    columns: dict[str, dict[str, tuple[int, str, bool, str, str]]] = {t: {} for t in primary}
    by_num: dict[tuple[str, int], str] = {}
    for table, name, num, type_, notnull, identity, generated in conn.execute(
        _COLUMNS, p
    ).fetchall():
        columns[table][name] = (num, type_, notnull, identity, generated)
        by_num[(table, num)] = name

    def names(table: str, nums: Iterable[int] | None) -> list[str]:
        # 0 is an expression in an index's key: never a column.
        return [by_num.get((table, n), "(expression)") if n else "(expression)" for n in nums or []]

    unique = [
        (t, i, names(t, keys), bool(partial))
        for t, i, keys, partial in conn.execute(_UNIQUE, p).fetchall()
    ]
    fks = [
        ForeignKey(t, n, f, names(t, ck), names(f, fk), d, u, names(t, sets), definition)
        for t, n, f, ck, fk, d, u, sets, definition in conn.execute(_FOREIGN_KEYS, p).fetchall()
    ]
    triggers = [(str(t), str(n), bool(row)) for t, n, row in conn.execute(_TRIGGERS, p).fetchall()]
    sequences = [(str(s), str(t)) for s, t in conn.execute(_SEQUENCES, p).fetchall()]
    return Catalog(schema, primary, columns, unique, fks, triggers, sequences)


# --- The rules (docs/scaling.md, "The rules it follows") ---------------------------------------


def key_not_null(cat: Catalog) -> list[str]:
    """The distribution column: bigint (co-location needs one type), NOT NULL, not generated."""
    out = []
    for t in cat.per_actor:
        _num, type_, notnull, _identity, generated = cat.columns[t][KEY]
        if type_ != "bigint":
            out.append(f"{t}.{KEY} is {type_}, not bigint")
        if not notnull:
            out.append(f"{t}.{KEY} may be NULL")
        if generated:
            out.append(f"{t}.{KEY} is a generated column")
    return out


def no_identity(cat: Catalog) -> list[str]:
    """No identity column on a per-actor table (ids come from sequences), and bigint sequences
    only (a worker cannot take values of an int or smallint sequence)."""
    out = [
        f"{t}.{c} is an identity column"
        for t in cat.per_actor
        for c, (_n, _t, _nn, identity, _g) in cat.columns[t].items()
        if identity
    ]
    out += [f"sequence {s} is {t}, not bigint" for s, t in cat.sequences if t != "bigint"]
    return out


def unique_has_key(cat: Catalog) -> list[str]:
    """Every primary key, unique constraint and unique index (partial ones too) of a distributed
    table has its distribution column as a plain key column."""
    out = []
    for table, index, keys, partial in cat.unique:
        column = cat.distribution_column(table)
        if column and column not in keys:
            what = "partial unique index" if partial else "unique index"
            out.append(f"{what} {index} on {table} ({', '.join(keys)}) lacks {column}")
    return out


def _reference(cat: Catalog) -> set[str]:
    """The reference tables; in another schema (the tests' scratch ones), every table without
    actor_key."""
    if cat.schema == SCHEMA:
        return set(REFERENCE_TABLES)
    return {t for t in cat.tables if KEY not in cat.columns[t]}


def fk_between_actors(cat: Catalog) -> list[str]:
    """A foreign key between per-actor tables has actor_key at the same position on both sides;
    none goes from another table to a per-actor table; one from a per-actor table to another
    table goes to a reference table."""
    per_actor = set(cat.per_actor)
    out = []
    for fk in cat.foreign_keys:
        if fk.table in per_actor and fk.references in per_actor:
            same = any(
                a == KEY and b == KEY for a, b in zip(fk.columns, fk.referenced, strict=False)
            )
            if not same:
                out.append(
                    f"foreign key {fk.name} ({fk.table} -> {fk.references}) does not pair "
                    f"{KEY} with {KEY}"
                )
        elif fk.references in per_actor:
            out.append(
                f"foreign key {fk.name} goes from {fk.table}, which is not per actor, to "
                f"{fk.references}"
            )
        elif fk.table in per_actor and fk.references not in _reference(cat):
            out.append(
                f"foreign key {fk.name} goes from {fk.table} to {fk.references}, "
                "which is not a reference table"
            )
    return out


def fk_actions(cat: Catalog) -> list[str]:
    """Citus refuses, on a foreign key whose columns include the referencing table's distribution
    column, ON DELETE SET NULL / SET DEFAULT (even PG15's SET NULL (columns), which does not null
    the key: citusdata/citus#7132) and ON UPDATE other than NO ACTION / RESTRICT."""
    out = []
    for fk in cat.foreign_keys:
        column = cat.distribution_column(fk.table)
        if column is None or column not in fk.columns:
            continue
        if fk.on_delete in ("n", "d"):
            out.append(f"foreign key {fk.name} on {fk.table}: ON DELETE {_ACTIONS[fk.on_delete]}")
        if fk.on_update not in ("a", "r"):
            out.append(f"foreign key {fk.name} on {fk.table}: ON UPDATE {_ACTIONS[fk.on_update]}")
    return out


def set_null_keeps_key(cat: Catalog) -> list[str]:
    """An ON DELETE SET NULL between per-actor tables never nulls actor_key itself (it names its
    columns, PG15), and no ON UPDATE SET NULL / SET DEFAULT touches it."""
    out = []
    for fk in cat.foreign_keys:
        if fk.table not in cat.per_actor or KEY not in fk.columns:
            continue
        if fk.on_delete in ("n", "d") and (not fk.delete_set or KEY in fk.delete_set):
            out.append(f"foreign key {fk.name} on {fk.table} sets {KEY} on delete")
        if fk.on_update in ("n", "d"):
            out.append(f"foreign key {fk.name} on {fk.table} sets {KEY} on update")
    return out


def row_triggers_only(cat: Catalog) -> list[str]:
    """Triggers run on the shards (with citus.enable_unsafe_triggers): on a per-actor table only
    row-level ones, which can keep to their row's key; none on the other tables (a reference
    table's trigger runs on every node)."""
    per_actor = set(cat.per_actor)
    out = []
    for table, name, row in cat.triggers:
        if table not in per_actor:
            out.append(f"trigger {name} on {table}, which is not per actor")
        elif not row:
            out.append(f"trigger {name} on {table} is a statement trigger")
    return out


def has_primary_key(cat: Catalog) -> list[str]:
    """Shard moves (rebalancing) replicate logically: every table needs a primary key or a
    replica identity index."""
    return [f"{t} has no primary key" for t, ok in cat.primary.items() if not ok]


RULES: dict[str, Callable[[Catalog], list[str]]] = {
    "key_not_null": key_not_null,
    "no_identity": no_identity,
    "unique_has_key": unique_has_key,
    "fk_between_actors": fk_between_actors,
    "fk_actions": fk_actions,
    "set_null_keeps_key": set_null_keeps_key,
    "row_triggers_only": row_triggers_only,
    "has_primary_key": has_primary_key,
}


def classification(cat: Catalog) -> list[str]:
    """Every table of aidb_memory is of one known kind, and the per-actor ones (those with an
    actor_key column) are exactly :data:`PER_ACTOR_TABLES`: a table added by a later migration
    cannot be forgotten here."""
    out = []
    known = set(REFERENCE_TABLES) | set(PER_ACTOR_TABLES) | set(BY_ID_TABLES)
    out += [f"table {t} is of no kind known here" for t in cat.tables if t not in known]
    out += [f"table {t} does not exist" for t in sorted(known - set(cat.tables))]
    found, expected = set(cat.per_actor), set(PER_ACTOR_TABLES)
    out += [f"table {t} has {KEY} but is not per actor here" for t in sorted(found - expected)]
    out += [
        f"table {t} is per actor here but has no {KEY}"
        for t in sorted(expected - found)
        if t in cat.tables
    ]
    return out


def violations(cat: Catalog) -> list[str]:
    """Every rule broken, one line each."""
    return [line for rule in RULES.values() for line in rule(cat)]


# --- install --citus -------------------------------------------------------------------------

_CITUS_TABLES = """
SELECT c.relname::text, p.partmethod::text, p.repmodel::text,
       CASE WHEN p.partkey IS NULL OR p.partkey = '' THEN NULL
            ELSE pg_catalog.column_to_column_name(p.logicalrelid, p.partkey) END
FROM pg_catalog.pg_dist_partition p
JOIN pg_catalog.pg_class c ON c.oid = p.logicalrelid
WHERE c.relnamespace = pg_catalog.to_regnamespace(%(schema)s)::oid
"""

NO_CITUS = (
    "aidb-memory: install --citus: the citus extension is not installed in this database "
    "(hint: connect to the Citus coordinator, where CREATE EXTENSION citus was run and the "
    "workers were added; or run install without --citus; docs/scaling.md)"
)


def citus_version(conn: Connection) -> str | None:
    row = conn.execute(
        "SELECT extversion FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) "
        "'citus'"
    ).fetchone()
    return str(row[0]) if row else None


def distributed(conn: Connection) -> dict[str, tuple[str, str | None]]:
    """The Citus tables of the schema: table -> (kind, distribution column)."""
    out: dict[str, tuple[str, str | None]] = {}
    for table, method, repmodel, column in conn.execute(_CITUS_TABLES, {"schema": SCHEMA}):
        if method == "h":
            kind = "distributed"
        elif method == "n" and repmodel == "t":
            kind = "reference"
        elif method == "n" and column is None:
            kind = "local"  # a Citus local table (or a single-shard one)
        else:
            kind = f"partmethod {method}"
        out[str(table)] = (kind, column)
    return out


def _wanted(s: Statement) -> tuple[str, str | None]:
    if s.kind == "reference":
        return ("reference", None)
    return ("distributed", KEY if s.kind == "per actor" else BY_ID_COLUMN)


@dataclass(frozen=True)
class Plan:
    """What ``install --citus`` runs, in one transaction, on a database where some tables are
    not distributed yet: the foreign keys that involve one of them are dropped first (so that no
    table turns into a Citus local table half-way, which an identity column would not survive,
    and so that the order of the calls cannot trip over them) and added again at the end, when
    Citus checks each against its rules."""

    settings: list[str]
    drop: list[str]
    distribute: list[Statement]
    add: list[str]

    def sql(self) -> list[str]:
        return [*self.settings, *self.drop, *(s.sql for s in self.distribute), *self.add]


SETTINGS = [
    # The foreign keys to reference tables need one connection per node for the rest of the
    # transaction; sequential from the start, so that nothing parallel comes first.
    "SET LOCAL citus.multi_shard_modify_mode TO 'sequential'",
    # The row triggers of the per-actor tables go to the shards (docs/scaling.md, "Triggers").
    "SET LOCAL citus.enable_unsafe_triggers TO on",
]


# Functions pinned to generic plans (``SET plan_cache_mode = force_generic_plan``: search,
# get_memory, session_get and session_messages, whose statements cost more to plan than to run on
# one server). Citus runs a generic plan only of a
# statement on one table ("fast path"); of any other it cannot make one ("could not create
# distributed plan"), so it plans such statements for each call's values (which is how it routes
# them by the key). On Citus those functions plan each call.
_GENERIC_FUNCTIONS = """
SELECT p.oid::pg_catalog.regprocedure::text
FROM pg_catalog.pg_proc p
WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace(%(schema)s)::oid
  AND 'plan_cache_mode=force_generic_plan' OPERATOR(pg_catalog.=) ANY (p.proconfig)
ORDER BY 1
"""
CUSTOM_PLANS = "plan_cache_mode = force_custom_plan"


# Citus gives the plan of a statement over distributed tables an estimated cost far above
# jit_above_cost (100,000), so with PostgreSQL's default jit = on every such statement of a call
# was compiled by LLVM, for each call (custom plans are not kept): ~110 ms of an add through the
# coordinator, against ~8 ms without (bench/README.md, issue 37). Our statements are small and
# planned per call there; JIT never pays for itself in them. So on Citus every function of ours
# that runs statements (SECURITY DEFINER: each API function and its body) runs with jit = off.
_JIT_FUNCTIONS = """
SELECT p.oid::pg_catalog.regprocedure::text
FROM pg_catalog.pg_proc p
WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace(%(schema)s)::oid
  AND p.prosecdef
  AND NOT 'jit=off' OPERATOR(pg_catalog.=) ANY (COALESCE(p.proconfig, '{}'::text[]))
ORDER BY 1
"""
NO_JIT = "jit = off"


# add writes a plain batch in one statement, a WITH of an UPDATE feeding INSERT ... SELECTs: on
# Citus a plan in steps whose rows go to every worker as intermediate results, committed in two
# phases (20 remote commands). Its block has the same writes as statements Citus sends whole to
# the actor's shard, which it runs when aidb_memory.shard_routed is on (sql/31_add_fast.sql): on
# Citus the functions whose code reads that setting run with it on (bench/README.md, issue 37).
SHARD_ROUTED = "aidb_memory.shard_routed = on"
# A read inside a subtransaction (session_get's error handler, each of PL/Python's statements)
# makes Citus open a transaction block on the worker: BEGIN with the SAVEPOINT, the reads,
# RELEASE, COMMIT, three round trips more than the reads (5 remote commands for session_get's 2).
# The functions whose code reads citus.select_opens_transaction_block (to keep it on for a
# REPEATABLE READ caller: sql/30_sessions.sql) run with it off.
OWN_SNAPSHOTS = "citus.select_opens_transaction_block = off"
# Each setting: the text in a function's code that asks for it, and what install --citus says
# of a function it sets it on.
_SETTINGS_ASKED = {
    SHARD_ROUTED: ("aidb_memory.shard_routed", "writes by statements on one shard"),
    OWN_SNAPSHOTS: (
        "citus.select_opens_transaction_block",
        "reads without a transaction block on the worker",
    ),
}
_ASKING_FUNCTIONS = """
SELECT p.oid::pg_catalog.regprocedure::text
FROM pg_catalog.pg_proc p
WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace(%(schema)s)::oid
  AND p.prosecdef
  AND pg_catalog.strpos(p.prosrc, %(asks)s) OPERATOR(pg_catalog.>) 0
  AND NOT %(setting)s OPERATOR(pg_catalog.=) ANY (COALESCE(p.proconfig, '{}'::text[]))
ORDER BY 1
"""


def generic_plans(conn: Connection) -> list[str]:
    """The statements that make the functions pinned to generic plans plan each call instead,
    every SECURITY DEFINER function run without JIT, and the functions whose code asks for a
    setting of :data:`_SETTINGS_ASKED` run with it (none when the install made none, or after
    they ran)."""
    rows = conn.execute(_GENERIC_FUNCTIONS.encode(), {"schema": SCHEMA}).fetchall()
    jit = conn.execute(_JIT_FUNCTIONS.encode(), {"schema": SCHEMA}).fetchall()
    asked = [
        f"ALTER FUNCTION {r[0]} SET {setting}"
        for setting, (asks, _) in _SETTINGS_ASKED.items()
        for r in conn.execute(
            _ASKING_FUNCTIONS.encode(),
            {"schema": SCHEMA, "asks": asks, "setting": setting.replace(" = ", "=")},
        ).fetchall()
    ]
    return (
        [f"ALTER FUNCTION {r[0]} SET {CUSTOM_PLANS}" for r in rows]
        + [f"ALTER FUNCTION {r[0]} SET {NO_JIT}" for r in jit]
        + asked
    )


def plan(cat: Catalog, done: dict[str, tuple[str, str | None]]) -> Plan:
    """The statements still to run, given the Citus tables ``done``; refuses (CliError) a table
    that Citus already holds in another way than ours."""
    todo = []
    for s in statements():
        want = _wanted(s)
        have = done.get(s.table)
        if have is None or have[0] == "local":
            todo.append(s)
        elif have != want:
            raise CliError(
                f"aidb-memory: install --citus refused: {SCHEMA}.{s.table} is a Citus "
                f"{have[0]} table{f' by {have[1]}' if have[1] else ''}, not "
                f"{want[0]}{f' by {want[1]}' if want[1] else ''} (hint: undistribute_table it, "
                "then run install --citus again; docs/scaling.md)"
            )
    if not todo:
        return Plan([], [], [], [])
    pending = {s.table for s in todo}
    fks = [fk for fk in cat.foreign_keys if fk.table in pending or fk.references in pending]
    drop = [f"ALTER TABLE {_name(fk.table)} DROP CONSTRAINT {_ident(fk.name)}" for fk in fks]
    add = [
        f"ALTER TABLE {_name(fk.table)} ADD CONSTRAINT {_ident(fk.name)} {fk.definition}"
        for fk in fks
    ]
    return Plan(list(SETTINGS), drop, todo, add)


def check(cat: Catalog) -> None:
    """Refuse (CliError) a schema that is not what the statements expect or breaks a rule."""
    problems = classification(cat) + violations(cat)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CliError(
            f"aidb-memory: install --citus refused: {problems[0]}{more} "
            "(hint: this schema cannot be distributed as it is; "
            "`python -m aidb_memory.install.citus check` lists every problem; docs/scaling.md)"
        )


def require(conn: Connection) -> str:
    """The version of the citus extension; refuses (CliError) a database without it."""
    version = citus_version(conn)
    if version is None:
        raise CliError(NO_CITUS)
    return version


def _pin(conn: Connection) -> None:
    conn.execute("SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true)")


def distribute(conn: Connection, *, say: Callable[[str], None], dry_run: bool = False) -> list[str]:
    """``install --citus``, after the install: distribute every table not distributed yet, in
    one transaction; skip the rest. Returns the statements (run, or with ``dry_run`` printed)."""
    conn.rollback()
    _pin(conn)
    version = citus_version(conn) if dry_run else require(conn)
    cat = read_catalog(conn)
    if dry_run and version is None:
        say("citus: warning: the citus extension is not installed in this database")
    if dry_run and any(t not in cat.tables for t in (s.table for s in statements())):
        conn.rollback()
        # Not installed yet, or a migration to come adds a table: the plan is made after it.
        say("citus: would distribute after the install (and check the schema first):")
        lines = [s.sql for s in statements()]
        for line in lines:
            say(f"citus: would run: {line}")
        return lines
    check(cat)
    steps = plan(cat, distributed(conn) if version else {})
    custom = generic_plans(conn)
    conn.rollback()
    if dry_run:
        if not steps.distribute:
            say("citus: every table is distributed already")
        for line in steps.sql() + custom:
            say(f"citus: would run: {line}")
        return steps.sql() + custom
    if not steps.distribute:
        say(f"citus: every table is distributed already (Citus {version})")
        if custom:
            with conn.transaction():
                _pin(conn)
                _custom_plans(conn, custom, say)
                record(conn)
        return custom
    with conn.transaction():
        _pin(conn)
        for line in steps.settings + steps.drop:
            conn.execute(line.encode())
        for s in steps.distribute:
            try:
                conn.execute(s.sql.encode())
            except psycopg.Error as e:
                first = (e.diag.message_primary or str(e)).splitlines()[0]
                hint = e.diag.message_hint
                raise CliError(
                    f"aidb-memory: install --citus failed at {SCHEMA}.{s.table}: {first}"
                    + (f" (hint: {hint})" if hint else "")
                ) from e
            say(f"citus: {s.kind} table {SCHEMA}.{s.table}")
        for line in steps.add:
            conn.execute(line.encode())
        if steps.add:
            say(f"citus: {len(steps.add)} foreign keys added again (Citus checked each)")
        _custom_plans(conn, custom, say)
        # What verify compares with, as the install recorded it, now with what Citus added
        # (an internal trigger per table) and the plans above: the install just checked that
        # nothing else changed.
        record(conn)
    return steps.sql() + custom


def _custom_plans(conn: Connection, statements: list[str], say: Callable[[str], None]) -> None:
    """Run :func:`generic_plans`' statements (the install, run again, pins them again)."""
    without_jit = 0
    asked = []
    for line in statements:
        conn.execute(line.encode())
        function, setting = line.removeprefix("ALTER FUNCTION ").split(" SET ", 1)
        if setting == NO_JIT:
            without_jit += 1
        elif setting in _SETTINGS_ASKED:
            asked.append(f"citus: {function} {_SETTINGS_ASKED[setting][1]} ({setting})")
        else:
            say(f"citus: {function} plans each call ({setting})")
    if without_jit:
        say(f"citus: {without_jit} functions run without JIT ({NO_JIT})")
    for line in asked:
        say(line)


def record(conn: Connection) -> None:
    """Re-record the catalog the install recorded (``catalog_code``, ``catalog_schema``,
    ``catalog_fingerprint``), so that ``verify`` compares with the distributed tables.

    The values are read first and written as parameters: ``runtime_settings`` is a reference
    table by now, and Citus plans a write to it on its own, refusing a subquery over the system
    catalog in it (``relation pg_proc is not distributed``)."""
    queries = {
        "catalog_code": catalog.lines_query(catalog.CODE),
        "catalog_schema": catalog.lines_query(catalog.SCHEMA_PART),
        "catalog_fingerprint": f"SELECT {SCHEMA}.catalog_fingerprint()",
    }
    for key, query in queries.items():
        row = conn.execute(query.encode()).fetchone()
        assert row is not None
        conn.execute(
            f"UPDATE {SCHEMA}.runtime_settings SET value = %s, updated_at = pg_catalog.now() "
            "WHERE key OPERATOR(pg_catalog.=) %s",
            (row[0], key),
        )


def main(argv: list[str] | None = None) -> int:
    """``python -m aidb_memory.install.citus [statements|check] [DSN]``: print the statements, or
    check a database's schema against the rules, one line per problem."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    what = args[0] if args else "statements"
    if what == "statements":
        for s in statements():
            print(s.sql + ";")
        return 0
    if what == "check":
        from aidb_memory.connection import connect

        with connect(args[1] if len(args) > 1 else None) as conn:
            cat = read_catalog(conn)
            problems = classification(cat) + violations(cat)
        for p in problems:
            print(p)
        return 1 if problems else 0
    print("usage: python -m aidb_memory.install.citus [statements | check [DSN]]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
