"""Slurm's engine host (pdl_spawner/slurm/engine_host.py), the user's server's side of the
kind: the kind's plug-in names it, its engines are steps of the job, and the session's
end is the job's time limit as ``squeue`` tells it (pdl_spawner/slurm/job_clock.py)."""

from __future__ import annotations

import time

import pytest

from pdl.contract import ServerContract
from pdl.lease import Grant
from pdl_server.engine_hosts import host_for
from pdl_server.session_clock import SessionEnd, session_end
from pdl_spawner.slurm import job_clock
from pdl_spawner.slurm.engine_host import SlurmSteps, srun_engine_cmd
from pdl_spawner.slurm.job_clock import end_time, running_end_time

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0


def test_the_servers_engine_host_is_the_jobs_steps():
    host = host_for(ServerContract(kind="slurm", slots=("gpu:0", "gpu:1"), workers=2, job=7,
                                   controller_ip="10.0.0.1"), cluster=None)
    assert type(host) is SlurmSteps and (host.workers, host.job) == (2, 7)
    assert srun_engine_cmd(7)[:2] == ["srun", "--jobid=7"]


def test_squeues_end_time_is_read_in_this_machines_time_zone_and_unknown_is_none():
    assert end_time("2026-11-26T23:59:00\n") == time.mktime((2026, 11, 26, 23, 59, 0, 0, 0, -1))
    for none in ("Unknown", "N/A", "", "NONE"):
        assert end_time(none) is None


def test_only_a_running_jobs_end_time_is_its_time_limit():
    """A cancelled job's EndTime is when it was cancelled: read as a time limit, the
    release said "time limit reached" for a job an admin ended (CI of issue 44)."""
    limit = time.mktime((2026, 11, 26, 23, 59, 0, 0, 0, -1))
    for state in ("RUNNING", "CONFIGURING", "SUSPENDED", "TIMEOUT"):
        assert running_end_time(f"{state} 2026-11-26T23:59:00\n") == limit
    for line in ("COMPLETING 2026-11-26T23:59:00", "CANCELLED 2026-11-26T23:59:00", "FAILED 2026-11-26T23:59:00",
                 "RUNNING Unknown", "RUNNING", ""):
        assert running_end_time(line) is None, line


def test_the_sessions_end_is_the_time_limit_of_the_job_holding_the_workers(monkeypatch, tmp_path):
    from pdl.lease import LeaseFiles

    asked = []
    monkeypatch.setattr(job_clock, "job_end", lambda job: asked.append(job) or NOW + job)
    job_clock.forget_readings()
    lease = LeaseFiles(tmp_path)
    contract = ServerContract(kind="slurm", job=41, session_warn_s=300)
    assert session_end(contract, lease) == SessionEnd(ends_at=NOW + 41, why="Slurm job 41's time limit",
                                                      warn_before_s=300)
    lease.keep_held(Grant(workers=1, slots=("gpu:0",), job=42))  # the engines came back in another job
    assert session_end(contract, lease).why == "Slurm job 42's time limit"
    session_end(contract, lease)
    assert asked == [41, 42]  # read once per job within READ_EVERY_S
    assert session_end(contract, lease, fresh=True).ends_at == NOW + 42 and asked == [41, 42, 42]
    job_clock.forget_readings()  # no fake reading is left for a later test
