"""Namespaces that belong to their roles (issue 35): a tenant's role cannot reach another's.

Before issue 35 every member of aidb_users could call every function on every namespace, knowing
only its name and an actor id. A namespace with grants (``namespace_grant``) is now refused, with
42501 and one line naming only the namespace, to every application role but the granted ones and
those with their privileges; these tests try the ways around it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from conftest import ADMIN_USER, WORKER_USER, Database

NS = "sales_ns"
OPEN = "open_ns"
ACTOR = "bob@example.com"
_ids = itertools.count()

# Every application function that takes a namespace, called on NS for ACTOR, session 's' (made
# by the granted role in ``tenants``). A function granted to aidb_users and missing here fails
# test_every_namespace_function_is_tried.
CALLS: dict[str, str] = {
    "session_start": "SELECT * FROM aidb_memory.session_start(%(ns)s, %(actor)s, 's2')",
    "add": "SELECT aidb_memory.add(%(ns)s, %(actor)s, "
    '\'[{"role": "user", "content": "hi"}]\', \'s\')',
    "add (keyed)": "SELECT aidb_memory.add(%(ns)s, %(actor)s, "
    '\'[{"role": "user", "content": "hi"}]\', \'s\', idempotency_key => \'k1\')',
    "add (no session)": "SELECT aidb_memory.add(%(ns)s, %(actor)s, "
    '\'[{"role": "user", "content": "hi"}]\')',
    "session_get": "SELECT * FROM aidb_memory.session_get(%(ns)s, %(actor)s, 's')",
    "session_get (budget)": "SELECT * FROM aidb_memory.session_get(%(ns)s, %(actor)s, 's', 1000)",
    "session_messages": "SELECT aidb_memory.session_messages(%(ns)s, %(actor)s, 's', "
    "limit_turns => 5)",
    "session_end": "SELECT * FROM aidb_memory.session_end(%(ns)s, %(actor)s, 's')",
    "session_pop": "SELECT * FROM aidb_memory.session_pop(%(ns)s, %(actor)s, 's')",
    "session_list": "SELECT * FROM aidb_memory.session_list(%(ns)s, %(actor)s)",
    "session_delete": "SELECT aidb_memory.session_delete(%(ns)s, %(actor)s, 's', 'asked')",
    "search": "SELECT * FROM aidb_memory.search(%(ns)s, %(actor)s, 'tea')",
    "remember": "SELECT aidb_memory.remember(%(ns)s, %(actor)s, 'likes coffee')",
    "list_memories": "SELECT * FROM aidb_memory.list_memories(%(ns)s, %(actor)s)",
    "get_memory": "SELECT * FROM aidb_memory.get_memory(%(ns)s, %(actor)s, key => 'k')",
    "get_memory (id)": "SELECT * FROM aidb_memory.get_memory(%(ns)s, %(actor)s, %(id)s::uuid)",
    "update_memory": "SELECT * FROM aidb_memory.update_memory(%(ns)s, %(actor)s, %(id)s::uuid, "
    "'x')",
    "memory_history": "SELECT * FROM aidb_memory.memory_history(%(ns)s, %(actor)s, %(id)s::uuid)",
    "delete": "SELECT aidb_memory.delete(%(ns)s, %(actor)s, '{\"all\": true}'::jsonb, 'asked')",
    "forget": "SELECT aidb_memory.forget(%(ns)s, %(actor)s, 'asked')",
    "status": "SELECT aidb_memory.status(%(ns)s, %(actor)s, %(event)s::uuid)",
    "list_actors": "SELECT * FROM aidb_memory.list_actors(%(ns)s)",
}
# What the tables hold, as the superuser sees it: a refused call must change none of it.
STATE = """
SELECT (SELECT count(*) FROM aidb_memory.session), (SELECT max(next_seq) FROM aidb_memory.session),
       (SELECT count(*) FROM aidb_memory.turn), (SELECT count(*) FROM aidb_memory.event),
       (SELECT count(*) FROM aidb_memory.memory), (SELECT count(*) FROM aidb_memory.summary),
       (SELECT count(*) FROM aidb_memory.memory_history),
       (SELECT count(*) FROM aidb_memory.session WHERE closed_at IS NOT NULL)
