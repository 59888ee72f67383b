"""Docker Swarm's workers: GPUs of the swarm's nodes, one per engine service.

:class:`SwarmGpus` is the Swarm kind's :class:`~pdl_spawner.core.worker_source.WorkerSource`,
made with its :class:`~pdl_spawner.swarm.spawner.PDLSwarmSpawner`. What is free is read
from the swarm on every call (:func:`~pdl_spawner.swarm.gpus.gpu_usage`) and GPUs taken
are promised in this hub process until Swarm counts them
(:mod:`~pdl_spawner.swarm.promises`); idle engines are scaled to 0 and back
(:mod:`~pdl_spawner.swarm.idle`); the GPUs' use is read by the hub's reader service
(:mod:`~pdl_spawner.swarm.gpu_use`).
"""

from __future__ import annotations


from jupyterhub.utils import url_path_join

from pdl.lease import Grant
from pdl_spawner.core.reservations import SlotLedger
from pdl_spawner.core.usage import GpuReading, NotEnoughWorkers, WorkerUsage
from pdl_spawner.core.worker_source import GpusReadAtOnce, SpawnerWorkers
from pdl_spawner.hub.db_thread import off_loop
from pdl_spawner.swarm.gpu_use import held_readings
from pdl_spawner.swarm.gpus import Promise, gpu_usage
from pdl_spawner.swarm.promises import SwarmGpuPromises
from pdl_spawner.swarm.state import service_replicas

#: Upper bound on workers per server when ``max_workers`` is 0 (the real bound is what is free).
GPU_REQUEST_CAP = 1024


class SwarmGpus(GpusReadAtOnce, SpawnerWorkers):
    """A Swarm server's GPUs (see the module docstring)."""

    kind = "gpu"
    unit = "GPUs"

    @property
    def owner_key(self) -> str:
        return self.spawner.owner.key

    @property
    def queue_db(self) -> str:
        return self.spawner.state_db

    @property
    def capacity(self) -> int:
        """No bound known without asking the swarm: what is free decides."""
        return GPU_REQUEST_CAP

    def ready_to_start(self) -> bool:
        return self.spawner.holds_promise() or bool(self.spawner.object_id)

    def lease_url(self) -> str | None:
        spawner = self.spawner
        if spawner.server is None or not spawner.swarm.node_addr:
            return None
        base = url_path_join(spawner.server.base_url, "pdl/api/lease")
        return f"http://{spawner.swarm.node_addr}:{spawner.swarm.port}{base}"

    def lease_token(self) -> str | None:
        return self.spawner.swarm.api_token

    # -- what is free --------------------------------------------------------------------

    async def read_capacity(self) -> None:
        """Read the nodes' GPU types, which the spawn's options are checked against."""
        self.spawner.remember_types(await self.spawner.cluster_nodes())

    def gpu_types_for(self, options: dict) -> list[str]:
        """The GPU types of PDL's nodes, as last read (the same whatever the options)."""
        return list(SwarmGpuPromises.known_types)

    async def usage(self) -> WorkerUsage:
        """GPUs of the swarm (of the spawn's chosen type) and their holders, this server's own not counted."""
        spawner = self.spawner
        return gpu_usage(*await spawner.read_swarm(), spawner.gpu_resource, promised=SwarmGpuPromises.promised,
                         exclude_owner=self.owner_key, gpu_type=spawner.chosen_gpu_type)

    async def gpu_type_usage(self) -> dict[str, tuple[int, int]]:
        """GPU type ("" : any) -> (free, total) GPUs of PDL's nodes, for the form."""
        swarm = await self.spawner.read_swarm()
        found = {}
        for kind in ["", *SwarmGpuPromises.known_types]:
            usage = gpu_usage(*swarm, self.spawner.gpu_resource, promised=SwarmGpuPromises.promised, gpu_type=kind)
            found[kind] = (usage.free, usage.total)
        return found

    async def take(self, n: int) -> None:
        """Promise ``n`` free GPUs to this server, or raise :class:`NotEnoughWorkers`."""
        usage = await self.usage()
        if n > usage.free:
            raise NotEnoughWorkers(n, usage)
        spawner = self.spawner
        SwarmGpuPromises.promised[self.owner_key] = Promise(spawner.user.name, n, spawner.chosen_gpu_type)

    # -- the engine lease ----------------------------------------------------------------

    async def reclaim_idle(self) -> list[str]:
        """Scale this server's running engine services to 0 and log their GPUs as reclaimed."""
        spawner = self.spawner
        running = [s for s in await spawner.engine_services_now() if service_replicas(s)]
        if not running:
            return []
        gpus = [f"{h.node}/{h.gpu}" for h in await spawner.engine_holdings(running)] or [f"{len(running)} GPU(s)"]
        await spawner.scale_engines(running, 0)
        await off_loop(spawner.reclaim_log.log_reclaim, self.owner_key, gpus, spawner.reclaim_reason())
        return gpus

    async def take_back(self) -> list[str]:
        """The session's end, enforced: the engine services scaled to 0 (as for idle engines)."""
        return await self.reclaim_idle()

    async def grant_again(self, n: int) -> Grant:
        """Every engine service of this server back to one task (the hub starts them: no slots)."""
        services = await self.spawner.engine_services_now()
        await self.spawner.bring_back_engines(services)
        self.log.info("Granted %d GPU(s) to %s again", len(services), self.owner_key)
        return Grant(workers=len(services))

    # -- GPU use --------------------------------------------------------------------------

    async def look_at_gpus(self) -> list[GpuReading] | None:
        """Each GPU this server's engines hold: its reading from the reader; None while an
        engine has no GPU placed or a GPU has no recent reading."""
        spawner = self.spawner
        running = [s for s in await spawner.engine_services_now() if service_replicas(s)]
        if not running:
            return None
        held = [h.gpu for h in await spawner.engine_holdings(running)]
        return held_readings(held, await spawner.gpu_readings())

    async def record_gpu_idle(self, since: float | None) -> None:
        """The flag, in the spawner's ``state_db``, where the admin view reads it."""
        await off_loop(SlotLedger(self.spawner.state_db).flag_gpu_idle, self.owner_key, since)
