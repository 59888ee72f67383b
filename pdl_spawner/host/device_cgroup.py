"""Per-server GPU device isolation with the Linux device cgroup, as Docker and
systemd's ``DeviceAllow=`` do it.

The hub runs as root. Each server owner (``"ann"``, ``"ann/named"``) gets a cgroup of
its own, ``<mount>/<parent>/<owner>`` (:class:`DeviceCgroup`). Every process of the
server joins it in the forked child, before it gives root up (:func:`join`), so the
processes cannot leave it (the cgroup files are root's) and all their descendants are
in it too. The cgroup then does two things:

- its processes can open the GPU device nodes of their reservation and none of the
  pool's other GPU nodes (:meth:`DeviceCgroup.restrict`); other devices are untouched;
- the hub finds and kills every one of them, double-forked daemons included
  (:meth:`DeviceCgroup.kill_all`).

Mechanisms (:func:`support` says which one this machine has):

- ``cgroup1-devices``: the cgroup v1 ``devices`` controller. A new cgroup inherits
  its parent's exception list (PDL's parent allows everything); each GPU node that is
  not allowed gets a ``c MAJ:MIN rwm`` line in ``devices.deny``, each allowed one a
  line in ``devices.allow`` (which removes the deny).
- ``cgroup2-bpf``: on cgroup v2, an eBPF program of type
  ``BPF_PROG_TYPE_CGROUP_DEVICE`` attached to the cgroup (as runc and systemd do):
  it answers "deny" for the denied char devices and "allow" for everything else.
  Attached with ``BPF_F_ALLOW_MULTI``, so programs of ancestor cgroups still apply.

A file descriptor opened before :meth:`~DeviceCgroup.restrict` took the node away
stays usable (the check is made at ``open``): :func:`processes_holding` finds the
processes that hold one, so that the hub frees a GPU only when none is left.
"""

from __future__ import annotations

import os
import re
import select
import signal
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pdl_spawner.host import bpf

#: The cgroup (under the devices mount) that holds one cgroup per server owner.
DEFAULT_PARENT = "pdl"

CGROUP1_DEVICES = "cgroup1-devices"
CGROUP2_BPF = "cgroup2-bpf"

#: Entries of a cgroup v1 directory whose names have no dot: an owner's cgroup must
#: not be called so (see :func:`cgroup_name`).
_V1_PLAIN_FILES = {"tasks", "notify_on_release", "release_agent"}


@dataclass(frozen=True)
class Support:
    """Whether GPU device isolation works on this machine, and how.

    ``mechanism`` is :data:`CGROUP1_DEVICES`, :data:`CGROUP2_BPF` or None (false);
    ``root`` the cgroup mount PDL's cgroups go under; ``reason`` one line for the log.
    """

    mechanism: str | None
    root: Path | None
    reason: str

    def __bool__(self) -> bool:
        return self.mechanism is not None

    def __str__(self) -> str:
        return self.reason


def support(mechanism: str | None = None) -> Support:
    """How this process can isolate GPU devices: the cgroup v1 devices controller when
    it is mounted (hybrid hosts), else cgroup v2 with a device eBPF program. Ask for
    one ``mechanism`` to get only that one. False, with the reason, when neither works
    (not root, no mount, a read-only mount, no BPF)."""
    if os.geteuid() != 0:
        return Support(None, None, f"GPU device isolation is off: it needs root (the hub runs as uid {os.geteuid()})")
    mounts = cgroup_mounts()
    v1 = next((where for kind, where, options in mounts if kind == "cgroup" and "devices" in options), None)
    v2 = cgroup2_mount()
    reasons = []
    if mechanism in (None, CGROUP1_DEVICES):
        if v1 is not None and os.access(v1, os.W_OK):
            return Support(CGROUP1_DEVICES, v1, f"GPU device isolation: cgroup v1 devices controller at {v1}")
        reasons.append("no writable cgroup v1 devices controller" if v1 is None else f"{v1} is read-only")
    if mechanism in (None, CGROUP2_BPF):
        if v2 is None or not os.access(v2, os.W_OK):
            reasons.append("no writable cgroup2 mount" if v2 is None else f"{v2} is read-only")
        else:
            missing = _bpf_device_missing()
            if missing is None:
                return Support(CGROUP2_BPF, v2, f"GPU device isolation: cgroup v2 device eBPF programs at {v2}")
            reasons.append(missing)
    return Support(None, None, "GPU device isolation is off: " + "; ".join(reasons or [f"unknown mechanism {mechanism!r}"]))


