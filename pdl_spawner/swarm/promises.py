"""The Swarm spawner's GPU accounting: what is free now, GPUs promised to spawns in
progress, and the GPU types a spawn may choose among (its nodes' labels,
:data:`~pdl_spawner.swarm.specs.GPU_TYPE_LABEL`).

:class:`SwarmGpuPromises` is a mixin of :class:`~pdl_spawner.swarm.spawner.PDLSwarmSpawner`
(its settings, the swarm's nodes, the promises), read by the kind's source of workers
(:class:`~pdl_spawner.swarm.workers.SwarmGpus`). Free GPUs are read from the swarm on every call (:func:`pdl_spawner.swarm.gpus.gpu_usage`,
the one definition of held) on the nodes PDL uses. Between the take of a spawn (or
of engines a cell asks back) and the moment every one of its engine tasks exists,
Swarm does not count its GPUs yet: the spawn's promise does, in this hub process
(:data:`SwarmGpuPromises.promised`), so no GPU is granted twice. Where a spawn
chose a GPU type, what is free and what it promises are of that type
(:func:`~pdl_spawner.swarm.gpus.gpu_usage`).
"""

from __future__ import annotations

from tornado import web
from traitlets import HasTraits, List, Unicode

from pdl_spawner.swarm.gpus import Promise, excluded_hostnames, gpu_types, select_nodes
from pdl_spawner.swarm.specs import LABEL_PREFIX


class SwarmGpuPromises(HasTraits):
    """Mixin: free GPUs, promises and GPU types (see the module docstring). The spawner
    provides ``docker`` (dockerspawner's seam), ``owner``, ``user`` and ``chosen_gpu_type``."""

    gpu_resource = Unicode(
        "NVIDIA-GPU", config=True,
        help="""Swarm generic resource one engine reserves one unit of. Each node's daemon.json
        declares its GPUs under this name (`"node-generic-resources": ["NVIDIA-GPU=GPU-<uuid>"]`).""",
    )

    nodes = List(
        Unicode(), config=True,
        help="Hostnames of the swarm nodes whose GPUs PDL hands out (engines run only there); "
        "empty: every node. A name that is not a node of the swarm fails each spawn with a one-line error.",
    )

    #: GPUs granted to spawns of this hub whose engine tasks don't exist yet:
    #: owner -> :class:`~pdl_spawner.swarm.gpus.Promise`. Shared by every spawner of the process.
    promised: dict[str, Promise] = {}

    #: The GPU types of PDL's nodes, as last read (shared by every spawner of the process).
    known_types: list[str] = []

    async def read_swarm(self) -> tuple[list[dict], list[dict], list[dict]]:
        """PDL's nodes, the engine services and the tasks on PDL's nodes (or not placed
        yet), whatever their desired state: a task meant to stop holds its GPU until it
        has (:func:`~pdl_spawner.swarm.gpus.is_active`); the nodes' GPU types are
        remembered (:meth:`gpu_types_for`)."""
        nodes = await self.cluster_nodes()
        services = await self.docker("services", filters={"label": [f"{LABEL_PREFIX}role=engine"]})
        tasks = await self.docker("tasks")
        if self.nodes:  # tasks placed on the other nodes hold none of these GPUs
            ids = {n["ID"] for n in nodes}
            tasks = [t for t in tasks if t.get("NodeID") in ids or not t.get("NodeID")]
        self.remember_types(nodes)
        return nodes, services, tasks

    def remember_types(self, nodes: list[dict]) -> None:
        """Keep the GPU types of ``nodes`` (PDL's) for :meth:`gpu_types_for`."""
        SwarmGpuPromises.known_types = gpu_types(nodes, self.gpu_resource)

    async def cluster_nodes(self) -> list[dict]:
        """The swarm's nodes that PDL uses (:attr:`nodes`), or HTTP 500 naming the bad names."""
        try:
            return select_nodes(await self.docker("nodes"), self.nodes)
        except ValueError as e:
            message = f"PDLSwarmSpawner.nodes: {e}"
            raise web.HTTPError(500, message, reason=message) from None

    async def avoided_hostnames(self) -> list[str]:
        """The swarm's nodes that engines must not run on (those :attr:`nodes` leaves out)."""
        return excluded_hostnames(await self.docker("nodes"), self.nodes)

    def holds_promise(self) -> bool:
        """Whether GPUs are promised to this server now (its spawn took them)."""
        return self.owner.key in SwarmGpuPromises.promised

    def forget_promise(self) -> None:
        """Swarm counts this server's GPUs now (or the spawn failed): drop its promise."""
        SwarmGpuPromises.promised.pop(self.owner.key, None)
