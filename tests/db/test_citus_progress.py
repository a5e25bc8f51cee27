"""Issue 36, item 6, on a real Citus cluster (tests/deployments.py): the batches that report
progress work on distributed tables too: namespace_update's re-index of a large namespace, and an
install's backfill (an UPDATE of a distributed table in batches of its key). Skipped without the
citus extension, as test_citus_cluster.py is."""

from __future__ import annotations

import io
import json

from test_citus_cluster import Node, cluster, node  # noqa: F401 (the cluster's fixtures)

from aidb_memory.install import backfill
from aidb_memory.progress import Reporter
from conftest import ADMIN_USER

NS = "citus_reindexed"


def test_a_reindex_of_a_distributed_namespace_reports_and_reindexes_every_memory(
    node: Node,  # noqa: F811
) -> None:
    node.sql("SELECT aidb_memory.init(%s)", (NS,))
    node.sql(
        """INSERT INTO aidb_memory.memory
               (actor_key, namespace_id, actor_id, content, content_hash, lexemes)
           SELECT aidb_memory.actor_key(%s, 'actor-' || (i %% 11)), n.id, 'actor-' || (i %% 11),
                  'The ' || i || ' travellers were flying', md5(i::text),
                  to_tsvector('english', 'The ' || i || ' travellers were flying')
           FROM generate_series(1, 2500) AS i,
                (SELECT id FROM aidb_memory.namespace WHERE name = %s) AS n""",
        (NS, NS),
    )
    notices: list[str] = []
    with node.connect(ADMIN_USER) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        conn.execute("SET aidb_memory.progress_interval = 0")
        conn.execute(
            "SELECT aidb_memory.namespace_update(%s, config => %s::jsonb)",
            (NS, json.dumps({"text_search_config": "simple"})),
        )
    assert [n.split(" memories")[0].split(": ")[-1] for n in notices] == [
        "1,000 of 2,500",
        "2,000 of 2,500",
        "done, 2,500",
    ], notices
    assert node.value(
        "SELECT bool_and(m.lexemes = to_tsvector('simple', m.content)) "
        "FROM aidb_memory.memory m JOIN aidb_memory.namespace n ON n.id = m.namespace_id "
        "WHERE n.name = %s",
        (NS,),
    )


def test_a_backfill_of_a_distributed_table_runs_in_batches(node: Node) -> None:  # noqa: F811
    node.sql("CREATE TABLE public.bf (k bigint, id bigint, c text, PRIMARY KEY (k, id))")
    node.sql("SELECT create_distributed_table('public.bf', 'k')")
    node.sql("INSERT INTO public.bf (k, id) SELECT i % 13, i FROM generate_series(1, 2500) AS i")
    out = io.StringIO()
    with node.connect(autocommit=False) as conn:
        backfill.run(
            conn,
            "UPDATE public.bf SET c = 'row ' || id::text",
            what="test",
            reporter=Reporter(out, mode="always", interval_s=0),
            batch_rows=1000,
        )
        conn.commit()
    assert [line.split(", ")[0] for line in out.getvalue().splitlines()] == [
        "test: bf.c: 1,000 of 2,500 rows (40%)",
        "test: bf.c: 2,000 of 2,500 rows (80%)",
        "test: bf.c: 2,500 of 2,500 rows (100%)",
        "test: bf.c: done",
    ]
    assert node.value("SELECT count(*) FROM public.bf WHERE c = 'row ' || id::text") == 2500