"""


def _role(db: Database, prefix: str, *options: str) -> str:
    """A new login role (cluster-wide: a name of this test's own)."""
    name = f"{prefix}_{db.name}_{next(_ids)}"
    db.sql(f"CREATE ROLE {name} LOGIN {' '.join(options)}")
    return name


@pytest.fixture
def tenants(db: Database) -> Iterator[dict[str, Any]]:
    """Two tenants' login roles, both aidb_users members; NS granted to the sales role, with a
    session, a memory and an event of ACTOR; OPEN has no grant."""
    sales = _role(db, "sales", "IN ROLE aidb_users")
    support = _role(db, "support", "IN ROLE aidb_users")
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    db.sql("SELECT aidb_memory.init(%s)", (OPEN,))
    assert db.value("SELECT aidb_memory.namespace_grant(%s, %s)", (NS, sales)) is True
    with db.connect(sales) as c:
        event = c.execute(
            'SELECT aidb_memory.add(%s, %s, \'[{"role": "user", "content": "tea?"}]\', \'s\')',
            (NS, ACTOR),
        ).fetchone()[0]  # type: ignore[index]
        mid = c.execute(
            "SELECT aidb_memory.remember(%s, %s, 'likes tea', key => 'k')", (NS, ACTOR)
        ).fetchone()[0]  # type: ignore[index]
    yield {"sales": sales, "support": support, "event": str(event), "id": str(mid)}
    db.sql(f"DROP ROLE IF EXISTS {sales}, {support}")


def _params(t: dict[str, Any], ns: str = NS) -> dict[str, Any]:
    return {"ns": ns, "actor": ACTOR, "id": t["id"], "event": t["event"]}


def _refused(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any], fn: str) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
        conn.execute(sql, params).fetchall()
    d = e.value.diag
    assert (
        d.message_primary == f'aidb_memory.{fn}: permission denied for namespace "{params["ns"]}"'
    )
    said = " ".join(
        x or "" for x in (d.message_primary, d.message_detail, d.message_hint, d.context)
    )
    for secret in (ACTOR, "likes tea", "tea?", params.get("id") or "-", params.get("event") or "-"):
        assert secret not in said


@pytest.mark.parametrize("call", sorted(CALLS))
def test_another_tenant_is_refused_and_nothing_changes(
    db: Database, tenants: dict[str, Any], call: str
) -> None:
    fn = call.split(" ")[0]
    before = db.sql(STATE)
    with db.connect(tenants["support"]) as c:
        _refused(c, CALLS[call], _params(tenants), fn)
    assert db.sql(STATE) == before
    # The granted tenant's own call is not refused (whatever it returns).
    with db.connect(tenants["sales"]) as c:
        c.execute(CALLS[call], _params(tenants)).fetchall()


def test_every_namespace_function_is_tried(db: Database) -> None:
    """Every function aidb_users may execute whose first argument is a namespace is in CALLS:
    a function added later gets its refusal tried here."""
    granted = {
        r[0]
        for r in db.sql(
            "SELECT p.proname FROM pg_catalog.pg_proc p "
            "WHERE p.pronamespace = 'aidb_memory'::regnamespace "
            "AND pg_catalog.has_function_privilege('aidb_users', p.oid, 'EXECUTE') "
            "AND p.proargnames[1] = 'namespace'"
        )
    }
    tried = {c.split(" ")[0] for c in CALLS}
    assert granted and granted <= tried, sorted(granted - tried)


def test_open_namespaces_stay_open_and_the_view_lists_what_a_role_may_use(
    db: Database, tenants: dict[str, Any]
) -> None:
    with db.connect(tenants["support"]) as c:
        c.execute(CALLS["add"], _params(tenants, OPEN))
        names = [r[0] for r in c.execute("SELECT name FROM aidb_memory.namespaces").fetchall()]
        assert OPEN in names and NS not in names
        assert c.execute("SELECT granted_roles FROM aidb_memory.namespaces").fetchall() == [
            (None,)
        ] * len(names)
    with db.connect(tenants["sales"]) as c:
        names = [r[0] for r in c.execute("SELECT name FROM aidb_memory.namespaces").fetchall()]
        assert OPEN in names and NS in names
    with db.connect(ADMIN_USER) as c:
        rows = dict(c.execute("SELECT name, granted_roles FROM aidb_memory.namespaces").fetchall())
        assert rows[NS] == [tenants["sales"]] and rows[OPEN] == []


