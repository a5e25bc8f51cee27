"""Vectors with pgvector (issue 27), and without it.

``vector_db`` runs a test on both storages of embeddings: pgvector (skipped, with the reason,
where this PostgreSQL does not have it) and real[] (install --without-pgvector, the path of a
server without pgvector). Memories are inserted directly as the superuser (what the worker
writes); the fake OpenAI-compatible server (tests/fake_openai.py) answers /v1/embeddings with the
vector a test queues, so a query's "meaning" is the vector the test chose for it.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import psycopg
import pytest

from aidb_memory.client import AsyncMemory, Memory
from aidb_memory.install.installer import Package, install
from conftest import APP_USER, PGVECTOR_MISSING, Database, pgvector_available, run_cli
from fake_openai import FakeOpenAI, Reply

NS = "vec"
DIMS = 8


def _setup(db: Database, fake: FakeOpenAI, *models: str) -> None:
    for name in models or ("emb",):
        opts = {"model": "fake-embedding", "base_url": fake.base_url, "max_retries": 0}
        db.sql("SELECT aidb_memory.create_model(%s, 'openai', %s::jsonb)", (name, json.dumps(opts)))
    spec = {"embedding": (models or ("emb",))[0]}
    db.sql("SELECT aidb_memory.init(%s, %s::jsonb)", (NS, json.dumps(spec)))


def _memory(
    db: Database, content: str, embedding: list[float], actor: str = "alice", model: str = "emb"
) -> str:
    return str(
        db.value(
            """INSERT INTO aidb_memory.memory
                   (actor_key, namespace_id, actor_id, content, content_hash, embedding,
                    embedding_model, lexemes)
               VALUES (aidb_memory.actor_key(%s, %s),
                       (SELECT id FROM aidb_memory.namespace WHERE name = %s), %s, %s, md5(%s),
                       %s::real[], %s, to_tsvector('english', %s))
               RETURNING public_id::text""",
            (NS, actor, NS, actor, content, content, [float(x) for x in embedding], model, content),
        )
    )


def _many(db: Database, n: int, actor: str = "alice") -> None:
    """``n`` memories of the actor, newer than any before, about invoices (no word in common
    with the queries below), with vectors spread evenly over every direction (a deterministic
    hash of the row and dimension): the oldest memory has neighbours, as a real one does."""
    db.sql(
        """INSERT INTO aidb_memory.memory
               (actor_key, namespace_id, actor_id, content, content_hash, embedding,
                embedding_model, created_at, lexemes)
           SELECT aidb_memory.actor_key(%(ns)s, %(actor)s),
                  (SELECT id FROM aidb_memory.namespace WHERE name = %(ns)s), %(actor)s,
                  'Invoice ' || g || ' was paid in March', md5('invoice' || g),
                  ARRAY(SELECT (sin(g * 12.9898 + k * 78.233) * 43758.5453)::numeric %% 1 - 0.5
                        FROM generate_series(1, %(dims)s) AS k)::real[],
                  'emb', now() + g * interval '1 second',
                  to_tsvector('english', 'Invoice ' || g || ' was paid in March')
           FROM generate_series(1, %(n)s) AS g""",
        {"ns": NS, "actor": actor, "n": n, "dims": DIMS},
    )


def _axis(i: int, dims: int = DIMS) -> list[float]:
    return [1.0 if k == i else 0.0 for k in range(dims)]


def _ids(db: Database, query: str, actor: str = "alice", **kwargs: Any) -> list[str]:
    names = "".join(f', "{k}" => %({k})s' for k in kwargs)
    rows = db.sql(
        f"SELECT id::text FROM aidb_memory.search(%(ns)s, %(actor)s, %(query)s{names})",
        {"ns": NS, "actor": actor, "query": query, **kwargs},
        user=APP_USER,
    )
    return [r[0] for r in rows]


def _storage(db: Database) -> str:
    return str(
        db.value(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = 'aidb_memory.memory'::regclass AND attname = 'embedding'"
        )
    )


def _reinstall(db: Database, **options: Any) -> list[str]:
    lines: list[str] = []
    with db.connect(autocommit=False) as conn:
        install(conn, Package.load(), say=lines.append, **options)
        conn.commit()
    return lines


def _fails(db: Database, query: str, params: Any, sqlstate: str) -> str:
    with db.connect(APP_USER) as conn, pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    assert info.value.sqlstate == sqlstate, str(info.value)
    return str(info.value.diag.message_primary)


def _require_pgvector(db: Database) -> None:
    if not pgvector_available(db.server):
        pytest.skip(PGVECTOR_MISSING)


# --- both storages -----------------------------------------------------------------------------


def test_each_storage_is_what_its_install_made(
    vector_db: Database, request: pytest.FixtureRequest
) -> None:
    # pgvector's vector without a dimension (models of any dimension in one column), or real[].
    storage = request.node.callspec.params["vector_db"]
    assert _storage(vector_db) == ("vector" if storage == "pgvector" else "real[]")


def test_meaning_is_found_and_the_query_vector_is_cached(
    vector_db: Database, fake: FakeOpenAI
) -> None:
    _setup(vector_db, fake)
    rex = _memory(vector_db, "The customer owns a dog named Rex", _axis(0))
    _memory(vector_db, "Invoice 4411 was paid in March", _axis(1))
    fake.queue(Reply(embedding=[0.9, 0.1, 0, 0, 0, 0, 0, 0]))
    query = "SELECT id::text FROM aidb_memory.search(%s, 'alice', 'which animal companion')"
    with vector_db.connect(APP_USER) as conn:
        first = [r[0] for r in conn.execute(query, (NS,)).fetchall()]
        second = [r[0] for r in conn.execute(query, (NS,)).fetchall()]
    assert first[0] == rex and second == first
    # One embedding call for the same text in the same backend: the second search reused it.
    assert len(fake.calls("/embeddings")) == 1


def test_a_vector_the_application_has_costs_no_call(vector_db: Database, fake: FakeOpenAI) -> None:
    _setup(vector_db, fake)
    rex = _memory(vector_db, "The customer owns a dog named Rex", _axis(0))
    _memory(vector_db, "Invoice 4411 was paid in March", _axis(1))
    given = [0.9, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert _ids(vector_db, "which animal companion", query_embedding=given)[0] == rex
    assert fake.calls("/embeddings") == []
    call = "SELECT * FROM aidb_memory.search(%s, 'alice', 'pets', query_embedding => %s)"
    assert _fails(vector_db, call, (NS, [1.0, 0.0]), "22023") == (
        "aidb_memory.search: query_embedding has 2 dimensions, but the memories embedded with "
        'model "emb" have 8'
    )
    assert _fails(vector_db, call, (NS, [float("nan")] * 8), "22023") == (
        "aidb_memory.search: query_embedding[1] is not a finite number"
    )
    assert _fails(vector_db, call, (NS, []), "22023").startswith(
        "aidb_memory.search: query_embedding has 0 dimensions"
    )
    vector_db.sql("SELECT * FROM aidb_memory.namespace_update(%s, '{\"embedding\": null}')", (NS,))
    assert _fails(vector_db, call, (NS, given), "22023") == (
        'aidb_memory.search: query_embedding is given, but namespace "vec" has no embedding model'
    )


def test_a_zero_vector_matches_nothing_by_meaning(vector_db: Database, fake: FakeOpenAI) -> None:
    _setup(vector_db, fake)
    _memory(vector_db, "The customer owns a dog named Rex", _axis(0))
    # No cosine with a zero vector (pgvector: NaN): no vector candidate, and no word matches.
    assert _ids(vector_db, "which animal companion", query_embedding=[0.0] * DIMS) == []


def test_the_oldest_of_5000_memories_is_found_by_meaning_only_with_pgvector(
    vector_db: Database, fake: FakeOpenAI
) -> None:
    _setup(vector_db, fake)
    rex = _memory(vector_db, "The customer owns a dog named Rex", _axis(0))
    _many(vector_db, 5000)
    # The meaning of "which animal companion", which shares no word with any memory.
    given = [1.0, 0.05, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    found = rex in _ids(vector_db, "which animal companion", query_embedding=given)
    if _storage(vector_db) == "real[]":
        # What the docs say real[] cannot do: only the newest 1,000 memories are compared.
        assert not found
        return
    assert found
    # With the HNSW index of the dimension (install creates it for the stored dimensions), the
    # actor's 5,001 vectors (more than vectors.EXACT_MAX) are searched through it.
    lines = _reinstall(vector_db)
    assert (
        f"created the HNSW index aidb_memory.memory_embedding_{DIMS}_idx of vectors of 8 "
        "dimensions" in lines
    )
    before = _index_scans(vector_db, f"memory_embedding_{DIMS}_idx")
    with vector_db.connect(APP_USER, autocommit=False) as conn:
        conn.execute("SET LOCAL hnsw.ef_search = 77")
        rows = conn.execute(
            "SELECT id::text FROM aidb_memory.search(%s, 'alice', 'which animal companion', "
            "query_embedding => %s)",
            (NS, given),
        ).fetchall()
        # The index scan's settings were the statement's alone: the caller's are as they were.
        assert conn.execute("SHOW hnsw.ef_search").fetchone() == ("77",)
        assert conn.execute("SHOW enable_sort").fetchone() == ("on",)
        assert conn.execute("SHOW hnsw.iterative_scan").fetchone() == ("off",)
    assert rows[0][0] == rex
    assert _index_scans(vector_db, f"memory_embedding_{DIMS}_idx", more_than=before) > before


def test_a_selective_filter_still_returns_k_memories_by_meaning(
    vector_db: Database, fake: FakeOpenAI
) -> None:
    """Issue 34: the filter is a condition of the vector scan itself (with pgvector, the HNSW
    index's iterative scan goes on until enough memories it selects are found), not applied to
    the nearest memories afterwards."""
    _setup(vector_db, fake)
    _many(vector_db, 5100)  # more than vectors.EXACT_MAX: the HNSW index answers, with pgvector
    # One memory in 50 is the red team's; the query's meaning is nearest none of them.
    vector_db.sql(
        'UPDATE aidb_memory.memory SET metadata = \'{"team": "red"}\' '
        "WHERE substring(content from 'Invoice (\\d+)')::int % 50 = 0"
    )
    red = {
        r[0]
        for r in vector_db.sql(
            'SELECT public_id::text FROM aidb_memory.memory WHERE metadata = \'{"team": "red"}\''
        )
    }
    assert len(red) == 102
    if _storage(vector_db) != "real[]":
        _reinstall(vector_db)  # the HNSW index of the dimension
    before = _index_scans(vector_db, f"memory_embedding_{DIMS}_idx")
    found = _ids(
        vector_db,
        "which animal companion",
        query_embedding=_axis(0),
        filter=json.dumps({"team": "red"}),
    )
    assert len(found) == 10 and set(found) <= red, found
    unfiltered = _ids(vector_db, "which animal companion", query_embedding=_axis(0))
    assert len(unfiltered) == 10 and not set(unfiltered) <= red
    if _storage(vector_db) != "real[]":
        assert _index_scans(vector_db, f"memory_embedding_{DIMS}_idx", more_than=before) > before


def test_a_page_past_the_first_is_still_found_by_meaning(
    vector_db: Database, fake: FakeOpenAI
) -> None:
    """The HNSW scan asks for as many memories as the page searched (limit plus offset, up to
    vectors.HNSW_MAX_CANDIDATES), not a fixed few: the fifth page of ten of a query whose words no
    memory has is the fifth ten by meaning (before, 40 candidates: an empty page)."""
    _setup(vector_db, fake)
    _many(vector_db, 5100)
    if _storage(vector_db) != "real[]":
        _reinstall(vector_db)  # the HNSW index of the dimension
    # The memories search compares: without pgvector, the newest 1,000 (vectors.VECTOR_WINDOW).
    window = 1000 if _storage(vector_db) == "real[]" else 5100
    nearest = [
        r[0]
        for r in vector_db.sql(
            "SELECT m.public_id::text FROM (SELECT * FROM aidb_memory.memory "
            "ORDER BY created_at DESC LIMIT %s) AS m "
            "ORDER BY (m.embedding::real[])[1] / sqrt((SELECT sum(x * x) "
            "FROM unnest(m.embedding::real[]) AS x)) DESC LIMIT 100",
            (window,),
        )
    ]
    first = _ids(vector_db, "which animal companion", query_embedding=_axis(0))
    fifth = _ids(vector_db, "which animal companion", query_embedding=_axis(0), offset=40)
    assert len(first) == 10 and len(fifth) == 10, (first, fifth)
    assert not set(first) & set(fifth)
    # Approximate (HNSW), so within the nearest 100 rather than exactly the 41st to 50th.
    assert set(fifth) <= set(nearest), fifth


def _index_scans(db: Database, index: str, more_than: int | None = None) -> int:
    """The index's scans as the statistics say, waiting (up to 10 s) for more than
    ``more_than`` (a backend reports its counts when it ends)."""
    deadline = time.monotonic() + 10
    while True:
        with db.connect() as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = %s", (index,)
            ).fetchone()
        n = int(row[0]) if row else 0
        if more_than is None or n > more_than or time.monotonic() > deadline:
            return n
        time.sleep(0.2)


# --- pgvector only -----------------------------------------------------------------------------


def test_models_of_two_dimensions_share_the_column(db: Database, fake: FakeOpenAI) -> None:
    _require_pgvector(db)
    _setup(db, fake, "emb", "emb-large")
    _memory(db, "The customer owns a dog named Rex", _axis(0), actor="alice")
    _reinstall(db)  # the 8-dimension HNSW index: it must not refuse vectors of another dimension
    db.sql('SELECT * FROM aidb_memory.namespace_update(%s, \'{"embedding": "emb-large"}\')', (NS,))
    cat = _memory(db, "Bob has a cat called Miso", _axis(0, 12), actor="bob", model="emb-large")
    _memory(db, "Bob pays by card", _axis(5, 12), actor="bob", model="emb-large")
    assert _ids(db, "pet", actor="bob", query_embedding=[0.8] + [0.1] * 11)[0] == cat
    # Alice's vectors are of the old model: never compared, refused as before.
    message = _fails(db, "SELECT * FROM aidb_memory.search(%s, 'alice', 'pet')", (NS,), "55000")
    assert 'embedded with model "emb"' in message
    assert sorted(db.sql("SELECT DISTINCT vector_dims(embedding) FROM aidb_memory.memory")) == [
        (8,),
        (12,),
    ]
    assert (
        "created the HNSW index aidb_memory.memory_embedding_12_idx of vectors of 12 "
        "dimensions" in _reinstall(db)
    )
    # The build may run in parallel; the table keeps migration 0020's no parallel plans after it.
    assert db.value(
        "SELECT reloptions FROM pg_class WHERE oid = 'aidb_memory.memory'::regclass"
    ) == ["parallel_workers=0"]


def test_install_moves_real_embeddings_to_pgvector(real_db: Database, fake: FakeOpenAI) -> None:
    """An upgrade of a database that stored real[] (installed before pgvector was): install
    converts the stored vectors, and search finds by meaning through pgvector."""
    _require_pgvector(real_db)
    _setup(real_db, fake)
    rex = _memory(real_db, "The customer owns a dog named Rex", [0.6, 0.8, 0, 0, 0, 0, 0, 0])
    _memory(real_db, "Invoice 4411 was paid in March", _axis(1))
    assert _storage(real_db) == "real[]"
    assert "pgvector" not in " ".join(_reinstall(real_db, pgvector=False))
    assert _storage(real_db) == "real[]"
    lines = _reinstall(real_db)
    assert "embeddings are stored as pgvector values now (memory.embedding: vector)" in lines
    assert _storage(real_db) == "vector"
    assert real_db.value(
        "SELECT embedding::real[] FROM aidb_memory.memory WHERE public_id = %s", (rex,)
    ) == pytest.approx([0.6, 0.8, 0, 0, 0, 0, 0, 0])
    assert _ids(real_db, "which animal companion", query_embedding=_axis(0))[0] == rex
    # Nothing more to do on the next install; verify sees no drift.
    assert not [line for line in _reinstall(real_db) if "pgvector" in line or "HNSW" in line]
    verify = run_cli("verify", dsn=real_db.dsn())
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_uninstall_drops_the_vector_extension_install_created(db: Database) -> None:
    _require_pgvector(db)
    assert db.value("SELECT value FROM aidb_memory.runtime_settings WHERE key = 'created_vector'")
    result = run_cli("uninstall", "--yes", dsn=db.dsn())
    assert result.returncode == 0, result.stderr
    assert "dropped extension vector" in result.stdout
    assert db.value("SELECT count(*) FROM pg_extension WHERE extname = 'vector'") == 0


def test_the_clients_pass_the_query_vector(vector_db: Database, fake: FakeOpenAI) -> None:
    _setup(vector_db, fake)
    rex = _memory(vector_db, "The customer owns a dog named Rex", _axis(0))
    _memory(vector_db, "Invoice 4411 was paid in March", _axis(1))
    given = (0.9, 0.1, 0, 0, 0, 0, 0, 0)  # any sequence of numbers
    with Memory(vector_db.dsn(APP_USER)) as m:
        assert str(m.search(NS, "alice", "animal companion", query_embedding=given)[0].id) == rex

    async def run() -> str:
        async with AsyncMemory(vector_db.dsn(APP_USER)) as m:
            hits = await m.search(NS, "alice", "animal companion", query_embedding=given)
            return str(hits[0].id)

    assert asyncio.run(run()) == rex
    assert fake.calls("/embeddings") == []


def test_doctor_says_which_storage_and_what_the_other_would_change(
    vector_db: Database, fake: FakeOpenAI, request: pytest.FixtureRequest
) -> None:
    result = run_cli("doctor", dsn=vector_db.dsn())
    line = next(x for x in result.stdout.splitlines() if x.split()[1:2] == ["vectors"])
    if request.node.callspec.params["vector_db"] == "real[]":
        assert line.startswith("ok       vectors     real[] (installed --without-pgvector): ")
        assert "newest 1,000 memories" in line
        assert "`aidb-memory install` moves the embeddings to it" in line
        return
    assert line.startswith("ok       vectors     pgvector 0.8.6 (schema pg_catalog): ")
    assert "HNSW indexes: none" in line and "without pgvector, search compares" in line
    # A stored dimension without its HNSW index is named, with the fix.
    _setup(vector_db, fake)
    _memory(vector_db, "The customer owns a dog named Rex", _axis(0))
    result = run_cli("doctor", dsn=vector_db.dsn())
    lines = result.stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.split()[1:2] == ["vectors"])
    assert lines[at].startswith("partial  vectors     pgvector")
    assert "vectors of 8 dimensions have no HNSW index" in lines[at]
    assert lines[at + 1].strip().startswith("fix: aidb-memory install creates the HNSW index")
    _reinstall(vector_db)
    result = run_cli("doctor", dsn=vector_db.dsn())
    line = next(x for x in result.stdout.splitlines() if x.split()[1:2] == ["vectors"])
    assert line.startswith("ok") and "HNSW indexes: 8 dimensions" in line


def test_install_without_pgvector_keeps_real_embeddings(real_db: Database) -> None:
    """The command line's --without-pgvector, on a database that kept real[]: nothing moves."""
    _require_pgvector(real_db)
    result = run_cli("install", "--without-pgvector", dsn=real_db.dsn())
    assert result.returncode == 0, result.stderr
    assert "pgvector" not in result.stdout and _storage(real_db) == "real[]"
    script = run_cli("sql", "--without-pgvector", dsn=real_db.dsn())
    assert script.returncode == 0 and "CREATE EXTENSION vector" not in script.stdout
    assert "CREATE EXTENSION vector" in run_cli("sql", dsn=real_db.dsn()).stdout