def cgroup_mounts() -> list[tuple[str, Path, set[str]]]:
    """(fstype, mount point, options) of every cgroup and cgroup2 mount of this process."""
    found = []
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 4 and fields[2] in ("cgroup", "cgroup2"):
                where = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
                found.append((fields[2], Path(where), set(fields[3].split(","))))
    return found


def cgroup2_mount() -> Path | None:
    """The first cgroup2 mount of this process, or None."""
    return next((where for kind, where, _ in cgroup_mounts() if kind == "cgroup2"), None)


def make_cgroup(folder: Path) -> None:
    """Make the cgroup ``folder`` if missing (its parent must exist), open to every account
    to read and pass through (a user's processes read their limits there, an engine
    reaches its slot's ``cgroup.procs``; the hub's umask would close it), also where
    another part of PDL made it. RuntimeError where ``folder`` exists and is no cgroup."""
    try:
        folder.mkdir()
    except FileExistsError:
        if not (folder / "cgroup.procs").is_file():
            raise RuntimeError(f"{folder} exists and is not a cgroup") from None
    folder.chmod(0o755)


def v1_mounts(controllers, off) -> tuple[dict[str, Path], list[str]]:
    """The writable cgroup v1 mount of each of ``controllers``, and for each it lacks a
    line ``off(controller)`` + why (none mounted, or read-only)."""
    mounts, missing = {}, []
    for controller in controllers:
        where = next((where for kind, where, options in cgroup_mounts()
                      if kind == "cgroup" and controller in options), None)
        if where is None:
            missing.append(f"{off(controller)}: no cgroup v1 {controller} controller is mounted")
        elif not os.access(where, os.W_OK):
            missing.append(f"{off(controller)}: {where} is read-only")
        else:
            mounts[controller] = where
    return mounts, missing


def cgroup_name(owner: str) -> str:
    """The cgroup directory name of server owner ``owner`` (``"ann"``, ``"ann/named"``).

    Distinct owners get distinct names: letters, digits, ``_`` and ``-`` stay, every
    other byte of the UTF-8 becomes ``%XX`` (``"ann/x.y"`` -> ``"ann%2Fx%2Ey"``), so no
    name contains ``/`` or is ``.``, ``..`` or one of the cgroup's own files. ValueError
    (one line) for an owner that is empty, contains ``..``, NUL or another control
    character, or whose name would exceed 255 bytes.
    """
    if not owner or ".." in owner or any(ord(c) < 32 or ord(c) == 127 for c in owner):
        raise ValueError(f"server owner {owner!r} cannot name a cgroup: empty, '..' or a control character")
    name = "".join(c if re.fullmatch(r"[A-Za-z0-9_-]", c) else "".join(f"%{b:02X}" for b in c.encode())
                   for c in owner)
    if name in _V1_PLAIN_FILES:
        name = f"%{ord(name[0]):02X}{name[1:]}"
    if len(name) > 255:
        raise ValueError(f"server owner {owner!r} cannot name a cgroup: longer than 255 bytes once escaped")
    return name


def join(procs_file: str | bytes | os.PathLike) -> None:
    """Move the calling process into the cgroup whose ``cgroup.procs`` is ``procs_file``
    (:attr:`DeviceCgroup.procs_file`). For a ``preexec_fn``, in the forked child, as
    root, before it gives root up: it only opens and writes one file. OSError when it
    cannot (then the child must not go on: a raising preexec_fn stops the exec)."""
    fd = os.open(procs_file, os.O_WRONLY)
    try:
        os.write(fd, b"0")  # 0: the writer itself
    finally:
        os.close(fd)


