"""PDLSlurmSpawner on the simulated Slurm cluster, through a real hub: the reservation is
a Slurm job of the user's own account, the engines its steps on the three nodes, and
Slurm's own view says who holds which GPU."""

from __future__ import annotations

import time

import pytest

from hub_harness import Kernel
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
