"""The admin view's source for Docker Swarm (:class:`~pdl_spawner.swarm.PDLSwarmSpawner`).

The holdings are the GPUs that PDL's engine tasks hold, read from the swarm's manager
through the Docker Engine API (:mod:`pdl_spawner.swarm.gpus`), each on its node, since
the time its task reached its state. The pool is the GPUs that PDL's nodes declare, as
``"<hostname>/<GPU id>"``. When Docker cannot be read the page says so and still shows
the queue and the reclaims, which come from the hub's SQLite file as locally (there
it holds no slot reservations, and the slots of its reclaims are GPU descriptions,
e.g. ``"pdl-node1/GPU-fake-1"``, shown as they are). The same file holds the hub's flags
on GPUs held idle, shown for owners whose engines hold GPUs. Its settings
(:func:`reader`) come from the hub's final config
(:func:`pdl_spawner.swarm.kind.admin_settings`): the hub's SQLite file, the manager's
Docker URL (docker-py must be installed: the ``swarm`` extra), the generic resource
that counts as a GPU, and PDL's nodes (the GPUs of other nodes are not in the pool).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from pdl_spawner.admin.frame import (
    RECENT_RECLAIMS, PageParts, gpu_idle_rows, gpu_idle_section, gpu_name, holdings_sections, iso_utc,
    nodes_summary, queue_rows, reclaim_rows, reservation_row, split_owner,
)
from pdl_spawner.core.reservations import Reclaim, SlotLedger
from pdl_spawner.core.wait_queue import Waiter, WaitQueue
from pdl_spawner.swarm.gpus import GpuHolding, SwarmSnapshot, swarm_snapshot
from pdl_spawner.swarm.specs import LABEL_PREFIX

#: The generic resource that counts as a GPU on Swarm, unless the settings name another.
DEFAULT_GPU_RESOURCE = "NVIDIA-GPU"
#: Seconds one Docker API call of the Swarm source may take.
DOCKER_TIMEOUT_S = 10


def gpu_reservation_rows(holdings: list[GpuHolding], now: float) -> list[dict]:
    """One row per GPU held (:func:`~pdl_spawner.admin.frame.reservation_row`), in
    the holdings' order (node, then GPU): the GPU id as ``slot`` (``"(pending)"`` for a
    task not placed yet), its node's hostname as ``node``, its type as ``gpu_type``
    (:attr:`~pdl_spawner.swarm.gpus.GpuHolding.gpu_type`)."""
    return [{**reservation_row(h.gpu, h.node, h.owner, h.user or split_owner(h.owner)[0], h.since, now),
             "gpu_type": h.gpu_type} for h in holdings]


def swarm_status_model(
    snapshot: SwarmSnapshot, waiters: list[Waiter], reclaims: list[Reclaim], *, now: float, error: str | None = None,
    gpu_idle: dict[str, float] | None = None,
) -> dict:
    """Everything the view shows on Swarm, JSON-ready: ``source`` (``"swarm"``),
    ``nodes`` (hostnames of PDL's nodes) and ``unavailable`` (those of them that offer
    no GPU now), ``now`` (ISO UTC), ``pool`` and ``free`` (GPUs as
    ``"<hostname>/<GPU id>"``: PDL's nodes' GPUs, and those no task holds),
    ``other_services`` (GPUs of the pool held by services that are not PDL engines),
    ``reservations`` (:func:`gpu_reservation_rows`), ``queue`` and ``reclaims`` as
    locally, and ``error``: None, or why Docker could not be read (then ``pool`` and
    ``free`` are None and there are no reservations). ``now`` is epoch seconds.
    ``gpu_idle``: the hub's flags on GPUs held idle (owner -> since), shown as
    ``gpu_idle`` rows for owners whose engines hold GPUs now."""
    held = {(h.node, h.gpu) for h in snapshot.holdings}
    in_use = set(snapshot.in_use) | held
    known = error is None
    return {
        "source": "swarm",
        "nodes": list(snapshot.nodes),
        "unavailable": list(snapshot.unavailable),
        "now": iso_utc(now),
        "pool": [gpu_name(*g) for g in snapshot.pool] if known else None,
        "free": [gpu_name(*g) for g in snapshot.pool if g not in in_use] if known else None,
        "other_services": [gpu_name(*g) for g in snapshot.pool if g in in_use and g not in held],
        "reservations": gpu_reservation_rows(snapshot.holdings, now),
        "queue": queue_rows(waiters, now),
        "reclaims": reclaim_rows(reclaims),
        "gpu_idle": gpu_idle_rows({o: t for o, t in (gpu_idle or {}).items()
                                   if o in {h.owner for h in snapshot.holdings}}, now),
        "error": error,
    }


#: The Swarm source's part of the page.
PAGE = PageParts(summary=nodes_summary, sections=lambda status: holdings_sections(
    status, "GPU", "No GPU is held.", "No GPU was reclaimed.") + "\n" + gpu_idle_section(status), unreadable="Docker")


def read_swarm(docker_host: str) -> tuple[list[dict], list[dict], list[dict]]:
    """The swarm's nodes, PDL's engine services and their tasks (those meant to stop
    too: one holds its GPU until it has, :func:`~pdl_spawner.swarm.gpus.is_active`), as the
    Engine API of the manager at ``docker_host`` (a Docker base URL) returns them.
    Each call may take up to :data:`DOCKER_TIMEOUT_S` seconds. Raises what docker-py
    raises (see :func:`read_swarm_status`)."""
    import docker

    client = docker.APIClient(base_url=docker_host, version="auto", timeout=DOCKER_TIMEOUT_S)
    try:
        return (
            client.nodes(),
            client.services(filters={"label": [f"{LABEL_PREFIX}role=engine"]}),
            client.tasks(),
        )
    finally:
        client.close()


def docker_errors() -> tuple[type[BaseException], ...]:
    """What reading the swarm raises when Docker is unreachable, refuses, or is no manager."""
    import docker.errors
    import requests

    return docker.errors.DockerException, requests.exceptions.RequestException, OSError


def read_swarm_status(db_path: str | Path, *, docker_host: str, resource: str, node_names: list[str]) -> dict:
    """:func:`swarm_status_model` now: the holdings and the pool from the swarm manager
    at ``docker_host`` (GPUs are units of generic resource ``resource``; PDL's nodes are
    ``node_names``, all when empty), the queue and the reclaims from ``db_path``. When
    Docker cannot be read the model carries the error (one line) instead."""
    ledger = SlotLedger(db_path)
    waiters, reclaims, flags = WaitQueue(db_path).waiters(), ledger.reclaims(RECENT_RECLAIMS), ledger.gpu_idle_flags()
    try:
        snapshot, error = swarm_snapshot(*read_swarm(docker_host), resource, node_names), None
    except docker_errors() as exc:
        error = " ".join(f"{docker_host}: {exc}".split())[:500]
        logging.getLogger("pdl.admin_view").warning("cannot read the swarm: %s", error)
        snapshot = SwarmSnapshot(nodes=list(node_names))
    return swarm_status_model(snapshot, waiters, reclaims, now=time.time(), error=error, gpu_idle=flags)


def reader(settings: dict) -> Callable[[], dict]:
    """The Swarm reader, from :func:`pdl_spawner.swarm.kind.admin_settings`: the manager at
    ``docker_host`` (GPUs as the generic resource ``gpu_resource``, on the nodes
    ``nodes``: empty, every node), the queue and reclaims of ``state_db``."""
    return partial(read_swarm_status, settings["state_db"], docker_host=settings["docker_host"],
                   resource=settings.get("gpu_resource") or DEFAULT_GPU_RESOURCE,
                   node_names=list(settings.get("nodes") or []))
