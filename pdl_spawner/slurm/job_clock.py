"""When a Slurm job's time limit ends, as the user's server reads it (``squeue``'s
EndTime, which an extension moves): the session's end on Slurm
(:meth:`pdl_spawner.slurm.engine_host.SlurmSteps.scheduler_end`), read at most every
:data:`READ_EVERY_S` seconds in one process.
"""

from __future__ import annotations

import subprocess
import threading
import time

#: Seconds a reading of a job's end time is reused.
READ_EVERY_S = 15.0

#: ``squeue``'s states (``%T``) of a job that runs: its EndTime is its time limit. In any
#: other state the job has ended (scancel, a node's failure, the limit itself) and its
#: EndTime is when that happened, not a limit to count down to.
RUNNING_STATES = ("RUNNING", "CONFIGURING", "SUSPENDED")


def job_end(job: int) -> float | None:
    """The time limit of Slurm job ``job`` while it runs (epoch seconds, from ``squeue``'s
    EndTime in this machine's time zone), or None when it has none: ended (then the
    engines are lost, not timed out), no such job, no limit, or no answer."""
    try:
        done = subprocess.run(["squeue", "-h", "-j", str(job), "-o", "%T %e"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return running_end_time(done.stdout) if done.returncode == 0 else None


def running_end_time(text: str) -> float | None:
    """``squeue -o "%T %e"``'s line (``RUNNING 2026-11-26T23:59:00``) as the job's time
    limit in epoch seconds, also once that limit ended it (``TIMEOUT``); None for a job
    that ended otherwise, or no EndTime."""
    state, _, end = text.strip().partition(" ")
    return end_time(end) if state in (*RUNNING_STATES, "TIMEOUT") else None


def end_time(text: str) -> float | None:
    """``squeue -o %e``'s EndTime (``2026-11-26T23:59:00``, this machine's time zone) in
    epoch seconds; None for none (``Unknown``, ``N/A``, nothing)."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


_cache: dict[int, tuple[float, float | None]] = {}
_cache_lock = threading.Lock()


def forget_readings() -> None:
    """Read the jobs' end times afresh (the hub just moved one)."""
    with _cache_lock:
        _cache.clear()


def cached_job_end(job: int, fresh: bool = False) -> float | None:
    """:func:`job_end`, from a reading of at most :data:`READ_EVERY_S` s ago in this
    process (``fresh``: read now)."""
    with _cache_lock:
        read_at, ends_at = _cache.get(job, (0.0, None))
        if fresh or time.monotonic() - read_at > READ_EVERY_S:
            ends_at = job_end(job)
            _cache[job] = (time.monotonic(), ends_at)
    return ends_at
