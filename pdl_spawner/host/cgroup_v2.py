"""Each server's processes bounded in one cgroup v2 folder and its leaves, on machines
whose cgroup v2 mount has the controllers PDL's limits need (pure cgroup v2 hosts, as
Debian 12 and Ubuntu 22.04 and later are; hybrid hosts with the v1 controllers use
:mod:`~pdl_spawner.host.account_limits` and :mod:`~pdl_spawner.host.cpu_limits`).

On cgroup v2 a process is in one cgroup of one tree, and a cgroup whose children get
controllers holds no process itself, so a server's limits nest (:class:`ServerTree`)::

    <cg2>/<parent>                       the controllers of CONTROLLERS passed down
    <cg2>/<parent>/<cgroup_name(owner)>  the server's folder: the same folder as its GPU
                                         device and bind filters (eBPF, which its leaves
                                         inherit); memory.max (mem_limit), pids.max; no process
        main                             the server, its kernels, terminals and controller:
                                         cpu.max (cpu_limit), cpuset.cpus (placed off other
                                         users' slots), joined in the forked child as root
        <slot_dirname(slot)>             a slot the server holds: cpuset.cpus, the slot's
                                         cores; its engine moves itself there as it starts

A user owns the ``cgroup.procs`` of the server's folder and of the leaves of the slots
it holds (cgroup v2 lets a process move between two cgroups only to a writer of both
and of their common ancestor's ``cgroup.procs``), nothing else: not the limits, not the
folder of another user (their common ancestor, ``<parent>``, is root's), and not the
server's folder as a place to run (it has controllers below it: the kernel refuses).
The owner is the server's account (PDL does not turn JupyterHub's named servers on: each
user has one server, so the server's folder is the user's one control group).

Every function needs root. :func:`support` says in one line why the tree cannot be used.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pdl.slots import slot_dirname
from pdl_spawner.host.account_limits import users_memory_bytes
from pdl_spawner.host.cpu_limits import PERIOD_US, cores_of, place, quota_us
from pdl_spawner.host.device_cgroup import DEFAULT_PARENT, cgroup2_mount, cgroup_name, kill_cgroup, make_cgroup

#: The controllers the tree bounds a server with.
CONTROLLERS = ("cpu", "cpuset", "memory", "pids")
#: The leaf of a server's own processes.
MAIN = "main"


def support(root: Path | None = None) -> tuple[Path | None, str]:
    """(the cgroup2 mount to build trees under, "") where this process can bound servers
    with :data:`CONTROLLERS` there; else (None, one line saying why not)."""
    if os.geteuid() != 0:
        return None, f"cgroup v2 limits are off: they need root (the hub runs as uid {os.geteuid()})"
    root = root or cgroup2_mount()
    if root is None:
        return None, "cgroup v2 limits are off: no cgroup2 mount"
    if not os.access(root, os.W_OK):
        return None, f"cgroup v2 limits are off: {root} is read-only"
    have = set((root / "cgroup.controllers").read_text().split())
    missing = [c for c in CONTROLLERS if c not in have]
    if missing:
        return None, (f"cgroup v2 limits are off: {root} lacks the {', '.join(missing)} controller"
                      f"{'s' if len(missing) > 1 else ''} (bound to cgroup v1, or not built)")
    return root, ""


def enable(folder: Path, controllers=CONTROLLERS) -> None:
    """Pass ``controllers`` down to ``folder``'s children (its ``cgroup.subtree_control``),
    those not passed yet. OSError EBUSY where ``folder`` holds processes (not the root)."""
    control = folder / "cgroup.subtree_control"
    wanted = [c for c in controllers if c not in control.read_text().split()]
    if wanted:
        control.write_text(" ".join(f"+{c}" for c in wanted))


def subtree(folder: Path) -> list[Path]:
    """``folder`` and every cgroup below it, the deepest first (empty where it is gone)."""
    if not folder.is_dir():
        return []
    found = [Path(top) for top, _, _ in os.walk(folder)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def pids(folder: Path) -> list[int]:
    """The processes in ``folder`` and below it now (a cgroup v2 ``cgroup.procs`` lists
    only its own)."""
    found: set[int] = set()
    for cgroup in subtree(folder):
        try:
            found |= {int(p) for p in (cgroup / "cgroup.procs").read_text().split()}
        except FileNotFoundError:
            pass
    return sorted(found)


def kill(folder: Path, timeout_s: float = 5.0) -> list[int]:
    """SIGKILL every process in ``folder`` and below it, again until none is left (a
    process may move between the leaves or fork meanwhile) or ``timeout_s`` passed: the
    processes still there then (empty: all dead, or no such folder)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for cgroup in subtree(folder):
            kill_cgroup(cgroup / "cgroup.procs", max(0.0, min(0.5, deadline - time.monotonic())))
        left = pids(folder)
        if not left or time.monotonic() >= deadline:
            return left


def remove(folder: Path) -> None:
    """Remove ``folder`` and every cgroup below it, the deepest first; nothing where it is
    gone. OSError EBUSY while a process is in one of them."""
    for cgroup in subtree(folder):
        try:
            cgroup.rmdir()
        except FileNotFoundError:
            pass


