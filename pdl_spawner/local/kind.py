"""The embedded default as a cluster kind (:class:`pdl_spawner.kinds.ClusterKind`,
registered as ``local``): servers and engines as processes of this machine, its GPUs
(or CPU slots) the pool.

Its own variable is ``PDL_POOL``; its hub settings keep the slot ledger in the hub's
state folder, and a hub that is not root serves one user only (users are kept apart
by Unix accounts, which only root can make).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pdl_spawner.kinds import ClusterKind
from pdl_spawner.settings import values
from pdl_spawner.settings.config_reading import effective
from pdl_spawner.settings.variables import Variable

SPAWNER = "pdl_spawner.local.spawner:PDLLocalSpawner"


def configure(c, found: dict[str, Any], state_dir: Path) -> None:
    """The ledger in ``state_dir``; refuses several users without root (one line)."""
    users = found["PDL_USERS"]
    if os.geteuid() != 0 and len(users) > 1:
        raise SystemExit(f"PDL_USERS lists {len(users)} users, but the hub is not root, so their servers could not "
                         "be kept apart: start it as root (each user then gets their own Unix account), "
                         "or list one user")
    c.PDLLocalSpawner.reservations_db = str(state_dir / "reservations.sqlite")


def ledger_settings(c, sections: list[str]) -> dict:
    """What the admin source of a kind on the slot ledger reads, as a spawner whose config
    sections are ``sections`` has it: the ledger, the pool (None: the spawner's default)
    and nvidia-smi."""
    return {name: effective(c, sections, name) for name in ("reservations_db", "pool", "cpu_slots", "nvidia_smi")}


def admin_settings(c) -> dict:
    """:func:`ledger_settings` of this kind's spawner."""
    return ledger_settings(c, KIND.sections())


KIND = ClusterKind(
    name="local", spawner=SPAWNER, engine_host="pdl_spawner.local.engine_host:LocalSlots",
    admin_source="pdl_spawner.local.admin_source",
    configure=configure, admin_settings=admin_settings,
    variables=(Variable("PDL_POOL", "The embedded default's slots, e.g. `gpu:0,gpu:1` or `cpu:0,cpu:1,cpu:2`.",
                        values.names, trait="PDLLocalSpawner.pool", shown="every GPU, else one CPU slot per core"),),
)
