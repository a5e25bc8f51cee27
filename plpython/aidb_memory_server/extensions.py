"""Where pg_trgm is, and SQL that names its functions and operators there.

A database may have pg_trgm in any schema (CREATE EXTENSION puts it in public by default; install
creates it in pg_catalog when absent). Our functions run with search_path = pg_catalog, pg_temp,
so nothing of pg_trgm is found by name: statements name its schema explicitly, taken from
pg_extension (never from search_path), and call its functions with their exact argument types
(text, text), so that a look-alike with other argument types planted in that schema by its owner
is never a better match. The schema is looked up once per connection, when the first statement
that needs it is built (moving the extension therefore takes effect in new connections).

Statements are written with the quoted identifier ``"@trgm@"`` where pg_trgm's schema goes:
``"@trgm@".similarity(a, b)``, ``a OPERATOR("@trgm@".%) b`` (still SQL that parses, so that
tools reading our SQL strings see these statements).
"""

from __future__ import annotations

PLACEHOLDER = '"@trgm@"'

_schema: list[str] = []
_built: dict[str, str] = {}

_LOOKUP = """
SELECT n.nspname FROM pg_catalog.pg_extension e
JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
WHERE e.extname = 'pg_trgm'
"""


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (always quoted: right for any name)."""
    if "\x00" in name:
        raise ValueError("an identifier cannot contain NUL")
    return '"' + name.replace('"', '""') + '"'


def qualify(template: str, schema: str) -> str:
    """``template`` with every ``"@trgm@"`` replaced by ``schema`` quoted as an identifier."""
    return template.replace(PLACEHOLDER, quote_ident(schema))


def trgm_schema(function: str) -> str:
    """The schema pg_trgm is in, looked up once per connection; ``function`` (the public
    function being run) names the caller in the error when pg_trgm is missing."""
    if not _schema:
        from aidb_memory_server import db
        from aidb_memory_server.errors import OBJECT_NOT_IN_PREREQUISITE_STATE, ApiError

        rows = db.execute(_LOOKUP)
        if not rows.nrows():
            raise ApiError(
                OBJECT_NOT_IN_PREREQUISITE_STATE,
                f"aidb_memory.{function}: the pg_trgm extension is not installed in this database",
                hint="a superuser runs CREATE EXTENSION pg_trgm (in any schema) and recreates "
                "the index aidb_memory.memory_word_trgm_idx that went with it",
            )
        _schema.append(str(rows[0]["nspname"]))
    return _schema[0]


def trgm_sql(template: str, function: str) -> str:
    """``template`` qualified by pg_trgm's schema (built once per connection); ``function`` as
    for ``trgm_schema``."""
    built = _built.get(template)
    if built is None:
        built = qualify(template, trgm_schema(function))
        _built[template] = built
    return built


# pgvector (issue 27): the same rule as for pg_trgm. Its schema is the schema of the type of
# memory.embedding (install converted the column there, vectors.storage reads it on every search),
# written ``"@vector@"`` in statements: ``"@vector@".vector_dims(e)``,
# ``a OPERATOR("@vector@".<=>) b``.
VECTOR_PLACEHOLDER = '"@vector@"'
_vector_built: dict[tuple[str, str], str] = {}


def vector_sql(template: str, schema: str) -> str:
    """``template`` with every ``"@vector@"`` replaced by ``schema`` quoted as an identifier
    (built once per connection and schema)."""
    built = _vector_built.get((template, schema))
    if built is None:
        built = template.replace(VECTOR_PLACEHOLDER, quote_ident(schema))
        _vector_built[(template, schema)] = built
    return built