def test_admins_and_workers_are_not_refused(db: Database, tenants: dict[str, Any]) -> None:
    with db.connect(ADMIN_USER) as c:
        c.execute(CALLS["session_get"], _params(tenants)).fetchall()
        c.execute(CALLS["add"], _params(tenants))
    with db.connect(WORKER_USER) as c:
        assert c.execute(
            "SELECT count(*) FROM aidb_memory.events WHERE namespace_id = "
            "(SELECT id FROM aidb_memory.namespaces WHERE name = %s)",
            (NS,),
        ).fetchone()[0]  # type: ignore[index]


def test_a_revoke_is_seen_by_the_next_call_of_an_open_transaction(
    db: Database, tenants: dict[str, Any]
) -> None:
    with db.connect(tenants["sales"], autocommit=False) as c:
        c.execute(CALLS["session_get (budget)"], _params(tenants)).fetchall()
        c.execute(CALLS["add"], _params(tenants))
        db.sql("SELECT aidb_memory.namespace_revoke(%s, %s)", (NS, tenants["sales"]), ADMIN_USER)
        # The grant is gone, but the namespace is open again with none: grant another role.
        other = _role(db, "other")
        db.sql("SELECT aidb_memory.namespace_grant(%s, %s)", (NS, other), ADMIN_USER)
        _refused(c, CALLS["add"], _params(tenants), "add")
        c.rollback()
        _refused(c, CALLS["session_get (budget)"], _params(tenants), "session_get")
        c.rollback()
    db.sql(f"DROP ROLE {other}")


def test_the_last_revoke_opens_the_namespace_again(db: Database, tenants: dict[str, Any]) -> None:
    assert db.value("SELECT aidb_memory.namespace_revoke(%s, %s)", (NS, tenants["sales"])) is True
    assert db.value("SELECT aidb_memory.namespace_revoke(%s, %s)", (NS, tenants["sales"])) is False
    with db.connect(tenants["support"]) as c:
        c.execute(CALLS["session_get"], _params(tenants)).fetchall()


def test_a_member_of_a_member_is_let_in_unless_it_does_not_inherit(
    db: Database, tenants: dict[str, Any]
) -> None:
    team = _role(db, "team", f"IN ROLE {tenants['sales']}")
    app = _role(db, "app", f"IN ROLE aidb_users, {team}")
    # NOINHERIT (per role: PostgreSQL 15 has no per-grant INHERIT): the privileges to call
    # aidb_memory granted to it directly, its grant of the namespace only through team.
    noinherit = _role(db, "noinh", f"NOINHERIT IN ROLE {team}")
    db.sql(f"GRANT USAGE ON SCHEMA aidb_memory TO {noinherit}")
    db.sql(
        "GRANT EXECUTE ON FUNCTION aidb_memory.add(text, text, jsonb, text, text, text, jsonb), "
        "aidb_memory.session_get(text, text, text, integer, text, integer, integer) "
        f"TO {noinherit}"
    )
    with db.connect(app) as c:
        c.execute(CALLS["add"], _params(tenants))
    with db.connect(noinherit) as c:
        _refused(c, CALLS["add"], _params(tenants), "add")
        # PostgreSQL's own rule: a NOINHERIT member has the role's privileges after SET ROLE.
        c.execute(f"SET ROLE {tenants['sales']}")
        c.execute(CALLS["add"], _params(tenants))
        c.execute("RESET ROLE")
        _refused(c, CALLS["session_get"], _params(tenants), "session_get")
    db.sql(f"DROP OWNED BY {noinherit}")
    db.sql(f"DROP ROLE {app}, {noinherit}, {team}")


def test_set_role_to_a_role_that_is_not_granted_refuses_a_granted_login(
    db: Database, tenants: dict[str, Any]
) -> None:
    db.sql(f"GRANT {tenants['support']} TO {tenants['sales']}")
    with db.connect(tenants["sales"]) as c:
        c.execute(f"SET ROLE {tenants['support']}")
        _refused(c, CALLS["session_get"], _params(tenants), "session_get")
        c.execute("RESET ROLE")
        c.execute(CALLS["session_get"], _params(tenants)).fetchall()


