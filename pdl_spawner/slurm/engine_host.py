"""Slurm's engines, as the user's server runs them: one engine per worker, each a step of
the user's Slurm job (``srun --jobid``) on the node and GPU Slurm chose
(:class:`SlurmSteps`, named by :mod:`pdl_spawner.slurm.kind`); the session's end is the
job's time limit (:mod:`pdl_spawner.slurm.job_clock`)."""

from __future__ import annotations

import subprocess
import sys

from pdl.contract import ServerContract
from pdl.engine_contract import EngineContract
from pdl.lease import Grant
from pdl_server import clusters
from pdl_server.engine_hosts import SlotEngines
from pdl_spawner.slurm import job_clock
from pdl_spawner.slurm.job_clock import RUNNING_STATES


class SlurmSteps(SlotEngines):
    """Engines as steps of Slurm job ``job``: one per worker, on a GPU Slurm binds (the
    slot names the engine's worker of the reservation, not a GPU index)."""

    def __init__(self, cluster, slots: list[str], job: int):
        super().__init__(cluster, slots)
        self.job = job

    @classmethod
    def for_contract(cls, contract: ServerContract, cluster) -> SlurmSteps:
        return cls(cluster, list(contract.slots), contract.job)

    @classmethod
    def scheduler_end(cls, contract: ServerContract, held: Grant | None, fresh: bool = False
                      ) -> tuple[float, str] | None:
        """The time limit of the job holding the workers (the grant's, else the spawn's)."""
        job = held.job if held is not None and held.job else contract.job
        ends_at = job_clock.cached_job_end(job, fresh) if job else None
        return None if ends_at is None else (ends_at, f"Slurm job {job}'s time limit")

    @classmethod
    def forget_readings(cls) -> None:
        job_clock.forget_readings()

    def launch(self, slot: str) -> None:
        clusters.start_engine(self.cluster, slot, environment=EngineContract(slot=slot).env(),
                              command=srun_engine_cmd(self.job))

    def lost(self) -> str | None:
        return None if slurm_job_running(self.job) else f"Slurm job {self.job} ended"

    def take_up(self, grant: Grant) -> None:
        self.job = grant.job
        super().take_up(grant)


def srun_engine_cmd(slurm_job: int) -> list[str]:
    """The command of an engine that is one step of Slurm job ``slurm_job``: one task on
    one node with one GPU of the job, as Slurm chooses (``--exact``: only its own share,
    so the steps run side by side); the step ends when the engine does, or at srun's
    first SIGINT (ipyparallel's stop), not its second."""
    return ["srun", f"--jobid={slurm_job}", "--ntasks=1", "--nodes=1", "--gpus=1", "--exact", "--quiet",
            "--quit-on-interrupt", "--kill-on-bad-exit=1", "--job-name=pdl-engine", sys.executable, "-m",
            "pdl_spawner.slurm.engine_boot"]


def slurm_job_running(slurm_job: int) -> bool:
    """False once Slurm says job ``slurm_job`` has ended (its time limit, scancel) or is
    not running; True while it runs, and when Slurm cannot be asked (never end on doubt)."""
    try:
        done = subprocess.run(["squeue", "-h", "-j", str(slurm_job), "-o", "%T"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return True
    if done.returncode != 0:
        return "Invalid job id" not in done.stderr
    return done.stdout.strip() in RUNNING_STATES
