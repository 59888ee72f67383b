"""Idle engines on Docker Swarm: the Swarm spawner's half of the engine lease.

:class:`SwarmIdleEngines` is a mixin of :class:`~pdl_spawner.swarm.spawner.PDLSwarmSpawner`,
called by the kind's source of workers (:class:`~pdl_spawner.swarm.workers.SwarmGpus`) when
:meth:`pdl_spawner.core.spawner.SpawnerCore.tend_lease` reclaims or grants again. Engines released for
idleness have their services scaled to 0 (their GPUs go back to the swarm; the reclaim
is logged in ``state_db`` for the admin view); asked back, they are scaled to 1 once
their GPUs are free and nobody waits in the queue, or the answer says in one line why not.
"""

from __future__ import annotations

import asyncio

from docker.errors import APIError, NotFound
from tornado import web
from traitlets import HasTraits

from pdl_spawner.core.reservations import SlotLedger
from pdl_spawner.swarm.gpus import GpuHolding, gpu_holdings
from pdl_spawner.swarm.specs import LABEL_PREFIX


class SwarmIdleEngines(HasTraits):
    """Mixin: scale idle engines to 0 and back. The spawner provides ``docker``,
    ``owner``, ``swarm`` (its :class:`~pdl_spawner.swarm.state.SwarmServer`),
    ``state_db``, ``gpu_resource``, ``wait_tasks``, ``reserve_workers`` and ``forget_promise``."""

    @property
    def reclaim_log(self) -> SlotLedger:
        """Where reclaims are logged (the admin view lists them): :attr:`state_db`."""
        return SlotLedger(self.state_db)

    async def engine_services_now(self) -> list[dict]:
        return await self.docker("services", filters={"label": [f"{LABEL_PREFIX}owner={self.owner.key}",
                                                                  f"{LABEL_PREFIX}role=engine"]})

    async def scale_engines(self, services: list[dict], replicas: int) -> None:
        """Set every engine service of ``services`` to ``replicas`` tasks (0: its GPU is released)."""
        for svc in services:
            await self.docker("update_service", svc["ID"], svc["Version"]["Index"],
                              mode={"Replicated": {"Replicas": replicas}}, fetch_current_spec=True)

    async def engine_holdings(self, running: list[dict]) -> list[GpuHolding]:
        """The GPUs the tasks of ``running`` (engine services scaled above 0) hold now."""
        tasks = await self.docker("tasks", filters={"service": [s["ID"] for s in running],
                                                     "desired-state": ["running"]})
        return gpu_holdings(await self.docker("nodes"), running, tasks, self.gpu_resource)

    async def bring_back_engines(self, services: list[dict]) -> None:
        """Scale the engine services back to one task each once their GPUs are free, and
        wait until they run; HTTP 409 (one line, nothing left running) when they are not."""
        await self.reserve_workers(len(services), spawning=False)
        try:
            await self.scale_engines(await self.engine_services_now(), 1)
            wait = self.wait_tasks([s["ID"] for s in services], "engine", current_only=True, holds_gpus=True)
            try:
                await asyncio.wait_for(wait, timeout=self.start_timeout)
            except asyncio.TimeoutError:
                message = f"the engines did not start within {self.start_timeout} s"
                raise web.HTTPError(504, message, reason=message) from None
        except BaseException:
            try:
                await self.scale_engines(await self.engine_services_now(), 0)
            except (APIError, NotFound):
                self.log.warning("Could not scale the engines of %s back to 0", self.owner.key)
            raise
        finally:
            self.forget_promise()
