"""Running an installed schema: for the operator who runs it.

What ``aidb-memory doctor``, ``deps``, ``worker``, ``events`` and ``retry`` run: the server checks
(``doctor``), the server's Python packages (``deps``), the long-term memory worker (``worker``)
and the event queue's report (``events``). These read what ``aidb_memory.install`` installed;
nothing in ``install`` imports them.
"""
