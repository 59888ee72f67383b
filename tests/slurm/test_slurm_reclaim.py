"""Idle engines on Slurm: the server stops its steps, the hub cancels the job, so Slurm
has the GPUs back; the next cell asks Slurm for a new job, and says why not while
Slurm cannot start one."""

from __future__ import annotations

import pytest

from fault_cells import SUM, magic
from slurm_hub_harness import slurm_engines, slurm_hub_fixture, spawn_and_sum
from waiting import wait_until

pytestmark = pytest.mark.slurm

IDLE_S = 10  # long enough for the test's steps between two idle periods on a busy machine


@pytest.fixture(scope="module")
def hub(slurm, tmp_path_factory):
    yield from slurm_hub_fixture(tmp_path_factory.mktemp("slurm-reclaim"), slurm, ["admin", "ann", "ben"],
                                 hub_env={"PDL_ENGINE_IDLE_TIMEOUT": str(IDLE_S)})


def test_idle_engines_end_the_job_and_the_next_cell_asks_slurm_again(hub, slurm):
    first, kernel = spawn_and_sum(hub, "ann", 2)
    try:
        kernel.execute_ok("x = 41")  # kernel state, which must survive the release

        # idle: the job ends, in Slurm's own view, and the notebook server stays
        wait_until(lambda: not hub.pdl_jobs("ann"), 90, what=lambda: f"ann's idle job to end: {slurm.jobs()}")
        wait_until(lambda: not slurm_engines(hub.root), 30, what="her engine steps to end")
        assert hub.server_ready("ann")
        hub.wait_for_log(f"Reclaimed Slurm job {first['id']} from ann: engines idle for {IDLE_S} s", 15)

        # Slurm's GPUs go to ben; ann's next cell is refused with Slurm's reason
        hub.spawn("ben", 2)
        hub.wait_ready("ben", timeout=120)
        out = kernel.execute(magic(SUM, 2), timeout=120)
        assert "Slurm cannot start 2 GPU(s) for you now (reason Resources)" in out["stderr"], out
        assert "sum" not in out["stdout"]

        # ben stops: ann's next cell gets a new job and runs, with her kernel's state
        hub.api("DELETE", "/users/ben/server")
        wait_until(lambda: not hub.pdl_jobs("ben"), 60, what="ben's job to end")
        out = kernel.execute_ok(magic(SUM, 2), timeout=180)
        assert "sum 2" in out["stdout"], out
        [second] = hub.pdl_jobs("ann")
        assert second["id"] != first["id"] and second["state"] == "RUNNING"
        assert {env["SLURM_JOB_ID"] for env in slurm_engines(hub.root).values()} == {second["id"]}
        assert kernel.execute_ok("print(x + 1)")["stdout"].strip() == "42"
    finally:
        kernel.close()
        hub.api("DELETE", "/users/ann/server")
        hub.api("DELETE", "/users/ben/server")
    hub.wait_no_pdl_jobs()


#: Seconds each node's Epilog takes in the test below: the reclaimed job stays COMPLETING,
#: holding its two GPUs, that long (well under the spawner's ENDING_WAIT_S).
EPILOG_S = 15


def test_the_next_cell_waits_for_the_reclaimed_job_to_complete_instead_of_being_refused(hub, slurm):
    """Guards PDLSlurmSpawner._wait_earlier_jobs_ended: a cancelled job holds its GPUs
    until it has completed (the site's epilog, its processes' grace). A cell right after
    the reclaim must get a new job once they are back, not Slurm's "Resources" refusal
    for GPUs that are the user's own (the CI failure of 64a31df)."""
    first, kernel = spawn_and_sum(hub, "ann", 2)
    try:
        with slurm.slow_epilog(EPILOG_S):
            hub.wait_for_log(f"Reclaimed Slurm job {first['id']} from ann", 90)
            ending = slurm.job(first["id"])
            assert ending is not None and ending["state"] == "COMPLETING", ending  # the race is on
            out = kernel.execute(magic(SUM, 2), timeout=180)
        assert out["error"] is None and "sum 2" in out["stdout"], out
        assert "cannot start" not in out["stderr"], out
        [second] = hub.pdl_jobs("ann")
        assert second["id"] != first["id"] and second["state"] == "RUNNING"
    finally:
        kernel.close()
        hub.api("DELETE", "/users/ann/server")
    hub.wait_no_pdl_jobs()
