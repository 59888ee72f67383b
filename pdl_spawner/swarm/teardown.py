"""Removing a server from Docker Swarm: its services, then its secrets, waiting for its tasks.

:class:`SwarmTeardown` is a mixin of :class:`~pdl_spawner.swarm.spawner.PDLSwarmSpawner`; its
:meth:`SwarmTeardown.remove_object` is dockerspawner's hook for ``stop()`` and the
cleanup after a failed spawn. Everything labelled with the server's ``pdl.owner`` goes,
whether or not the spawner's state lists it (a hub that crashed mid-spawn).
"""

from __future__ import annotations

import asyncio
import time

from docker.errors import APIError, NotFound
from traitlets import HasTraits

from pdl_spawner.swarm.state import ACTIVE_TASK_STATES

#: Seconds between checks while waiting for tasks.
POLL_S = 0.25
#: Seconds stop() waits for removed services' tasks to stop.
STOP_WAIT_S = 30.0


class SwarmTeardown(HasTraits):
    """Mixin: remove a server's services and secrets. The spawner provides ``docker``,
    ``owner`` and ``swarm``."""

    async def remove_object(self):
        """Remove every service and secret of this server; wait until its tasks stopped."""
        selector = self.owner.filter()
        services = [s["ID"] for s in await self.docker("services", filters=selector)]
        for service_id in services:
            try:
                await self.docker("remove_service", service_id)
            except NotFound:
                pass
        if services:
            await self.wait_stopped(services)
        for secret in await self.docker("secrets", filters=selector):
            await self.remove_secret(secret["ID"])
        if services:
            self.log.info("Removed %d service(s) of %s", len(services), self.owner.key)
        self.swarm.engine_services.clear()
        self.swarm.secrets.clear()

    async def wait_stopped(self, service_ids: list[str]) -> None:
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline:
            tasks = await self.docker("tasks")
            if not any(t.get("ServiceID") in service_ids and t["Status"]["State"] in ACTIVE_TASK_STATES
                       for t in tasks):
                return
            await asyncio.sleep(POLL_S)
        self.log.warning("Tasks of %s still stopping after %.0f s", self.owner.key, STOP_WAIT_S)

    async def remove_secret(self, secret_id: str) -> None:
        """Remove a secret, waiting while a removed service's task still uses it."""
        deadline = time.monotonic() + STOP_WAIT_S
        while True:
            try:
                await self.docker("remove_secret", secret_id)
                return
            except NotFound:
                return
            except APIError as e:
                if "in use" not in str(e) or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(POLL_S)
