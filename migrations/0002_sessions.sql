-- Sessions (SPEC §3) and the events every add records (SPEC §5).

CREATE TABLE aidb_memory.session (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace_id     bigint NOT NULL REFERENCES aidb_memory.namespace (id) ON DELETE CASCADE,
    actor_id         text NOT NULL,
    session_id       text NOT NULL,
    agent_id         text,
    started_at       timestamptz NOT NULL DEFAULT now(),
    closed_at        timestamptz,
    prev_handoff     jsonb,
    handoff          jsonb,
    -- The position allocator: writers serialize on this row, so positions are gap-free.
    next_seq         bigint NOT NULL DEFAULT 1,
    total_chars      bigint NOT NULL DEFAULT 0,
    -- The tail: what the next add needs to place its turns in rounds, without reading turns.
    tail_sequence_id text,
    tail_round_start bigint,
    open_calls       text[] NOT NULL DEFAULT '{}',
    last_user_seq    bigint,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (namespace_id, actor_id, session_id)
);
-- prev_handoff and session_list: an actor's sessions, newest first.
CREATE INDEX session_actor_idx ON aidb_memory.session (namespace_id, actor_id, agent_id, closed_at DESC);

CREATE TABLE aidb_memory.event (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    public_id       uuid NOT NULL DEFAULT gen_random_uuid() UNIQUE,
    correlation_id  uuid,
    namespace_id    bigint NOT NULL REFERENCES aidb_memory.namespace (id) ON DELETE CASCADE,
    actor_id        text NOT NULL,
    agent_id        text,
    session_id      text,
    idempotency_key text,
    -- Only with an idempotency key: what tells a retry from a different batch.
    turns_hash      text,
    -- The turns themselves when the add named no session (a session keeps them as turn rows).
    turns           jsonb,
    turn_count      int NOT NULL,
    status          text NOT NULL CHECK (status IN ('accepted', 'processing', 'processed', 'failed', 'skipped')),
    attempts        int NOT NULL DEFAULT 0,
    last_error      text,
    lease_until     timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    processed_at    timestamptz
);
CREATE UNIQUE INDEX event_idempotency_idx ON aidb_memory.event (namespace_id, actor_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX event_queue_idx ON aidb_memory.event (id) WHERE status IN ('accepted', 'processing');
CREATE INDEX event_actor_idx ON aidb_memory.event (namespace_id, actor_id);

CREATE TABLE aidb_memory.turn (
    session_ref  bigint NOT NULL REFERENCES aidb_memory.session (id) ON DELETE CASCADE,
    seq          bigint NOT NULL,
    -- seq of the first turn of this turn's reasoning round: a read may cut only where a round starts.
    round_start  bigint NOT NULL,
    -- chars of all earlier turns of the session: a budgeted read range-scans on it.
    char_offset  bigint NOT NULL,
    chars        int NOT NULL,
    role         text NOT NULL CHECK (role IN ('user', 'assistant', 'system', 'tool')),
    content      text,
    kind         text NOT NULL,
    name         text,
    tool_calls   jsonb,
    tool_call_id text,
    meta         jsonb NOT NULL DEFAULT '{}'::jsonb,
    event_ref    bigint REFERENCES aidb_memory.event (id) ON DELETE SET NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_ref, seq)
);
CREATE INDEX turn_offset_idx ON aidb_memory.turn (session_ref, char_offset, seq);
CREATE INDEX turn_event_idx ON aidb_memory.turn (event_ref);

-- Summaries written by compaction (a later migration's feature; the reads know them now).
CREATE TABLE aidb_memory.summary (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_ref bigint NOT NULL REFERENCES aidb_memory.session (id) ON DELETE CASCADE,
    from_seq    bigint NOT NULL,
    to_seq      bigint NOT NULL,
    turn_count  int NOT NULL,
    content     text NOT NULL,
    chars       int NOT NULL,
    model       text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (from_seq <= to_seq)
);
CREATE INDEX summary_session_idx ON aidb_memory.summary (session_ref, to_seq);

-- Who erased what, when and why. Never any content, and not even the actor's or the session's
-- id (erasure must leave no trace of them): only an HMAC of them under this database's own
-- random key (audit_key), which an admin can recompute to answer "was X erased?" but which
-- cannot be reversed or confirmed by guessing without the key.
CREATE TABLE aidb_memory.audit_key (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    key       text NOT NULL
);
INSERT INTO aidb_memory.audit_key (key)
VALUES (replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));

CREATE TABLE aidb_memory.audit_log (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    by_role      text NOT NULL,
    action       text NOT NULL,
    namespace    text NOT NULL,
    subject_hash text,
    counts       jsonb NOT NULL DEFAULT '{}'::jsonb,
    reason       text NOT NULL CHECK (reason <> '')
);
