"""Installing and upgrading the schema: for the operator who installs.

What ``aidb-memory install``, ``sql``, ``status``, ``verify`` and ``uninstall`` run: the source
tree (``sources``), the migrations and the code bundle read from it (``migrations``,
``codebundle``), the script built from them (``script``, with the trust checks of ``trust``), the
catalog records it compares (``catalog``), the executor (``installer``) and the Citus layer
(``citus``). Nothing here is imported by the client.
"""
