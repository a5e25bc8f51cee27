"""Scene: alice writes in. session_start opens her session, add stores the first two turns with
an idempotency key, and the same add again (a client's retry) stores nothing."""

from __future__ import annotations

from aidb_memory.demo.context import Context

_SEED_ADD = """
    SELECT aidb_memory.add(
      namespace       => 'helpdesk_namespace',
      actor_id        => 'alice',
      turns           => '[
        {"role": "user", "content": "my discount was not applied",
         "kind": "user_prompt", "meta": {"sequence_id": "s-01"}},
        {"role": "assistant", "content": "let me check the renewal history",
         "kind": "model_response", "meta": {"sequence_id": "s-01"}}
      ]'::jsonb,
      session_id      => 'conv-738949',
      agent_id        => 'helpdesk-agent-64849',
      idempotency_key => 'conv-738949-turn-001'
    );
"""

_TURN_COUNT = """
    SELECT session_id, turn_count, total_chars
    FROM aidb_memory.session_list(namespace => 'helpdesk_namespace', actor_id => 'alice');
"""


def scene(ctx: Context) -> None:
    page, app = ctx.page, ctx.app
    page.heading("Alice writes in: session_start")
    page.say(
        """
        The help desk opens a session for the conversation. session_start is idempotent (calling
        it again resumes the session); prev_handoff is NULL because alice has no earlier
        conversation with this agent.
        """
    )
    page.run(
        app,
        """
        SELECT session_id, started_at, closed_at, prev_handoff
        FROM aidb_memory.session_start(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'alice',
          agent_id   => 'helpdesk-agent-64849',
          session_id => 'conv-738949'
        );
        """,
    )

    page.heading("The first two turns: add, with an idempotency key")
    page.say(
        """
        add stores a batch of turns, all or none, and returns the id of the event it records for
        long-term memory. meta.sequence_id groups the turns of one reasoning round.
        """
    )
    first = page.run(app, _SEED_ADD)
    page.heading("The same add again, as a client retries after a lost reply")
    second = page.run(app, _SEED_ADD)
    same = bool(first and second and first[0][0] == second[0][0])
    page.say(
        f"""
        {"The same event id" if same else "A DIFFERENT event id (this is a bug)"}: the key
        conv-738949-turn-001 was seen before, so the retry stored nothing. The session still has
        two turns:
        """
    )
    page.run(app, _TURN_COUNT)
