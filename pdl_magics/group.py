"""The process group of a world (:class:`ProcessGroup`): forming it on the engines
(torch.distributed or Horovod), reusing it while the world and backend stay, and
tearing it down.

An engine is in one group at a time. Each group formed gets a fresh key, so an
engine left out of the last world, still holding the group before, never mistakes
it for the new one (see :func:`pdl.runtime.engine.init_torch`).

Rendezvous:

- torch, ranks on one host sharing a file system: a FileStore in a 0700 folder
  made by rank 0's engine; otherwise a TCPStore on rank 0 (127.0.0.1 on one host);
- Horovod: a rendezvous server this notebook process runs
  (:mod:`~pdl_magics.horovod_driver`), bound to 127.0.0.1 when every rank is on
  this host, else to the address that routes to rank 0's host.
"""

from __future__ import annotations

import socket

import ipyparallel as ipp

from pdl.netaddr import route_addr
from pdl_server import clusters
from pdl_server.world import Rank, local_ranks

from . import horovod_driver
from .engines import Engines
from .errors import DistributedUsageError


#: Seconds each rank waits to reach its peers' addresses before a group across hosts forms.
PEER_ROUTE_WAIT_S = 30.0


class ProcessGroup:
    """The torch.distributed group (or Horovod world) of this session's current world."""

    def __init__(self, engines: Engines):
        self.engines = engines
        self._key: tuple | None = None
        self._generation = 0
        self._rendezvous: horovod_driver.Rendezvous | None = None

    def ensure(self, world: list[Rank], backend: str, timeout_s: float) -> None:
        """Form the group of ``backend`` on ``world`` (collective timeout ``timeout_s``
        seconds), unless these ranks already form one; RuntimeError naming the rank
        that could not join, DistributedUsageError when an engine cannot use Horovod."""
        base = (tuple(r.engine_id for r in world), backend)
        if self._key is not None and self._key[:2] == base:
            return
        self._generation += 1
        key = (*base, self._generation)
        self._key = None
        self._stop_rendezvous()
        if len({r.host for r in world}) > 1:
            self._await_routes(world)
        calls = self._horovod_calls(world, key, timeout_s) if backend == "horovod" else \
            self._torch_calls(world, key, timeout_s)
        ars = [self.engines.call_async(r.engine_id, *call) for r, call in zip(world, calls)]
        try:
            for r, ar in zip(world, ars):
                ar.get(timeout=clusters.ENGINE_TIMEOUT_S)
        except ipp.error.RemoteError as e:
            what = "Horovod" if backend == "horovod" else "torch.distributed"
            raise RuntimeError(
                f"could not set up {what} on rank {r.rank} ({r.host}): {e.ename}: {e.evalue}"
            ) from None
        self._key = key

    def _await_routes(self, world: list[Rank]) -> None:
        """Every rank reaches every other rank's address (at most :data:`PEER_ROUTE_WAIT_S`
        seconds) before the group's connections are made: an overlay network may route to
        a container that just started only seconds later (:mod:`pdl.runtime.peer_routes`).
        RuntimeError naming the first rank that reached not all of them."""
        addrs = [r.addr for r in world]
        answers = self.engines.call_all([r.engine_id for r in world], "unreached_peers", addrs, PEER_ROUTE_WAIT_S)
        for r, unreached in zip(world, answers):
            if unreached:
                raise RuntimeError(
                    f"rank {r.rank} ({r.host}) has no route to {', '.join(unreached)} after "
                    f"{PEER_ROUTE_WAIT_S:g} s: the cluster's network does not connect the engines "
                    f"of this server (ask the admin to check it)")

    def forget(self) -> None:
        """The next cell forms a new group (the current one may be broken half-way:
        ranks interrupted at different collectives, a Horovod world shut down)."""
        self._key = None

    def close(self) -> None:
        """Forget the group and stop this process's Horovod rendezvous, if any."""
        self._key = None
        self._stop_rendezvous()

    def _torch_calls(self, world: list[Rank], key: tuple, timeout_s: float) -> list[tuple]:
        """Each rank's ``init_torch`` arguments: a FileStore in a private folder when the
        ranks share one host and its file system, else a TCPStore on rank 0."""
        master = world[0]
        one_host = len({r.host for r in world}) == 1
        rendezvous = self._private_rendezvous(world) if one_host else None
        if rendezvous is None:
            addr = "127.0.0.1" if one_host else master.addr
            port = self.engines.call(master.engine_id, "free_port", "")
            rendezvous = f"tcp://{addr}:{port}"
        local = local_ranks([r.host for r in world])
        return [("init_torch", key, r.rank, len(world), local[r.rank], rendezvous, timeout_s) for r in world]

    def _private_rendezvous(self, world: list[Rank]) -> str | None:
        """``file://`` + a new store file in a 0700 folder made by rank 0's engine, or
        None when another rank cannot see that folder (e.g. engines in separate
        containers on one node), which then meet on a TCPStore as across hosts."""
        master = world[0].engine_id
        path = self.engines.call(master, "new_store_file")
        others = [r.engine_id for r in world[1:]]
        if others and not all(self.engines.call_all(others, "sees_file_folder", path)):
            self.engines.call(master, "remove_store_file", path)
            return None
        return f"file://{path}"

    def _horovod_calls(self, world: list[Rank], key: tuple, timeout_s: float) -> list[tuple]:
        """Start this group's rendezvous here; each rank's ``init_horovod`` arguments."""
        one_host = len({r.host for r in world}) == 1
        problems = self.engines.call_all([r.engine_id for r in world], "horovod_problem", not one_host)
        for r, problem in zip(world, problems):
            if problem is not None:
                raise DistributedUsageError(
                    f"--backend horovod: the engine of rank {r.rank} ({r.host}) cannot use "
                    f"Horovod ({problem}); {horovod_driver.INSTALL_HINT}"
                )
        here = one_host and world[0].host == socket.gethostname()
        bind = "127.0.0.1" if here else route_addr(world[0].addr)
        slots = horovod_driver.plan([r.host for r in world])
        self._rendezvous = horovod_driver.Rendezvous(slots, bind)
        return [
            (
                "init_horovod",
                key,
                horovod_driver.rank_env(slot, bind, self._rendezvous.port, timeout_s),
                slot.local_rank,
                "127.0.0.1" if one_host else r.addr,
            )
            for r, slot in zip(world, slots)
        ]

    def _stop_rendezvous(self) -> None:
        if self._rendezvous is not None:
            self._rendezvous.stop()
            self._rendezvous = None
