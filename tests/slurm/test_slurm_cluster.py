"""The simulated 3-node Slurm cluster behaves as a lab's Slurm does, seen by its users.

What PDL's Slurm engine will rely on: three idle nodes with one GPU each; a job step over
the three nodes gets one GPU per task (``CUDA_VISIBLE_DEVICES=0`` on each node) and ranks
0..2; a request for more GPUs than the cluster has is refused at submission, not left
pending; a job that needs GPUs another user holds pends with reason ``Resources`` and
starts when they are freed; one user cannot cancel another's job; and each job has a
/tmp and /dev/shm of its own on each node (``job_container/tmpfs``), shared by its steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_harness import ANN, BEN, gpu_type
from waiting import wait_until

pytestmark = pytest.mark.slurm

NODES = ["n1", "n2", "n3"]
#: What each task prints: its node, its GPU, its rank and who it runs as.
WHO_AM_I = 'echo "$(hostname) CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES rank=$SLURM_PROCID $(id -un)"'


def wait_job(slurm, job_id: int, timeout: float = 30, **expected: str) -> dict:
    """Wait until job ``job_id`` shows ``expected`` in squeue (e.g. state="RUNNING"); return it."""
    def shows():
        job = slurm.job(job_id)
        return job if job and all(job[k] == v for k, v in expected.items()) else None

    return wait_until(shows, timeout, what=lambda: f"job {job_id} with {expected}: {slurm.job(job_id)}")


def test_sinfo_shows_three_idle_nodes_with_one_typed_gpu_each(clean_slurm):
    sinfo = ("sinfo", "-N", "-h", "-p", "gpu", "-o", "%N %t %G")
    expected = [f"{n} idle gpu:{gpu_type(n)}:1" for n in NODES]
    assert clean_slurm.run(*sinfo, user=ANN, check=True).stdout.splitlines() == expected
    # the same from the root namespace (over pdl-sl-host), where PDL's hub runs
    assert clean_slurm.run(*sinfo, user=ANN, netns=None, check=True).stdout.splitlines() == expected
    assert {n: (v["state"], v["gres"]) for n, v in clean_slurm.nodes().items()} == \
        {n: ("idle", f"gpu:{gpu_type(n)}:1") for n in NODES}


def test_a_three_node_step_runs_one_task_per_node_each_with_its_gpu(clean_slurm):
    step = clean_slurm.run("srun", "-N3", "--gres=gpu:1", "-l", "sh", "-c", WHO_AM_I, user=ANN, check=True)
    assert sorted(step.stdout.splitlines()) == [
        f"{rank}: {node} CUDA_VISIBLE_DEVICES=0 rank={rank} {ANN}" for rank, node in enumerate(NODES)]


def test_a_step_can_be_started_from_the_root_namespace(clean_slurm):
    # as a user's server next to the hub would: srun talks to the controller and the
    # nodes over pdl-sl-host (10.78.0.1), and the node connects back for the output
    step = clean_slurm.run("srun", "-w", "n2", "--gres=gpu:1", "sh", "-c", WHO_AM_I, user=BEN, netns=None,
                           check=True)
    assert step.stdout.splitlines() == [f"n2 CUDA_VISIBLE_DEVICES=0 rank=0 {BEN}"]


def test_more_gpus_than_the_cluster_has_are_refused_at_once(clean_slurm):
    # refused: the commands return with Slurm's error, no job is left waiting
    batch = clean_slurm.run("sbatch", "--gpus=4", "--wrap", "true", user=ANN)
    step = clean_slurm.run("srun", "--immediate", "-N4", "--gres=gpu:1", "true", user=ANN)
    assert batch.returncode != 0
    assert "Batch job submission failed: Requested node configuration is not available" in batch.stderr
    assert step.returncode != 0
    assert "Unable to allocate resources: Requested partition configuration not available now" in step.stderr
    assert clean_slurm.jobs() == []
    # What PDL must not do: four nodes asked for without --immediate are accepted and
    # pend for good (Slurm's default EnforcePartLimits=NO), their reason says why.
    never = clean_slurm.sbatch("-N4", "--gres=gpu:1", "--wrap", "true", user=ANN)
    wait_job(clean_slurm, never, state="PENDING", reason="PartitionNodeLimit")


def test_a_job_waits_for_gpus_another_user_holds_and_starts_when_they_are_freed(clean_slurm):
    slurm = clean_slurm
    anns = slurm.sbatch("-N3", "--gres=gpu:1", "--wrap", "sleep 600", user=ANN)
    assert wait_job(slurm, anns, state="RUNNING")["nodelist"] == "n[1-3]"
    bens = slurm.sbatch("--gres=gpu:1", "--wrap", "sleep 600", user=BEN)
    # Slurm says "Priority" until its scheduler has looked at the job, then "Resources"
    wait_job(slurm, bens, state="PENDING", reason="Resources")
    seen_by_ben = slurm.run("squeue", "-h", "-j", str(bens), "-o", "%T %r", user=BEN, check=True).stdout
    assert seen_by_ben.split() == ["PENDING", "Resources"]
    assert slurm.job(anns)["state"] == "RUNNING"

    slurm.run("scancel", str(anns), user=ANN, check=True)
    started = wait_job(slurm, bens, state="RUNNING")
    assert started["user"] == BEN and started["nodes"] == "1"


def test_a_user_cannot_cancel_anothers_job(clean_slurm):
    slurm = clean_slurm
    anns = slurm.sbatch("--gres=gpu:1", "--wrap", "sleep 600", user=ANN)
    wait_job(slurm, anns, state="RUNNING")
    refused = slurm.run("scancel", str(anns), user=BEN)
    assert refused.returncode != 0
    assert refused.stderr.strip() == f"scancel: error: Kill job error on job id {anns}: Access/permission denied"
    assert slurm.job(anns)["state"] == "RUNNING"
    slurm.run("scancel", str(anns), user=ANN, check=True)
    wait_until(lambda: slurm.job(anns) is None, 30, what=lambda: f"job {anns} gone: {slurm.job(anns)}")


#: A step that plants a file of its user's in /tmp and /dev/shm, as a tool's cache or a
#: collective's shared memory would.
PLANT = 'echo x > /tmp/planted-$(id -un) && echo x > /dev/shm/planted-$(id -un)'
#: What a step sees there: the names, then /tmp's owner and mode.
LOOK = 'ls -A /tmp /dev/shm; stat -c "%U %a" /tmp'


def test_each_job_has_its_own_tmp_and_shm_shared_by_its_steps_and_gone_at_its_end(clean_slurm):
    slurm = clean_slurm
    # ann's job on n1: a second step sees what the first planted (her ranks share them)
    anns = slurm.run("salloc", "-N1", "-w", "n1", "sh", "-c", f"srun sh -c '{PLANT}' && srun sh -c '{LOOK}'",
                     user=ANN, check=True)
    assert anns.stdout.split() == ["/dev/shm:", f"planted-{ANN}", "/tmp:", f"planted-{ANN}", ANN, "700"], anns
    # ben's job on the same node, and ann's next one, see nothing of hers: her places went with her job
    for user in (BEN, ANN):
        later = slurm.run("srun", "-N1", "-w", "n1", "sh", "-c", LOOK, user=user, check=True)
        assert later.stdout.split() == ["/dev/shm:", "/tmp:", user, "700"], (user, later)
    assert not Path(f"/tmp/planted-{ANN}").exists() and not Path(f"/dev/shm/planted-{ANN}").exists()
