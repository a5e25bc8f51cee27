"""Scene: alice's sessions (session_list), and what only admins see: the sessions view and the
events of every add."""

from __future__ import annotations

from aidb_memory.demo.context import APP_ROLE, Context


def scene(ctx: Context) -> None:
    page, app, admin = ctx.page, ctx.app, ctx.admin
    page.heading("Alice's sessions: session_list")
    page.say("Index rows, never transcripts; the most recently active first.")
    page.run(
        app,
        """
        SELECT session_id, agent_id, closed_at IS NOT NULL AS closed, turn_count, total_chars
        FROM aidb_memory.session_list(namespace => 'helpdesk_namespace', actor_id => 'alice');
        """,
    )

    page.heading("What only admins see")
    page.say(
        f"""
        {APP_ROLE} reads sessions through the session functions only; the sessions view is for
        admins:
        """
    )
    page.run(app, "SELECT count(*) FROM aidb_memory.sessions;")
    page.say(
        """
        An admin sees the event each add recorded for long-term memory: one per add, none for the
        retry. Those of the adds made while extraction was off are skipped; the later ones went
        through the worker above. bob's are gone with everything else of his.
        """
    )
    page.run(
        admin,
        """
        SELECT actor_id, session_id, idempotency_key, status, attempts
        FROM aidb_memory.events ORDER BY event_id;
        """,
    )