def test_a_role_named_like_the_namespace_gets_nothing(
    db: Database, tenants: dict[str, Any]
) -> None:
    db.sql(f"CREATE ROLE {NS}_{db.name} LOGIN IN ROLE aidb_users")
    db.sql(f"SELECT aidb_memory.init('{NS}_{db.name}')")
    db.sql(f"SELECT aidb_memory.namespace_grant('{NS}_{db.name}', %s)", (tenants["sales"],))
    with db.connect(f"{NS}_{db.name}") as c:
        _refused(c, CALLS["add"], _params(tenants, f"{NS}_{db.name}"), "add")
    db.sql(f"DROP ROLE {NS}_{db.name}")


def test_security_definer_wrappers_lend_no_grant(db: Database, tenants: dict[str, Any]) -> None:
    """A SECURITY DEFINER function of a granted role, executed by another tenant's role, does not
    let that role in: the check is of the calling role, whoever owns the functions between."""
    sales, support = tenants["sales"], tenants["support"]
    schema = f"app_{db.name}"
    db.sql(f"CREATE SCHEMA {schema} AUTHORIZATION {sales}")
    with db.connect(sales) as c:
        c.execute(
            f"CREATE FUNCTION {schema}.peek(a text) RETURNS jsonb LANGUAGE sql SECURITY DEFINER "
            f"SET search_path = pg_catalog AS $$ SELECT items FROM aidb_memory.session_get("
            f"'{NS}', a, 's') $$"
        )
        c.execute(f"GRANT USAGE ON SCHEMA {schema} TO {support}")
        c.execute(f"GRANT EXECUTE ON FUNCTION {schema}.peek(text) TO {support}")
        assert c.execute(f"SELECT {schema}.peek(%s)", (ACTOR,)).fetchone()[0]  # type: ignore[index]
    with db.connect(support) as c:
        _refused(c, f"SELECT {schema}.peek(%(actor)s)", _params(tenants), "session_get")
    db.sql(f"DROP SCHEMA {schema} CASCADE")


def test_a_refused_call_holds_no_lock_on_the_tenants_session(
    db: Database, tenants: dict[str, Any]
) -> None:
    with db.connect(tenants["support"], autocommit=False) as attacker:
        for call in ("add", "add (keyed)", "session_end", "session_pop"):
            _refused(attacker, CALLS[call], _params(tenants), call.split(" ")[0])
            attacker.rollback()
            attacker.execute("SELECT 1")  # a transaction left open, as an attacker would
        with db.connect(tenants["sales"]) as c:
            c.execute("SET lock_timeout = '2s'")
            c.execute(CALLS["add"], _params(tenants))


def test_actor_binding_and_grants_both_must_allow(db: Database, tenants: dict[str, Any]) -> None:
    sales = tenants["sales"]
    db.sql(
        'SELECT aidb_memory.namespace_update(%s, config => \'{"actor_binding": "session_user"}\')',
        (NS,),
    )
    with db.connect(sales) as c:
        c.execute(CALLS["add"], {**_params(tenants), "actor": sales})
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="is not the calling role"):
            c.execute(CALLS["add"], _params(tenants))
    with db.connect(tenants["support"]) as c:
        _refused(c, CALLS["add"], {**_params(tenants), "actor": tenants["support"]}, "add")


def test_a_dropped_roles_grant_lets_no_one_in_and_can_be_revoked(
    db: Database, tenants: dict[str, Any]
) -> None:
    gone = _role(db, "gone", "IN ROLE aidb_users")
    db.sql("SELECT aidb_memory.namespace_revoke(%s, %s)", (NS, tenants["sales"]))
    db.sql("SELECT aidb_memory.namespace_grant(%s, %s)", (NS, gone))
    db.sql(f"DROP ROLE {gone}")
    with db.connect(tenants["support"]) as c:
        _refused(c, CALLS["add"], _params(tenants), "add")
    assert db.value("SELECT aidb_memory.namespace_revoke(%s, %s)", (NS, gone)) is True
    with db.connect(tenants["support"]) as c:
        c.execute(CALLS["add"], _params(tenants))


