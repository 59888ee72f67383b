"""What each user's account may take of the machine: processes and memory, in cgroups of its own.

Without limits, one user's runaway ``fork()`` loop fills the machine's process table, and
one user's allocation fills its memory, so that nobody, the hub included, can start
anything, or the kernel's OOM killer takes the hub. Each Unix account gets a cgroup in
each of the cgroup v1 controllers ``pids`` and ``memory``,
``<mount>/<parent>/<cgroup_name(account)>`` (:class:`AccountLimits`); every process of
every server of the user joins them in the forked child, as root, before it gives root
up (:func:`~pdl_spawner.host.device_cgroup.join`), so that it and all its descendants
count, and cannot leave (the cgroups' files are root's).

- **Processes**: ``pids.max``. Past it, ``fork()`` and ``clone()`` fail with EAGAIN in
  that user's processes only (Python: ``BlockingIOError: [Errno 11] Resource temporarily
  unavailable``); every other user and the hub go on.
- **Memory**: ``memory.limit_in_bytes`` of the account (JupyterHub's ``mem_limit``, in
  bytes), and of the parent, which holds every user: the machine's memory less what is
  kept for the hub, the proxy and the admin view (:func:`limit_all_users`). An allocation
  past either is met by the OOM killer inside the cgroup that is full, which ends one of
  that cgroup's processes; the hub's own processes are outside, and are the last the
  machine-wide OOM killer picks (:func:`protect_hub`; the users' processes are marked to
  be picked first, :func:`mark_user_process`, and cannot lower their score: their
  ``/proc`` is read-only, :func:`hold_oom_score`).

Where it works (:func:`support`): the cgroup v1 controllers, as root. A host with cgroup
v2 only gets the same limits from :mod:`~pdl_spawner.host.cgroup_v2`.
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from pdl_spawner.host.device_cgroup import DEFAULT_PARENT, cgroup_name, make_cgroup, v1_mounts

CONTROLLERS = ("pids", "memory")
#: ``oom_score_adj`` of the hub and the processes it starts for itself (the proxy, the
#: admin view): the machine-wide OOM killer picks them last (-1000 would be never).
HUB_OOM_SCORE_ADJ = -900
#: ``oom_score_adj`` of a user's processes: picked before the hub's, whatever the hub's is.
USER_OOM_SCORE_ADJ = 500


@dataclass(frozen=True)
class Support:
    """The writable mount of each controller of :data:`CONTROLLERS` this machine has, and
    one line per controller it lacks."""

    mounts: dict[str, Path] = field(default_factory=dict)
    missing: tuple[str, ...] = ()


def support() -> Support:
    """Which of :data:`CONTROLLERS` this process can use (cgroup v1, as root)."""
    if os.geteuid() != 0:
        return Support({}, (f"per-user process and memory limits are off: they need root "
                            f"(the hub runs as uid {os.geteuid()})",))
    mounts, missing = v1_mounts(CONTROLLERS, lambda controller: f"the per-user {controller} limit is off")
    return Support(mounts, tuple(missing))


def machine_memory_bytes() -> int:
    """The machine's memory (``MemTotal`` of /proc/meminfo), in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemTotal")


class AccountLimits:
    """The cgroups of Unix account ``account`` in the controllers of ``mounts``
    (:attr:`Support.mounts`). Constructing it touches nothing; every method needs root."""

    def __init__(self, account: str, mounts: dict[str, Path], parent: str = DEFAULT_PARENT):
        self.account = account
        self.parent = parent
        self.paths = {controller: Path(root) / parent / cgroup_name(account) for controller, root in mounts.items()}

    def __repr__(self) -> str:
        return f"AccountLimits({self.account!r}, {sorted(self.paths)})"

    @property
    def procs_files(self) -> list[Path]:
        """The files a process joins through (:func:`~pdl_spawner.host.device_cgroup.join`), one per controller."""
        return [path / "cgroup.procs" for path in self.paths.values()]

    def apply(self, processes: int = 0, memory_bytes: int = 0) -> None:
        """Make the cgroups if missing and set the account's limits: at most ``processes``
        processes and threads, ``memory_bytes`` bytes of memory (0: no limit of the
        account's own). Every server of the account shares them. ValueError below 0."""
        if processes < 0 or memory_bytes < 0:
            raise ValueError(f"limits are 0 (none) or more: processes {processes}, memory {memory_bytes} bytes")
        for controller, path in self.paths.items():
            for folder in (path.parent, path):
                make_cgroup(folder)  # the user's processes read their limit and OOM count there
        if "pids" in self.paths:
            (self.paths["pids"] / "pids.max").write_text(str(processes) if processes else "max")
        if "memory" in self.paths:
            _limit_memory(self.paths["memory"], memory_bytes)

    def processes_now(self) -> int:
        """The account's processes and threads now (0 without the pids cgroup)."""
        try:
            return int((self.paths["pids"] / "pids.current").read_text())
        except (KeyError, FileNotFoundError):
            return 0

    def remove(self) -> bool:
        """Remove the cgroups once none of the account's processes is left in them: True
        when they are gone, False while another server of the account still runs."""
        gone = True
        for path in self.paths.values():
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno != errno.EBUSY:
                    raise
                gone = False
        return gone


