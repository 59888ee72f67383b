"""A distributed session: run one cell on N engines with torch.distributed ready.

This is the plain-Python object behind ``%%distributed``; it can be used without
IPython::

    from pdl_magics import DistributedSession
    s = DistributedSession()
    s.run("print(rank, world_size)", n=2)

Contract of :meth:`DistributedSession.run`:

- the first ``n`` engines in rank order (host, then slot) form the world; the
  process group is created once and reused while ``n`` and the backend stay the same;
- ``backend="torch"`` initialises torch.distributed (NCCL on GPUs, gloo on CPUs);
  ``backend="horovod"`` initialises Horovod (``hvd`` is defined in the cell)
  against a rendezvous this session runs (:mod:`~pdl_magics.horovod_driver`).
  An engine is in one group at a time: switching backends tears the old one down;
- before the first cell on a set of engines, the preflight (:mod:`~pdl_magics.preflight`)
  checks them; when it fails, :class:`~pdl_magics.preflight.PreflightFailed` is raised and
  nothing runs;
- rank 0's stdout/stderr are written to ``out``/``err`` live; every rank's output
  is kept in :attr:`DistributedSession.last_outputs`;
- when a rank raises, :class:`~pdl_magics.errors.RankFailed` is raised for the
  rank that failed first on its own (not one that merely lost its peer), after
  every other rank has stopped;
- on KeyboardInterrupt every rank is interrupted; the call returns (re-raising
  KeyboardInterrupt) once they have all stopped, leaving the engines usable;
- when an engine dies mid-cell (killed, out of memory, its node lost), the cell
  fails within seconds naming that rank and host; the engine is replaced on the
  same reserved slot before the next cell, so the next cell runs;
- the hang watchdog: when no rank has made progress (new output, a ``pdl.log``
  call, a rank finishing) for ``hang_timeout_s``, the cell says so once and shows
  every running rank's Python stack (:mod:`pdl.stacks`), then keeps waiting.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TextIO

import ipyparallel as ipp

from pdl import engine_lease
from pdl.netaddr import route_addr
from pdl.slots import default_pool, slot_index

from . import clusters, horovod_driver, status_file
from .cell_watch import STOP_TIMEOUT_S, CellWatch
from .errors import DistributedUsageError, RanksStuck
from .world import CellResult, Rank, call_engine

#: Backends ``--backend`` accepts.
BACKENDS = ("torch", "horovod")

#: Default of the hang watchdog: seconds without progress on any rank before the
#: cell shows every rank's stack (0 turns it off).
HANG_TIMEOUT_S = 300.0
#: Seconds to wait for engines to confirm a signal (interrupt, stack request).
SIGNAL_REPLY_S = 2.0
#: Seconds a cell waits for the hub to grant slots again after an idle release.
LEASE_WAIT_S = 120.0


class DistributedSession:
    """Runs cells on the engines of this user's cluster (hub) or a local one.

    ``cluster_file`` selects an existing cluster (the hub case; default from
    ``$PDL_CLUSTER_FILE``). Without one, a local cluster is started on first use
    over ``local_slots`` (default: this machine's GPUs, else CPU slots).
    """

    _default: DistributedSession | None = None

    def __init__(self, cluster_file: str | None = None, local_slots: list[str] | None = None,
                 preflight: bool = True):
        self.cluster_file = cluster_file or clusters.hub_cluster_file()
        #: run :mod:`~pdl_magics.preflight` before the first cell on each set of engines
        self.preflight = preflight
        #: the worlds (:meth:`world_identity`) that passed it in this session
        self.preflight_passed: set[frozenset] = set()
        self.local_slots = list(local_slots) if local_slots is not None else None
        self.client: ipp.Client | None = None
        self._cluster = None
        self._engines: dict[int, dict] = {}
        self._replaced: set[int] = set()  # killed engines the controller may still list
        self._group_key: tuple | None = None
        self._rendezvous: horovod_driver.Rendezvous | None = None
        self._generation = 0
        self._cell_number = 0
        self.last_outputs: dict[int, tuple[str, str]] = {}
        #: rank -> the last ``pdl.log`` snapshot of the last cell (see :mod:`pdl.metrics`)
        self.last_metrics: dict[int, dict] = {}
        self.last_world: list[Rank] = []
        self._views: dict[int, ipp.DirectView] = {}
        # status writes happen on this one thread, in order, so a cell never waits for the disk
        self._status_writer = ThreadPoolExecutor(1, thread_name_prefix="pdl-status")

    @classmethod
    def default(cls) -> DistributedSession:
        """The process-wide session the magics use."""
        if cls._default is None:
            cls._default = cls()
        return cls._default

    # -- engines -------------------------------------------------------------

    @property
    def is_hub(self) -> bool:
        return self.cluster_file is not None

    def pool(self) -> list[str]:
        """Slots this session may use: the hub reservation, or the local pool."""
        if self.is_hub:
            return clusters.hub_slots()
        if self.local_slots is None:
            self.local_slots = default_pool()
        return self.local_slots

    def available(self) -> int:
        """How many engines ``-n`` may ask for."""
        size = clusters.hub_engine_count() if self.is_hub else len(self.pool())
        return size or len(self._connect().ids)

    def validate(self, n: int, backend: str) -> None:
        """Raise DistributedUsageError (one line, naming what is valid) for bad input."""
        if backend not in BACKENDS:
            raise DistributedUsageError(
                f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}"
            )
        if backend == "horovod":
            horovod_driver.require()
        avail = self.available()
        where = "reserved for you" if self.is_hub else "in the local pool"
        if not 1 <= n <= avail:
            raise DistributedUsageError(
                f"-n {n} is not available: {avail} engine(s) {where}; use -n 1..{avail}"
            )

    def _connect(self) -> ipp.Client:
        if self.client is None:
            if self.is_hub:
                self._cluster = ipp.Cluster.from_file(self.cluster_file)
                self.client = self._cluster.connect_client_sync()
            else:
                self._cluster = clusters.new_cluster(cluster_id=f"pdl-local-{id(self):x}")
                clusters.start_controller(self._cluster)
                self.client = self._cluster.connect_client_sync()
            self.client.block = False
        return self.client

    def _grow(self, n: int) -> None:
        """Make sure at least ``n`` engines are up (starting local ones if needed)."""
        client = self._connect()
        if not self.is_hub:
            self._restart_dead_local_engines()
            running = {info["slot"] for info in self._engines.values()}
            started = len(self._cluster.engines)
            missing = [s for s in self.pool()[started:n] if s not in running]
            if missing:
                clusters.start_slot_engines(self._cluster, missing, len(self.pool()))
            target = n
        else:
            self._bring_back_engines()
            target = clusters.hub_engine_count() or n
        # ipyparallel's wait shows engines starting (a progress bar); ours then waits until the
        # registered engines are live ones (not killed but still listed)
        try:
            client.wait_for_engines(target, timeout=clusters.ENGINE_TIMEOUT_S, block=True)
        except ipp.error.EngineError:
            # an engine that died since the last cell (its set stopped, or its unregistration
            # arrived now) while its replacement starts: not a failure of this wait
            pass
        self._wait_for_engines(target)

    def _bring_back_engines(self) -> None:
        """Under the hub: if the engines were stopped for idleness, ask for slots again and
        wait until they run (:mod:`pdl.engine_lease`); DistributedUsageError if none are free."""
        lease = engine_lease.lease_dir()
        released = engine_lease.read(lease, engine_lease.RELEASED) if lease is not None else None
        if released is None:
            return
        n = released.get("engines") or len(released.get("slots") or clusters.hub_slots())
        reason = released.get("reason", "idle")
        given_back = "GPUs" if "engines" in released else "slots"
        print(f"Your engines were stopped ({reason}) and their {given_back} given back; asking for {n} again...",
              file=sys.stderr, flush=True)
        engine_lease.write(lease, engine_lease.WANT, {"workers": n})
        deadline = time.monotonic() + LEASE_WAIT_S
        while engine_lease.read(lease, engine_lease.RELEASED) is not None:
            grant = engine_lease.read(lease, engine_lease.GRANT) or {}
            if "refused" in grant or time.monotonic() > deadline:
                engine_lease.remove(lease, engine_lease.WANT, engine_lease.GRANT)
                why = grant.get("refused") or f"the hub did not answer within {LEASE_WAIT_S:.0f} s"
                raise DistributedUsageError(f"your engines were stopped ({reason}) and cannot come back now: {why}")
            time.sleep(0.2)
        self._engines.clear()  # every engine is new

    def _restart_dead_local_engines(self) -> None:
        """Start a fresh engine on the slot of each local engine whose process died
        (killed, crashed, or restarted from the Cluster panel) since the last cell."""
        here = socket.gethostname()
        for eid, info in list(self._engines.items()):
            if info["host"] == here and not status_file.pid_alive(info["pid"]):
                del self._engines[eid]
                self._replaced.add(eid)
                clusters.restart_slot_engine(self._cluster, info["slot"], len(self.pool()))

    def _wait_for_engines(self, target: int) -> None:
        """Wait until ``target`` live engines are known, or raise :class:`RanksStuck`."""
        deadline = time.monotonic() + clusters.ENGINE_TIMEOUT_S
        while True:
            self._refresh_engines()
            if len(self._engines) >= target:
                return
            if time.monotonic() > deadline:
                raise RanksStuck(f"only {len(self._engines)} of {target} engines registered within "
                                 f"{clusters.ENGINE_TIMEOUT_S} s")
            time.sleep(0.2)

    def _refresh_engines(self) -> None:
        ids = [i for i in self.client.ids if i not in self._replaced]
        new = [i for i in ids if i not in self._engines]
        if new:
            pending = {i: self.client[i].apply_async(call_engine, "describe") for i in new}
            for i, ar in pending.items():
                try:
                    self._engines[i] = ar.get(timeout=clusters.ENGINE_TIMEOUT_S)
                except (ipp.error.EngineError, ipp.error.RemoteError) as e:
                    if isinstance(e, ipp.error.RemoteError) and e.ename != "EngineError":
                        raise
                    self._replaced.add(i)  # died since it registered: its replacement will register
        for gone in set(self._engines) - set(ids):
            del self._engines[gone]

    def world(self, n: int) -> list[Rank]:
        """The first ``n`` engines in rank order (host, then slot)."""
        self._grow(n)

        def order(item):
            eid, info = item
            return (info["host"], slot_index(info["slot"]), eid)

        chosen = sorted(self._engines.items(), key=order)[:n]
        return [
            Rank(rank, eid, info["host"], info["addr"], info["slot"])
            for rank, (eid, info) in enumerate(chosen)
        ]

    # -- process group ---------------------------------------------------------

    def ensure_group(self, world: list[Rank], backend: str, timeout_s: float) -> None:
        """Form the process group of ``backend`` on ``world`` (collective timeout
        ``timeout_s``), unless these ranks already form one; RuntimeError naming the rank
        that could not join."""
        base = (tuple(r.engine_id for r in world), backend)
        if self._group_key is not None and self._group_key[:2] == base:
            return
        # A fresh key for every group formed: an engine left out of the last world
        # still holds the group before it and must not mistake it for this one.
        self._generation += 1
        key = (*base, self._generation)
        self._group_key = None
        self._stop_rendezvous()
        if backend == "horovod":
            calls = self._horovod_calls(world, key, timeout_s)
        else:
            calls = self._torch_calls(world, key, timeout_s)
        ars = [self.client[r.engine_id].apply_async(call_engine, *call) for r, call in zip(world, calls)]
        try:
            for r, ar in zip(world, ars):
                ar.get(timeout=clusters.ENGINE_TIMEOUT_S)
        except ipp.error.RemoteError as e:
            what = "Horovod" if backend == "horovod" else "torch.distributed"
            raise RuntimeError(
                f"could not set up {what} on rank {r.rank} ({r.host}): {e.ename}: {e.evalue}"
            ) from None
        self._group_key = key

    def forget_group(self) -> None:
        """The next cell forms a new group (the current one may be broken half-way)."""
        self._group_key = None

    def world_identity(self, world: list[Rank]) -> frozenset:
        """Which engine processes ``world`` is made of: the same ranks on restarted
        engines are another world."""
        return frozenset((r.engine_id, self._engines.get(r.engine_id, {}).get("pid")) for r in world)

    def _torch_calls(self, world: list[Rank], key: tuple, timeout_s: float) -> list[tuple]:
        """Each rank's ``init_torch`` arguments: a FileStore in a private folder when the
        ranks share one host and its file system, else a TCPStore on rank 0."""
        master = world[0]
        one_host = len({r.host for r in world}) == 1
        rendezvous = self._private_rendezvous(world) if one_host else None
        if rendezvous is None:
            addr = "127.0.0.1" if one_host else master.addr
            port = self.client[master.engine_id].apply_sync(call_engine, "free_port", "")
            rendezvous = f"tcp://{addr}:{port}"
        local = _local_ranks(world)
        return [
            ("init_torch", key, r.rank, len(world), local[r.rank], rendezvous, timeout_s)
            for r in world
        ]

    def _private_rendezvous(self, world: list[Rank]) -> str | None:
        """``file://`` + a new store file in a 0700 folder made by rank 0's engine, or
        None when another rank cannot see that folder (e.g. engines in separate
        containers on one node), which then meet on a TCPStore as across hosts."""
        master = self.client[world[0].engine_id]
        path = master.apply_sync(call_engine, "new_store_file")
        others = [r.engine_id for r in world[1:]]
        if others and not all(self.client[others].apply_sync(call_engine, "sees_file_folder", path)):
            master.apply_sync(call_engine, "remove_store_file", path)
            return None
        return f"file://{path}"

    def _horovod_calls(self, world: list[Rank], key: tuple, timeout_s: float) -> list[tuple]:
        """Start this group's rendezvous here; each rank's ``init_horovod`` arguments."""
        one_host = len({r.host for r in world}) == 1
        problems = self.client[[r.engine_id for r in world]].apply_sync(
            call_engine, "horovod_problem", not one_host
        )
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

    # -- running ---------------------------------------------------------------

    def run(
        self,
        code: str,
        n: int | None = None,
        *,
        backend: str = "torch",
        all_output: bool = False,
        timeout_s: float = 1800.0,
        hang_timeout_s: float = HANG_TIMEOUT_S,
        out: TextIO | None = None,
        err: TextIO | None = None,
        preflight: bool = True,
    ) -> CellResult:
        """Run ``code`` on ``n`` ranks (default: every available engine). See module doc.

        ``timeout_s``: how long a collective may wait for its peers (seconds);
        ``hang_timeout_s``: the hang watchdog's period without progress (seconds, 0: off);
        ``preflight=False`` (or the session's) skips the preflight before the first cell.
        """
        out = out or sys.stdout
        err = err or sys.stderr
        if n is None:
            n = self.available()
        self.validate(n, backend)
        world = self.world(n)
        if preflight and self.preflight:
            from .preflight import before_first_cell

            before_first_cell(self, world, backend, timeout_s)  # raises PreflightFailed: nothing runs
        self.ensure_group(world, backend, timeout_s)
        self._cell_number += 1
        ars = [
            self._view(r.engine_id).apply_async(call_engine, "run_cell", code, self._cell_number)
            for r in world
        ]
        self.last_world = world
        self.publish_status(running=True, force=True)
        outcome = CellWatch(self, world, ars, out, err, hang_timeout_s).wait()
        self.last_outputs = {
            r.rank: (md["stdout"] or "", md["stderr"] or "") for r, md in zip(world, outcome.meta)
        }
        self.last_metrics = outcome.metrics
        self.publish_status(running=False, metrics=outcome.metrics, force=True)
        if outcome.aborted or outcome.stuck or outcome.user_interrupt or outcome.interrupted or outcome.dead or (
            backend == "horovod" and outcome.failed
        ):
            # Interrupted ranks may have stopped at different collectives; a group
            # kept across that would hang the next collective, so form a new one.
            # Horovod is rebuilt after any failure: its world may have shut itself
            # down, and its unnamed collectives are numbered per rank.
            self._group_key = None
        if outcome.stuck:
            self.replace_engines(outcome.stuck, err)
        if all_output:
            self.show_output(range(1, n), out)
        return outcome.finish()

    def show_output(self, ranks, out: TextIO | None = None) -> None:
        """Print the kept stdout/stderr of ``ranks`` from the last cell."""
        out = out or sys.stdout
        by_rank = {r.rank: r for r in self.last_world}
        for rank in ranks:
            if rank not in self.last_outputs:
                raise DistributedUsageError(
                    f"no output kept for rank {rank}; ranks of the last cell: "
                    f"{', '.join(map(str, sorted(self.last_outputs))) or 'none'}"
                )
            stdout, stderr = self.last_outputs[rank]
            print(f"--- rank {rank} ({by_rank[rank].host}) ---", file=out)
            if stdout:
                out.write(stdout if stdout.endswith("\n") else stdout + "\n")
            if stderr:
                out.write(stderr if stderr.endswith("\n") else stderr + "\n")
        out.flush()

    def interrupt(self, ranks: list[Rank]) -> None:
        """Send SIGINT to the engines of ``ranks`` (through ipyparallel's control channel)."""
        self.send_signal(ranks, signal.SIGINT)

    def send_signal(self, ranks: list[Rank], signum: int) -> None:
        """Send ``signum`` to the engines of ``ranks`` that are still registered.

        Waits at most :data:`SIGNAL_REPLY_S` for the engines' nannies to confirm: an
        engine that died a moment ago (its node gone) never answers.
        """
        live = set(self.client.ids)
        targets = [r.engine_id for r in ranks if r.engine_id in live]
        if targets:
            sent = self.client.send_signal(signum, targets=targets, block=False)
            try:
                sent.result(timeout=SIGNAL_REPLY_S)
            except Exception:  # noqa: BLE001 - no answer, or an engine that is gone: sent anyway
                pass

    def replace_engines(self, ranks: list[Rank], err: TextIO | None = None) -> None:
        """Kill the engines of ``ranks`` (stuck in native code) and bring up fresh ones.

        Each replacement gets the same slot. Under the hub, ``pdl-singleuser``
        restarts the engine; locally this session does. Variables on those ranks are lost.
        """
        err = err or sys.stderr
        target = len(self._engines)
        for r in ranks:
            info = self._engines.pop(r.engine_id, None)
            self._replaced.add(r.engine_id)
            print(
                f"rank {r.rank} ({r.host}) did not stop within {STOP_TIMEOUT_S:.0f} s (stuck in a "
                f"collective or native code); restarting its engine: variables on that rank are lost.",
                file=err, flush=True,
            )
            if info is None or info["host"] != socket.gethostname():
                raise RanksStuck(f"rank {r.rank} on {r.host} is stuck and cannot be restarted from here")
            try:
                os.kill(info["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
            if not self.is_hub:
                clusters.restart_slot_engine(self._cluster, info["slot"], len(self.pool()))
        self._wait_for_engines(target)

    def _view(self, engine_id: int) -> ipp.DirectView:
        """A non-blocking view of one engine (kept: making one per call costs time)."""
        view = self._views.get(engine_id)
        if view is None:
            view = self._views[engine_id] = self.client[engine_id]
        return view

    def publish_status(self, running: bool, metrics: dict | None = None, force: bool = False) -> None:
        """Tell the Cluster panel what this session runs (:mod:`pdl_magics.status_file`).

        The file is written on a background thread, in call order, within milliseconds.
        """
        cluster_file = self._cluster.cluster_file if self._cluster is not None else None
        args = (cluster_file, list(self.last_world))
        kwargs = dict(running=running, metrics=dict(metrics or {}), cell=self._cell_number,
                      slots=list(self.pool()), hub=self.is_hub, force=force)
        try:
            self._status_writer.submit(status_file.write_status, *args, **kwargs)
        except RuntimeError:  # no new threads at interpreter exit: write here
            status_file.write_status(*args, **kwargs)

    def close(self) -> None:
        """Disconnect; a local cluster is stopped, a hub cluster is left running."""
        if self.client is not None:
            self.client.close()
            self.client = None
        if self._cluster is not None and not self.is_hub:
            self._cluster.stop_cluster_sync()
        self._cluster = None
        self._engines.clear()
        self._views.clear()
        self._group_key = None
        self._stop_rendezvous()
        try:  # after the writes still queued
            self._status_writer.submit(status_file.remove_status).result(timeout=10)
        except (RuntimeError, FutureTimeout):
            status_file.remove_status()


def _local_ranks(world: list[Rank]) -> dict[int, int]:
    """Rank -> index among the ranks on the same host."""
    seen: dict[str, int] = {}
    local = {}
    for r in world:
        local[r.rank] = seen.get(r.host, 0)
        seen[r.host] = local[r.rank] + 1
    return local
