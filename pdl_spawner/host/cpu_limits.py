"""What each server may take of the machine's cores: JupyterHub's ``cpu_limit`` for the
server and its kernels, and each engine kept on the cores of its slot, and ended when
the hub takes the slot back.

Without it, a user's kernel runs busy loops on every core, engines pinned to another
user's slot among them, and re-pinning (``os.sched_setaffinity``) takes any core; and an
engine whose slot the hub took back runs on, on cores the hub has granted to someone
else. With the cgroup v1 controllers ``cpu`` and ``cpuset`` (as root):

- **The server's processes** (the server, its kernels and terminals, its controller)
  are in ``<cpu|cpuset>/<parent>/servers/<hub>/<cgroup_name(owner)>``
  (:meth:`CpuLimits.server_procs_files`, joined in the forked child before it gives root
  up), limited to ``cpu_limit`` cores (``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``;
  none: no quota), and kept off the cores of other accounts' slots
  (:meth:`CpuLimits.place_servers`, after every grant, take-back and server start): a
  server runs on its own slots' cores and those no one holds; one whose user holds no
  slot, on the cores no one holds, or every core where all are held. All servers
  together (``<parent>/servers``) weigh :data:`SERVER_SHARES` against all slots'
  :data:`ENGINE_SHARES` (``<parent>/slots``), as much: on a core both want (a user's
  own, or where every core is held), each gets half of it when both are busy, so that
  an interrupt, a heartbeat or a new kernel is answered in time while engines train on
  every core. Servers mostly wait: engines lose only what they use, and ``cpu_limit``
  bounds that.
- **Each slot** has ``<cpu>/<parent>/slots/<hub>/<slot>`` (``<hub>``: the hub's account prefix, so two hubs of one machine keep apart) and
  ``<cpuset>/<parent>/slots/<hub>/<slot>`` (``cpuset.cpus``: the slot's cores, so that no
  affinity its processes set takes them elsewhere). While a user holds the slot, the two
  ``cgroup.procs`` files are that user's to write (:meth:`CpuLimits.grant`): their
  engine joins them as it starts (:func:`pdl.runtime.boot.join_slot_cgroups`, told the
  files by the engine contract). A process of another account cannot join them (the
  kernel wants the writer to own the process as well as the file).
- **Taking a slot back** (:meth:`CpuLimits.take_back`): the files are root's again, and
  every process in the slot's cgroups is killed, again until none is left, before the
  hub grants the slot to anyone else.

Where this machine lacks a controller, or the hub is not root, :func:`support` says why
in one line, and the hub logs it once. A host with cgroup v2 only gets the same from
:mod:`~pdl_spawner.host.cgroup_v2`, which places servers with :func:`place` too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from pdl.slots import slot_dirname
from pdl_spawner.host.device_cgroup import DEFAULT_PARENT, cgroup_name, kill_cgroup, make_cgroup, v1_mounts

CONTROLLERS = ("cpu", "cpuset")
#: Microseconds of one quota period of ``cpu_limit``: short, so that a limited kernel
#: runs in small slices rather than stalling for long ones.
PERIOD_US = 10_000
#: ``cpu.shares`` of all servers' processes together and of all engines together: on a
#: core both want, each gets half. A smaller weight for the servers (1/65, then 1/5)
#: left kernels, Jupyter servers and controllers seconds late on a loaded machine
#: while engines trained on every core: interrupts taken for stuck ranks, websockets
#: not answered in 5 s.
SERVER_SHARES = 1024
ENGINE_SHARES = 1024


@dataclass(frozen=True)
class Support:
    """The writable mount of each controller of :data:`CONTROLLERS`, and one line per
    controller this machine lacks (then nothing is limited)."""

    mounts: dict[str, Path] = field(default_factory=dict)
    missing: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return not self.missing


def support() -> Support:
    """Which of :data:`CONTROLLERS` this process can use (cgroup v1, as root)."""
    if os.geteuid() != 0:
        return Support({}, (f"per-user CPU limits are off: they need root (the hub runs as uid {os.geteuid()})",))
    mounts, missing = v1_mounts(CONTROLLERS, lambda controller: "per-user CPU limits are off")
    return Support(mounts, tuple(missing))


class CpuLimits:
    """The servers' and the slots' CPU cgroups under ``<mount>/<parent>`` of each
    controller of ``support`` (a true :class:`Support`). Constructing it touches
    nothing; every method needs root."""

    def __init__(self, support: Support, hub: str, parent: str = DEFAULT_PARENT):
        if not support:
            raise ValueError("; ".join(support.missing))
        self.mounts = support.mounts
        self.hub = hub
        self.parent = parent

    def __repr__(self) -> str:
        return f"CpuLimits(hub={self.hub!r}, parent={self.parent!r})"

    # -- the servers -------------------------------------------------------------------

    def server_paths(self, owner: str) -> list[Path]:
        """The server's cgroups, in :data:`CONTROLLERS`' order (under the hub's folder, as
        the slots': two hubs of one machine may both have a user of that name)."""
        return [self.mounts[c] / self.parent / "servers" / cgroup_name(self.hub) / cgroup_name(owner)
                for c in CONTROLLERS]

    def server_procs_files(self, owner: str) -> list[Path]:
        """The files a server's process joins through
        (:func:`~pdl_spawner.host.device_cgroup.join`)."""
        return [path / "cgroup.procs" for path in self.server_paths(owner)]

    def limit_server(self, owner: str, cpu_limit: float | None) -> None:
        """Make the server's cgroup if missing and limit it to ``cpu_limit`` cores (None
        or 0: no quota, only the weight). ValueError below 0."""
        if cpu_limit is not None and cpu_limit < 0:
            raise ValueError(f"cpu_limit is a number of cores, 0 or more (0: none), got {cpu_limit}")
        path, cpuset_path = self.server_paths(owner)
        _make_pair(path, cpuset_path, SERVER_SHARES)
        (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (path / "cpu.cfs_quota_us").write_text(str(quota_us(cpu_limit) or -1))

    def remove_server(self, owner: str) -> None:
        """Remove the server's cgroups once empty (nothing if gone)."""
        for path in self.server_paths(owner):
            _remove(path)

    def place_servers(self) -> None:
        """Keep every server's processes, this hub's and any other's under ``parent``, off
        the cores of slots that other accounts hold: on its own slots' cores and those no
        one holds; a server whose account holds no slot, on the cores no one holds (every
        core where all are held). Reads who holds what from the slots' cgroups (a held
        slot's ``cgroup.procs`` is its holder's) and whose a server is from its processes;
        a server without processes yet is left as it is."""
        root = self.mounts["cpuset"]
        place(cores_of(root / "cpuset.cpus"), (root / self.parent / "slots").glob("*/*/"),
              (root / self.parent / "servers").glob("*/*/"))

    # -- the slots ---------------------------------------------------------------------

    def slot_folders(self) -> list[Path]:
        """The folders that hold this hub's slots' cgroups, in :data:`CONTROLLERS`' order
        (the server contract's ``slot_cgroups``)."""
        return [self.mounts[c] / self.parent / "slots" / cgroup_name(self.hub) for c in CONTROLLERS]

    def slot_paths(self, slot: str) -> list[Path]:
        """The slot's cgroups, in :data:`CONTROLLERS`' order."""
        return [folder / slot_dirname(slot) for folder in self.slot_folders()]

    def slot_procs_files(self, slot: str) -> list[Path]:
        """The files the slot's engine joins through."""
        return [path / "cgroup.procs" for path in self.slot_paths(slot)]

    def grant(self, slot: str, cores: list[int], uid: int) -> None:
        """Make the slot's cgroups if missing, keep them to ``cores``, and let account
        ``uid`` put its processes in them (until :meth:`take_back`). ValueError without
        cores."""
        if not cores:
            raise ValueError(f"slot {slot} needs at least one core")
        cpu_path, cpuset_path = self.slot_paths(slot)
        _make_pair(cpu_path, cpuset_path, ENGINE_SHARES)
        (cpuset_path / "cpuset.cpus").write_text(",".join(map(str, sorted(cores))))
        for procs in self.slot_procs_files(slot):
            os.chown(procs, uid, -1)
        self.place_servers()

    def take_back(self, slot: str, timeout_s: float = 5.0) -> list[int]:
        """Nobody but root may join the slot's cgroups from now on, and every process in
        them is killed, again until none is left or ``timeout_s`` passed: the processes
        still there then (empty: the slot is free)."""
        left: list[int] = []
        for procs in self.slot_procs_files(slot):
            try:
                os.chown(procs, 0, -1)
            except FileNotFoundError:
                continue
        for procs in self.slot_procs_files(slot):
            if procs.exists():
                left += kill_cgroup(procs, timeout_s)
        self.place_servers()
        return sorted(set(left))

    def pids_on(self, slot: str) -> list[int]:
        """The processes in the slot's cgroups now."""
        pids: set[int] = set()
        for procs in self.slot_procs_files(slot):
            try:
                pids |= {int(p) for p in procs.read_text().split()}
            except FileNotFoundError:
                pass
        return sorted(pids)


def quota_us(cpu_limit: float | None) -> int | None:
    """Microseconds of CPU a :data:`PERIOD_US` period gives ``cpu_limit`` cores (at least
    1000, the kernel's least); None for no limit (None or 0)."""
    return max(1000, round(cpu_limit * PERIOD_US)) if cpu_limit else None


def _make(folder: Path, shares: int | None = None) -> None:
    """:func:`~pdl_spawner.host.device_cgroup.make_cgroup`, with the folder's ``cpu.shares``."""
    make_cgroup(folder)
    if shares is not None:
        (folder / "cpu.shares").write_text(str(shares))


def _make_pair(cpu_path: Path, cpuset_path: Path, shares: int) -> None:
    """Make a server's or a slot's two cgroups, ``<parent>/<servers|slots>/<hub>/<name>``
    in ``cpu`` and ``cpuset``, with what is missing above them: the ``servers`` or
    ``slots`` folder of ``cpu`` weighs ``shares``; each new cpuset starts with its parent's
    cores."""
    _make(cpu_path.parents[2])
    _make(cpu_path.parents[1], shares=shares)
    _make(cpu_path.parent)
    _make(cpu_path)
    for folder in (cpuset_path.parents[2], cpuset_path.parents[1], cpuset_path.parent, cpuset_path):
        _make(folder)
        _inherit_cpuset(folder)


def _inherit_cpuset(folder: Path) -> None:
    """A new v1 cpuset takes no process until its cores and memory nodes are set: its
    parent's, where it has none yet."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        if not (folder / name).read_text().strip():
            (folder / name).write_text((folder.parent / name).read_text().strip())


def place(machine: set[int], slots, servers) -> None:
    """Keep each of the cgroups ``servers`` off the cores of the cgroups ``slots`` that
    other accounts hold (see :meth:`CpuLimits.place_servers`); ``machine``: every core.
    A slot's holder is the owner of its ``cgroup.procs`` (root: nobody), a server's
    account that of its first process; a server without processes is left as it is."""
    held: dict[int, set[int]] = {}
    for slot in slots:
        try:
            holder = (slot / "cgroup.procs").stat().st_uid
            if holder:
                held.setdefault(holder, set()).update(cores_of(slot / "cpuset.cpus"))
        except FileNotFoundError:  # taken back and removed meanwhile
            continue
    taken = set().union(*held.values())
    for server in servers:
        uid = account_of(server / "cgroup.procs")
        if uid is None:
            continue
        others = set().union(*(cores for holder, cores in held.items() if holder != uid))
        # its own slots' cores always (a core may carry two users' slots where the
        # pool has more slots than cores): its engines start there before they join
        allowed = ((machine - others) | held[uid]) if uid in held else (machine - taken)
        try:
            set_cores(server, allowed or machine)
        except OSError:  # the server stopped meanwhile, or the kernel refused: left as it is
            continue


def cores_of(cpuset_file: Path) -> set[int]:
    """The cores a ``cpuset.cpus`` (or ``cpuset.cpus.effective``) file lists."""
    return _cores(cpuset_file.read_text())


def _cores(cpulist: str) -> set[int]:
    """The cores of a cpuset list (``"0-2,5"``)."""
    cores: set[int] = set()
    for part in cpulist.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cores.update(range(int(first), int(last or first) + 1))
    return cores


def set_cores(folder: Path, cores: set[int]) -> None:
    """Write ``folder``'s ``cpuset.cpus`` where it differs."""
    if _cores((folder / "cpuset.cpus").read_text()) != cores:
        (folder / "cpuset.cpus").write_text(",".join(map(str, sorted(cores))))


def account_of(procs: Path) -> int | None:
    """The account (real uid, not root) of the first process in ``procs`` that has
    one; None for none."""
    try:
        pids = procs.read_text().split()
    except FileNotFoundError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as status:
                uid = next(int(line.split()[1]) for line in status if line.startswith("Uid:"))
        except (FileNotFoundError, ProcessLookupError, StopIteration):
            continue
        if uid:
            return uid
    return None


def _remove(folder: Path) -> None:
    try:
        folder.rmdir()
    except FileNotFoundError:
        pass
