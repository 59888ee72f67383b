"""Docker Swarm's engines, as the user's server sees them: the hub runs them as services
on other nodes, and starts, stops and brings them back; the server runs only their
controller and says when they are idle (:class:`SwarmServices`, named by
:mod:`pdl_spawner.swarm.kind`)."""

from __future__ import annotations

from pdl.contract import ServerContract
from pdl.lease import Grant, Release
from pdl_server.engine_hosts import EngineHost, log


class SwarmServices(EngineHost):
    """Engines the hub runs as Docker Swarm services (see the module docstring)."""

    def __init__(self, workers: int):
        self.workers = workers

    @classmethod
    def for_contract(cls, contract: ServerContract, cluster) -> SwarmServices:
        return cls(contract.workers)

    def release(self, reason: str) -> Release:
        log(f"{reason}; the hub stops them and frees their GPUs")
        return Release(reason=reason, workers=self.workers)

    def take_up(self, grant: Grant) -> None:
        log(f"the hub started {grant.workers} engine(s) again")
