"""Scene: the help-desk agent's namespace, made by an admin, and the application's own login
role."""

from __future__ import annotations

from aidb_memory.demo.context import APP_ROLE, Context


def scene(ctx: Context) -> None:
    page, admin = ctx.page, ctx.admin
    page.heading("A namespace for the help-desk agent (as an admin)")
    page.say(
        """
        A namespace scopes everything agent memory stores. It starts without a model, so nothing
        is summarized yet; later in the story an admin gives it one. The low
        compaction_min_target_chars (default 200) lets this short conversation reach, soon, the
        point where compaction would run. Long-term memory comes later in the story too:
        extraction is off until then, so these first conversations stay out of it.
        """
    )
    page.run(
        admin,
        """
        SELECT aidb_memory.init(
          name   => 'helpdesk_namespace',
          config => '{"compaction_min_target_chars": 20, "extraction": false}'
        ) AS namespace_id;
        """,
    )
    page.say(
        f"""
        The application connects as its own login role, {APP_ROLE}, a member of aidb_users: it
        may call the session functions but read no table. Every step below runs as {APP_ROLE}.
        """
    )
    page.run(admin, f"CREATE ROLE {APP_ROLE} LOGIN IN ROLE aidb_users;")
