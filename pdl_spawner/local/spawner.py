"""The embedded-default spawner: the user's server and engines as local processes.

Contract, on top of :class:`~pdl_spawner.host.server.HostServer` (JupyterHub's
:class:`~jupyterhub.spawner.LocalProcessSpawner`):

- ``start()`` first checks ``user_options``: ``workers`` is the only key a user may
  set; any other (``image``, ``volumes``, ``env``, ...) fails with HTTP 400 naming
  the valid option. It then reserves ``workers`` slots from
  :attr:`PDLLocalSpawner.pool` in the :class:`~pdl_spawner.core.reservations.SlotLedger`
  before anything is launched. If they are not free it fails at once (no process
  started, nothing reserved) with a one-line message saying what is free. It then
  runs ``pdl-singleuser`` with ``PDL_SLOTS``, which starts the server (on a port from
  :attr:`PDLLocalSpawner.port_range`) and one pinned engine per slot.
- A spawn with ``user_options["queue"]`` (the form's "wait in the queue") that finds
  the slots busy waits instead, first come first served (:mod:`~pdl_spawner.core.wait_queue`),
  showing its position on the spawn page; cancelling the spawn leaves the queue. A
  direct spawn is refused while anyone waits.
- ``stop()`` stops that process tree and releases the slots; so does a ``poll()``
  that finds the server gone (``clear_state``, which frees whatever the ledger holds
  for the server, so a reservation made just before a hub crash, before JupyterHub
  saved the spawner's state, is freed when the restarted hub finds no server).
- The reservation is in the spawner state and in the ledger file, so it survives
  hub restarts (with ``JupyterHub.cleanup_servers = False`` the servers do too).
- **Accounts.** The server part is :class:`~pdl_spawner.host.server.HostServer`'s
  (each hub user's own Unix account when the hub runs as root, their cgroups, their
  port). Here the device cgroup lets the user's processes open only the GPU device
  nodes of their reservation (and a GPU is freed only when none of them holds it open).
- The ledger and the queue are SQLite files: every call is made off the event loop
  (:mod:`~pdl_spawner.hub.db_thread`), so a lock held elsewhere never freezes the hub.
- Idle engines give their slots back through the server's HTTP lease API
  (:mod:`~pdl_spawner.core.idle_engines`); nothing the user can write decides which slots
  are theirs or how many they get.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pwd
import signal
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Integer, List, Unicode, default, validate

from pdl.contract import ServerContract
from pdl.lease import Grant
from pdl.nvidia_smi import MigDevice, query_gpus
from pdl.slots import cpu_count, cpus_for_slot, default_pool, holds_gpu, mig_slots, parse_slot, slot_types, usable_cores
from pdl_spawner.host import device_cgroup
from pdl_spawner.hub.db_thread import off_loop
from pdl_spawner.core.gpu_types import GpuTypeChoice
from pdl_spawner.host.server import HostServer
from pdl_spawner.core.reservations import NotEnoughSlots, SlotLedger
from pdl_spawner.core.spawner import SpawnerCore
from pdl_spawner.core.usage import NotEnoughWorkers, SchedulerLimits, WorkerUsage
from pdl_spawner.local import mig_nodes
from pdl_spawner.local.kind import KIND


class PDLLocalSpawner(GpuTypeChoice, HostServer, SpawnerCore, LocalProcessSpawner):
    """Spawn a user's server plus one ipyparallel engine per reserved GPU or CPU slot."""

    kind_name = KIND.name

    pool = List(
        Unicode(),
        config=True,
        help="""Slots users can reserve, e.g. ["gpu:0", "gpu:1"], ["mig:0", "mig:1"] (MIG
        devices, numbered in `nvidia-smi -L`'s order) or ["cpu:0", "cpu:1"].

        Default: every GPU nvidia-smi reports (each MIG device of a GPU that MIG splits),
        else `cpu_slots` CPU slots.
        """,
    )

    @default("default_workers")
    def _default_default_workers(self):
        """3 on the embedded default (a newcomer's first cell runs on 3 engines, fewer where
        fewer slots exist); the other kinds' 1 is the core's."""
        return 3

    @default("pool")
    def _default_pool(self):
        return default_pool(self.cpu_slots)

    @validate("pool")
    def _validate_pool(self, proposal):
        for slot in proposal.value:
            parse_slot(slot)
        if len(set(proposal.value)) != len(proposal.value):
            raise ValueError(f"pool lists a slot twice: {proposal.value}")
        cpu_slots = sum(1 for slot in proposal.value if slot.startswith("cpu:"))
        if cpu_slots > cpu_count():
            self.log.warning("pool has %d CPU slots on %d cores: engines will share cores and each "
                             "train slower than one per core would", cpu_slots, cpu_count())
        return proposal.value

    cpu_slots = Integer(
        None,
        allow_none=True,
        config=True,
        help="Number of CPU slots in the default pool of a machine without GPUs; "
        "default (None): one per core, so that no two engines share a core. "
        "The machine's cores are split evenly between them.",
    )

    reservations_db = Unicode(
        "pdl-reservations.sqlite",
        config=True,
        help="SQLite file of slot reservations (relative to the hub's working directory). "
        "Every spawner of one hub must use the same file.",
    )

    def default_accounts_record(self) -> Path:
        """``accounts`` beside :attr:`reservations_db`."""
        return Path(self.reservations_db).parent / "accounts"

    gpu_device_template = Unicode(
        "/dev/nvidia{index}", config=True,
        help="""Device node of GPU slot gpu:{index} (and of the GPU a MIG slot's device is
        on). A user's processes may open only the nodes of their own reservation (device
        cgroup), when the hub runs as root.""",
    )

    mig_minors_file = Unicode(
        mig_nodes.MIG_MINORS_FILE, config=True,
        help="""Where the driver lists the capability minors of the MIG devices' GPU and
        compute instances (read for the device cgroup of MIG slots).""",
    )

    mig_cap_template = Unicode(
        mig_nodes.CAP_TEMPLATE, config=True,
        help="""Capability node of minor {minor}: a MIG slot's server may open those of its
        own device's instances, and none of another's.""",
    )

    # -- reservations ----------------------------------------------------------

    @property
    def ledger(self) -> SlotLedger:
        """The slot ledger; its calls block: make them with :func:`off_loop`."""
        return SlotLedger(self.reservations_db)

    @property
    def queue_db(self) -> str:
        """The queue lives next to the ledger."""
        return self.reservations_db

    @property
    def worker_kind(self) -> str:
        return "gpu" if self.pool and holds_gpu(self.pool[0]) else "cpu"

    @property
    def worker_capacity(self) -> int:
        return len(self.pool)

    # -- GPU types --------------------------------------------------------------

    #: nvidia-smi path -> (GPU slot -> its type, MIG slot -> its device), read once per hub process.
    _machine_gpus: dict[str, tuple[dict[str, str], dict[str, MigDevice]]] = {}

    @property
    def slot_types(self) -> dict[str, str]:
        """GPU slot (``gpu:<index>``, ``mig:<n>``) -> its type, as read ({} before :meth:`read_capacity`)."""
        return PDLLocalSpawner._machine_gpus.get(self.nvidia_smi, ({}, {}))[0]

    @property
    def mig_devices(self) -> dict[str, MigDevice]:
        """MIG slot -> its device, as read ({} before :meth:`read_capacity`)."""
        return PDLLocalSpawner._machine_gpus.get(self.nvidia_smi, ({}, {}))[1]

    async def read_capacity(self) -> None:
        """Read the GPUs' types and MIG devices (``nvidia-smi``) the first time this hub
        process needs them, where the pool has GPU slots."""
        if self.nvidia_smi not in PDLLocalSpawner._machine_gpus and any(map(holds_gpu, self.pool)):
            smi = self.nvidia_smi or None
            migs = await asyncio.to_thread(mig_slots, smi)
            types = await asyncio.to_thread(slot_types, smi, migs)
            PDLLocalSpawner._machine_gpus[self.nvidia_smi] = (types, migs)

    def gpu_types_for(self, options: dict) -> list[str]:
        """The types of the pool's GPUs (the same whatever the options)."""
        types = self.slot_types
        return sorted({types[s] for s in self.pool if s in types})

    @property
    def spawn_pool(self) -> list[str]:
        """The slots this spawn may take: the pool's GPUs of its chosen type, else the pool."""
        chosen = self.chosen_gpu_type
        return [s for s in self.pool if self.slot_types.get(s) == chosen] if chosen else list(self.pool)

    async def gpu_type_usage(self) -> dict[str, tuple[int, int]]:
        """GPU type ("" : any) -> (free, total) slots of the pool, for the form."""
        held = {h.slot for h in await off_loop(self.ledger.holdings)}
        found = {}
        for kind in ["", *self.gpu_types_for({})]:
            slots = [s for s in self.pool if not kind or self.slot_types.get(s) == kind]
            found[kind] = (sum(s not in held for s in slots), len(slots))
        return found

    # -- usage ------------------------------------------------------------------

    async def worker_usage(self) -> WorkerUsage:
        await self.read_capacity()
        return await off_loop(self._usage, self.spawn_pool)

    def _usage(self, pool: list[str]) -> WorkerUsage:
        """``pool``, and the users holding its slots other than this server; blocks on the ledger."""
        holders: dict[str, int] = {}
        for h in self.ledger.holdings():
            if h.slot in pool and h.owner != self.owner:
                user = h.owner.split("/", 1)[0]
                holders[user] = holders.get(user, 0) + 1
        return WorkerUsage(total=len(pool), holders=holders)

    async def scheduler_limits(self) -> SchedulerLimits:
        """No cap on workers of this machine's own; its limits on the user's processes,
        in one line (:meth:`HostServer.machine_limits_note`)."""
        return SchedulerLimits(note=self.machine_limits_note())

    async def take_workers(self, n: int) -> list[str]:
        """``n`` free slots of :attr:`spawn_pool` from the ledger (all or nothing)."""
        pool = self.spawn_pool
        try:
            return await off_loop(self.ledger.reserve, self.owner, n, pool)
        except NotEnoughSlots as e:
            raise NotEnoughWorkers(e.wanted, WorkerUsage(total=len(pool), holders=e.holders)) from None

    def release_blocking(self) -> list[str]:
        """End whatever still runs on this server's slots, then free every slot the ledger
        holds for it (blocks on the ledger)."""
        self.end_slot_processes(self.ledger.held_by(self.owner))
        released = self.ledger.release(self.owner)
        if released:
            self.log.info("Released %s for %s", ",".join(released), self.owner)
        return released

    async def release(self) -> None:
        self.forget_port()
        await off_loop(self.release_blocking)

    # -- the slots' devices ----------------------------------------------------------

    def gpu_nodes(self, slots: list[str]) -> list[Path]:
        """Device nodes of the GPU slots among ``slots``: a GPU's node; for a MIG device,
        its GPU's node and the capability nodes of its instances (:mod:`.mig_nodes`)."""
        nodes = []
        minors = mig_nodes.read_minors(self.mig_minors_file) if any(s.startswith("mig:") for s in slots) else {}
        for slot in slots:
            kind, index = parse_slot(slot)
            if kind == "gpu":
                nodes.append(Path(self.gpu_device_template.format(index=index)))
            elif kind == "mig" and slot in self.mig_devices:
                device = self.mig_devices[slot]
                gpu = Path(self.gpu_device_template.format(index=device.gpu))
                if gpu not in nodes:  # another MIG device of the same GPU named it already
                    nodes.append(gpu)
                nodes += mig_nodes.cap_nodes(device, minors, self.mig_cap_template)
        return nodes

    def restrict_devices(self, slots: list[str]) -> None:
        """Let this server's processes open the GPU nodes of ``slots`` and no other of the pool."""
        cgroup = self.cgroup
        if cgroup is not None:
            all_nodes = [n for n in self.gpu_nodes(self.pool) if n.exists()]
            cgroup.restrict([n for n in self.gpu_nodes(slots) if n.exists()], all_nodes)

    def give_slot_cores(self, slots: list[str]) -> None:
        """Let this server's engines join the cgroups of ``slots``, each kept to its
        slot's cores (:mod:`~pdl_spawner.host.cpu_limits`, or on cgroup v2
        :mod:`~pdl_spawner.host.cgroup_v2`; nothing without them)."""
        cpu = self.cpu_limits or self.tree
        if cpu is None:
            return
        uid, cores = pwd.getpwnam(self.account).pw_uid, usable_cores()
        for slot in slots:
            cpu.grant(slot, cpus_for_slot(slot, self.pool, cores), uid)

    def end_slot_processes(self, slots: list[str]) -> list[int]:
        """Take ``slots``' cgroups back and kill every process in them (blocks up to
        about 5 s a slot): the processes that would not die (empty: the slots are free)."""
        cpu = self.cpu_limits or self.tree
        left = []
        for slot in slots if cpu is not None else []:
            left += cpu.take_back(slot)
        if left:
            self.log.error("processes %s on the slots of %s survived SIGKILL", left, self.owner)
        return left

    def server_contract(self) -> ServerContract:
        """:meth:`HostServer.server_contract`, with the nvidia-smi this hub reads the machine's
        GPUs with, by which the server finds its MIG slots' devices, the whole pool,
        which the server splits the machine's cores over (so no two users' engines share
        one), and where the slots' cgroups are, which its engines join."""
        cpu, tree = self.cpu_limits, self.tree
        folders = cpu.slot_folders() if cpu is not None else [tree.path] if tree is not None else []
        return dataclasses.replace(super().server_contract(), nvidia_smi=self.nvidia_smi, pool=tuple(self.pool),
                                   slot_cgroups=tuple(map(str, folders)))

    def prepare_account(self) -> None:
        """The account and its cgroups (:meth:`HostServer.prepare_account`), the device
        cgroup opening only the GPUs of this server's slots, the slots' cgroups this
        server's engines may join."""
        super().prepare_account()
        self.restrict_devices(self.slots)
        self.give_slot_cores(self.slots)

    # -- idle engines ----------------------------------------------------------

    async def reclaim_idle_workers(self) -> list[str] | None:
        """Free this server's slots in the ledger (logged as a reclaim); its device cgroup
        then opens no GPU. Only when no process of the user holds one of its GPUs open
        (a handle opened before, which the cgroup cannot take back): the user's processes
        are looked at, and when none holds one, looked at again after the cgroup stopped
        new opens. While one does, every slot stays reserved (the GPUs stay open to them)
        and this returns None (the next look tries again). The lease is the user's to
        write, so "released" alone never frees a GPU that is in use. Whatever still runs
        in the slots' cgroups (an engine the server did not stop) is killed before they
        are free."""
        held = await off_loop(self.ledger.held_by, self.owner)
        if not held:
            return []
        holders = await off_loop(self.gpu_holders, held)
        if not holders:  # look again once no new open can succeed: one opened meanwhile shows now
            self.restrict_devices([])
            holders = await off_loop(self.gpu_holders, held)
            if holders:
                self.restrict_devices(held)
        if holders:
            kept = ", ".join(f"pid {pid} has {' '.join(nodes)}" for pid, nodes in sorted(holders.items()))
            if kept != self._kept_for:
                self.log.info("Kept %s for %s, whose lease says released: %s open; freed once none is",
                              ",".join(held), self.owner, kept)
            self._kept_for = kept
            return None
        self._kept_for = ""
        if await asyncio.to_thread(self.end_slot_processes, held):  # one would not die: the slots stay
            return None
        return await off_loop(self.ledger.reclaim, self.owner, self.reclaim_reason())

    async def take_back_workers(self) -> list[str]:
        """The session's end (or GPUs held idle past their release), enforced: the device cgroup closes every GPU to this server's
        processes, those that hold one of its GPUs open anyway are killed, and its slots
        are freed (logged as a reclaim)."""
        held = await off_loop(self.ledger.held_by, self.owner)
        if not held:
            return []
        self.restrict_devices([])
        for pid in await off_loop(self.gpu_holders, held):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(self.end_slot_processes, held)
        self.slots = []
        return await off_loop(self.ledger.reclaim, self.owner, self.reclaim_reason())

    #: The holders last logged by :meth:`reclaim_idle_workers` ("" none): logged once, not every look.
    _kept_for = ""

    def gpu_holders(self, slots: list[str]) -> dict[int, list[str]]:
        """Processes of this server's cgroup or account with a GPU node of ``slots`` open:
        pid -> nodes (empty without :attr:`system_users`: one person's machine). Blocks."""
        if not self.system_users:
            return {}
        nodes = [n for n in self.gpu_nodes(slots) if n.exists()]
        if not nodes:
            return {}
        cgroup = self.tree or self.cgroup  # on cgroup v2, every leaf of the server
        pids = set(cgroup.pids()) if cgroup is not None else set()
        with contextlib.suppress(KeyError):
            pids |= set(device_cgroup.processes_of_uid(pwd.getpwnam(self.account).pw_uid))
        return device_cgroup.processes_holding(nodes, pids)

    async def gpu_use(self) -> list[float] | None:
        """Each held GPU's use in percent (``nvidia-smi`` on this machine, asked by the hub);
        None without GPU slots, with a MIG slot (nvidia-smi reads no use of a MIG device:
        the server's use is unknown), or when a held GPU has no reading."""
        slots = [parse_slot(slot) for slot in self.slots]
        indexes = [str(index) for kind, index in slots if kind == "gpu"]
        if not indexes or any(kind == "mig" for kind, _ in slots):
            return None
        rows = await asyncio.to_thread(query_gpus, ("index", "utilization.gpu"), nvidia_smi=self.nvidia_smi or None)
        use = {row["index"]: row["utilization.gpu"] for row in rows}
        try:
            return [float(use[index]) for index in indexes]
        except (KeyError, ValueError):  # a GPU not listed, or "[N/A]"
            return None

    async def record_gpu_idle(self, since: float | None) -> None:
        """The flag, in the ledger, where the admin view reads it."""
        await off_loop(self.ledger.flag_gpu_idle, self.owner, since)

    async def grant_workers_again(self, n: int) -> Grant:
        """Slots from the ledger again (the device cgroup follows them)."""
        self.slots = await self.reserve_workers(n, spawning=False)
        self.restrict_devices(self.slots)
        await asyncio.to_thread(self.give_slot_cores, self.slots)
        self.log.info("Granted %s to %s again", ",".join(self.slots), self.owner)
        return Grant(workers=n, slots=tuple(self.slots))
