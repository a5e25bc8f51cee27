-- Pinned instructions (issue 11, config pin_instructions): each session keeps the extent of its
-- instructions prefix, the leading system/developer turns (seqs 1..pinned_seq, pinned_chars chars
-- in all), maintained by add and session_pop, so that a budgeted read returns them first without
-- looking for them and compaction starts after them. Existing sessions get theirs from their
-- turns; no turn is rewritten.

ALTER TABLE aidb_memory.session
    ADD COLUMN pinned_seq bigint NOT NULL DEFAULT 0,
    ADD COLUMN pinned_chars bigint NOT NULL DEFAULT 0;

UPDATE aidb_memory.session AS s
SET pinned_seq = p.last_seq, pinned_chars = p.chars
FROM (
    SELECT x.id, x.last_seq,
           (SELECT coalesce(sum(t.chars), 0) FROM aidb_memory.turn AS t
            WHERE t.session_ref = x.id AND t.seq <= x.last_seq) AS chars
    FROM (
        SELECT s2.id,
               coalesce((SELECT min(t.seq) FROM aidb_memory.turn AS t
                         WHERE t.session_ref = s2.id AND t.role NOT IN ('system', 'developer')),
                        s2.next_seq) - 1 AS last_seq
        FROM aidb_memory.session AS s2
    ) AS x
    WHERE x.last_seq > 0
) AS p
WHERE s.id = p.id;
