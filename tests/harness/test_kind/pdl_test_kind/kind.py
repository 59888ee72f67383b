"""A cluster kind that lives only in the tests, registered as ``procs``: what a fourth
kind needs, and nothing else (docs/architecture.md, "Adding a cluster kind"). Its files
(a namespace package, found where ``tests/harness/test_kind`` is on ``PYTHONPATH``; its
entry point in ``pdl_test_kind-0.1.dist-info``):

- ``kind.py``: its plug-in: its spawner, its engine host, the embedded default's admin
  source, its own variable (``PDL_PROCS_SLOTS``, the slots) and its hub settings (the
  ledger in the hub's state folder);
- ``spawner.py``: the embedded default's slots under another name;
- ``engine_host.py``: the user's server's engines as plain processes of a host of its
  own (no slot pinning), each marked ``PDL_TEST_KIND_ENGINE=1``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pdl_spawner.kinds import ClusterKind
from pdl_spawner.local.kind import ledger_settings
from pdl_spawner.settings import values
from pdl_spawner.settings.variables import Variable


def configure(c, found: dict[str, Any], state_dir: Path) -> None:
    c.ProcsSpawner.reservations_db = str(state_dir / "reservations.sqlite")


def admin_settings(c) -> dict:
    return ledger_settings(c, KIND.sections())


KIND = ClusterKind(
    name="procs", spawner="pdl_test_kind.spawner:ProcsSpawner", engine_host="pdl_test_kind.engine_host:PlainProcesses",
    admin_source="pdl_spawner.local.admin_source", configure=configure, admin_settings=admin_settings,
    variables=(Variable("PDL_PROCS_SLOTS", "The test kind's slots, e.g. `cpu:0,cpu:1`.", values.names,
                        trait="ProcsSpawner.pool"),),
)
