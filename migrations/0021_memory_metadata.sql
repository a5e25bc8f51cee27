-- A memory's metadata (issue 34): the JSON object an application tags it with. Existing memories
-- get {} (a constant default: no table rewrite). search and list_memories return it, so their
-- result types gain it last (a type's attribute is added in place; the functions that return
-- it are replaced by sql/60_memories.sql).
ALTER TABLE aidb_memory.memory ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}';
ALTER TYPE aidb_memory.search_result ADD ATTRIBUTE metadata jsonb;
ALTER TYPE aidb_memory.list_memories_result ADD ATTRIBUTE metadata jsonb;
