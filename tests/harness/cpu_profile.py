"""CPU seconds each test costs, with everything it starts (a pytest plugin, on with
``PDL_CPU_PROFILE=<file prefix>``; Linux, as root, cgroup v1's ``cpuacct``).

Wall seconds tell the critical path; on a 2-core machine whose tests run side by side
the cores are the limit, and CPU seconds tell which tests spend them. Each pytest
process (each xdist worker) moves itself into a ``cpuacct`` cgroup of its own, so its
hubs, servers, engines, browsers and Slurm daemons are counted with it; the simulated
swarm's nodes (``pdl-swarm-node*``) and Docker's containers are counted apart, since
their processes are the daemons' children. One JSON line a test, in
``<prefix>.<worker>.jsonl``: ``{"test", "wall_s", "own_s", "swarm_s", "docker_s",
"machine_s"}`` (``machine_s``: every core's busy seconds meanwhile, whoever spent them).
``scripts/cpu_report.py`` sums them by worker group.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def _usage_s(group: Path) -> float:
    try:
        return int((group / "cpuacct.usage").read_text()) / 1e9
    except OSError:
        return 0.0


def _machine_busy_s() -> float:
    """Busy seconds of every core since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class CpuProfile:
    def __init__(self, prefix: str):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.group = CPUACCT / f"pdl-cpu-profile-{worker}"
        self.group.mkdir(exist_ok=True)
        (self.group / "cgroup.procs").write_text(str(os.getpid()))
        self.out = Path(f"{prefix}.{worker}.jsonl")
        self.out.parent.mkdir(parents=True, exist_ok=True)

    def sample(self) -> dict[str, float]:
        return {"wall_s": time.monotonic(), "own_s": _usage_s(self.group),
                "swarm_s": sum(_usage_s(g) for g in CPUACCT.glob("pdl-swarm-node*")),
                "docker_s": _usage_s(CPUACCT / "docker"), "machine_s": _machine_busy_s()}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        before = self.sample()
        yield
        after = self.sample()
        line = {"test": item.nodeid, **{k: round(after[k] - before[k], 2) for k in before}}
        with self.out.open("a") as f:
            f.write(json.dumps(line) + "\n")


def pytest_configure(config):
    prefix = os.environ.get("PDL_CPU_PROFILE")
    if prefix and CPUACCT.is_dir() and os.geteuid() == 0:
        config.pluginmanager.register(CpuProfile(prefix), "pdl-cpu-profile")
