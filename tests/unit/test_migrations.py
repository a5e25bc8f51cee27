"""Run-once migrations without a database: file names, lint, checksums."""

from __future__ import annotations

from pathlib import Path

import pytest

from aidb_memory.install.migrations import (
    SqlSourceError,
    canonical_checksum,
    load_migrations,
    parse_statements,
)
from aidb_memory.install.sources import default_tree

TABLE = "CREATE TABLE aidb_memory.t (id bigint PRIMARY KEY, label text NOT NULL DEFAULT 'x');\n"


def checksum(text: str) -> str:
    return canonical_checksum(parse_statements(Path("m.sql"), text))


def write(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def refused(directory: Path) -> str:
    with pytest.raises(SqlSourceError) as info:
        load_migrations(directory)
    return str(info.value)


# --- the package's own migrations ---------------------------------------------------------------


def test_the_package_migrations_load_in_order() -> None:
    migrations = load_migrations(default_tree().migrations_dir)
    names = [m.name for m in migrations]
    assert names
    assert names == sorted(names)
    assert names[0] == "0001_namespaces"
    for m in migrations:
        assert m.statements
        assert len(m.checksum) == 64
        assert m.checksum == checksum(m.path.read_text(encoding="utf-8"))


def test_statements_are_split_at_the_right_place_after_multibyte_characters(tmp_path: Path) -> None:
    text = (
        "-- § é ü\nCREATE TABLE t (a text DEFAULT 'é');\n"
        "/* ✓ */ INSERT INTO t VALUES ('§');\nSELECT 1"
    )
    (migration,) = load_migrations(write(tmp_path, {"0001_x.sql": text}))
    assert migration.statements == (
        "CREATE TABLE t (a text DEFAULT 'é')",
        "INSERT INTO t VALUES ('§')",
        "SELECT 1",
    )


# --- file names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "1_short_number.sql",
        "00001_long_number.sql",
        "0002-dash.sql",
        "0002_Upper.sql",
        "0002_space name.sql",
        "0002_.sql",
        "0002_upper_ext.SQL",
        "0002_no_extension",
        "0002_other.txt",
        "0002_backup.sql~",
        "add_column.sql",
    ],
)
def test_a_badly_named_file_is_refused_with_its_name(tmp_path: Path, name: str) -> None:
    directory = write(tmp_path, {"0001_ok.sql": TABLE, name: "SELECT 1;"})
    message = refused(directory)
    assert name in message
    assert "NNNN_lowercase_name.sql" in message


def test_hidden_files_and_a_readme_are_not_migrations(tmp_path: Path) -> None:
    directory = write(
        tmp_path, {"0001_ok.sql": TABLE, ".gitkeep": "", "README.md": "# migrations\n"}
    )
    assert [m.name for m in load_migrations(directory)] == ["0001_ok"]


def test_a_directory_among_migrations_is_refused(tmp_path: Path) -> None:
    directory = write(tmp_path, {"0001_ok.sql": TABLE})
    (directory / "0002_dir.sql").mkdir()
    assert "0002_dir.sql" in refused(directory)


def test_two_files_with_the_same_number_are_refused(tmp_path: Path) -> None:
    directory = write(
        tmp_path, {"0001_ok.sql": TABLE, "0002_a.sql": "SELECT 1;", "0002_b.sql": "SELECT 2;"}
    )
    message = refused(directory)
    assert "0002_a.sql" in message
    assert "0002_b.sql" in message
    assert "number 0002" in message


def test_migrations_are_ordered_by_number(tmp_path: Path) -> None:
    directory = write(
        tmp_path, {"0010_c.sql": "SELECT 3;", "0002_b.sql": "SELECT 2;", "0001_a.sql": "SELECT 1;"}
    )
    assert [m.name for m in load_migrations(directory)] == ["0001_a", "0002_b", "0010_c"]


