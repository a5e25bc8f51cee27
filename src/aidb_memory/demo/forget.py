"""Scene: bob's erasure request: forget removes every trace of him and leaves one audit row
without content."""

from __future__ import annotations

from aidb_memory.demo.context import Context


def scene(ctx: Context) -> None:
    page, app, admin = ctx.page, ctx.app, ctx.admin
    page.heading("Erasure: forget")
    page.say(
        """
        bob asks the help desk to erase what it knows of him. forget removes every trace of an
        actor in the namespace (sessions, turns, summaries, handoffs, events, memories and
        their history, idempotency keys) and returns the counts:
        """
    )
    page.run(
        app,
        """
        SELECT aidb_memory.forget(
          namespace => 'helpdesk_namespace',
          actor_id  => 'bob',
          reason    => 'erasure request #4711'
        ) AS removed;
        """,
    )
    page.run(
        app,
        """
        SELECT (SELECT count(*) FROM aidb_memory.list_memories(
                  namespace => 'helpdesk_namespace', actor_id => 'bob')) AS memories,
               (SELECT count(*) FROM aidb_memory.session_list(
                  namespace => 'helpdesk_namespace', actor_id => 'bob')) AS sessions;
        """,
    )
    page.say(
        """
        One audit row remains, readable by superusers: who, when, what, the counts and the
        reason, with an HMAC of namespace and actor instead of bob's id, and no content:
        """
    )
    page.run(
        admin,
        """
        SELECT by_role, action, namespace, counts, reason, left(subject_hash, 16) AS subject_hash
        FROM aidb_memory.audit_log WHERE action = 'forget';
        """,
    )
