"""Facts about local processes, and what a process of PDL asks of the kernel for itself,
that several parts of PDL need (the hub's admin view, the user's server, the engines).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

import psutil

_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is a live, non-zombie process on this host."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def reap_exited_children() -> None:
    """Collect every exited child of this process (orphans re-parented here too), without
    waiting, so none lingers as a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def die_with_parent() -> None:
    """Linux only: get SIGKILL when the parent process exits; no-op elsewhere.

    Processes this one forks (the controller's schedulers and heart monitor) get
    the same, so the whole tree goes when its root's parent does.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    # SIGKILL, not SIGTERM: an engine blocked in a collective cannot run a Python handler
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # parent died before prctl took effect
        sys.exit(1)
    os.register_at_fork(after_in_child=die_with_parent)


def no_new_privileges() -> None:
    """Linux only: this process and everything it starts can never gain privileges
    (setuid binaries, file capabilities). Irreversible; no-op elsewhere."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
