"""Scene: the conversation goes on past the agent's budget; a budgeted read compacts it once
(or says why not), and the same read again calls no model."""

from __future__ import annotations

from psycopg.types.json import Jsonb

from aidb_memory.demo.context import MODEL, Context
from aidb_memory.demo.page import cell

BUDGET = 1600  # limit_chars of the reads that compact; a summary may use a quarter of it

# The rest of alice's second conversation: long enough that a read with BUDGET chars compacts.
_MORE = [
    (
        "One more thing: we are growing. Can you add three seats to our pro plan, starting with "
        "the next billing cycle?",
        "Sure. Your pro plan has 5 seats at $25 each; from the renewal on April 1 it will have 8 "
        "seats, so the monthly total goes from $125 to $200 before the SAVE20 discount.",
    ),
    (
        "With SAVE20 that makes what, exactly? Finance needs the number for their forecast.",
        "SAVE20 takes 20% off: 8 seats at $25 is $200, minus $40, so $160 a month. I added a "
        "note with that figure to the account for your finance team.",
    ),
    (
        "Good. Also, our company moved: invoices should go to 14 Harbour Street, Leith, "
        "Edinburgh EH6 6JJ.",
        "I updated the billing address to 14 Harbour Street, Leith, Edinburgh EH6 6JJ. Invoices "
        "from April 1 on show it; past invoices keep the old address.",
    ),
    (
        "Can past invoices be reissued with the new address? Our auditor, Priya Shah, asked for "
        "that.",
        "Yes, I can reissue the invoices for January to March. They get new numbers "
        "(INV-2025-0412 to INV-2025-0414) and the originals are marked as replaced. Shall I?",
    ),
    (
        "Yes please, go ahead with all three.",
        "Done: INV-2025-0412, INV-2025-0413 and INV-2025-0414 are reissued with the new address "
        "and emailed to billing@alice-co.example. The originals are marked as replaced.",
    ),
    (
        "We also need our VAT number on every invoice: GB 123 4567 89.",
        "I added VAT number GB 123 4567 89 to the account. It appears on every invoice from now "
        "on, including the three I just reissued, which I regenerated.",
    ),
    (
        "Can we pay annually instead of monthly? Priya says it is easier for the audit.",
        "Yes: annual billing charges 10 months for 12, so $1,600 a year for 8 seats after "
        "SAVE20. You can switch at the April 1 renewal; I cannot switch mid-cycle.",
    ),
    (
        "Let's do that: switch us to annual billing at the April renewal.",
        "Scheduled: from April 1 your plan bills annually, $1,600 for 8 seats with SAVE20. "
        "You get a confirmation email today and a reminder a week before.",
    ),
    (
        "Last question: can I export all our invoices as a CSV for Priya?",
        "Yes: Billing > Invoices > Export gives a CSV of every invoice with its number, date, "
        "amount, VAT and status. I also emailed you the export for 2024 and 2025.",
    ),
    (
        "Perfect, that is everything. Thanks for sorting all of this out!",
        "My pleasure, Alice: 8 seats and annual billing from April 1, the new address and VAT "
        "number on every invoice, three invoices reissued. Have a good day!",
    ),
]

_BUDGETED = f"""
    SELECT items->0->>'kind' AS first_item, items->0->'meta' AS first_meta,
           length(items->0->>'content') AS first_chars, {BUDGET} / 4 AS target_chars,
           jsonb_path_query_array(items, '$[*].seq') AS seqs,
           compacted_entries, overflow_chars, warnings, items->0->>'content' AS first_content
    FROM aidb_memory.session_get(
           namespace   => 'helpdesk_namespace',
           actor_id    => 'alice',
           session_id  => 'conv-738950',
           limit_chars => {BUDGET}
         );
"""

_CALLS = """
    SELECT model_name, purpose, outcome, latency_ms, chars_in, chars_out, error
    FROM aidb_memory.model_calls ORDER BY id;
"""

_COMPACTION_CALLS = """
    SELECT count(*) AS compaction_calls
    FROM aidb_memory.model_calls WHERE purpose = 'compaction';
"""

