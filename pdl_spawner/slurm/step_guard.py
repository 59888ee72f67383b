"""``python -m pdl_spawner.slurm.step_guard CMD...``: run a user's server as the task of a Slurm
step, and end the step with it.

With ``PDLSlurmSpawner.server_placement = "allocation"`` the server is a step of the
user's job (:func:`pdl_spawner.slurm.placement.server_step_argv`), and the ``srun`` on
the login node that the hub watches lasts as long as the step. A step lasts as long as
something holds its output open. Slurm stops what is left of a step once its task
exits, but where it tracks a step by its process tree (``ProctrackType=
proctrack/linuxproc`` or ``pgid``) it misses the processes that were orphaned: killed
with SIGKILL (the OOM killer), the server would leave its Jupyter server and its
engines' sruns behind, the step and its srun would go on, the hub would never learn
that the server died, and the job would hold its GPUs until its time limit.

This process is the step's task instead. It becomes the child subreaper of everything
CMD starts (orphans come to it, not to PID 1), passes SIGINT, SIGTERM and SIGHUP on to
CMD, and once CMD has exited, stops whatever of it is left: SIGTERM, then SIGKILL after
:data:`GRACE_S`, until no descendant is left. It exits with CMD's status.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import time

import psutil

from pdl.process import reap_exited_children

_PR_SET_CHILD_SUBREAPER = 36
#: Seconds what CMD left has to exit after SIGTERM, before SIGKILL.
GRACE_S = 5.0
#: Signals passed on to CMD.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def become_subreaper() -> None:
    """Orphaned descendants of this process are re-parented to it (Linux), not to PID 1."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def descendants() -> list[psutil.Process]:
    """Every live process below this one (zombies, which only wait to be reaped, aside)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def stop_leftovers(grace_s: float = GRACE_S) -> None:
    """SIGTERM every descendant, SIGKILL those still there after ``grace_s``, until none is left."""
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    while True:
        reap_exited_children()
        left = descendants()
        if not left:
            return
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        for process in left:
            try:
                process.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m pdl_spawner.slurm.step_guard CMD...", file=sys.stderr)
        return 2
    become_subreaper()
    child = subprocess.Popen(argv)
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, frame: child.send_signal(signum))
    status = child.wait()
    for sig in FORWARDED:  # CMD is gone: nothing to pass on, and what it left is stopped below
        signal.signal(sig, signal.SIG_IGN)
    stop_leftovers()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main())
