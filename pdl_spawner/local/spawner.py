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
- Where the slots come from, and how they are freed, taken back and granted again, is
  the kind's :class:`~pdl_spawner.local.workers.LedgerSlots`; here the server's devices,
  cores and contract.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pwd
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Integer, List, Unicode, default, validate

from pdl.contract import ServerContract
from pdl.nvidia_smi import MigDevice
from pdl.slots import cpu_count, cpus_for_slot, default_pool, parse_slot, usable_cores
from pdl_spawner.host import device_cgroup
from pdl_spawner.host.server import HostServer
from pdl_spawner.core.reservations import SlotLedger
from pdl_spawner.core.spawner import SpawnerCore
from pdl_spawner.local import mig_nodes
from pdl_spawner.local.kind import KIND
from pdl_spawner.local.workers import MACHINE_GPUS, LedgerSlots


class PDLLocalSpawner(HostServer, SpawnerCore, LocalProcessSpawner):
    """Spawn a user's server plus one ipyparallel engine per reserved GPU or CPU slot."""

    kind_name = KIND.name
    worker_source = LedgerSlots

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
        """The slot ledger; its calls block: make them off the event loop (:mod:`~pdl_spawner.hub.db_thread`)."""
        return SlotLedger(self.reservations_db)

    # -- GPU types --------------------------------------------------------------

    @property
    def slot_types(self) -> dict[str, str]:
        """GPU slot (``gpu:<index>``, ``mig:<n>``) -> its type, as read ({} before the
        source's ``read_capacity``)."""
        return MACHINE_GPUS.get(self.nvidia_smi, ({}, {}))[0]

    @property
    def mig_devices(self) -> dict[str, MigDevice]:
        """MIG slot -> its device, as read ({} before the source's ``read_capacity``)."""
        return MACHINE_GPUS.get(self.nvidia_smi, ({}, {}))[1]

    @property
    def spawn_pool(self) -> list[str]:
        """The slots this spawn may take: the pool's GPUs of its chosen type, else the pool."""
        chosen = self.chosen_gpu_type
        return [s for s in self.pool if self.slot_types.get(s) == chosen] if chosen else list(self.pool)

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