def test_an_empty_migration_is_refused(tmp_path: Path) -> None:
    message = refused(write(tmp_path, {"0001_empty.sql": "-- nothing yet\n"}))
    assert "0001_empty.sql" in message
    assert "no statements" in message


def test_a_syntax_error_names_the_file(tmp_path: Path) -> None:
    message = refused(write(tmp_path, {"0001_bad.sql": "CREATE TABEL t (a int);"}))
    assert "0001_bad.sql" in message
    assert "syntax error" in message


def test_a_psql_meta_command_is_a_syntax_error(tmp_path: Path) -> None:
    assert "0001_meta.sql" in refused(write(tmp_path, {"0001_meta.sql": "\\set x 1\n" + TABLE}))


# --- lint ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("statement", "what"),
    [
        (
            "CREATE OR REPLACE FUNCTION aidb_memory.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            "CREATE OR REPLACE FUNCTION",
        ),
        (
            "create or replace function aidb_memory.f() returns int language sql as 'select 1'",
            "CREATE OR REPLACE FUNCTION",
        ),
        (
            "CREATE OR REPLACE PROCEDURE aidb_memory.p() LANGUAGE sql AS 'SELECT 1'",
            "CREATE OR REPLACE PROCEDURE",
        ),
        ("CREATE OR REPLACE VIEW aidb_memory.v AS SELECT 1 AS one", "CREATE OR REPLACE VIEW"),
    ],
)
def test_a_replaceable_object_in_a_migration_is_refused(
    tmp_path: Path, statement: str, what: str
) -> None:
    message = refused(write(tmp_path, {"0002_replace.sql": f"{TABLE}{statement};\n"}))
    assert message.startswith("0002_replace.sql: ")
    assert what in message
    assert "sql/" in message


def test_a_plain_create_function_is_allowed_in_a_migration(tmp_path: Path) -> None:
    # e.g. a helper that the migration uses once and drops; only replaceable ones go in sql/.
    text = (
        "CREATE FUNCTION aidb_memory.tmp() RETURNS int LANGUAGE sql AS 'SELECT 1';\n"
        "DROP FUNCTION aidb_memory.tmp();\n"
    )
    assert [m.name for m in load_migrations(write(tmp_path, {"0002_helper.sql": text}))] == [
        "0002_helper"
    ]


@pytest.mark.parametrize(
    "statement",
    [
        "BEGIN",
        "COMMIT",
        "ROLLBACK",
        "START TRANSACTION",
        "SAVEPOINT s",
        "RELEASE SAVEPOINT s",
        "end",
        "PREPARE TRANSACTION 'x'",
    ],
)
def test_transaction_control_in_a_migration_is_refused(tmp_path: Path, statement: str) -> None:
    message = refused(write(tmp_path, {"0003_tx.sql": f"{TABLE}{statement};\n"}))
    assert message.startswith("0003_tx.sql: ")
    assert "transaction" in message


@pytest.mark.parametrize(
    "statement",
    [
        "VACUUM aidb_memory.t",
        "CREATE INDEX CONCURRENTLY t_label ON aidb_memory.t (label)",
        "DROP INDEX CONCURRENTLY aidb_memory.t_label",
        "REINDEX (CONCURRENTLY) TABLE aidb_memory.t",
        "CREATE DATABASE other",
        "ALTER SYSTEM SET work_mem = '1MB'",
    ],
)
def test_what_cannot_run_in_a_transaction_is_refused(tmp_path: Path, statement: str) -> None:
    message = refused(write(tmp_path, {"0004_outside.sql": f"{TABLE}{statement};\n"}))
    assert message.startswith("0004_outside.sql: ")
    assert "transaction" in message


def test_analyze_and_a_plain_index_are_fine(tmp_path: Path) -> None:
    text = TABLE + "CREATE INDEX t_label ON aidb_memory.t (label);\nANALYZE aidb_memory.t;\n"
    assert load_migrations(write(tmp_path, {"0004_index.sql": text}))[0].statements[1:] == (
        "CREATE INDEX t_label ON aidb_memory.t (label)",
        "ANALYZE aidb_memory.t",
    )


