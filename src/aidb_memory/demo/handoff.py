"""Scene: the conversation ends with notes (session_end's handoff), and alice's next session
starts from it (prev_handoff)."""

from __future__ import annotations

from aidb_memory.demo.context import Context


def scene(ctx: Context) -> None:
    page, app = ctx.page, ctx.app
    page.heading("The conversation ends: session_end with notes (the handoff)")
    page.say(
        """
        session_end closes the session and stores a handoff built from what is stored (no model
        call): the notes, the ids, the times, the turn count and the last user prompt.
        """
    )
    page.run(
        app,
        """
        SELECT handoff, closed_at
        FROM aidb_memory.session_end(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'alice',
          session_id => 'conv-738949',
          notes      => 'discount reapplied'
        );
        """,
    )

    page.heading("Alice writes again: the next session_start shows prev_handoff")
    page.run(
        app,
        """
        SELECT session_id, prev_handoff
        FROM aidb_memory.session_start(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'alice',
          agent_id   => 'helpdesk-agent-64849',
          session_id => 'conv-738950'
        );
        """,
    )
    page.say(
        """
        The agent starts from the handoff of alice's last closed session with this agent, without
        reading the old transcript.
        """
    )