def test_only_admins_grant_and_bad_arguments_are_refused(
    db: Database, tenants: dict[str, Any]
) -> None:
    with db.connect(tenants["sales"]) as c, pytest.raises(psycopg.errors.InsufficientPrivilege):
        c.execute("SELECT aidb_memory.namespace_grant(%s, %s)", (NS, tenants["support"]))
    with db.connect(ADMIN_USER) as c:
        with pytest.raises(psycopg.errors.UndefinedObject, match="role"):
            c.execute("SELECT aidb_memory.namespace_grant(%s, 'no_such_role_x')", (NS,))
        with pytest.raises(psycopg.errors.UndefinedObject, match="namespace"):
            c.execute("SELECT aidb_memory.namespace_grant('no_such_ns', %s)", (tenants["sales"],))
        with pytest.raises(psycopg.errors.NullValueNotAllowed):
            c.execute("SELECT aidb_memory.namespace_revoke(%s, NULL)", (NS,))
        # Granting again changes nothing and says so.
        assert c.execute(
            "SELECT aidb_memory.namespace_grant(%s, %s)", (NS, tenants["sales"])
        ).fetchone() == (False,)


def test_a_refusal_says_one_line_and_its_hint(db: Database, tenants: dict[str, Any]) -> None:
    """No traceback, no internal SQL, no detail: the error's line and its hint."""
    with (
        db.connect(tenants["support"]) as c,
        pytest.raises(psycopg.errors.InsufficientPrivilege) as e,
    ):
        c.execute(CALLS["remember"], _params(tenants))
    d = e.value.diag
    assert "\n" not in (d.message_primary or "") and d.message_detail is None
    assert (
        d.message_hint == "an admin grants it to a role of yours with aidb_memory.namespace_grant"
    )
    for part in (d.message_primary, d.message_hint, d.context):
        assert "Traceback" not in (part or "") and "SELECT" not in (part or "")


def test_list_actors_pages_a_granted_namespace_and_only_one(
    db: Database, tenants: dict[str, Any]
) -> None:
    """Its tenant lists the namespace's actors (with a session, or a memory only), by prefix and
    a page at a time; an open namespace is refused to everyone, as it would show every
    tenant's users."""
    sales = tenants["sales"]
    with db.connect(sales) as c:
        for actor in ("amy", "ann", "bea", "Zed", "é"):
            c.execute(CALLS["add"], {**_params(tenants), "actor": actor})
        c.execute("SELECT aidb_memory.remember(%s, 'memo-only', 'likes jam')", (NS,))

        def listed(**kw: Any) -> list[str]:
            sql = (
                "SELECT actor_id FROM aidb_memory.list_actors(%(ns)s, %(prefix)s, %(n)s, %(after)s)"
            )
            args = {"ns": NS, "prefix": None, "n": 100, "after": None, **kw}
            return [r[0] for r in c.execute(sql, args).fetchall()]

        everyone = sorted(["amy", "ann", "bea", "Zed", "é", "memo-only", ACTOR])
        assert listed() == everyone  # code-point order: "Zed" < "amy" < "é"
        assert listed(prefix="a") == ["amy", "ann"]
        assert listed(n=2) == everyone[:2]
        assert listed(n=2, after=everyone[1]) == everyone[2:4]
        assert listed(prefix="a", after="amy") == ["ann"]
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="limit"):
            listed(n=0)
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="has no grants"):
            c.execute("SELECT * FROM aidb_memory.list_actors(%s)", (OPEN,))
    # Forgetting an actor's only memory and its sessions takes it off the list.
    with db.connect(sales) as c:
        c.execute("SELECT aidb_memory.forget(%s, 'memo-only', 'asked')", (NS,))
        names = [r[0] for r in c.execute("SELECT * FROM aidb_memory.list_actors(%s)", (NS,))]
        assert "memo-only" not in names and "amy" in names
    with db.connect(ADMIN_USER) as c:
        assert c.execute("SELECT count(*) FROM aidb_memory.list_actors(%s)", (NS,)).fetchone()