# --- checksums ----------------------------------------------------------------------------------

MIGRATION = """-- Sessions.
CREATE TABLE aidb_memory.session (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL,
    budget      integer NOT NULL DEFAULT 4000 CHECK (budget > 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX session_name ON aidb_memory.session (name);
INSERT INTO aidb_memory.session (name) VALUES ('first');
"""

REFORMATTED = [
    # whitespace
    " ".join(MIGRATION.replace("-- Sessions.", "").split()),
    # comments
    "/* a block\n   comment */\n"
    + MIGRATION.replace("-- Sessions.", "-- Other words.")
    + "-- trailing comment\n",
    MIGRATION.replace("NOT NULL,", "NOT NULL, -- required\n"),
    # keyword case
    MIGRATION.replace("CREATE TABLE", "create table")
    .replace("NOT NULL", "not null")
    .replace("INSERT INTO", "insert into")
    .replace("VALUES", "values")
    .replace("DEFAULT", "Default"),
    # identifiers quoted without need, or in another case (both fold to the same name)
    MIGRATION.replace("aidb_memory.session (name);", '"aidb_memory"."session" ("name");'),
    MIGRATION.replace("integer", "INTEGER"),
    MIGRATION.replace("CREATE INDEX session_name", "CREATE INDEX SESSION_NAME"),
    # no final semicolon, extra semicolons
    MIGRATION.rstrip().rstrip(";"),
    MIGRATION.replace(");\nCREATE INDEX", ");;\n\nCREATE INDEX"),
]

EDITED = [
    MIGRATION.replace("4000", "4001"),  # a constant
    MIGRATION.replace("'first'", "'First'"),  # a string constant's case
    MIGRATION.replace("'first'", "'first '"),  # whitespace inside a string
    MIGRATION.replace("budget > 0", "budget >= 0"),
    MIGRATION.replace("name        text", "title       text").replace("(name)", "(title)"),
    MIGRATION.replace("integer", "bigint"),
    MIGRATION.replace(" NOT NULL,\n    budget", ",\n    budget"),
    MIGRATION.replace("CREATE INDEX session_name", "CREATE UNIQUE INDEX session_name"),
    MIGRATION.replace("CREATE INDEX session_name", 'CREATE INDEX "Session_Name"'),
    MIGRATION + "INSERT INTO aidb_memory.session (name) VALUES ('second');\n",
]


@pytest.mark.parametrize("text", REFORMATTED)
def test_the_checksum_is_stable_under_reformatting(text: str) -> None:
    assert text != MIGRATION
    assert checksum(text) == checksum(MIGRATION)


@pytest.mark.parametrize("text", EDITED)
def test_the_checksum_changes_with_the_meaning(text: str) -> None:
    assert text != MIGRATION
    assert checksum(text) != checksum(MIGRATION)


def test_the_checksum_changes_when_statements_are_reordered() -> None:
    a = "CREATE TABLE a (x int);\nCREATE TABLE b (x int);\n"
    b = "CREATE TABLE b (x int);\nCREATE TABLE a (x int);\n"
    assert checksum(a) != checksum(b)


def test_load_migrations_uses_the_same_checksum(tmp_path: Path) -> None:
    (one,) = load_migrations(write(tmp_path / "a", {"0001_s.sql": MIGRATION}))
    (two,) = load_migrations(write(tmp_path / "b", {"0001_s.sql": REFORMATTED[0]}))
    (three,) = load_migrations(write(tmp_path / "c", {"0001_s.sql": EDITED[0]}))
    assert one.checksum == two.checksum != three.checksum
    # What runs is the file's own text, statement by statement.
    assert one.statements[2] == "INSERT INTO aidb_memory.session (name) VALUES ('first')"
