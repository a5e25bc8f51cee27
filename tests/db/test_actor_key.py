"""The distribution key (issue 15): one definition, in SQL and in the server code alike."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aidb_memory_server import keys
from conftest import Database

actors = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=80)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(namespace=actors, actor_id=actors)
def test_sql_and_python_compute_the_same_key(db: Database, namespace: str, actor_id: str) -> None:
    assert db.value("SELECT aidb_memory.actor_key(%s, %s)", (namespace, actor_id)) == (
        keys.actor_key(namespace, actor_id)
    )


def test_the_key_is_a_fixed_standard_hash() -> None:
    # sha256(b"support:alice")[:8] as a signed big-endian integer: the same on every machine,
    # so that a database moved to another architecture or major version keeps its rows' keys.
    assert keys.actor_key("support", "alice") == int.from_bytes(
        bytes.fromhex("070eb556bb900fbe"), "big", signed=True
    )
    assert keys.actor_key("sales", "alice") != keys.actor_key("support", "alice")
