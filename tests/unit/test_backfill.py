"""Issue 36, item 6: migrations' backfill marks (lint) and the batched statements install runs
for them, without a database."""

from __future__ import annotations

from pathlib import Path

import pglast
import pytest

from aidb_memory.install.backfill import Backfill
from aidb_memory.install.migrations import SqlSourceError, load_migrations
from aidb_memory.install.sources import default_tree

TABLE = "CREATE TABLE aidb_memory.t (id bigint PRIMARY KEY, a text, b text);\n"


def load(tmp_path: Path, text: str) -> tuple[int, ...]:
    (tmp_path / "0001_x.sql").write_text(TABLE + text, encoding="utf-8")
    (migration,) = load_migrations(tmp_path)
    return migration.backfills


def test_the_package_marks_the_backfills_of_search_and_of_the_actor_key() -> None:
    marked = {
        m.name: [Backfill.parse(m.statements[i]).name for i in m.backfills]
        for m in load_migrations(default_tree().migrations_dir)
        if m.backfills
    }
    assert marked["0018_lexemes"] == ["memory", "memory"]
    assert marked["0026_metadata_entries"] == ["memory"]
    assert "memory" in marked["0015_actor_key"] and "turn" in marked["0015_actor_key"]


def test_a_mark_is_the_comment_line_right_before_the_statement(tmp_path: Path) -> None:
    text = (
        "-- backfill: b from a\nUPDATE aidb_memory.t SET b = a;\n"
        "UPDATE aidb_memory.t SET a = b;\n"
        "-- something else\n-- Backfill: with its reason\nUPDATE aidb_memory.t SET b = 'x';\n"
    )
    assert load(tmp_path, text) == (1, 3)


@pytest.mark.parametrize(
    ("statement", "refusal"),
    [
        ("DELETE FROM aidb_memory.t", "right before an UPDATE, not a DeleteStmt"),
        ("UPDATE aidb_memory.t SET a = b RETURNING id", "no WITH and no RETURNING"),
        (
            "WITH x AS (SELECT 1) UPDATE aidb_memory.t SET a = b",
            "no WITH and no RETURNING",
        ),
        (
            "UPDATE aidb_memory.t AS x SET a = y.b FROM aidb_memory.t AS y WHERE y.id = x.id + 1",
            "reads that table again",
        ),
        (
            "UPDATE aidb_memory.t SET a = (SELECT max(b) FROM aidb_memory.t)",
            "reads that table again",
        ),
    ],
)
def test_a_mark_on_what_batches_could_change_is_refused(
    tmp_path: Path, statement: str, refusal: str
) -> None:
    with pytest.raises(SqlSourceError) as info:
        load(tmp_path, f"-- backfill: no\n{statement};\n")
    assert "0001_x.sql" in str(info.value) and refusal in str(info.value)


def test_a_batch_adds_the_key_range_to_the_statement_s_own_condition() -> None:
    backfill = Backfill.parse(
        "UPDATE aidb_memory.memory AS x SET actor_key = aidb_memory.actor_key(n.name, x.actor_id) "
        "FROM aidb_memory.namespace AS n WHERE n.id = x.namespace_id OR false"
    )
    assert (backfill.table, backfill.ref, backfill.columns) == (
        '"aidb_memory"."memory"',
        "x",
        ("actor_key",),
    )
    key = [("actor_key", "bigint"), ("id", "bigint")]
    middle = backfill.batch(key, lower=True, upper=True)
    # The statement's condition stays whole (parenthesized), ANDed with the range.
    assert middle.endswith(
        "WHERE (n.id = x.namespace_id OR FALSE) "
        "AND ROW(x.actor_key, x.id) > ROW(CAST($1 AS bigint), CAST($2 AS bigint)) "
        "AND ROW(x.actor_key, x.id) <= ROW(CAST($3 AS bigint), CAST($4 AS bigint))"
    )
    first = backfill.batch(key, lower=False, upper=True)
    assert first.endswith(
        "WHERE (n.id = x.namespace_id OR FALSE) "
        "AND ROW(x.actor_key, x.id) <= ROW(CAST($1 AS bigint), CAST($2 AS bigint))"
    )
    last = backfill.batch(key, lower=True, upper=False)
    assert "> ROW(CAST($1 AS bigint), CAST($2 AS bigint))" in last and "<=" not in last
    # The rest of the statement is unchanged: the same tree without the range.
    assert pglast.parse_sql(backfill.batch(key, lower=False, upper=False))[0].stmt == (
        pglast.parse_sql(backfill.statement)[0].stmt
    )


def test_without_a_condition_the_range_is_the_condition() -> None:
    backfill = Backfill.parse("UPDATE aidb_memory.memory SET lexemes = to_tsvector(content)")
    assert backfill.ref == "memory"
    assert backfill.batch([("id", "bigint")], lower=True, upper=False).endswith(
        "WHERE ROW(memory.id) > ROW(CAST($1 AS bigint))"
    )
