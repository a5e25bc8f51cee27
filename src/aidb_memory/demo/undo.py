"""Scene: an exchange walked back with session_pop, down to the user turn."""

from __future__ import annotations

from aidb_memory.demo.context import Context


def scene(ctx: Context) -> None:
    page, app = ctx.page, ctx.app
    page.heading("Walking back an exchange: session_pop")
    page.say(
        """
        In the new conversation the agent promises a refund it cannot give. The application
        withdraws the exchange: session_pop removes and returns the newest turn; popping until a
        user turn comes back walks back the whole exchange.
        """
    )
    page.run(
        app,
        """
        SELECT aidb_memory.add(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'alice',
          turns      => '[
            {"role": "user", "content": "is the discount on my next invoice?"},
            {"role": "assistant", "content": "Yes: SAVE20 is active again."},
            {"role": "user", "content": "can you refund the difference for March?"},
            {"role": "assistant", "content": "Done, I refunded it."}
          ]'::jsonb,
          session_id => 'conv-738950'
        );
        """,
    )
    pop = """
        SELECT item->'seq' AS seq, item->>'role' AS role, item->>'content' AS content
        FROM aidb_memory.session_pop(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'alice',
          session_id => 'conv-738950'
        ) AS item;
    """
    rows = page.run(app, pop)
    while rows and rows[0][1] != "user":
        page.say("Not a user turn yet; pop again:")
        rows = page.run(app, pop)