class ServerTree:
    """The cgroup v2 folder of server owner ``owner`` (``"<account>"``) and its leaves,
    under ``<root>/<parent>`` (see the module docstring). Constructing it touches nothing.
    ``controllers`` are those it passes down and writes limits for (tests on a mount
    without controllers give none)."""

    def __init__(self, owner: str, root: Path, parent: str = DEFAULT_PARENT, controllers=CONTROLLERS):
        self.owner = owner
        self.root = Path(root)
        self.parent = parent
        self.controllers = tuple(controllers)
        self.path = self.root / parent / cgroup_name(owner)

    def __repr__(self) -> str:
        return f"ServerTree({self.owner!r}, {self.path})"

    @property
    def procs_file(self) -> Path:
        """The file the server's processes join through (:func:`~pdl_spawner.host.device_cgroup.join`)."""
        return self.path / MAIN / "cgroup.procs"

    def slot_path(self, slot: str) -> Path:
        """The leaf of ``slot``, while the server holds it."""
        return self.path / slot_dirname(slot)

    def make(self, processes: int = 0, memory_bytes: int = 0, cpu_limit: float | None = None) -> None:
        """Make the folder and its main leaf if missing and set the server's limits: at
        most ``processes`` processes and threads, ``memory_bytes`` bytes of memory (0:
        none of its own; swap is not a way past it), ``cpu_limit`` cores for the main leaf
        (None or 0: no quota). ValueError below 0."""
        if processes < 0 or memory_bytes < 0 or (cpu_limit is not None and cpu_limit < 0):
            raise ValueError(f"limits are 0 (none) or more: processes {processes}, memory {memory_bytes} bytes, "
                             f"cpu_limit {cpu_limit}")
        make_cgroup(self.root / self.parent)
        if self.controllers:
            enable(self.root, self.controllers)
            enable(self.root / self.parent, self.controllers)
        make_cgroup(self.path)
        if "pids" in self.controllers:
            (self.path / "pids.max").write_text(str(processes) if processes else "max")
        if "memory" in self.controllers:
            (self.path / "memory.max").write_text(str(memory_bytes) if memory_bytes else "max")
            swap = self.path / "memory.swap.max"
            if swap.exists():
                swap.write_text("0" if memory_bytes else "max")
        leaf_controllers = [c for c in ("cpu", "cpuset") if c in self.controllers]
        if leaf_controllers:
            enable(self.path, leaf_controllers)
        make_cgroup(self.path / MAIN)
        if "cpu" in self.controllers:
            quota = quota_us(cpu_limit)
            (self.path / MAIN / "cpu.max").write_text(f"{quota or 'max'} {PERIOD_US}")

    def grant(self, slot: str, cores: list[int], uid: int) -> None:
        """Make ``slot``'s leaf, keep it to ``cores``, and let account ``uid`` move its
        processes into it (until :meth:`take_back`); every server is placed again
        (:func:`place_servers`). ValueError without cores."""
        if not cores:
            raise ValueError(f"slot {slot} needs at least one core")
        leaf = self.slot_path(slot)
        make_cgroup(leaf)
        if "cpuset" in self.controllers:
            (leaf / "cpuset.cpus").write_text(",".join(map(str, sorted(cores))))
        os.chown(leaf / "cgroup.procs", uid, -1)
        os.chown(self.path / "cgroup.procs", uid, -1)  # the common ancestor of main and the leaf
        if "cpuset" in self.controllers:
            place_servers(self.root, self.parent)

    def take_back(self, slot: str, timeout_s: float = 5.0) -> list[int]:
        """Nobody but root may move into ``slot``'s leaf from now on, every process in it
        is killed, again until none is left or ``timeout_s`` passed, and the leaf is
        removed, and every server placed again: the processes still there then (empty:
        the slot is free)."""
        leaf = self.slot_path(slot)
        try:
            os.chown(leaf / "cgroup.procs", 0, -1)
        except FileNotFoundError:
            return []
        left = kill(leaf, timeout_s)
        if not left:
            remove(leaf)
            if "cpuset" in self.controllers:
                place_servers(self.root, self.parent)
        return left

    def slot_pids(self, slot: str) -> list[int]:
        """The processes in ``slot``'s leaf now."""
        return pids(self.slot_path(slot))

    def pids(self) -> list[int]:
        """Every process of the server now, in any of its leaves."""
        return pids(self.path)

    def kill_all(self, timeout_s: float = 5.0) -> list[int]:
        """:func:`kill` of the server's folder."""
        return kill(self.path, timeout_s)

    def remove(self) -> None:
        """Remove the folder and its leaves (:func:`remove`)."""
        remove(self.path)

    def processes_now(self) -> int:
        """The server's processes and threads now (0 without the pids controller)."""
        try:
            return int((self.path / "pids.current").read_text())
        except (FileNotFoundError, ValueError):
            return 0


def limit_all_users(root: Path, kept_bytes: int, parent: str = DEFAULT_PARENT) -> int:
    """Let every user's processes together (``<root>/<parent>``) take the machine's memory
    less ``kept_bytes``, for the hub, the proxy and the admin view: that limit, in bytes.
    ValueError unless 0 < ``kept_bytes`` < the machine's memory."""
    most = users_memory_bytes(kept_bytes)
    make_cgroup(root / parent)
    enable(root, ("memory",))
    (root / parent / "memory.max").write_text(str(most))
    return most


def place_servers(root: Path, parent: str = DEFAULT_PARENT) -> None:
    """Keep every server's main leaf under ``<root>/<parent>`` off the cores of the slots
    other accounts hold, as :meth:`pdl_spawner.host.cpu_limits.CpuLimits.place_servers`
    does on cgroup v1 (:func:`pdl_spawner.host.cpu_limits.place`)."""
    folders = [f for f in (root / parent).glob("*/") if (f / MAIN).is_dir()]
    slots = [leaf for f in folders for leaf in f.glob("*/") if leaf.name != MAIN]
    place(cores_of(root / "cpuset.cpus.effective"), slots, [f / MAIN for f in folders])