class DeviceCgroup:
    """The device cgroup of one server owner: ``<mount>/<parent>/<cgroup_name(owner)>``.

    Constructing it touches nothing. ``parent`` is one plain directory name (tests use a
    unique one). ``isolation`` defaults to :func:`support` at first use; every method
    that touches the cgroup raises RuntimeError, with :attr:`Support.reason`, where it
    is false. Needs root.
    """

    def __init__(self, owner: str, parent: str = DEFAULT_PARENT, isolation: Support | None = None):
        if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}", parent) or ".." in parent:
            raise ValueError(f"cgroup parent {parent!r} must be one plain directory name")
        self.owner = owner
        self.name = cgroup_name(owner)
        self.parent = parent
        self._isolation = isolation

    def __repr__(self) -> str:
        return f"DeviceCgroup({self.owner!r}, parent={self.parent!r})"

    @property
    def isolation(self) -> Support:
        """The mechanism this cgroup uses (:func:`support` unless given)."""
        if self._isolation is None:
            self._isolation = support()
        return self._isolation

    @property
    def path(self) -> Path:
        """The cgroup's directory (it may not exist yet)."""
        if not self.isolation:
            raise RuntimeError(self.isolation.reason)
        return self.isolation.root / self.parent / self.name

    @property
    def procs_file(self) -> Path:
        """The file :func:`join` writes to."""
        return self.path / "cgroup.procs"

    def create(self) -> None:
        """Make the cgroup (and the parent) if missing. Idempotent. A new cgroup lets
        its processes open every device: :meth:`restrict` it before anything joins."""
        for directory in (self.path.parent, self.path):
            try:
                directory.mkdir()
            except FileExistsError:
                if not (directory / "cgroup.procs").is_file():
                    raise RuntimeError(f"{directory} exists and is not a cgroup") from None

    def restrict(self, allowed: Iterable[os.PathLike | str], all_gpu_nodes: Iterable[os.PathLike | str]) -> None:
        """From now on, processes in the cgroup (running or new) can open the char
        device nodes in ``allowed`` and none of the other nodes of ``all_gpu_nodes``;
        other devices are not affected. Replaces what an earlier call allowed:
        ``restrict([], all_gpu_nodes)`` denies every GPU. Nodes are matched by
        ``major:minor`` (``os.stat(node).st_rdev``), so links and copies count too.
        Creates the cgroup if missing. ValueError for a node that is not a char
        device; OSError when the kernel refuses."""
        allow = _char_devices(allowed)
        deny = _char_devices(all_gpu_nodes) - allow
        self.create()
        if self.isolation.mechanism == CGROUP1_DEVICES:
            # deny first, then allow: in between, the rule is only stricter than both
            for file, devices in (("devices.deny", deny), ("devices.allow", allow)):
                for major, minor in sorted(devices):
                    _write(self.path / file, f"c {major}:{minor} rwm")
        else:
            _bpf_attach_device_filter(self.path, sorted(deny))

    def pids(self) -> list[int]:
        """The processes in the cgroup now (none when it does not exist)."""
        try:
            return [int(line) for line in self.procs_file.read_text().split()]
        except FileNotFoundError:
            return []

    def kill_all(self, timeout_s: float = 5.0) -> list[int]:
        """:func:`kill_cgroup` of this cgroup."""
        return kill_cgroup(self.procs_file, timeout_s)

    def remove(self) -> None:
        """Remove the cgroup (not its parent); nothing if it is gone. OSError EBUSY
        while processes are in it (:meth:`kill_all` first)."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            pass


def kill_cgroup(procs_file: os.PathLike | str, timeout_s: float = 5.0) -> list[int]:
    """SIGKILL every process of the cgroup whose ``cgroup.procs`` is ``procs_file``,
    again until it is empty (so processes forked meanwhile die too), waiting at most
    ``timeout_s`` seconds. Returns the processes still in it then (empty: all dead, or
    no such cgroup). Never signals a process outside the cgroup (pidfds pin each
    process between the check and the kill)."""
    def listed() -> list[int]:
        try:
            return [int(line) for line in Path(procs_file).read_text().split()]
        except FileNotFoundError:
            return []

    deadline = time.monotonic() + timeout_s
    while True:
        pids = listed()
        if not pids:
            return []
        pidfds = _pidfds(pids)
        try:
            still_in = set(listed())
            for pid, fd in pidfds.items():
                if pid in still_in:
                    _kill(fd)
            _wait_exit(list(pidfds.values()), deadline)
        finally:
            for fd in pidfds.values():
                os.close(fd)
        if time.monotonic() >= deadline:
            return listed()


def _char_devices(nodes: Iterable[os.PathLike | str]) -> set[tuple[int, int]]:
    devices = set()
    for node in nodes:
        st = os.stat(node)
        if not stat.S_ISCHR(st.st_mode):
            raise ValueError(f"{node} is not a character device node")
        devices.add((os.major(st.st_rdev), os.minor(st.st_rdev)))
    return devices


def _write(path: Path, line: str) -> None:
    """One write() per line: the kernel reads one rule per write."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# -- open devices ------------------------------------------------------------


