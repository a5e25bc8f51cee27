"""Scene: a fact stored at once with remember, found by search at once; the same call again
stores nothing."""

from __future__ import annotations

from aidb_memory.demo.context import Context
from aidb_memory.demo.memories import SEARCH

_REMEMBER = """
    SELECT aidb_memory.remember(
      namespace => 'helpdesk_namespace',
      actor_id  => 'alice',
      content   => 'The auditor of Alice Co is Priya Shah.',
      agent_id  => 'helpdesk-agent-64849'
    ) AS memory_id;
"""


def scene(ctx: Context) -> None:
    page, app = ctx.page, ctx.app
    page.heading("A fact stored at once: remember")
    page.say(
        """
        The worker makes memories of conversations, later. remember stores one fact now, in the
        caller's transaction, with no model and no worker, and returns the memory's id. The
        help-desk agent notes who alice's auditor is:
        """
    )
    stored = page.run(app, _REMEMBER)
    page.say("search finds it at once, by its words:")
    page.run(app, SEARCH.format(query="auditor"))
    page.say("The same call again, as a client retries after a lost reply:")
    again = page.run(app, _REMEMBER)
    same = bool(stored and again and stored[0][0] == again[0][0])
    page.say(
        f"""
        {"The same id" if same else "A DIFFERENT id (this is a bug)"}: an exact duplicate of a
        current memory of the actor is not stored twice.
        """
    )
