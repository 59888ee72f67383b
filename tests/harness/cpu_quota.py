"""CPU quotas for processes the tests start: a cgroup per process with a share of one
core (cgroup v1's ``cpu`` controller, or cgroup v2's ``cpu.max``), to make one engine
slower than another the way a slower machine would. Needs root; :func:`problem` says
why it cannot be used here."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")
#: Microseconds of one quota period: short, so that a throttled process runs in small
#: slices (the kernel's default, 100 ms, makes a short step's time jump by a period).
PERIOD_US = 10_000


def problem() -> str | None:
    """None when quotas can be set here, else why not (one line)."""
    if os.geteuid() != 0:
        return "CPU quotas need root (a cgroup of the tests' own)"
    if (V1 / "cpu.cfs_quota_us").is_file() or "cpu" in _v2_controllers():
        return None
    return "no cgroup cpu controller (v1 /sys/fs/cgroup/cpu or v2 cpu.max) on this machine"


def _v2_controllers() -> set[str]:
    try:
        return set((V2 / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


@contextlib.contextmanager
def quotas(shares: dict[int, float], name: str = "pdl-test-quota", period_us: int = PERIOD_US):
    """Within: each process ``pid`` of ``shares`` (all its threads) limited to that
    fraction of one core (0.5: half a core) in every ``period_us`` microseconds, each in
    a cgroup of its own; afterwards, back in the root cgroup and the cgroups removed."""
    v1 = (V1 / "cpu.cfs_quota_us").is_file()
    root = V1 if v1 else V2
    made = []
    try:
        if not v1:
            (V2 / "cgroup.subtree_control").write_text("+cpu")
        for pid, share in shares.items():
            group = root / f"{name}-{pid}"
            group.mkdir(exist_ok=True)
            made.append(group)
            quota = max(1000, int(share * period_us))
            if v1:
                (group / "cpu.cfs_quota_us").write_text("-1")  # a period below the quota is refused
                (group / "cpu.cfs_period_us").write_text(str(period_us))
                (group / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                (group / "cpu.max").write_text(f"{quota} {period_us}")
            (group / "cgroup.procs").write_text(str(pid))
        yield
    finally:
        for group in made:
            with contextlib.suppress(OSError):
                for pid in (group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        (root / "cgroup.procs").write_text(pid)
                group.rmdir()
