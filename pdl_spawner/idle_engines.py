"""Idle engines give their workers back: the hub's side, shared by both PDL spawners.

The user's server stops counting on its engines after ``engine_idle_timeout``
seconds without a task and says so in its engine lease (:mod:`pdl.engine_lease`);
a kernel that needs engines again asks in the same lease. While a server runs, the
hub looks at its lease every :data:`LEASE_TICK_S` seconds (:meth:`IdleEngines.tend_lease`,
the spawner's own: the local spawner reads the files in the user's cluster directory
and frees ledger slots; the Swarm spawner asks the user's server over HTTP and scales
the engine services to 0 and back). The watch starts with the server and again after
a hub restart (the first ``poll()`` that finds the server running), and ends in ``stop()``.
"""

from __future__ import annotations

import asyncio

from traitlets import HasTraits, Integer

#: Seconds between the hub's looks at a server's engine lease (released, wanted).
LEASE_TICK_S = 1.0


class IdleEngines(HasTraits):
    """Mixin: the hub's watch over a server's engine lease (see the module docstring)."""

    engine_idle_timeout = Integer(
        0,
        config=True,
        help="""Seconds without a task on a user's engines after which they are stopped and
        their workers released; the notebook server and its files stay, and the next
        %%distributed cell asks for workers again (or says that none are free). 0: never.""",
    )

    _lease_task: asyncio.Task | None = None

    async def tend_lease(self) -> None:
        """One look at the lease: reclaim released workers, grant or refuse a request."""
        raise NotImplementedError

    def watch_lease(self) -> None:
        """Start the watch (once) when idle reclaim is on."""
        if self.engine_idle_timeout and (self._lease_task is None or self._lease_task.done()):
            self._lease_task = asyncio.ensure_future(self._lease_loop())

    def unwatch_lease(self) -> None:
        if self._lease_task is not None:
            self._lease_task.cancel()
            self._lease_task = None

    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(LEASE_TICK_S)
            try:
                await self.tend_lease()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a bad answer must not end the watch
                self.log.exception("engine lease of %s", self.owner_key)
