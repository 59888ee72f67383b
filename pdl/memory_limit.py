"""The memory limit this process's account runs under, as the hub sets it (a cgroup v1
``memory`` cgroup per account, :mod:`pdl_spawner.core.account_limits`), and how many of
the account's processes the kernel's OOM killer has ended there: what lets a notebook
say that a rank was ended by its user's memory limit rather than only that it died.
Reads the files the kernel shows every process (``/proc/self/cgroup`` and the cgroup's
own); None where there is no such cgroup."""

from __future__ import annotations

from pathlib import Path

V1_MEMORY = Path("/sys/fs/cgroup/memory")
#: A memory limit at or above this many bytes is none (the kernel's "unlimited").
NO_LIMIT_BYTES = 1 << 62


def memory_cgroup() -> Path | None:
    """This process's cgroup v1 memory folder, where it is in one below the root."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") and path not in ("", "/"):
            return V1_MEMORY / path.lstrip("/")
    return None


def oom_kills() -> int | None:
    """How many processes the OOM killer has ended in this process's memory cgroup."""
    folder = memory_cgroup()
    try:
        for line in (folder / "memory.oom_control").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, TypeError, ValueError):
        return None
    return None


def limit_bytes() -> int | None:
    """The memory limit of this process's cgroup, in bytes (None: no limit)."""
    folder = memory_cgroup()
    try:
        limit = int((folder / "memory.limit_in_bytes").read_text())
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
