"""Issue 36, item 6: an upgrade whose migrations backfill rows reports its progress (rows done of
total, rate, time left) on stderr, and the batches it runs them in give the database the one
statement gives (the script of ``aidb-memory sql`` run by psql). The release is this repository's
tree right before migration 0018 (search's lexemes for every memory) arrived."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_upgrade_actor_key import install_tree, tree_before

from aidb_memory.connection import CliError
from aidb_memory.install import backfill
from aidb_memory.install.installer import Package, install
from aidb_memory.install.script import render
from aidb_memory.progress import INTERVAL_ENV, Reporter
from aidb_memory.throwaway import ThrowawayServer
from conftest import Database, _create_database, _drop_database, psql, run_cli

NS = "upgrade_progress"
MIGRATION = "migrations/0018_lexemes.sql"
MEMORIES = 2500  # of 5 actors, in batches of 1,000 rows: 3 batches


@pytest.fixture(scope="module")
def release_before(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tree_before(MIGRATION, tmp_path_factory.mktemp("before-0018-progress"))


@pytest.fixture
def other_empty_db(pg_server: ThrowawayServer, template_db: Database) -> Iterator[Database]:
    database = _create_database(pg_server, "template0")
    try:
        yield database
    finally:
        _drop_database(database)


def _release_with_memories(db: Database, release: Path, count: int = MEMORIES) -> None:
    """The release installed, with ``count`` memories that are the same in every database
    (their ids, public ids and times fixed), some of them superseded."""
    install_tree(db, release)
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    db.sql(
        """INSERT INTO aidb_memory.memory
               (actor_key, namespace_id, actor_id, public_id, content, content_hash,
                valid_from, valid_to, created_at, updated_at)
           SELECT aidb_memory.actor_key(n.name, a.actor), n.id, a.actor, md5('m' || i)::uuid,
                  c.content, md5(c.content), '2026-01-01T00:00:00Z',
                  CASE WHEN i %% 7 = 0 THEN '2026-02-01T00:00:00Z'::timestamptz END,
                  '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z'
           FROM aidb_memory.namespace AS n
           CROSS JOIN generate_series(1, %s) AS i
           CROSS JOIN LATERAL (SELECT 'actor-' || i %% 5 AS actor) AS a
           CROSS JOIN LATERAL (SELECT format('Memory %%s: travelled to city %%s and played chess',
                                             i, i %% 97) AS content) AS c
           WHERE n.name = %s""",
        (count, NS),
    )


def _state(db: Database) -> dict[str, list[str]]:
    """Every row of the tables the backfills of 0018 and 0026 write, in a stable order."""
    out = {}
    for table in ("memory", "memory_lexeme", "memory_word"):
        out[table] = sorted(
            json.dumps(r, sort_keys=True, default=str)
            for (r,) in db.sql(f"SELECT to_jsonb(t) FROM aidb_memory.{table} AS t")
        )
    return out


def test_an_upgrade_reports_its_backfills_and_reaches_what_one_statement_does(
    empty_db: Database, other_empty_db: Database, release_before: Path
) -> None:
    batched, whole = empty_db, other_empty_db
    for db in (batched, whole):
        _release_with_memories(db, release_before)
    assert batched.value("SELECT count(*) FROM aidb_memory.memory") == MEMORIES

    out = io.StringIO()  # not a terminal: reported because forced, as --progress does
    reporter = Reporter(out, mode="always", interval_s=0)
    with batched.connect(autocommit=False) as conn:
        install(conn, Package.load(), say=lambda _line: None, progress=reporter, batch_rows=1000)
        conn.commit()
    result = psql(whole.dsn(), input=render(Package.load().steps()))
    assert result.returncode == 0, result.stderr

    lines = out.getvalue().splitlines()
    what = "migration 0018_lexemes: memory.lexemes: "
    lexemes = [line for line in lines if line.startswith(what)]
    assert [line.split(", ")[0].removeprefix(what) for line in lexemes] == [
        "1,000 of 2,500 rows (40%)",
        "2,000 of 2,500 rows (80%)",
        "2,500 of 2,500 rows (100%)",
        "done",
    ], lines
    assert "rows/s, about" in lexemes[0] and lexemes[0].endswith(" left")
    assert lexemes[-1].startswith(what + "done, 2,500 rows in ")
    for what in ("0018_lexemes: memory.lexeme_keys", "0026_metadata_entries: memory.lexeme_keys"):
        assert any(line.startswith(f"migration {what}: done, 2,500 rows") for line in lines), lines
    # The batches wrote what the one statement of psql's script wrote, row for row.
    assert _state(batched) == _state(whole)
    assert batched.value(
        "SELECT bool_and(lexemes = to_tsvector('english', content)) FROM aidb_memory.memory"
    )


def test_a_failure_half_way_leaves_the_migration_undone_and_a_second_install_does_it(
    empty_db: Database, release_before: Path
) -> None:
    db = empty_db
    _release_with_memories(db, release_before)
    # A trigger that fails on the memory of the last batch (the highest key); install drops
    # what is not its own, but only after the migrations.
    last = db.value("SELECT id FROM aidb_memory.memory ORDER BY actor_key DESC, id DESC LIMIT 1")
    db.sql(
        """CREATE FUNCTION public.fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN RAISE EXCEPTION 'half way'; END $$"""
    )
    db.sql(
        f"""CREATE TRIGGER fail_once BEFORE UPDATE ON aidb_memory.memory FOR EACH ROW
            WHEN (NEW.id = {int(last)}) EXECUTE FUNCTION public.fail_once()"""
    )
    out = io.StringIO()
    with db.connect(autocommit=False) as conn, pytest.raises(CliError, match="half way"):
        install(
            conn,
            Package.load(),
            say=lambda _line: None,
            progress=Reporter(out, mode="always", interval_s=0),
            batch_rows=1000,
        )
    # Two batches were done before the failure, and the whole install was rolled back.
    assert "memory.lexemes: 2,000 of 2,500 rows" in out.getvalue()
    assert db.value("SELECT to_regclass('aidb_memory.memory_lexeme')") is None
    assert not db.value(
        "SELECT count(*) FROM aidb_memory.schema_migrations WHERE name = '0018_lexemes'"
    )
    assert (
        db.value(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = 'aidb_memory.memory'::regclass "
            "AND attname = 'lexemes'"
        )
        == 0
    )

    db.sql("DROP TRIGGER fail_once ON aidb_memory.memory")
    install_tree(db, None)
    assert db.value(
        "SELECT bool_and(lexemes = to_tsvector('english', content)) FROM aidb_memory.memory"
    )
    assert db.value("SELECT count(*) FROM aidb_memory.memory") == MEMORIES


@pytest.mark.parametrize(
    ("flags", "progress", "steps"),
    [(("--progress",), True, True), ((), False, True), (("--progress", "--quiet"), False, False)],
)
def test_install_reports_on_a_pipe_only_when_asked_and_quiet_prints_nothing(
    empty_db: Database, release_before: Path, flags: tuple[str, ...], progress: bool, steps: bool
) -> None:
    _release_with_memories(empty_db, release_before, 300)
    # Every line at once (interval 0): the backfills here take well under the default 5 s.
    result = run_cli("install", *flags, dsn=empty_db.dsn(), env={INTERVAL_ENV: "0"})
    assert result.returncode == 0, result.stderr
    assert ("migration 0018_lexemes applied" in result.stdout) == steps
    lines = result.stderr.splitlines()
    if progress:
        assert any(
            line.startswith("migration 0018_lexemes: memory.lexemes: 300 of 300 rows (100%), ")
            for line in lines
        ), lines
        assert any(
            line.startswith("migration 0018_lexemes: memory.lexemes: done, 300 rows in ")
            for line in lines
        ), lines
    else:
        assert lines == []
    if not steps:
        assert result.stdout == ""
    assert empty_db.value(
        "SELECT bool_and(lexemes = to_tsvector('english', content)) FROM aidb_memory.memory"
    )


def test_each_batch_is_the_next_rows_of_the_key(db: Database) -> None:
    """The batches of a backfill follow the primary key, batch_rows rows each: each batch is one
    statement, so statement_timestamp() tells which batch wrote a row."""
    db.sql("CREATE TABLE public.t (a bigint, b text, c timestamptz, PRIMARY KEY (a, b))")
    db.sql(
        "INSERT INTO public.t (a, b) SELECT hashtext(i::text) % 50, 'row ' || i "
        "FROM generate_series(1, 2500) AS i"
    )
    out = io.StringIO()
    with db.connect(autocommit=False) as conn:
        backfill.run(
            conn,
            "UPDATE public.t SET c = statement_timestamp() WHERE a > -1000000000",
            what="test",
            reporter=Reporter(out, mode="always", interval_s=0),
            batch_rows=1000,
        )
        conn.commit()
    batches = [
        keys
        for (keys,) in db.sql(
            "SELECT array_agg(ROW(a, b)::text ORDER BY a, b) FROM public.t GROUP BY c ORDER BY c"
        )
    ]
    in_order = [key for (key,) in db.sql("SELECT ROW(a, b)::text FROM public.t ORDER BY a, b")]
    assert batches == [in_order[:1000], in_order[1000:2000], in_order[2000:]]
    assert [line.split(", ")[0] for line in out.getvalue().splitlines()] == [
        "test: t.c: 1,000 of 2,500 rows (40%)",
        "test: t.c: 2,000 of 2,500 rows (80%)",
        "test: t.c: 2,500 of 2,500 rows (100%)",
        "test: t.c: done",
    ]
