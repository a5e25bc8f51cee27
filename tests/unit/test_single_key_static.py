"""Issue 15, item 3, statically: every statement of the server code on a per-actor table touches
one actor's rows by the distribution key (tests/actor_key_rule.py has the rule and the checker).

The first tests hold the checker itself to small statements, good and bad; the last ones run it
over every statement of plpython/ and sql/ and print what is left, one line per table occurrence:
file:line [owner] `first line of the statement`: table AS alias: what is missing. [hot] marks a
statement that a hot API function reaches.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import actor_key_rule as rule
from actor_key_rule import check_sql

REPO = Path(__file__).resolve().parents[2]


def _missing(sql: str, **options: object) -> list[str]:
    """The aliases whose key the checker finds unconstrained, with INSERT findings by table."""
    return sorted(
        v.alias if "not constrained" in v.missing else f"{v.table}: {v.missing.split(' ')[0]}"
        for v in check_sql(sql, **options)
    )


# --- the checker, on statements of its own ----------------------------------------------------


def test_a_filter_on_the_key_passes_and_its_absence_fails() -> None:
    assert not _missing("SELECT s.id FROM aidb_memory.session s WHERE s.actor_key = $1")
    assert not _missing("SELECT id FROM aidb_memory.session WHERE actor_key = $1 AND id = $2")
    assert _missing("SELECT s.id FROM aidb_memory.session s WHERE s.id = $1") == ["s"]
    # namespace and actor filters are kept, but they are not the key
    assert _missing(
        "SELECT id FROM aidb_memory.session WHERE namespace_id = $1 AND actor_id = $2"
    ) == ["session"]


def test_a_cast_parameter_or_constant_counts_but_not_a_set_of_keys() -> None:
    assert not _missing("SELECT 1 FROM aidb_memory.turn t WHERE t.actor_key = $1::bigint")
    assert not _missing("SELECT 1 FROM aidb_memory.turn t WHERE $1 = t.actor_key")
    assert not _missing("SELECT 1 FROM aidb_memory.turn t WHERE t.actor_key = 42")
    assert not _missing("SELECT 1 FROM aidb_memory.turn t WHERE t.actor_key IN ($1)")
    assert _missing("SELECT 1 FROM aidb_memory.turn t WHERE t.actor_key = ANY($1)") == ["t"]
    assert _missing("SELECT 1 FROM aidb_memory.turn t WHERE t.actor_key IN ($1, $2)") == ["t"]
    assert _missing("SELECT 1 FROM aidb_memory.turn t WHERE t.actor_key <> $1") == ["t"]


def test_only_top_level_and_conjuncts_count() -> None:
    assert _missing("SELECT 1 FROM aidb_memory.session s WHERE s.actor_key = $1 OR s.id = $2") == [
        "s"
    ]
    assert _missing(
        "SELECT 1 FROM aidb_memory.session s WHERE NOT (s.actor_key = $1) AND s.id = $2"
    ) == ["s"]
    assert not _missing(
        "SELECT 1 FROM aidb_memory.session s WHERE (s.id = $2 AND s.actor_key = $1) AND true"
    )


def test_the_key_must_not_be_computed_from_a_joined_namespace_row() -> None:
    sql = """
        SELECT s.id FROM aidb_memory.session s JOIN aidb_memory.namespace n ON n.id = s.namespace_id
        WHERE n.name = $1 AND s.actor_key = aidb_memory.actor_key(n.id, $2)
    """
    assert _missing(sql) == ["s"]
    # computed from parameters only: a value like any other
    assert not _missing(
        "SELECT 1 FROM aidb_memory.session s WHERE s.actor_key = aidb_memory.actor_key($1, $2)"
    )


def test_joins_chain_the_key_from_a_constrained_table() -> None:
    good = """
        SELECT t.seq FROM aidb_memory.session s
        JOIN aidb_memory.turn t ON t.actor_key = s.actor_key AND t.session_ref = s.id
        WHERE s.actor_key = $1 AND s.session_id = $2
    """
    assert not _missing(good)
    # joined on the surrogate id only: the turn is read without the key
    bad = """
        SELECT t.seq FROM aidb_memory.session s
        JOIN aidb_memory.turn t ON t.session_ref = s.id
        WHERE s.actor_key = $1
    """
    assert _missing(bad) == ["t"]
    # a chain of equalities, in any order and through WHERE
    chain = """
        SELECT 1 FROM aidb_memory.turn t, aidb_memory.summary x, aidb_memory.session s
        WHERE x.actor_key = t.actor_key AND t.actor_key = s.actor_key AND s.actor_key = $1
    """
    assert not _missing(chain)
    # two tables equal to each other and to nothing else
    assert _missing(
        "SELECT 1 FROM aidb_memory.turn t JOIN aidb_memory.summary x ON x.actor_key = t.actor_key"
    ) == ["t", "x"]


def test_using_joins_on_the_key() -> None:
    assert not _missing(
        "SELECT 1 FROM aidb_memory.turn t JOIN aidb_memory.summary x USING (actor_key) "
        "WHERE t.actor_key = $1"
    )
    assert _missing(
        "SELECT 1 FROM aidb_memory.turn t JOIN aidb_memory.summary x USING (session_ref) "
        "WHERE t.actor_key = $1"
    ) == ["x"]


def test_an_outer_join_constrains_its_nullable_side_only() -> None:
    good = """
        SELECT 1 FROM aidb_memory.session s
        LEFT JOIN aidb_memory.compaction_ahead l
               ON l.actor_key = s.actor_key AND l.session_ref = s.id
        WHERE s.actor_key = $1
    """
    assert not _missing(good)
    # the preserved side is not filtered by the ON of a LEFT JOIN
    bad = """
        SELECT 1 FROM aidb_memory.session s
        LEFT JOIN aidb_memory.compaction_ahead l ON l.actor_key = $1 AND s.actor_key = l.actor_key
    """
    assert _missing(bad) == ["s"]
    right = """
        SELECT 1 FROM aidb_memory.compaction_ahead l
        RIGHT JOIN aidb_memory.session s ON l.actor_key = s.actor_key
        WHERE s.actor_key = $1
    """
    assert not _missing(right)


def test_subqueries_anywhere_are_checked_and_constrain_only_themselves() -> None:
    # a scalar subquery in the select list, unconstrained
    assert _missing(
        "SELECT s.id, (SELECT count(*) FROM aidb_memory.turn t WHERE t.session_ref = s.id) "
        "FROM aidb_memory.session s WHERE s.actor_key = $1"
    ) == ["t"]
    # a correlated subquery chained to the outer, constrained row
    assert not _missing(
        "SELECT s.id, (SELECT count(*) FROM aidb_memory.turn t "
        "WHERE t.actor_key = s.actor_key AND t.session_ref = s.id) "
        "FROM aidb_memory.session s WHERE s.actor_key = $1"
    )
    # a subquery's WHERE never constrains the outer table
    assert _missing(
        "SELECT 1 FROM aidb_memory.session s WHERE EXISTS (SELECT 1 FROM aidb_memory.turn t "
        "WHERE t.actor_key = $1 AND s.actor_key = t.actor_key)"
    ) == ["s"]
    # a subquery in FROM, its rows named by alias and star
    assert not _missing(
        "SELECT f.seq FROM (SELECT t.* FROM aidb_memory.turn t WHERE t.actor_key = $1) AS f"
    )
    assert _missing(
        "SELECT f.seq FROM (SELECT t.* FROM aidb_memory.turn t) AS f WHERE f.actor_key = $1"
    ) == ["t"]
    # HAVING, ORDER BY and CASE hold subqueries too
    assert _missing(
        "SELECT 1 FROM aidb_memory.session s WHERE s.actor_key = $1 "
        "ORDER BY (SELECT max(seq) FROM aidb_memory.turn t)"
    ) == ["t"]


def test_in_subquery_carries_the_key_to_the_outer_table() -> None:
    good = """
        DELETE FROM aidb_memory.compaction_lock AS l
        WHERE (l.actor_key, l.session_ref) IN (
            SELECT c.actor_key, c.session_ref FROM aidb_memory.compaction_lock AS c
            WHERE c.actor_key = $1 FOR UPDATE OF c SKIP LOCKED)
    """
    assert not _missing(good)
    bad = """
        DELETE FROM aidb_memory.compaction_lock AS l
        WHERE l.session_ref IN (
            SELECT c.session_ref FROM aidb_memory.compaction_lock AS c
            WHERE c.actor_key = $1 FOR UPDATE OF c SKIP LOCKED)
    """
    assert _missing(bad) == ["l"]
    assert not _missing(
        "SELECT 1 FROM aidb_memory.memory m WHERE m.actor_key = "
        "(SELECT s.actor_key FROM aidb_memory.session s WHERE s.actor_key = $1 LIMIT 1)"
    )
    assert _missing(
        "SELECT 1 FROM aidb_memory.memory m WHERE m.actor_key NOT IN "
        "(SELECT s.actor_key FROM aidb_memory.session s WHERE s.actor_key = $1)"
    ) == ["m"]


def test_ctes_pass_the_key_on_and_are_checked_themselves() -> None:
    good = """
        WITH s AS (SELECT actor_key, id FROM aidb_memory.session WHERE actor_key = $1 AND id = $2)
        SELECT t.seq FROM aidb_memory.turn t JOIN s ON t.actor_key = s.actor_key
    """
    assert not _missing(good)
    bad = """
        WITH s AS (SELECT actor_key, id FROM aidb_memory.session WHERE id = $2)
        SELECT t.seq FROM aidb_memory.turn t JOIN s ON t.actor_key = s.actor_key
    """
    assert _missing(bad) == ["session", "t"]
    # a data-modifying CTE and its RETURNING, with renamed columns
    returning = """
        WITH d(k, ref) AS (DELETE FROM aidb_memory.session WHERE actor_key = $1
                           RETURNING actor_key, id)
        SELECT count(*) FROM aidb_memory.turn t, d WHERE t.actor_key = d.k
    """
    assert not _missing(returning)


def test_update_and_delete_filter_their_target() -> None:
    assert _missing("UPDATE aidb_memory.session SET closed_at = now() WHERE id = $1") == ["session"]
    assert not _missing(
        "UPDATE aidb_memory.session SET closed_at = now() WHERE actor_key = $2 AND id = $1"
    )
    assert not _missing(
        "UPDATE aidb_memory.session s SET total_chars = x.n FROM (SELECT 1 AS n) x "
        "WHERE s.actor_key = $1"
    )
    assert _missing("DELETE FROM aidb_memory.summary WHERE session_ref = $1") == ["summary"]
    assert not _missing(
        "DELETE FROM aidb_memory.turn t USING aidb_memory.session s "
        "WHERE s.actor_key = $1 AND t.actor_key = s.actor_key AND t.session_ref = s.id"
    )
    assert _missing(
        "DELETE FROM aidb_memory.turn t USING aidb_memory.session s "
        "WHERE t.actor_key = $1 AND t.session_ref = s.id"
    ) == ["s"]
    # the SET clause holds subqueries too
    assert _missing(
        "UPDATE aidb_memory.session s SET next_seq = (SELECT max(seq) FROM aidb_memory.turn t "
        "WHERE t.session_ref = s.id) WHERE s.actor_key = $1"
    ) == ["t"]


def test_inserts_list_the_key_and_name_it_in_on_conflict() -> None:
    assert not _missing(
        "INSERT INTO aidb_memory.compaction_lock (actor_key, session_ref) VALUES ($1, $2)"
    )
    assert _missing("INSERT INTO aidb_memory.compaction_lock (session_ref) VALUES ($1)") == [
        "compaction_lock: INSERT"
    ]
    assert _missing("INSERT INTO aidb_memory.compaction_lock VALUES ($1, $2)") == [
        "compaction_lock: INSERT"
    ]
    assert _missing(
        "INSERT INTO aidb_memory.session (actor_key, namespace_id, actor_id, session_id) "
        "VALUES ($1, $2, $3, $4) ON CONFLICT (namespace_id, actor_id, session_id) DO NOTHING"
    ) == ["session: ON"]
    assert not _missing(
        "INSERT INTO aidb_memory.session (actor_key, namespace_id, actor_id, session_id) "
        "VALUES ($1, $2, $3, $4) "
        "ON CONFLICT (actor_key, namespace_id, actor_id, session_id) DO NOTHING"
    )
    # INSERT ... SELECT: the source obeys the rule
    assert _missing(
        "INSERT INTO aidb_memory.compaction_lock (actor_key, session_ref) "
        "SELECT s.actor_key, s.id FROM aidb_memory.session s WHERE s.id = $1"
    ) == ["s"]
    # other tables need nothing
    assert not _missing("INSERT INTO aidb_memory.audit_log (action) VALUES ($1)")
    assert not _missing("SELECT name FROM aidb_memory.namespace WHERE id = $1")


def test_a_key_range_counts_only_for_the_queue_claim() -> None:
    between = "SELECT q.id FROM aidb_memory.event q WHERE q.actor_key BETWEEN $1 AND $2"
    assert _missing(between) == ["q"]
    assert not _missing(between, allow_range=True)
    both = "SELECT q.id FROM aidb_memory.event q WHERE q.actor_key >= $1 AND q.actor_key < $2"
    assert not _missing(both, allow_range=True)
    assert _missing(both) == ["q"]
    one_side = "SELECT q.id FROM aidb_memory.event q WHERE q.actor_key >= $1 AND q.id < $2"
    assert _missing(one_side, allow_range=True) == ["q"]


def test_plpgsql_variables_and_function_results_are_values() -> None:
    sql = "SELECT e.kind FROM aidb_memory.event e WHERE e.actor_key = k AND e.id = claimed"
    assert not _missing(sql, variables={"k", "claimed"})
    assert _missing(sql) == ["e"]  # outside PL/pgSQL, `k` is no value
    lateral = """
        SELECT w.items FROM aidb_memory.session_read_plan($1, $2, $3) AS p
        LEFT JOIN LATERAL (
            SELECT jsonb_agg(t.content) AS items FROM aidb_memory.turn AS t
            WHERE t.actor_key = p.actor_key AND t.session_ref = p.session_ref
        ) AS w ON true
    """
    assert not _missing(lateral)
    # the rows of a set-returning function are many values, never one key
    assert _missing(
        "SELECT 1 FROM unnest($1::bigint[]) AS u(k) JOIN aidb_memory.memory m ON m.actor_key = u.k"
    ) == ["m"]


def test_triggers_use_new_old_and_their_transition_tables() -> None:
    row = "SELECT 1 FROM aidb_memory.session s WHERE s.actor_key = NEW.actor_key"
    assert not _missing(row, trigger=True)
    assert _missing(row) == ["s"]
    statement = """
        DELETE FROM aidb_memory.compaction_lock AS l
        WHERE (l.actor_key, l.session_ref) IN (
            SELECT c.actor_key, c.session_ref FROM aidb_memory.compaction_lock AS c
            JOIN removed AS r ON r.actor_key = c.actor_key AND r.id = c.session_ref
            FOR UPDATE OF c SKIP LOCKED)
    """
    assert not _missing(statement, trigger=True)
    assert _missing(statement) == ["c", "l"]
    # joined on the transition table's id only
    by_id = """
        DELETE FROM aidb_memory.memory_word AS v
        USING (SELECT DISTINCT r.actor_key, r.namespace_id, w.word
               FROM removed AS r, unnest(tsvector_to_array(r.tsv)) AS w(word)) AS g
        WHERE v.actor_key = g.actor_key AND v.word = g.word
          AND NOT EXISTS (SELECT 1 FROM aidb_memory.memory AS m
                          WHERE m.namespace_id = v.namespace_id)
    """
    assert _missing(by_id, trigger=True) == ["m"]


def test_views_over_per_actor_tables_need_the_key_too() -> None:
    sql = "SELECT e.kind FROM aidb_memory.events AS e WHERE e.event_id = $1"
    assert _missing(sql, views={"events"}) == ["e"]
    assert not _missing(sql)


def test_violations_name_the_table_the_alias_and_what_is_missing() -> None:
    (violation,) = check_sql("SELECT 1 FROM aidb_memory.turn t WHERE t.session_ref = $1")
    assert str(violation).startswith("turn AS t: t.actor_key is not constrained")
    (violation,) = check_sql("INSERT INTO aidb_memory.turn (session_ref, seq) VALUES ($1, $2)")
    assert str(violation) == (
        "turn: INSERT does not list actor_key among its columns (session_ref, seq)"
    )


# --- the collector, on a server of its own ------------------------------------------------------


def _tiny_server(root: Path) -> rule.Server:
    (root / "sql").mkdir()
    package = root / "plpython" / "aidb_memory_server"
    package.mkdir(parents=True)
    (package / "common.py").write_text(
        textwrap.dedent("""
            COLUMNS = "s.id, s.session_id"
        """)
    )
    (package / "things.py").write_text(
        textwrap.dedent('''
            from aidb_memory_server import db
            from aidb_memory_server.common import COLUMNS

            _READ = f"""
            SELECT {COLUMNS} FROM aidb_memory.session s WHERE s.actor_key = $1
            """
            _SLOPPY = """
            SELECT {what} FROM aidb_memory.turn WHERE session_ref = $1
            """
            _ALL = """
            -- spans actors: an admin count over a namespace
            SELECT count(*) FROM aidb_memory.session WHERE namespace_id = $1
            """


            def hot_one():
                db.execute(_READ)
                return helper()


            def helper():
                return db.execute(_SLOPPY.format(what="seq"))


            def admin():
                db.execute(_ALL)
                db.execute("DELETE FROM aidb_memory.summary WHERE session_ref = $1")
        ''')
    )
    (root / "sql" / "10_api.sql").write_text(
        textwrap.dedent("""
            CREATE FUNCTION aidb_memory.session_get(k bigint) RETURNS bigint
            LANGUAGE plpgsql AS $$
            DECLARE
                n bigint;
            BEGIN
                SELECT count(*) INTO n FROM aidb_memory.turn t WHERE t.actor_key = k;
                n := (SELECT count(*) FROM aidb_memory.summary x WHERE x.session_ref = n);
                RETURN aidb_memory.session_start(k);
            END
            $$;
            CREATE FUNCTION aidb_memory.session_start(k bigint) RETURNS bigint
            LANGUAGE plpython3u AS $py$ things.hot_one $py$;
            CREATE FUNCTION aidb_memory.namespace_drop() RETURNS bigint
            LANGUAGE plpython3u AS $py$ things.admin $py$;
            CREATE FUNCTION aidb_memory.words_gone() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                DELETE FROM aidb_memory.memory_word AS v USING gone AS g
                WHERE v.actor_key = g.actor_key;
                RETURN NULL;
            END
            $$;
            CREATE TRIGGER words_gone AFTER DELETE ON aidb_memory.memory
                REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
                EXECUTE FUNCTION aidb_memory.words_gone();
            CREATE FUNCTION aidb_memory.count_all() RETURNS bigint LANGUAGE sql AS $$
                SELECT count(*) FROM aidb_memory.memory
            $$;
            CREATE VIEW aidb_memory.everything AS SELECT * FROM aidb_memory.memory;
        """)
    )
    return rule.collect(root)


def test_the_collector_finds_statements_with_their_place(tmp_path: Path) -> None:
    server = _tiny_server(tmp_path)
    lines = rule.report(server)
    expected = [
        "sql/10_api.sql:8 [sql:session_get] [hot] `n := (SELECT count(*) FROM "
        "aidb_memory.summary x WHERE x.session_ref = n)`: summary AS x: x.actor_key is not "
        "constrained",
        "sql/10_api.sql:28 [sql:count_all] `SELECT count(*) FROM aidb_memory.memory`: memory: ",
        "sql/10_api.sql:30 [view:everything] `CREATE VIEW aidb_memory.everything AS SELECT * FROM "
        "aidb_memory.memory`: memory: ",
        "plpython/aidb_memory_server/things.py:8 [py:things:_SLOPPY] [hot] `SELECT {what} FROM "
        "aidb_memory.turn WHERE session_ref = $1`: turn: ",
        "plpython/aidb_memory_server/things.py:28 [py:things:admin] `DELETE FROM "
        "aidb_memory.summary WHERE session_ref = $1`: summary: ",
    ]
    assert len(lines) == len(expected), "\n".join(lines)
    for line, start in zip(lines, expected, strict=True):
        assert line.startswith(start), line
    assert server.views == {"everything"}
    assert server.triggers == {("memory", "DELETE"): {"words_gone"}}
    assert server.unparsed == []
    (spanning,) = [s for s in server.statements if s.spans is not None]
    assert spanning.spans == "an admin count over a namespace"
    assert spanning.owner == "py:things:_ALL"
    hot = server.hot()
    assert server.statements.index(spanning) not in hot
    assert any(server.statements[i].owner == "py:things:_READ" for i in hot)


# --- the server ---------------------------------------------------------------------------------

# Where a statement that spans actors may be used (`-- spans actors: <reason>`): admin functions
# and views, the worker's claim without a key range and its count of waiting events, the
# retry of a namespace's failed events, and the re-indexing of a namespace's memories when its
# text search configuration changes. Statements reached from a hot API function never may.
SPANNING_ALLOWED_FROM = (
    "sql:namespace_drop",
    "sql:namespace_update",
    "sql:events_retry",
    "sql:event_claim",
    "sql:event_remaining",
    # The sweep of expired memories (issue 34): the worker's, by the expiry index.
    "sql:expire_memories",
    # The queue's depth and latency for monitoring (issue 36): admins' and workers'.
    "sql:metrics",
    "view:sessions",
    "view:events",
    # The rows of those two views (sql/20_namespaces.sql says why a view reads through one).
    "sql:sessions_rows",
    "sql:events_rows",
)


@pytest.fixture(scope="module")
def server() -> rule.Server:
    return rule.collect(REPO)


def test_the_collector_reads_every_statement_of_the_server(server: rule.Server) -> None:
    assert server.unparsed == [], "statements the checker could not parse"
    tables = set().union(*(s.touches() for s in server.statements))
    assert tables == rule.PER_ACTOR_TABLES
    hot = server.hot()
    for function in rule.HOT_FUNCTIONS:
        reached = server.reachable([f"sql:{function}"])
        statements = [n for n in reached if n.startswith("stmt:")]
        touching = [n for n in statements if server.statements[int(n[5:])].touches()]
        assert touching, f"no statement on a per-actor table found for {function}"
    assert hot


def test_every_statement_on_a_per_actor_table_uses_the_key(server: rule.Server) -> None:
    lines = rule.report(server)
    hot = sum(" [hot] " in line for line in lines)
    assert not lines, (
        f"{len(lines)} occurrences of per-actor tables without the key ({hot} in hot calls):\n"
        + "\n".join(lines)
    )


def test_statements_that_span_actors_stay_out_of_hot_calls(server: rule.Server) -> None:
    hot = server.hot()
    allowed = {n for n in server.reachable(SPANNING_ALLOWED_FROM) if n.startswith("stmt:")}
    spanning = [(i, s) for i, s in enumerate(server.statements) if s.spans is not None]
    print(f"\n{len(spanning)} statements span actors:")
    for _, statement in spanning:
        print(f"  {statement.where} `{statement.first_line}`: {statement.spans}")
    problems = []
    for index, statement in spanning:
        if not statement.spans:
            problems.append(f"{statement.where}: `-- spans actors:` gives no reason")
        if index in hot:
            problems.append(f"{statement.where}: spans actors, and a hot API function uses it")
        if f"stmt:{index}" not in allowed:
            problems.append(
                f"{statement.where}: spans actors, used by none of {SPANNING_ALLOWED_FROM}"
            )
    assert not problems, "\n".join(problems)