# What each warning of a budgeted read means, for the narration.
_WARNINGS = {
    "compaction_call_failed": (
        "the model call failed (now, or less than compaction_cooldown_s ago: then no call was"
        " made); model_calls below has the error"
    ),
    "compaction_summary_overlength": (
        "the model's summary was still longer than the target after one retry"
    ),
    "compaction_model_unavailable": "the namespace's model is not registered",
    "compaction_budget_too_small": "a quarter of the budget is too small for a summary",
    "compaction_busy": "another read was compacting this session",
}


def scene(ctx: Context) -> None:
    page, app, admin = ctx.page, ctx.app, ctx.admin
    page.heading("The conversation goes on, past the agent's budget")
    page.say(
        """
        Alice stays in conv-738950 with more requests. The application stores the exchange
        with one add; $1 is these turns as a jsonb array:
        """
    )
    turns = page.show_turns([(r, t) for q, a in _MORE for r, t in (("user", q), ("assistant", a))])
    page.run(
        app,
        """
        SELECT aidb_memory.add(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'alice',
          turns      => $1,
          session_id => 'conv-738950'
        );
        """,
        (Jsonb(turns),),
    )
    page.run(
        app,
        """
        SELECT session_id, turn_count, total_chars
        FROM aidb_memory.session_list(namespace => 'helpdesk_namespace', actor_id => 'alice')
        WHERE session_id = 'conv-738950';
        """,
    )
    page.say(
        f"""
        The agent reads its history with limit_chars => {BUDGET}, less than the session holds.
        """
    )

    page.heading("session_get over budget: compaction")
    page.say(
        f"""
        This read finds the turns over its budget and compacts once: the oldest three quarters
        of the turns not yet summarized, cut at a round boundary, become one summary of at most
        a quarter of limit_chars ({BUDGET // 4} chars), written by {MODEL}. The summary comes
        first in items (kind summary, role system, no seq; meta says what it covers), then the
        newest rounds that fit.
        """
    )
    rows = page.run(app, _BUDGETED)
    summarized = False
    if rows:
        kind, meta, chars, target, _seqs, compacted, overflow, warnings, _text = rows[0]
        if kind == "summary" and isinstance(meta, dict):
            summarized = not warnings
            page.say(
                f"""
                A summary was created: turns {meta.get("from_seq")} to {meta.get("to_seq")}
                ({meta.get("turn_count")} turns) in {chars} chars, within the target of {target};
                compacted_entries {compacted} (the turns it stands for), overflow_chars
                {overflow}, warnings {cell(warnings)}.
                """
            )
        else:
            codes = ", ".join(warnings or []) or "none"
            why = "; ".join(_WARNINGS.get(w, w) for w in warnings or [])
            page.say(
                f"""
                No summary was written: warnings {codes}{f": {why}" if why else ""}. The read is
                answered all the same, with the newest whole rounds that fit (overflow_chars
                {overflow} left out), as without a model: compaction never fails a read.
                """
            )
    page.say("As an admin, the model call as recorded (no content, never a key):")
    page.run(admin, _CALLS)

    page.heading("The same budgeted read again")
    page.run(
        app,
        f"""
        SELECT items->0->>'kind' AS first_item, items->0->'meta' AS first_meta,
               compacted_entries, overflow_chars, warnings
        FROM aidb_memory.session_get(
               namespace   => 'helpdesk_namespace',
               actor_id    => 'alice',
               session_id  => 'conv-738950',
               limit_chars => {BUDGET}
             );
        """,
    )
    calls = page.run(admin, _COMPACTION_CALLS)
    count = calls[0][0] if calls else "?"
    if summarized:
        page.say(
            f"""
            Still {count} compaction call: the summary and the newest turns fit the budget
            together, so the read returns the stored summary and calls no model. The turns it
            stands for are still stored, unchanged; an unbudgeted read returns them all.
            """
        )
    else:
        page.say(
            f"""
            Still {count} compaction call: after a failed call, this session's reads do not
            call that model again for compaction_cooldown_s (60 s by default); they answer at
            once with compaction_call_failed and the newest rounds that fit. The first
            over-budget read after the cool-down tries again.
            """
        )
