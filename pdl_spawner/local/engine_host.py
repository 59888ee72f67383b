"""The embedded default's engines, as the user's server runs them: one engine process per
slot reserved on this machine, each pinned to its slot and forked from the server's warm
parent (:class:`LocalSlots`, named by :mod:`pdl_spawner.local.kind`)."""

from __future__ import annotations

from pdl.contract import ServerContract
from pdl_server import clusters
from pdl_server import warm_engines
from pdl_server.engine_hosts import SlotEngines


class LocalSlots(SlotEngines):
    """Engines on this machine's reserved slots, each pinned to its slot."""

    @classmethod
    def for_contract(cls, contract: ServerContract, cluster) -> LocalSlots:
        return cls(cluster, list(contract.slots))

    def warm_up(self) -> None:
        warm_engines.warm_up(self.cluster)

    def launch(self, slot: str) -> None:
        clusters.start_slot_engines(self.cluster, [slot], self.slots)
