"""The memory limit this process's account runs under, as the hub sets it, and how many
of the account's processes the kernel's OOM killer has ended there: what lets a notebook
say that a rank was ended by its user's memory limit rather than only that it died.

Where the hub sets it: a cgroup v1 ``memory`` cgroup per account
(:mod:`pdl_spawner.host.account_limits`), or on cgroup v2 the server's folder, the one
above the leaf the process is in (:mod:`pdl_spawner.host.cgroup_v2`). Reads the files the
kernel shows every process (``/proc/self/cgroup`` and the cgroup's own); None where
there is no such cgroup."""

from __future__ import annotations

from pathlib import Path

V1_MEMORY = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup")
#: A memory limit at or above this many bytes is none (the kernel's "unlimited").
NO_LIMIT_BYTES = 1 << 62
#: Each kind's files: the limit, the file that counts OOM kills, and that count's name.
_FILES = {"v1": ("memory.limit_in_bytes", "memory.oom_control", "oom_kill"),
          "v2": ("memory.max", "memory.events", "oom_kill")}


def memory_cgroup() -> tuple[str, Path] | None:
    """:func:`memory_folder` of this process."""
    try:
        return memory_folder(Path("/proc/self/cgroup").read_text())
    except OSError:
        return None


def memory_folder(proc_cgroup: str) -> tuple[str, Path] | None:
    """("v1" or "v2", the folder of the memory limit) of a process whose
    ``/proc/<pid>/cgroup`` reads ``proc_cgroup``, where it is in a cgroup below the root:
    v1's memory cgroup, or on a cgroup v2 only host the folder above its own (a server's
    leaf is in the server's folder)."""
    unified = None
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") and path not in ("", "/"):
            return "v1", V1_MEMORY / path.lstrip("/")
        if controllers == "":
            unified = path
    if unified is None or len(Path(unified).parts) < 3:  # not in a leaf below a folder
        return None
    return "v2", V2_ROOT / Path(unified).parent.relative_to("/")


def oom_kills() -> int | None:
    """How many processes the OOM killer has ended in this process's memory cgroup."""
    found = memory_cgroup()
    try:
        kind, folder = found
        _, counts, name = _FILES[kind]
        for line in (folder / counts).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, TypeError, ValueError):
        return None
    return None


def limit_bytes() -> int | None:
    """The memory limit of this process's cgroup, in bytes (None: no limit)."""
    found = memory_cgroup()
    try:
        kind, folder = found
        limit = int((folder / _FILES[kind][0]).read_text())  # v2's "max": ValueError, no limit
    except (OSError, TypeError, ValueError):
        return None
    return limit if limit < NO_LIMIT_BYTES else None


def limit_text() -> str:
    """"your memory limit of 1 GiB (all your processes together, as the admin set it)",
    without the size where none can be read."""
    limit = limit_bytes()
    size = f" of {limit / 2**30:.3g} GiB" if limit else ""
    return f"your memory limit{size} (all your processes together, as the admin set it)"


def ended_by_limit_line(kills_before: int | None) -> str | None:
    """The one line for a rank whose engine died, where the OOM killer has ended a process
    of this account since ``kills_before`` (:func:`oom_kills` when the cell started);
    None otherwise."""
    now = oom_kills()
    if kills_before is None or now is None or now <= kills_before:
        return None
    return f"its engine was ended by {limit_text()}: use less memory a rank, or fewer ranks at once"
