"""Facts about local processes that several parts of PDL need."""

from __future__ import annotations

import psutil


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is a live, non-zombie process on this host."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