def test_a_granted_roles_common_calls_stay_off_python_and_are_checked(
    db: Database, tenants: dict[str, Any]
) -> None:
    """add of plain messages, a budgeted session_get and get_memory take their SQL fast paths in
    a namespace with grants too (their PL/Python is not called): the first call of
    a connection asks namespace_role which grant lets it in, the next ones check that grant in
    their statement (the hint aidb_memory.granted_role); a refused role's calls get the Python
    code's refusal."""
    sales, support = tenants["sales"], tenants["support"]
    for role in (sales, support):
        db.sql(f"ALTER ROLE {role} SET track_functions = 'all'")
    calls = (
        "SELECT funcname, calls FROM pg_catalog.pg_stat_xact_user_functions "
        "WHERE schemaname = 'aidb_memory' ORDER BY funcname"
    )
    with db.connect(sales, autocommit=False) as c:
        for _ in range(3):
            c.execute(CALLS["add"], _params(tenants))
            c.execute(CALLS["session_get (budget)"], _params(tenants)).fetchall()
            assert c.execute(CALLS["get_memory (id)"], _params(tenants)).fetchall()
        seen = dict(c.execute(calls).fetchall())
        hint = c.execute("SELECT current_setting('aidb_memory.granted_role')").fetchone()
        c.rollback()
    assert seen.get("namespace_role") == 1 and "namespace_allows" not in seen, seen
    assert not {"add_py", "session_read_plan", "get_memory_py"} & set(seen), seen
    assert hint == (str(db.value("SELECT oid FROM pg_roles WHERE rolname = %s", (sales,))),)
    with db.connect(support, autocommit=False) as c:
        _refused(c, CALLS["add"], _params(tenants), "add")
        c.rollback()


FAST_CALLS = ("add", "session_get (budget)", "session_messages", "get_memory", "get_memory (id)")


def test_the_granted_role_hint_lets_no_one_in(db: Database, tenants: dict[str, Any]) -> None:
    """The setting aidb_memory.granted_role is the caller's to set: set to the granted role's OID
    by a role that does not have its privileges, to its own role's, or to anything at all, it
    lets no one in and breaks nothing; a hint of one namespace's grant opens no other."""
    sales, support = tenants["sales"], tenants["support"]
    sales_oid = db.value("SELECT oid FROM pg_roles WHERE rolname = %s", (sales,))
    support_oid = db.value("SELECT oid FROM pg_roles WHERE rolname = %s", (support,))
    before = db.sql(STATE)
    with db.connect(support) as c:
        for hint in (sales_oid, support_oid):
            c.execute("SELECT set_config('aidb_memory.granted_role', %s, false)", (str(hint),))
            for call in FAST_CALLS:
                _refused(c, CALLS[call], _params(tenants), call.split(" ")[0])
    assert db.sql(STATE) == before
    with db.connect(sales) as c:
        for hint in ("", "x", "0", "-1", "1e3", "4294967296", "99999999999", f" {sales_oid}"):
            c.execute("SELECT set_config('aidb_memory.granted_role', %s, false)", (hint,))
            for call in FAST_CALLS:
                c.execute(CALLS[call], _params(tenants)).fetchall()
    # A namespace granted to another role only: the hint of sales' grant of NS opens nothing.
    other = _role(db, "other")
    db.sql("SELECT aidb_memory.init('other_ns')")
    db.sql("SELECT aidb_memory.namespace_grant('other_ns', %s)", (other,))
    db.sql("SELECT * FROM aidb_memory.session_start('other_ns', %s, NULL, 's')", (ACTOR,))
    with db.connect(sales) as c:
        c.execute(CALLS["add"], _params(tenants))  # sets the hint
        for call in FAST_CALLS:
            _refused(c, CALLS[call], _params(tenants, "other_ns"), call.split(" ")[0])
    assert (
        db.value(
            "SELECT count(*) FROM aidb_memory.turn t JOIN aidb_memory.session s "
            "ON s.id = t.session_ref JOIN aidb_memory.namespace n ON n.id = s.namespace_id "
            "WHERE n.name = 'other_ns'"
        )
        == 0
    )
    db.sql(f"DROP ROLE {other}")