def processes_of_uid(uid: int) -> list[int]:
    """Processes whose effective uid is ``uid`` now (as ``/proc`` shows them)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except FileNotFoundError:  # ended meanwhile
                pass
    return pids


def processes_holding(nodes: Iterable[os.PathLike | str], pids: Iterable[int]) -> dict[int, list[str]]:
    """Of ``pids``, those with a file descriptor open on one of the char device ``nodes``
    (matched by ``major:minor``, as :meth:`DeviceCgroup.restrict` matches them, so a
    link or a copy of a node counts): pid -> the nodes it holds. Processes that end
    meanwhile are left out. Needs root to look into other accounts' processes."""
    devices = {}
    for node in nodes:
        st = os.stat(node)
        if stat.S_ISCHR(st.st_mode):
            devices[(os.major(st.st_rdev), os.minor(st.st_rdev))] = str(node)
    holding: dict[int, list[str]] = {}
    for pid in set(pids):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except (FileNotFoundError, ProcessLookupError):
            continue
        for fd in fds:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")  # follows the link to what is open
            except OSError:
                continue
            held = devices.get((os.major(st.st_rdev), os.minor(st.st_rdev))) if stat.S_ISCHR(st.st_mode) else None
            if held and held not in holding.setdefault(pid, []):
                holding[pid].append(held)
        if not holding.get(pid):
            holding.pop(pid, None)
    return holding


# -- killing -----------------------------------------------------------------


def _pidfds(pids: list[int]) -> dict[int, int]:
    """A pidfd for each of ``pids`` still alive: it pins the process, so its number
    cannot be reused by another while we check and signal."""
    fds = {}
    for pid in pids:
        try:
            fds[pid] = os.pidfd_open(pid)
        except ProcessLookupError:
            pass
    return fds


def _kill(pidfd: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_exit(pidfds: list[int], deadline: float) -> None:
    """Until every pidfd reports its process exited, or the deadline."""
    poller = select.poll()
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    waiting = len(pidfds)
    while waiting:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            return
        for fd, _ in poller.poll(left_ms):
            poller.unregister(fd)
            waiting -= 1


# -- cgroup v2: a BPF_PROG_TYPE_CGROUP_DEVICE program ------------------------------

_BPF_DEVCG_DEV_CHAR = 2


def _device_filter(deny: list[tuple[int, int]]) -> bytes:
    """The program: 0 (deny) for a char device in ``deny``, 1 (allow) for anything else.

    Its context is ``struct bpf_cgroup_dev_ctx {u32 access_type; u32 major; u32 minor;}``
    with the device type (block 1, char 2) in the low 16 bits of ``access_type``.
    """
    ldx_w, and_k, jne_k, mov_k, exit_ = 0x61, 0x54, 0x55, 0xB7, 0x95
    insn = bpf.insn
    program = [
        insn(ldx_w, dst=2, src=1, off=0),  # r2 = ctx->access_type
        insn(and_k, dst=2, imm=0xFFFF),  # r2 = device type
        insn(ldx_w, dst=3, src=1, off=4),  # r3 = ctx->major
        insn(ldx_w, dst=4, src=1, off=8),  # r4 = ctx->minor
    ]
    for major, minor in deny:  # 5 instructions each: skip the other 4 on a mismatch
        program += [
            insn(jne_k, dst=2, off=4, imm=_BPF_DEVCG_DEV_CHAR),
            insn(jne_k, dst=3, off=3, imm=major),
            insn(jne_k, dst=4, off=2, imm=minor),
            insn(mov_k, dst=0, imm=0),
            insn(exit_),
        ]
    program += [insn(mov_k, dst=0, imm=1), insn(exit_)]
    return b"".join(program)


def _bpf_load(deny: list[tuple[int, int]]) -> int:
    """Load the device filter; its program fd."""
    return bpf.load(bpf.PROG_TYPE_CGROUP_DEVICE, _device_filter(deny), b"pdl_devices", "device filter")


def _bpf_attach_device_filter(cgroup: Path, deny: list[tuple[int, int]]) -> None:
    """Attach a filter denying ``deny`` to ``cgroup`` in place of the one before."""
    program = _bpf_load(deny)
    try:
        bpf.attach_replacing(cgroup, bpf.ATTACH_CGROUP_DEVICE, program)
    finally:
        os.close(program)


@lru_cache(maxsize=1)
def _bpf_device_missing() -> str | None:
    """None when this kernel loads a device filter; else why not (one line)."""
    try:
        os.close(_bpf_load([]))
    except OSError as e:
        return f"cannot load a cgroup device eBPF program ({e.strerror or e})"
    return None
