"""A migration may declare the checksums of earlier texts of itself that it supersedes
(migrations.py; issue 10, item 9): databases that applied one are not "edited after applied"."""

from __future__ import annotations

from pathlib import Path

import pytest

from aidb_memory.install.migrations import (
    SqlSourceError,
    canonical_checksum,
    load_migrations,
    parse_statements,
    superseded_checksums,
)
from aidb_memory.install.script import migration_steps
from aidb_memory.install.sources import default_tree

OLD = "CREATE TABLE aidb_memory.t (id bigint PRIMARY KEY);\n"
NEW = "CREATE TABLE aidb_memory.t (id bigint PRIMARY KEY, note text);\n"


def checksum(text: str) -> str:
    return canonical_checksum(parse_statements(Path("m.sql"), text))


def test_a_header_line_names_an_earlier_text(tmp_path: Path) -> None:
    old = checksum(OLD)
    (migration,) = load_migrations(
        _write(tmp_path, f"-- what it is\n-- supersedes: {old.upper()}\n--   why\n\n{NEW}")
    )
    assert migration.checksum == checksum(NEW), "the header does not change the checksum"
    assert migration.supersedes == (old,)
    assert migration.accepted == (checksum(NEW), old)


def test_without_the_header_only_its_own_checksum_is_accepted(tmp_path: Path) -> None:
    (migration,) = load_migrations(_write(tmp_path, NEW))
    assert migration.supersedes == ()
    assert migration.accepted == (migration.checksum,)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("-- supersedes: abc\n" + NEW, "64 hex digits"),
        ("-- supersedes:\n" + NEW, "64 hex digits"),
        (NEW + "-- supersedes: " + "a" * 64 + "\n", "belongs in the header"),
        ("-- supersedes: " + "a" * 64 + "\n-- supersedes: " + "A" * 64 + "\n" + NEW, "twice"),
    ],
)
def test_a_malformed_or_misplaced_line_is_refused(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(SqlSourceError) as info:
        load_migrations(_write(tmp_path, text))
    assert "0001_t.sql" in str(info.value) and problem in str(info.value)


def test_superseding_its_own_checksum_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SqlSourceError, match="supersedes its own checksum"):
        load_migrations(_write(tmp_path, f"-- supersedes: {checksum(NEW)}\n{NEW}"))


def test_the_parser_alone() -> None:
    c = "0123456789abcdef" * 4
    assert superseded_checksums(Path("x.sql"), f"--supersedes:{c}\n{NEW}") == (c,)
    assert superseded_checksums(Path("x.sql"), NEW) == ()


def test_the_install_script_accepts_every_superseded_checksum(tmp_path: Path) -> None:
    old = checksum(OLD)
    migrations = load_migrations(_write(tmp_path, f"-- supersedes: {old}\n{NEW}"))
    check = migration_steps(migrations)[0].sql
    assert f"('0001_t', ARRAY['{checksum(NEW)}', '{old}'])" in check
    assert "r.applied = ANY (r.expected)" in check


def test_0005_supersedes_the_text_first_released() -> None:
    """The text of 0005_memories.sql that required pg_trgm and btree_gin in pg_catalog."""
    (m,) = [m for m in load_migrations(default_tree().migrations_dir) if m.name == "0005_memories"]
    assert m.supersedes == ("6f5d8e2a6763f85670459adab9d8747a017c9bdc39710cff183674c62f4f4cd8",)


def _write(directory: Path, text: str) -> Path:
    (directory / "0001_t.sql").write_text(text, encoding="utf-8")
    return directory
