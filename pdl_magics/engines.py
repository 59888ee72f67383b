"""The engines of one notebook session (:class:`Engines`): the one place that
connects to them, counts them, orders them into a world, signals and replaces them.

Two kinds of cluster, one interface:

- under the hub (``cluster_file`` given, see :mod:`pdl_server.clusters`), the
  engines were started by the user's server on the slots the hub reserved;
  after an idle release, :meth:`Engines.world` asks the hub for them again
  (:mod:`pdl.lease`);
- otherwise a local cluster is started on first use over ``local_slots``
  (default: this machine's GPUs, else CPU slots), one engine per slot, and dead
  engines are restarted on their slot before the next cell.

Rank order is (host, slot index, engine id), see :func:`~pdl_server.world.rank_order`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import time
import warnings
from collections.abc import Callable
from typing import TextIO

import ipyparallel as ipp

from pdl.lease import LeaseFiles, Refusal, Release, Want
from pdl.slots import default_pool
from pdl_server import clusters, status_file, warm_engines
from pdl_server.lease_client import LeaseClient
from pdl_server.session_clock import END_MARGIN_S, session_end
from pdl_server.world import Rank, call_engine, rank_order

from .errors import DistributedUsageError, RanksStuck

#: Seconds to wait for engines to confirm a signal (interrupt, stack request).
SIGNAL_REPLY_S = 2.0
#: Seconds between a wait's looks at the engines the controller has registered
#: (:meth:`Engines._wait_for_registrations`).
NOTICE_LOOK_S = 5.0
#: Seconds a cell waits for the hub to grant slots again after an idle release.
LEASE_WAIT_S = 120.0
#: Seconds the server may take to record a release it is due to make (its supervision period, twice).
RELEASE_SEEN_S = 4.0
#: The least level of the kernel's own Cluster log that reaches the notebook. In a kernel,
#: ipyparallel logs to the cell's output, and an engine set that stops (an idle release,
#: a replaced engine) logs the engines' last 100 lines of output there, tracebacks of
#: their shutdown included; PDL says what happened in one line of its own instead.
KERNEL_CLUSTER_LOG_LEVEL = logging.ERROR


@contextlib.contextmanager
def quiet_empty_location_lookup():
    """Within: no ipyparallel warning about looking up an empty host name.

    The controller's connection file leaves ``location`` empty (the controller is on
    this node): ipyparallel looks that empty name up when a client connects and, on a
    host where it does not resolve, warns "IPython could not determine IPs for : ...",
    which nobody can act on. Its warnings about a named host, and any other, still show.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"IPython could not determine IPs for : ", category=RuntimeWarning)
        yield


def _wait_for_release(lease: LeaseClient, seconds: float) -> Release | None:
    """The release the server records with its lease's owner, waited for (a long poll)
    up to ``seconds``; None if none came by then."""
    deadline = time.monotonic() + seconds
    view = lease.view()
    while view is not None and view.released is None and (left := deadline - time.monotonic()) > 0:
        view = lease.view(after=view, wait_s=left)
    return view.released if view is not None else None


def _unreachable(lease: LeaseClient) -> DistributedUsageError:
    return DistributedUsageError(f"cannot reach your server's engine lease at {lease.url}: "
                                 f"is your server stopping? Run the cell again, or restart your server")


