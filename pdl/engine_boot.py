"""Entry point for PDL's engine and controller processes.

``python -m pdl.engine_boot engine|controller [ipyparallel args...]``

Before handing over to ipyparallel it
- asks the kernel to SIGKILL this process (and what it forks) when its parent
  dies, so engines and controllers never outlive the kernel or user server that
  started them (even after ``kill -9``);
- pins the process to the cores in ``$PDL_CPUS`` (set by :func:`pdl.slots.engine_env`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


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


def pin_cpus() -> None:
    """Apply ``$PDL_CPUS`` (comma-separated core ids) as this process's affinity."""
    cpus = os.environ.get("PDL_CPUS")
    if cpus and hasattr(os, "sched_setaffinity"):
        wanted = {int(c) for c in cpus.split(",")}
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, (wanted & allowed) or allowed)


def main() -> None:
    role, args = sys.argv[1], sys.argv[2:]
    die_with_parent()
    if role == "engine":
        pin_cpus()
        from ipyparallel.engine.app import main as run
    elif role == "controller":
        from ipyparallel.controller.app import main as run
    else:
        sys.exit(f"pdl.engine_boot: unknown role {role!r}; use 'engine' or 'controller'")
    sys.argv = [f"pdl-{role}", *args]
    run()


if __name__ == "__main__":
    main()