def limit_all_users(mounts: dict[str, Path], kept_bytes: int, parent: str = DEFAULT_PARENT) -> int | None:
    """Let every user's account together (the ``memory`` parent) take the machine's memory
    less ``kept_bytes``, for the hub, the proxy and the admin view; that limit in bytes,
    or None without the memory controller. ValueError unless 0 < ``kept_bytes`` < the machine's memory."""
    most = users_memory_bytes(kept_bytes)
    if "memory" not in mounts:
        return None
    folder = Path(mounts["memory"]) / parent
    make_cgroup(folder)
    _limit_memory(folder, most)
    return most


def users_memory_bytes(kept_bytes: int) -> int:
    """The memory every user's processes may take together: the machine's less
    ``kept_bytes``, for the hub, the proxy and the admin view. ValueError unless
    0 < ``kept_bytes`` < the machine's memory."""
    total = machine_memory_bytes()
    if not 0 < kept_bytes < total:
        raise ValueError(f"the memory kept for the hub must be more than 0 and less than the machine's "
                         f"{total} bytes, got {kept_bytes}")
    return total - kept_bytes


def _limit_memory(folder: Path, most_bytes: int) -> None:
    """``folder``'s memory limit (0: none); where swap is counted too (``memsw``), memory
    and swap together get the same limit, so that swapping does not get past it. The
    kernel wants memory+swap >= memory at every step: memsw is opened first, set last."""
    memsw = folder / "memory.memsw.limit_in_bytes"
    if memsw.exists():
        memsw.write_text("-1")
    (folder / "memory.limit_in_bytes").write_text(str(most_bytes) if most_bytes else "-1")
    if memsw.exists() and most_bytes:
        memsw.write_text(str(most_bytes))


def protect_hub() -> bool:
    """The calling process (the hub) and what it starts from now on: the last the
    machine-wide OOM killer picks (:data:`HUB_OOM_SCORE_ADJ`). False where it may not
    (lowering a score needs CAP_SYS_RESOURCE, which some containers drop; :func:`hub_protection`
    says so): the users' processes are still picked first (:func:`mark_user_process`)."""
    try:
        Path("/proc/self/oom_score_adj").write_text(str(HUB_OOM_SCORE_ADJ))
    except PermissionError:
        return False
    return True


def hub_protection() -> str:
    """One line for the hub's log: the calling process's OOM score against its users'."""
    score = int(Path("/proc/self/oom_score_adj").read_text())
    if score <= HUB_OOM_SCORE_ADJ:
        return f"OOM: the hub's score is {score}, its users' processes' {USER_OOM_SCORE_ADJ}: the hub goes last"
    return (f"OOM: the hub's score stays at {score} (lowering it needs CAP_SYS_RESOURCE); its users' processes' "
            f"{USER_OOM_SCORE_ADJ}: they are still picked first")


def mark_user_process() -> None:
    """In a user's forked child, as root, before it gives root up: picked by the OOM
    killer before the hub (:data:`USER_OOM_SCORE_ADJ`); :func:`hold_oom_score` then keeps
    it from going lower. The kernel's own floor (the
    score a CAP_SYS_RESOURCE writer set) does not hold across ``exec``: a user's kernel
    lowered its score to 0, below every neighbour's, before this."""
    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    try:
        os.write(fd, str(USER_OOM_SCORE_ADJ).encode())
    finally:
        os.close(fd)


def mount_namespace() -> int:
    """The calling process's mount namespace (its inode number)."""
    return os.stat("/proc/self/ns/mnt").st_ino


_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 0x1, 0x2, 0x4, 0x8, 0x20, 0x1000


def hold_oom_score(hubs_namespace: int) -> None:
    """In a forked child, as root, inside a mount namespace of its own
    (:meth:`~pdl_spawner.host.private_tmp.PrivateTmp.enter`): ``/proc`` read-only for it
    and all it starts, so that no process of the user can write an OOM score (or any other
    ``/proc`` file: systemd's ``ProtectProc``-like hardening). The mount is locked for the
    user: a user namespace made later gets it read-only too. OSError where the kernel refuses,
    RuntimeError in the hub's own mount namespace (``hubs_namespace``: :func:`mount_namespace`
    read in the hub), whose /proc must stay writable."""
    if mount_namespace() == hubs_namespace:
        raise RuntimeError("hold_oom_score needs a mount namespace of its own: the hub's /proc stays writable")
    libc = ctypes.CDLL(None, use_errno=True)
    flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    if libc.mount(None, b"/proc", None, ctypes.c_ulong(flags), None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount /proc read-only: {os.strerror(code)}")
