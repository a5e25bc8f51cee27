"""The pure part of drift detection: records compared object by object, in words."""

from __future__ import annotations

import hashlib

from aidb_memory.install import catalog


def _lines(*items: tuple[str, str, str]) -> str:
    return "\n".join("\t".join(i) for i in items)


def test_identical_records_have_no_differences() -> None:
    rec = _lines(("function", "aidb_memory.f()", "abc"), ("index", "aidb_memory.i", "def"))
    assert catalog.differences(rec, rec, catalog.CODE) == []


def test_missing_extra_and_changed_objects_are_named() -> None:
    recorded = _lines(("index", "aidb_memory.a_idx", "1"), ("table", "aidb_memory.t", "2"))
    current = _lines(("table", "aidb_memory.t", "3"), ("index", "aidb_memory.z_idx", "4"))
    assert catalog.differences(recorded, current, catalog.SCHEMA_PART) == [
        "index aidb_memory.a_idx is missing",
        "index aidb_memory.z_idx is not part of aidb_memory",
        "table aidb_memory.t differs from what migrations created",
    ]


def test_a_disabled_trigger_says_so() -> None:
    name = "memory_words_added on aidb_memory.memory"
    recorded = _lines(("trigger", name, "O 123"), ("foreign key triggers", "aidb_memory.m", "OO"))
    current = _lines(("trigger", name, "D 123"), ("foreign key triggers", "aidb_memory.m", "DD"))
    assert catalog.differences(recorded, current, catalog.CODE) == [
        "foreign key triggers of aidb_memory.m are not all enabled",
        f"trigger {name} is disabled",
    ]


def test_a_changed_function_is_changed_by_hand() -> None:
    recorded = _lines(("function", "aidb_memory.f(text)", "1"))
    current = _lines(("function", "aidb_memory.f(text)", "2"))
    assert catalog.differences(recorded, current, catalog.CODE) == [
        "function aidb_memory.f(text) changed by hand"
    ]


def test_modules_digest_matches_the_sql_definition() -> None:
    # MODULES_QUERY: name:is_package:md5(source) per module, ordered by name's bytes, joined by \n
    digest = catalog.modules_digest([("b.x", False, "é = 1"), ("b", True, "")])
    md5 = hashlib.md5("é = 1".encode(), usedforsecurity=False).hexdigest()
    empty = hashlib.md5(b"", usedforsecurity=False).hexdigest()
    assert digest == f"b:true:{empty}\nb.x:false:{md5}"


def test_defined_objects_reads_signatures_and_views() -> None:
    defined = catalog.defined_objects(
        [
            "CREATE FUNCTION aidb_memory.f(a text, OUT b int, VARIADIC c text[]) "
            "LANGUAGE sql AS 'SELECT 1'",
            "CREATE FUNCTION aidb_memory.g(x int) RETURNS TABLE (y int) LANGUAGE sql AS 'SELECT 1'",
            "CREATE OR REPLACE VIEW aidb_memory.v AS SELECT 1",
            "GRANT SELECT ON aidb_memory.v TO PUBLIC",
            "CREATE OR REPLACE TRIGGER t AFTER DELETE ON aidb_memory.s "
            "FOR EACH STATEMENT EXECUTE FUNCTION aidb_memory.f()",
        ]
    )
    assert defined.triggers == ["t on aidb_memory.s"]
    assert defined.functions == ["aidb_memory.f(text, text[])", "aidb_memory.g(integer)"]
    assert defined.views == ["aidb_memory.v"]
