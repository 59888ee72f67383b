"""PDLSlurmSpawner on the simulated Slurm cluster, through a real hub: the reservation is
a Slurm job of the user's own account, the engines its steps on the three nodes, and
Slurm's own view says who holds which GPU."""

from __future__ import annotations

import time

import pytest

import slurm_harness
from hub_harness import Kernel, Progress, queue_up
from slurm_hub_harness import slurm_hub_fixture
from swarm_hub_harness import DDP_CELL, DDP_RESULT
from waiting import wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def hub(slurm, tmp_path_factory):
    yield from slurm_hub_fixture(tmp_path_factory.mktemp("slurm-hub"), slurm, ["admin", "ann", "ben"])


def test_three_gpus_are_one_job_of_the_users_account_and_ddp_trains_across_the_nodes(hub, slurm):
    r = hub.spawn("ann", 3)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ann", timeout=120)

    [job] = hub.pdl_jobs("ann")
    assert job["user"] == hub.account("ann") and job["state"] == "RUNNING", job
    assert job["nodes"] == "3", job

    kernel = Kernel(hub, "ann")
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        out = kernel.execute(DDP_CELL, timeout=300)
        assert out["error"] is None, f"{out}\n{hub.log_tail()}"
        assert "Warning" not in out["stdout"] + out["stderr"], out
    finally:
        kernel.close()
    ranks = {int(m[0]): m[1:] for m in DDP_RESULT.findall(out["stdout"])}
    assert sorted(ranks) == [0, 1, 2], out["stdout"]
    assert sorted(host for host, *_ in ranks.values()) == ["n1", "n2", "n3"]
    assert {gpu for _, gpu, *_ in ranks.values()} == {"0"}
    assert len({weights for *_, weights in ranks.values()}) == 1, "DDP replicas diverged"

    # stop frees every GPU, in Slurm's own view
    r = hub.api("DELETE", "/users/ann/server")
    assert r.status_code in (202, 204), r.text
    wait_until(lambda: not hub.pdl_jobs("ann") and {n["state"] for n in slurm.nodes().values()} == {"idle"}, 60,
               what=lambda: f"ann's job gone and every node idle: {slurm.jobs()} {slurm.nodes()}")


def test_busy_gpus_a_direct_spawn_is_refused_with_slurms_reason_a_queued_one_waits_then_is_served(hub, slurm):
    r = hub.spawn("ann", 3)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ann", timeout=120)

    # refused in one line with Slurm's own reason, quickly, and no job left behind
    started = time.monotonic()
    r = hub.spawn("ben", 1)
    assert r.status_code == 409, r.text
    assert time.monotonic() - started < 20
    message = r.json()["message"]
    assert "Slurm cannot start 1 GPU(s) for you now (reason Resources)" in message and "\n" not in message
    wait_until(lambda: not hub.pdl_jobs("ben"), 30, what=lambda: f"ben's refused job to go: {slurm.jobs()}")

    # with "wait in the queue": Slurm's queue, its reason and position on the spawn page (the
    # request returns once JupyterHub finds the spawn slow; after a failed spawn it says 201)
    r = hub.api("POST", "/users/ben/server", json={"workers": 1, "queue": True})
    assert r.status_code in (201, 202), r.text
    progress = Progress(hub, "ben")
    wait_until(lambda: progress.saw("Waiting in Slurm's queue for 1 GPU(s)") and progress.saw("reason Resources"),
               60, what=lambda: f"ben's progress to show Slurm's reason: {progress.messages}")
    [job] = hub.pdl_jobs("ben")
    assert job["state"] == "PENDING" and job["user"] == hub.account("ben"), job
    assert any(f"job {job['id']}, number 1 in partition gpu" in m for m in progress.messages), progress.messages

    # ann stops: Slurm starts ben's job, and his server comes up
    hub.api("DELETE", "/users/ann/server")
    wait_until(lambda: progress.ended is not None, 120, what="ben's spawn to end")
    assert progress.ended.get("ready"), progress.ended
    assert [j["state"] for j in hub.pdl_jobs("ben")] == ["RUNNING"]
    assert not hub.pdl_jobs("ann")
    hub.api("DELETE", "/users/ben/server")
    wait_until(lambda: not hub.pdl_jobs(), 60, what=lambda: f"every PDL job to go: {slurm.jobs()}")


def test_cancelling_a_queued_spawn_cancels_its_job(hub, slurm):
    slurm.sbatch("--ntasks=3", "--gpus-per-task=1", "--output=/dev/null", "--wrap=sleep 600", user=slurm_harness.ANN)
    queue_up(hub, "ben", 2)
    wait_until(lambda: [j["state"] for j in hub.pdl_jobs("ben")] == ["PENDING"], 30,
               what=lambda: f"ben's job pending: {slurm.jobs()}")
    r = hub.api("DELETE", "/users/ben/server")
    assert r.status_code in (202, 204), r.text
    wait_until(lambda: not hub.pdl_jobs("ben"), 30, what=lambda: f"ben's job cancelled: {slurm.jobs()}")
    wait_until(lambda: not hub.user_model("ben")["servers"], 30, what="ben's spawn to end")
    slurm.reset()
