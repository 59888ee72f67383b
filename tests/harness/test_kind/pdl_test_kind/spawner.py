"""The test kind's spawner: the embedded default's slots and ledger, told to its server
as kind ``procs``."""

from __future__ import annotations

from pdl_spawner.local.spawner import PDLLocalSpawner


class ProcsSpawner(PDLLocalSpawner):
    """:class:`~pdl_spawner.local.spawner.PDLLocalSpawner`, its server told it is a
    ``procs`` server (its engine host is the test kind's)."""

    kind_name = "procs"
