"""Scene: alice's memories (list_memories), and search finding one by an exact word and by a
misspelled one."""

from __future__ import annotations

from aidb_memory.demo.context import Context

SEARCH = """
    SELECT content, round(score::numeric, 2) AS score
    FROM aidb_memory.search(
      namespace => 'helpdesk_namespace',
      actor_id  => 'alice',
      query     => '{query}',
      "limit"   => 3
    );
"""


def scene(ctx: Context) -> None:
    page, app = ctx.page, ctx.app
    page.heading("Alice's memories: list_memories")
    memories = page.run(
        app,
        """
        SELECT content, session_id
        FROM aidb_memory.list_memories(namespace => 'helpdesk_namespace', actor_id => 'alice');
        """,
    )
    if memories and ctx.endpoint is None:
        page.say(
            """
            The current memories, newest first: every user turn since extraction was turned on,
            as alice wrote it, the small talk too. Verbatim extraction keeps what was said, not
            what matters; a model would pick and word the facts, and merge a changed fact with
            the old one.
            """
        )
    elif memories:
        page.say(
            """
            The current memories, newest first. A memory that a later fact supersedes keeps its
            row (valid_to, superseded_by) and leaves this list; include_superseded => true shows
            it, and memory_history keeps every change with the event that caused it.
            """
        )
    else:
        page.say(f"None: {ctx.why_no_memories}. The worker writes memories, and remember (below).")

    page.heading("search: an exact word and a misspelled one")
    if not memories:
        page.say(f"skipped: alice has no memories to search ({ctx.why_no_memories}).")
    else:
        page.say(
            """
            search ranks alice's current memories by BM25 over their stemmed words (rare words
            weigh more), a misspelled word standing for the words nearest it, and, with an
            embedding model, vectors. An exact word first:
            """
        )
        page.run(app, SEARCH.format(query="email"))
        page.say(
            """
            Then a misspelled one: bakerys is no word of any memory, but its trigrams are close
            to those of bakeries.
            """
        )
        found = page.run(app, SEARCH.format(query="bakerys"))
        if found:
            page.say("The misspelling still finds the fact, through its trigrams.")
        else:
            page.say("Nothing found: the model worded the facts without a word close to bakerys.")
