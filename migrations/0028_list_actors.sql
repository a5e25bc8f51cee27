-- list_actors (issue 35) pages a namespace's actors in code-point order, from its sessions and
-- from its actors' current memories (memory_lexeme's '' row, one per actor with any; its count
-- is not indexed, so remember's update of it stays HOT). Both indexes lead with namespace_id + 0,
-- which only list_actors' statements write: on namespace_id itself the planner took the session
-- index for the per-actor statements too (each names namespace_id besides the actor's key), a
-- scan of the namespace where they must probe by the key (tests/db/test_single_key_explain.py).
CREATE INDEX session_namespace_actor_idx
    ON aidb_memory.session ((namespace_id + 0), (actor_id COLLATE "C"));
CREATE INDEX memory_lexeme_actor_idx
    ON aidb_memory.memory_lexeme ((namespace_id + 0), (actor_id COLLATE "C")) WHERE lexeme = '';