class Engines:
    """This session's engines: a hub cluster (``cluster_file``) or a local one over ``local_slots``.

    Not thread-safe: one cell at a time uses it.
    """

    def __init__(self, cluster_file: str | None, local_slots: list[str] | None = None, name: str = "pdl-local"):
        self.cluster_file = cluster_file
        self.local_slots = list(local_slots) if local_slots is not None else None
        self._name = name
        self._client: ipp.Client | None = None
        self._cluster = None
        self._info: dict[int, dict] = {}  # engine id -> pdl.runtime.engine.describe() of a live engine
        self._replaced: set[int] = set()  # killed engines the controller may still list
        self._views: dict[int, ipp.DirectView] = {}

    # -- what there is -------------------------------------------------------------

    @property
    def is_hub(self) -> bool:
        """True when the engines are the ones the hub reserved (not a local cluster)."""
        return self.cluster_file is not None

    @property
    def cluster(self):
        """The connected :class:`ipyparallel.Cluster`, or None before the first connection."""
        return self._cluster

    @property
    def client(self) -> ipp.Client | None:
        """The (non-blocking) ipyparallel client, or None before :meth:`connect`."""
        return self._client

    def connect(self) -> ipp.Client:
        """The client, connecting (and starting a local controller) on first use."""
        if self._client is None:
            if self.is_hub:
                self._cluster = ipp.Cluster.from_file(self.cluster_file, log_level=KERNEL_CLUSTER_LOG_LEVEL)
            else:
                self._cluster = clusters.new_cluster(cluster_id=self._name, log_level=KERNEL_CLUSTER_LOG_LEVEL)
                warm_engines.warm_up(self._cluster)
                clusters.start_controller(self._cluster)
            with quiet_empty_location_lookup():
                self._client = self._cluster.connect_client_sync()
            self._client.block = False
        return self._client

    def pool(self) -> list[str]:
        """Slots the engines may use: the hub's reservation, or the local pool."""
        if self.is_hub:
            return clusters.hub_slots()
        if self.local_slots is None:
            self.local_slots = default_pool()
        return self.local_slots

    def count(self) -> int:
        """How many workers a cell may ask for (``-n``'s upper bound): those the hub
        reserved (:func:`~pdl_server.clusters.hub_workers`), or the local pool's."""
        size = clusters.hub_workers() if self.is_hub else len(self.pool())
        return size or len(self.connect().ids)

    def pids(self) -> dict[int, int]:
        """Engine id -> process id, for the engines known live since the last :meth:`world`."""
        return {eid: info["pid"] for eid, info in self._info.items()}

    def identity(self, world: list[Rank]) -> frozenset:
        """Which engine processes ``world`` is made of: the same ranks on restarted
        engines are another world."""
        return frozenset((r.engine_id, self._info.get(r.engine_id, {}).get("pid")) for r in world)

    # -- the world of a cell -------------------------------------------------------

    def world(self, n: int | None = None) -> list[Rank]:
        """The first ``n`` workers in rank order (default: all of them), starting or
        bringing back engines as needed.

        DistributedUsageError (one line, naming the valid range) when ``n`` is more
        than :meth:`count` or less than 1; RanksStuck when engines do not register
        within :data:`~pdl_server.clusters.ENGINE_TIMEOUT_S`.
        """
        available = self.count()
        if n is None:
            n = available
        if not 1 <= n <= available:
            where = "reserved for you" if self.is_hub else "in the local pool"
            raise DistributedUsageError(
                f"-n {n} is not available: {available} worker(s) {where}; use -n 1..{available}"
            )
        self._grow(n, available)
        chosen = sorted(self._info.items(), key=lambda item: rank_order(item[1]["host"], item[1]["slot"], item[0]))
        return [Rank(rank, eid, info["host"], info["addr"], info["slot"]) for rank, (eid, info) in enumerate(chosen[:n])]

    def _grow(self, n: int, available: int) -> None:
        """Make sure at least ``n`` engines are up (under the hub: all ``available``)."""
        self.connect()
        if self.is_hub:
            self._bring_back()
            target = available
        else:
            self._restart_dead_local()
            running = {info["slot"] for info in self._info.values()}
            started = len(self._cluster.engines)
            missing = [s for s in self.pool()[started:n] if s not in running]
            if missing:
                clusters.start_slot_engines(self._cluster, missing, self.pool())
            target = n
        # ipyparallel's wait shows engines starting (a progress bar); ours then waits until the
        # registered engines are live ones (not killed but still listed)
        try:
            self._wait_for_registrations(target)
        except ipp.error.EngineError:
            # an engine that died since the last cell (its set stopped, or its unregistration
            # arrived now) while its replacement starts: not a failure of this wait
            pass
        self._wait_until_live(target)

    def _wait_for_registrations(self, target: int) -> None:
        """Wait until the client knows ``target`` engines, within
        :data:`~pdl_server.clusters.ENGINE_TIMEOUT_S` (TimeoutError past it).

        ipyparallel's client learns of engines only from the controller's notices, and one
        sent just after the client connected can be lost (a subscription takes a moment to
        start): the engine runs, the controller lists it, and the client waited for it in
        vain (seen in a run: the engine's registration finished 11 ms after the kernel's
        client connected). So every :data:`NOTICE_LOOK_S` the wait asks the controller which
        engines it has; for one the client does not know, a new client (whose connection
        reply lists every engine) takes over.

        ipyparallel's wait counts the client's engines, then (after making its progress
        bar) listens for notices, in the calling thread while the client's own thread
        handles them: a registration handled in between is counted by the client but
        never wakes the wait, which then ends only at its timeout (seen in two runs on the
        simulated swarm: the cell waited 60 s for an engine its client knew, and idle
        engines were released under it). So the wait also ends once the client knows
        ``target`` engines after the wait began listening."""
        deadline = time.monotonic() + clusters.ENGINE_TIMEOUT_S
        waiting = self._client.wait_for_engines(target, timeout=clusters.ENGINE_TIMEOUT_S, block=False)
        while True:
            if len(self._client.ids) >= target:  # counted since it listens, or before: no notice will come
                return
            try:
                return waiting.result(timeout=NOTICE_LOOK_S)
            except TimeoutError:
                if waiting.done():  # the wait's own end: not all registered in time
                    raise
            if self._caught_up_on_missed_notices():
                waiting = self._client.wait_for_engines(target, timeout=max(0.0, deadline - time.monotonic()),
                                                        block=False)

    def registered_ids(self) -> set[int]:
        """The engines the controller has registered now (asked of it, not of the notices)."""
        return {eid for eid in self._client.queue_status() if isinstance(eid, int)}

    def _caught_up_on_missed_notices(self) -> bool:
        """Whether the controller has engines this client missed the notices of; if so, a
        new client (:meth:`_reconnect`), which knows them all, has taken over."""
        if not self.registered_ids() - set(self._client.ids):
            return False
        self._reconnect()
        return True

    def _reconnect(self) -> None:
        """A new client of the same controller in place of this one (which missed a notice)."""
        old = self._client
        with quiet_empty_location_lookup():
            self._client = self._cluster.connect_client_sync()
        self._client.block = False
        self._views.clear()
        old.close()

    def _bring_back(self) -> None:
        """Under the hub: note the cell's start with the lease's owner (the server keeps
        engines a cell starts on), and if the engines were stopped for idleness, ask for
        slots again and wait until they run (:mod:`pdl.lease`); DistributedUsageError if
        none are free, or the lease cannot be reached."""
        lease, files = LeaseClient.of_this_server(), LeaseFiles.of_this_server()
        if lease is None or files is None:
            return
        self._mind_session_end(lease, files)
        view = lease.cell_start()  # after any release being made now: this cell sees it
        if view is None:
            raise _unreachable(lease)
        released = view.released
        if released is None and view.gpu_idle is not None:  # the hub's flag: this cell may well lift it
            print(view.gpu_idle.line(), file=sys.stderr, flush=True)
        if released is None:
            return
        given_back = "slots" if released.slots else "GPUs"
        print(f"Your engines were stopped ({released.reason}) and their {given_back} given back; "
              f"asking for {released.workers} again...", file=sys.stderr, flush=True)
        # the engines registered now are stopped, or stopping (a Swarm service scaled to 0
        # stops its task over seconds, and the controller lists it until its heart stops):
        # none of them runs a rank again
        if self._client is not None:
            self._replaced.update(self._client.ids)
        view = lease.ask_again(Want(workers=released.workers)) or view
        deadline = time.monotonic() + LEASE_WAIT_S
        while view.released is not None:
            left = deadline - time.monotonic()
            if isinstance(view.answer, Refusal) or left <= 0:
                lease.forget_request()
                why = view.answer.reason if isinstance(view.answer, Refusal) else \
                    f"the hub did not answer within {LEASE_WAIT_S:.0f} s"
                raise DistributedUsageError(
                    f"your engines were stopped ({released.reason}) and cannot come back now: {why}")
            changed = lease.view(after=view, wait_s=left)  # the hub's answer, then the engines back, end it
            if changed is None:
                raise _unreachable(lease)
            view = changed
        self._info.clear()  # every engine is new

    @staticmethod
    def _mind_session_end(lease: LeaseClient, files: LeaseFiles) -> None:
        """In the session's last minutes, warn in one line; in its last seconds, wait for
        the server to release the engines (:mod:`pdl_server.session_clock`) rather than
        start a cell on engines about to be killed: the cell then asks for workers again."""
        end = session_end(lease=files)
        if end is None:
            return
        if end.ending():
            _wait_for_release(lease, END_MARGIN_S + RELEASE_SEEN_S)
        elif end.warning():
            print(end.warning(), file=sys.stderr, flush=True)

    def released_at_session_end(self) -> Release | None:
        """Under the hub, in the session's last seconds (:mod:`pdl_server.session_clock`):
        the release the server records as it stops the engines at the end, waited for up
        to :data:`RELEASE_SEEN_S` (it stops them first, then records it); None otherwise,
        at once. A cell whose engine died asks this before it blames the engine."""
        files = LeaseFiles.of_this_server() if self.is_hub else None
        lease = LeaseClient.of_this_server() if files is not None else None
        end = session_end(lease=files, fresh=True) if lease is not None else None
        if end is None or not end.ending():
            return None
        return _wait_for_release(lease, RELEASE_SEEN_S)

    def _restart_dead_local(self) -> None:
        """Start a fresh engine on the slot of each local engine whose process died
        (killed, crashed, or restarted from the Cluster panel) since the last cell."""
        here = socket.gethostname()
        for eid, info in list(self._info.items()):
            if info["host"] == here and not status_file.pid_alive(info["pid"]):
                del self._info[eid]
                self._replaced.add(eid)
                clusters.restart_slot_engine(self._cluster, info["slot"], self.pool())

    def _wait_until_live(self, target: int) -> None:
        """Wait until ``target`` live engines are known, or raise :class:`RanksStuck`.
        Like :meth:`_wait_for_registrations`, it asks the controller every
        :data:`NOTICE_LOOK_S` for engines the client's notices missed (a replacement that
        registered while this client's subscription started)."""
        deadline = time.monotonic() + clusters.ENGINE_TIMEOUT_S
        next_look = time.monotonic() + NOTICE_LOOK_S
        while True:
            self._refresh()
            if len(self._info) >= target:
                return
            now = time.monotonic()
            if now > deadline:
                raise RanksStuck(f"only {len(self._info)} of {target} engines registered within "
                                 f"{clusters.ENGINE_TIMEOUT_S} s")
            if now >= next_look:
                next_look = now + NOTICE_LOOK_S
                if self._caught_up_on_missed_notices():
                    continue
            time.sleep(0.2)

    def _refresh(self) -> None:
        ids = [i for i in self._client.ids if i not in self._replaced]
        new = [i for i in ids if i not in self._info]
        if new:
            pending = {}
            for i in new:
                try:
                    pending[i] = self._client[i].apply_async(call_engine, "describe")
                except IndexError:  # unregistered since the ids were read: its replacement will register
                    self._replaced.add(i)
            for i, ar in pending.items():
                try:
                    self._info[i] = ar.get(timeout=clusters.ENGINE_TIMEOUT_S)
                except (ipp.error.EngineError, ipp.error.RemoteError) as e:
                    if isinstance(e, ipp.error.RemoteError) and e.ename != "EngineError":
                        raise
                    self._replaced.add(i)  # died since it registered: its replacement will register
        for gone in set(self._info) - set(ids):
            del self._info[gone]

    # -- calling and signalling ------------------------------------------------------

    def call_async(self, engine_id: int, fname: str, *args) -> ipp.AsyncResult:
        """Start ``pdl.runtime.engine.<fname>(*args)`` on one engine; its AsyncResult."""
        view = self._views.get(engine_id)
        if view is None:  # kept: making a view per call costs time
            view = self._views[engine_id] = self.connect()[engine_id]
        return view.apply_async(call_engine, fname, *args)

    def call(self, engine_id: int, fname: str, *args):
        """``pdl.runtime.engine.<fname>(*args)`` on one engine, waited for; raises what it raised."""
        return self.call_async(engine_id, fname, *args).get()

    def call_all(self, engine_ids: list[int], fname: str, *args) -> list:
        """``pdl.runtime.engine.<fname>(*args)`` on several engines at once, waited for, in order."""
        return self.connect()[engine_ids].apply_sync(call_engine, fname, *args)

    def interrupt(self, ranks: list[Rank]) -> None:
        """Send SIGINT to the engines of ``ranks`` (through ipyparallel's control channel)."""
        self.send_signal(ranks, signal.SIGINT)

    def send_signal(self, ranks: list[Rank], signum: int) -> None:
        """Send ``signum`` to the engines of ``ranks`` that are still registered.

        Waits at most :data:`SIGNAL_REPLY_S` for the engines' nannies to confirm: an
        engine that died a moment ago (its node gone) never answers.
        """
        live = set(self.connect().ids)
        targets = [r.engine_id for r in ranks if r.engine_id in live]
        if targets:
            sent = self._client.send_signal(signum, targets=targets, block=False)
            try:
                sent.result(timeout=SIGNAL_REPLY_S)
            except Exception:  # noqa: BLE001 - no answer, or an engine that is gone: sent anyway
                pass

    def replace(self, ranks: list[Rank], why: Callable[[Rank], str], err: TextIO | None = None) -> None:
        """Kill the engines of ``ranks`` (stuck: ``why(rank)`` says how, in words that
        follow "rank 1 (host)") and bring up fresh ones on the same slots.

        Under the hub, ``pdl-singleuser`` restarts the engine; locally this object does.
        Variables on those ranks are lost. RanksStuck for an engine on another host.
        """
        err = err or sys.stderr
        target = len(self._info)
        for r in ranks:
            info = self._info.pop(r.engine_id, None)
            self._replaced.add(r.engine_id)
            print(
                f"rank {r.rank} ({r.host}) {why(r)}; restarting its engine: variables on that rank are lost.",
                file=err, flush=True,
            )
            if info is None or info["host"] != socket.gethostname():
                raise RanksStuck(f"rank {r.rank} on {r.host} is stuck and cannot be restarted from here")
            try:
                os.kill(info["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
            if not self.is_hub:
                clusters.restart_slot_engine(self._cluster, info["slot"], self.pool())
        self._wait_until_live(target)

    def close(self) -> None:
        """Disconnect; a local cluster is stopped, a hub cluster is left running."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._cluster is not None and not self.is_hub:
            self._cluster.stop_cluster_sync()
            warm_engines.stop_warm_parent(self._cluster)
        self._cluster = None
        self._info.clear()
        self._views.clear()
