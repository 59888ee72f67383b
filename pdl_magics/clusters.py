"""Finding or starting the ipyparallel cluster a notebook runs its cells on.

Two cases, same engines:

- **Hub** — the user's server was started by PDL's spawner. ``pdl-singleuser``
  started a controller and one engine per reserved slot, and exported
  ``PDL_CLUSTER_FILE`` (and ``PDL_SLOTS``) to the server and its kernels.
- **Local** — plain JupyterLab or IPython. A cluster is started on first use,
  one engine per slot of this machine's pool, and stopped when the kernel exits.

Every engine and controller runs through :mod:`pdl.engine_boot`, so it is pinned
to its slot and dies with the process that started it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import ipyparallel as ipp

from pdl.slots import engine_env

#: Seconds to wait for a controller's connection files and for engines to register.
ENGINE_TIMEOUT_S = 60

_BOOT = [sys.executable, "-m", "pdl.engine_boot"]


def new_cluster(*, cluster_id: str, profile_dir: str | None = None, shutdown_atexit=True):
    """An ipyparallel Cluster on 127.0.0.1 whose processes run through pdl.engine_boot."""
    kwargs = {"profile_dir": profile_dir} if profile_dir else {}
    cluster = ipp.Cluster(
        cluster_id=cluster_id,
        n=0,
        controller_ip="127.0.0.1",
        shutdown_atexit=shutdown_atexit,
        engine_timeout=ENGINE_TIMEOUT_S,
        log_level=30,
        **kwargs,
    )
    # ipyparallel writes a profile into profile_dir; make sure its parent exists.
    Path(cluster.profile_dir).mkdir(parents=True, exist_ok=True)
    return cluster


def start_controller(cluster) -> None:
    """Start the cluster's controller (blocking; safe inside a running event loop)."""
    cluster.start_controller_sync(
        controller_cmd=[*_BOOT, "controller"],
        # notice a dead engine within ~3 s instead of ipyparallel's default ~30 s
        controller_args=["--HeartMonitor.period=1000", "--HeartMonitor.max_heartmonitor_misses=3"],
    )


def start_slot_engines(cluster, slots: list[str], pool_size: int) -> None:
    """Start one engine per slot, each with its own pinning environment (blocking)."""
    for slot in slots:
        cluster.start_engines_sync(
            n=1,
            engine_set_id=slot_engine_set_id(slot),
            environment=engine_env(slot, pool_size),
            engine_cmd=[*_BOOT, "engine"],
        )


def slot_engine_set_id(slot: str) -> str:
    return f"slot-{slot.replace(':', '-')}"


def restart_slot_engine(cluster, slot: str, pool_size: int) -> None:
    """Replace the (dead or killed) engine of ``slot`` with a fresh one."""
    esid = slot_engine_set_id(slot)
    if esid in cluster.engines:
        cluster.stop_engines_sync(esid)
    start_slot_engines(cluster, [slot], pool_size)


def hub_cluster_file() -> str | None:
    """The cluster file exported by ``pdl-singleuser``, if this kernel runs under the hub."""
    return os.environ.get("PDL_CLUSTER_FILE") or None


def hub_slots() -> list[str]:
    """The slots the hub reserved for this user (``PDL_SLOTS``)."""
    from pdl.slots import parse_slot_list

    return parse_slot_list(os.environ.get("PDL_SLOTS", ""))
