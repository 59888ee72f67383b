"""The hub's private networks on Docker Swarm: each running server has one of its own.

A server's notebook and engines talk (controller, process groups, Horovod) only on
their private overlay network, so another user's containers, which are on other
networks, cannot reach them, on the same node or any other (see
:mod:`pdl_spawner.swarm.specs`, "Networking").

The hub keeps a pool of :data:`~pdl_spawner.swarm.specs.PRIVATE_NETWORK` networks
(made on first use, then kept across spawns and hub restarts) plus the global
:func:`~pdl_spawner.swarm.specs.network_keeper_service` on all of them, so no spawn
changes a node's networks (Docker Engine before 23.0 would restart every GPU task on
a node whose networks change). Growing the pool changes them once.

A network is taken while a notebook service names it in its ``pdl.network`` label,
or while a spawn of this hub process has claimed it (:meth:`NetworkPool.claim`) and
not yet released it (:meth:`NetworkPool.release`, once the notebook service exists
or the spawn failed).

Every Docker call goes through the ``docker`` coroutine function given to each call
(the spawner's one seam, ``PDLSwarmSpawner.docker``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from pdl_spawner.swarm.gpus import is_available
from pdl_spawner.swarm.specs import LABEL_PREFIX, NETWORK_KEEPER, PRIVATE_NETWORK, network_keeper_service, private_network

#: ``await docker("method", *args, **kwargs)``: docker-py's low-level API.
Docker = Callable[..., Awaitable]
#: Seconds :func:`ensure_pool` waits for the keeper to run on every node after a change.
KEEPER_WAIT_S = 60.0
POLL_S = 0.25


class NoFreeNetwork(RuntimeError):
    """Every network of the pool is taken."""

    def __init__(self, size: int):
        super().__init__(
            f"No private network is free for your server (0 of {size} are free); try again when a "
            f"server stops, or ask the admin to raise PDLSwarmSpawner.private_networks")


def pool_names(size: int) -> list[str]:
    """The names of a pool of ``size`` networks, in the order they are handed out."""
    return [PRIVATE_NETWORK.format(index=i) for i in range(size)]


def free_network(names: list[str], notebooks: list[dict], claimed: set[str]) -> str | None:
    """The first of ``names`` that no notebook service's ``pdl.network`` label names and
    nobody ``claimed``; None when all are taken."""
    taken = set(claimed)
    for service in notebooks:
        taken.add((service.get("Spec", {}).get("Labels") or {}).get(LABEL_PREFIX + "network"))
    return next((n for n in names if n not in taken), None)


def keeper_networks(service: dict) -> set[str]:
    """Network IDs of the keeper service's spec (Swarm stores IDs, whatever was given)."""
    return {n["Target"] for n in service["Spec"]["TaskTemplate"].get("Networks", [])}


async def ensure_pool(docker: Docker, *, size: int, image: str, user: str) -> bool:
    """Make the pool's first ``size`` networks and the keeper, on every network of the
    pool (also those beyond ``size`` from an earlier, larger pool: they may be in use).

    Returns True when nothing had to change or the keeper runs on every ready, active
    node after the change; False when it did not within :data:`KEEPER_WAIT_S` (spawns
    still work, but on Docker Engine before 23.0 a node's first task on a network may
    restart the GPU tasks running there).
    """
    selector = {"label": [f"{LABEL_PREFIX}role=network"]}
    existing = {n["Name"] for n in await docker("networks", filters=selector)}
    changed = False
    for index, name in enumerate(pool_names(size)):
        if name not in existing:
            await docker("create_network", **private_network(index))
            changed = True
    networks = await docker("networks", filters=selector)
    spec = network_keeper_service(image=image, networks=sorted(n["Name"] for n in networks), user=user)
    keepers = [s for s in await docker("services", filters={"name": NETWORK_KEEPER})
               if s["Spec"]["Name"] == NETWORK_KEEPER]
    if not keepers:
        keeper_id = (await docker("create_service", **spec))["ID"]
        changed = True
    else:
        keeper_id = keepers[0]["ID"]
        if keeper_networks(keepers[0]) != {n["Id"] for n in networks}:
            await docker("update_service", keeper_id, version=keepers[0]["Version"]["Index"],
                         task_template=spec["task_template"], name=spec["name"], labels=spec["labels"],
                         mode=spec["mode"], endpoint_spec=spec["endpoint_spec"])
            changed = True
    return not changed or await _keeper_everywhere(docker, keeper_id, len(networks))


async def _keeper_everywhere(docker: Docker, keeper_id: str, n_networks: int) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + KEEPER_WAIT_S
    while True:
        nodes = {n["ID"] for n in await docker("nodes") if is_available(n)}
        tasks = await docker("tasks", filters={"service": keeper_id, "desired-state": "running"})
        running = {t["NodeID"] for t in tasks
                   if t["Status"]["State"] == "running" and len(t.get("NetworksAttachments") or []) == n_networks}
        if nodes <= running:
            return True
        if loop.time() > deadline:
            return False
        await asyncio.sleep(POLL_S)


class NetworkPool:
    """The claims of one hub process (one instance per process, shared by its spawners)."""

    def __init__(self) -> None:
        self._claims: dict[str, str] = {}
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    def _loop_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:
            self._lock = (loop, asyncio.Lock())
        return self._lock[1]

    async def claim(self, docker: Docker, owner: str, *, size: int, image: str, user: str) -> tuple[str, bool]:
        """A free network for ``owner``'s server (its own claim, if it has one), and
        :func:`ensure_pool`'s answer; :class:`NoFreeNetwork` when all are taken."""
        async with self._loop_lock():
            ready = await ensure_pool(docker, size=size, image=image, user=user)
            self._claims.pop(owner, None)
            notebooks = await docker("services", filters={"label": [f"{LABEL_PREFIX}role=notebook"]})
            name = free_network(pool_names(size), notebooks, set(self._claims.values()))
            if name is None:
                raise NoFreeNetwork(size)
            self._claims[owner] = name
            return name, ready

    def release(self, owner: str) -> None:
        """Drop ``owner``'s claim (its notebook service's label holds the network now,
        or the spawn failed)."""
        self._claims.pop(owner, None)
