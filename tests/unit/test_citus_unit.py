"""The Citus layer without a server: the statements that distribute the schema, their order, the
plan around them, the rules on a catalog built by hand, and docs/scaling.md quoting them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aidb_memory import cli
from aidb_memory.connection import CliError
from aidb_memory.install import citus
from aidb_memory.install.citus import Catalog, ForeignKey

REPO = Path(__file__).resolve().parents[2]
SCALING = REPO / "docs" / "scaling.md"

# The foreign keys between the tables (migrations 0001-0018): referencing -> referenced.
FOREIGN_KEYS = {
    "turn": {"session", "event"},
    "summary": {"session"},
    "memory": {"event", "namespace"},
    "memory_history": {"memory", "event", "namespace"},
    "session": {"namespace"},
    "event": {"namespace"},
    "memory_word": {"namespace"},
    "memory_lexeme": {"namespace"},
    "actor_lock": {"namespace"},
    "model_usage": {"namespace"},
}


def test_every_table_is_distributed_once_in_the_expected_way() -> None:
    statements = citus.statements()
    tables = [s.table for s in statements]
    assert len(tables) == len(set(tables)) == 28
    kinds = {s.table: s.kind for s in statements}
    assert {t for t, k in kinds.items() if k == "reference"} == {
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
    }
    assert {t for t, k in kinds.items() if k == "by id"} == {"model_usage", "audit_log"}
    assert {t for t, k in kinds.items() if k == "per actor"} == {
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


def test_the_exact_calls() -> None:
    by_table = {s.table: s.sql for s in citus.statements()}
    assert by_table["namespace"] == (
        "SELECT pg_catalog.create_reference_table('aidb_memory.namespace')"
    )
    assert by_table["session"] == (
        "SELECT pg_catalog.create_distributed_table('aidb_memory.session', 'actor_key', "
        "colocate_with => 'none')"
    )
    assert by_table["turn"] == (
        "SELECT pg_catalog.create_distributed_table('aidb_memory.turn', 'actor_key', "
        "colocate_with => 'aidb_memory.session')"
    )
    assert by_table["audit_log"] == (
        "SELECT pg_catalog.create_distributed_table('aidb_memory.audit_log', 'id', "
        "colocate_with => 'none')"
    )
    per_actor = [s for s in citus.statements() if s.kind == "per actor"]
    assert per_actor[0].table == "session"
    assert all("colocate_with => 'aidb_memory.session'" in s.sql for s in per_actor[1:])


def test_order_follows_the_foreign_keys() -> None:
    """Reference tables first; a referenced table before every table that references it."""
    order = [s.table for s in citus.statements()]
    kinds = [s.kind for s in citus.statements()]
    assert kinds == sorted(kinds, key=["reference", "per actor", "by id"].index)
    for referencing, referenced in FOREIGN_KEYS.items():
        for target in referenced:
            assert order.index(target) < order.index(referencing), (referencing, target)


def _catalog(**changes: object) -> Catalog:
    """A catalog of two per-actor tables and a reference one, as the rules want them."""
    cat = Catalog(
        schema="aidb_memory",
        primary={"session": True, "turn": True, "namespace": True},
        columns={
            "session": {
                "actor_key": (1, "bigint", True, "", ""),
                "id": (2, "bigint", True, "", ""),
            },
            "turn": {
                "actor_key": (1, "bigint", True, "", ""),
                "session_ref": (2, "bigint", True, "", ""),
                "seq": (3, "integer", True, "", ""),
            },
            "namespace": {"id": (1, "bigint", True, "a", "")},
        },
        unique=[
            ("session", "session_pkey", ["actor_key", "id"], False),
            ("turn", "turn_pkey", ["actor_key", "session_ref", "seq"], False),
            ("namespace", "namespace_pkey", ["id"], False),
        ],
        foreign_keys=[
            ForeignKey(
                "turn",
                "turn_session_ref_fkey",
                "session",
                ["actor_key", "session_ref"],
                ["actor_key", "id"],
                "c",
                "a",
                [],
                "FOREIGN KEY (actor_key, session_ref) "
                "REFERENCES aidb_memory.session(actor_key, id) ON DELETE CASCADE",
            )
        ],
        triggers=[("session", "t", True)],
        sequences=[("session_id_seq", "bigint")],
    )
    for name, value in changes.items():
        setattr(cat, name, value)
    return cat


def test_rules_pass_a_good_catalog_and_each_fails_a_bad_one() -> None:
    assert citus.violations(_catalog()) == []
    good = _catalog()
    fk = good.foreign_keys[0]
    bad = {
        "key_not_null": _catalog(
            columns={
                **good.columns,
                "turn": {**good.columns["turn"], "actor_key": (1, "integer", False, "", "")},
            }
        ),
        "no_identity": _catalog(sequences=[("s", "integer")]),
        "unique_has_key": _catalog(unique=[*good.unique, ("turn", "x", ["seq"], True)]),
        "fk_between_actors": _catalog(
            foreign_keys=[
                ForeignKey(
                    "turn",
                    "f",
                    "session",
                    ["session_ref", "actor_key"],
                    ["actor_key", "id"],
                    "c",
                    "a",
                    [],
                    "",
                )
            ]
        ),
        "fk_actions": _catalog(
            foreign_keys=[
                ForeignKey(**{**fk.__dict__, "on_delete": "n", "delete_set": ["session_ref"]})
            ]
        ),
        "set_null_keeps_key": _catalog(
            foreign_keys=[ForeignKey(**{**fk.__dict__, "on_delete": "n", "delete_set": []})]
        ),
        "row_triggers_only": _catalog(triggers=[("session", "t", False)]),
        "has_primary_key": _catalog(primary={**good.primary, "turn": False}),
    }
    assert set(bad) == set(citus.RULES)
    for rule, cat in bad.items():
        assert citus.RULES[rule](cat), rule


def test_plan_drops_and_adds_again_only_the_foreign_keys_of_tables_to_distribute() -> None:
    cat = _catalog()
    everything = citus.plan(cat, {})
    assert everything.settings == citus.SETTINGS
    assert [s.table for s in everything.distribute] == [s.table for s in citus.statements()]
    assert everything.drop == [
        'ALTER TABLE "aidb_memory"."turn" DROP CONSTRAINT "turn_session_ref_fkey"'
    ]
    assert everything.add == [
        'ALTER TABLE "aidb_memory"."turn" ADD CONSTRAINT "turn_session_ref_fkey" '
        + cat.foreign_keys[0].definition
    ]
    sql = everything.sql()
    assert sql.index(everything.drop[0]) < sql.index(everything.distribute[0].sql)
    assert sql.index(everything.distribute[-1].sql) < sql.index(everything.add[0])

    done = {s.table: citus._wanted(s) for s in citus.statements()}
    assert citus.plan(cat, done).sql() == []  # idempotent: nothing left to do
    some = {t: v for t, v in done.items() if t not in ("turn", "audit_log")}
    partial = citus.plan(cat, some)
    assert [s.table for s in partial.distribute] == ["turn", "audit_log"]
    assert len(partial.drop) == len(partial.add) == 1
    # A Citus local table (made by Citus itself from a foreign key to a reference table) is
    # distributed as if it were a plain one.
    assert [s.table for s in citus.plan(cat, {**some, "turn": ("local", None)}).distribute] == [
        "turn",
        "audit_log",
    ]
    untouched = {t: v for t, v in done.items() if t != "audit_log"}
    assert citus.plan(cat, untouched).drop == []


def test_plan_refuses_a_table_citus_holds_another_way() -> None:
    with pytest.raises(CliError, match=r"aidb_memory.session is a Citus reference table, not "):
        citus.plan(_catalog(), {"session": ("reference", None)})
    with pytest.raises(CliError, match=r"distributed table by id, not distributed by actor_key"):
        citus.plan(_catalog(), {"memory": ("distributed", "id")})


def test_classification_names_unknown_and_missing_tables() -> None:
    problems = citus.classification(_catalog())
    assert "table compaction_ahead does not exist" in problems
    cat = _catalog(
        primary={**_catalog().primary, "extra": True},
        columns={**_catalog().columns, "extra": {"actor_key": (1, "bigint", True, "", "")}},
    )
    problems = citus.classification(cat)
    assert "table extra is of no kind known here" in problems
    assert "table extra has actor_key but is not per actor here" in problems


def test_install_has_citus_option() -> None:
    args = cli.build_parser().parse_args(["install", "--citus", "--dry-run"])
    assert args.citus and args.dry_run
    assert not cli.build_parser().parse_args(["install"]).citus


def test_scaling_doc_quotes_the_statements_in_order() -> None:
    """docs/scaling.md shows the exact calls (its ```sql blocks are not run: Citus is not
    available to the tests); they must be the ones install --citus runs, in its order."""
    text = SCALING.read_text(encoding="utf-8")
    calls = re.findall(r"^SELECT pg_catalog\.create_\w+_table\(.*?\);$", text, flags=re.MULTILINE)
    assert calls == [s.sql + ";" for s in citus.statements()]
    for table in citus.REFERENCE_TABLES + citus.PER_ACTOR_TABLES + citus.BY_ID_TABLES:
        assert f"`{table}`" in text, table
