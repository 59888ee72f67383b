"""The engines of a user's server: one host per cluster kind, chosen once from the
server contract by the kind's name (:func:`host_for`); each kind's plug-in names its
host, in the kind's own folder (the embedded default's slots of this machine, Slurm's
job steps, Swarm's services that the hub runs). :class:`SlotEngines` is the base of
hosts that start one engine per slot here.

Each host starts its engines, keeps them running (:meth:`EngineHost.tend`), stops them
for an idle release (:meth:`EngineHost.release`) and brings them back as the hub's
grant says (:meth:`EngineHost.take_up`). The supervisor (:mod:`pdl_server.singleuser`)
drives them the same way, whatever the kind.
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading
from importlib.metadata import entry_points

from pdl.contract import KINDS_GROUP, ServerContract
from pdl.lease import Grant, Release
from pdl_server import clusters


def log(line: str) -> None:
    """One line of the server's log (its stderr), as ``pdl-singleuser: <line>``."""
    print(f"pdl-singleuser: {line}", file=sys.stderr, flush=True)


class EngineHost:
    """The engines of one server (see the module docstring). Used from one thread."""

    #: how many workers the engines are
    workers: int = 0

    @classmethod
    def for_contract(cls, contract: ServerContract, cluster) -> EngineHost:
        """The host of the server ``contract`` describes, over ``cluster`` (its kind's)."""
        raise NotImplementedError

    @classmethod
    def scheduler_end(cls, contract: ServerContract, held: Grant | None, fresh: bool = False
                      ) -> tuple[float, str] | None:
        """Where the cluster's scheduler limits how long the workers are held: the end of
        that limit (epoch seconds) and what it is, in words ("Slurm job 42's time limit"),
        for the workers of ``contract`` or of the grant ``held`` they came back on; None
        without one (the default). ``fresh``: read now, not from an earlier reading."""
        return None

    @classmethod
    def forget_readings(cls) -> None:
        """Forget this process's readings of :meth:`scheduler_end` (the hub just moved it)."""

    def warm_up(self) -> None:
        """Get ready to start engines in a fraction of a second, before the controller
        starts (default: nothing; hosts whose engines run on this machine start the warm
        parent they are forked from, :func:`pdl_server.warm_engines.warm_up`)."""

    def start(self) -> None:
        """Start the engines of the spawn (blocking until their processes are started)."""

    def tend(self, stop: threading.Event) -> str | None:
        """Restart any engine that died; the reason, one line, when the engines are lost
        for good and cannot be restarted (a Slurm job that ended), else None."""
        return None

    def dead_slots(self) -> list[str]:
        """The slots whose engine process is not running, for :meth:`tend` to restart
        (cheap: the supervisor asks a few times a second); none by default, where the
        host restarts nothing."""
        return []

    def release(self, reason: str) -> Release:
        """Stop the engines (or leave that to the hub) and say what is given back."""
        raise NotImplementedError

    def take_up(self, grant: Grant) -> None:
        """Bring the engines back as ``grant`` says (blocking until they are started)."""


class SlotEngines(EngineHost):
    """One engine per slot, each an engine set of the cluster, restarted when it dies."""

    def __init__(self, cluster, slots: list[str]):
        self.cluster, self.slots = cluster, list(slots)

    @property
    def workers(self) -> int:
        return len(self.slots)

    def launch(self, slot: str) -> None:
        """Start the engine of ``slot`` (blocking)."""
        raise NotImplementedError

    def restart(self, slot: str) -> None:
        """Replace the (dead or killed) engine of ``slot`` with a fresh one."""
        clusters.stop_slot_engine(self.cluster, slot)
        self.launch(slot)

    def start(self) -> None:
        for slot in self.slots:
            self.launch(slot)

    def dead_slots(self) -> list[str]:
        """The slots whose engine process is not running."""
        return [slot for slot in self.slots
                if not clusters.engine_set_running(self.cluster.engines.get(clusters.slot_engine_set_id(slot)))]

    def tend(self, stop: threading.Event) -> str | None:
        for slot in self.dead_slots():
            if stop.is_set():  # shutting down: the cluster is being stopped, not crashing
                return None
            lost = self.lost()
            if lost:
                return lost
            log(f"engine for {slot} exited; restarting it")
            try:
                self.restart(slot)
            except Exception as e:  # noqa: BLE001 - keep supervising the other slots
                log(f"could not restart {slot}: {e}")
        return None

    def lost(self) -> str | None:
        """Why no engine can be restarted any more, or None (by default they always can)."""
        return None

    def release(self, reason: str) -> Release:
        for slot in self.slots:
            clusters.stop_slot_engine(self.cluster, slot)
        log(f"{reason}; stopped them and gave back {','.join(self.slots)}")
        return Release(reason=reason, workers=len(self.slots), slots=tuple(self.slots))

    def take_up(self, grant: Grant) -> None:
        self.slots = list(grant.slots)
        for slot in self.slots:
            self.restart(slot)
        log(f"engines back on {','.join(self.slots)}")


@functools.lru_cache(maxsize=None)
def host_class(kind: str) -> type[EngineHost]:
    """The engine host class that the plug-in of cluster kind ``kind`` names (registered
    under :data:`pdl.contract.KINDS_GROUP`; looked up once a process). ValueError, one
    line naming the registered kinds, for a kind that is not one."""
    points = {point.name: point for point in entry_points(group=KINDS_GROUP)}
    if kind not in points:
        raise ValueError(f"PDL_KIND must be one of {', '.join(sorted(points))}, got {kind[:40]!r}: "
                         "this server was not started by PDL's hub")
    module, _, name = points[kind].load().engine_host.partition(":")
    return getattr(importlib.import_module(module), name)


def host_for(contract: ServerContract, cluster) -> EngineHost:
    """The engine host of the server ``contract`` describes, over ``cluster``: its kind's
    (:func:`host_class` of ``contract.kind``)."""
    return host_class(contract.kind).for_contract(contract, cluster)
