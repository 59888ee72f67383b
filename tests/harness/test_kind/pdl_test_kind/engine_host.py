"""The test kind's engines: plain processes of the user's server, one per slot, each
marked ``PDL_TEST_KIND_ENGINE=1`` (the tests see which host started them)."""

from __future__ import annotations

from pdl.contract import ServerContract
from pdl.engine_contract import EngineContract
from pdl_server import clusters
from pdl_server.engine_hosts import SlotEngines

#: Set in every engine this host starts.
MARK = {"PDL_TEST_KIND_ENGINE": "1"}


class PlainProcesses(SlotEngines):
    """One unpinned engine process per slot, restarted when it dies."""

    @classmethod
    def for_contract(cls, contract: ServerContract, cluster) -> PlainProcesses:
        return cls(cluster, list(contract.slots))

    def launch(self, slot: str) -> None:
        clusters.start_engine(self.cluster, slot, environment={**EngineContract(slot=slot).env(), **MARK})
