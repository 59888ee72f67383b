"""The engines of a user's server, one host per cluster kind, chosen once from the
server contract (:func:`host_for`):

- :class:`LocalSlots` (the embedded default): one engine process per reserved slot
  of this machine, pinned to it;
- :class:`SlurmSteps` (Slurm): one engine per worker, each a step of the user's
  Slurm job (``srun --jobid``) on the node and GPU Slurm chose;
- :class:`SwarmServices` (Docker Swarm): the hub runs the engines as services on
  other nodes; the server runs only their controller.

Each host starts its engines, keeps them running (:meth:`EngineHost.tend`), stops them
for an idle release (:meth:`EngineHost.release`) and brings them back as the hub's
grant says (:meth:`EngineHost.take_up`). The supervisor (:mod:`pdl_server.singleuser`)
drives them the same way, whatever the kind.
"""

from __future__ import annotations

import subprocess
import sys
import threading

from pdl.contract import ServerContract
from pdl.engine_contract import EngineContract
from pdl.lease import Grant, Release
from pdl_server import clusters
from pdl_server.session_clock import RUNNING_STATES


def log(line: str) -> None:
    """One line of the server's log (its stderr), as ``pdl-singleuser: <line>``."""
    print(f"pdl-singleuser: {line}", file=sys.stderr, flush=True)


class EngineHost:
    """The engines of one server (see the module docstring). Used from one thread."""

    #: how many workers the engines are
    workers: int = 0

    def start(self) -> None:
        """Start the engines of the spawn (blocking until their processes are started)."""

    def tend(self, stop: threading.Event) -> str | None:
        """Restart any engine that died; the reason, one line, when the engines are lost
        for good and cannot be restarted (a Slurm job that ended), else None."""
        return None

    def release(self, reason: str) -> Release:
        """Stop the engines (or leave that to the hub) and say what is given back."""
        raise NotImplementedError

    def take_up(self, grant: Grant) -> None:
        """Bring the engines back as ``grant`` says (blocking until they are started)."""


class SlotEngines(EngineHost):
    """One engine per slot, each an engine set of the cluster, restarted when it dies."""

    def __init__(self, cluster, slots: list[str]):
        self.cluster, self.slots = cluster, list(slots)

    @property
    def workers(self) -> int:
        return len(self.slots)

    def launch(self, slot: str) -> None:
        """Start the engine of ``slot`` (blocking)."""
        raise NotImplementedError

    def restart(self, slot: str) -> None:
        """Replace the (dead or killed) engine of ``slot`` with a fresh one."""
        clusters.stop_slot_engine(self.cluster, slot)
        self.launch(slot)

    def start(self) -> None:
        for slot in self.slots:
            self.launch(slot)

    def dead_slots(self) -> list[str]:
        """The slots whose engine process is not running."""
        return [slot for slot in self.slots
                if not clusters.engine_set_running(self.cluster.engines.get(clusters.slot_engine_set_id(slot)))]

    def tend(self, stop: threading.Event) -> str | None:
        for slot in self.dead_slots():
            if stop.is_set():  # shutting down: the cluster is being stopped, not crashing
                return None
            lost = self.lost()
            if lost:
                return lost
            log(f"engine for {slot} exited; restarting it")
            try:
                self.restart(slot)
            except Exception as e:  # noqa: BLE001 - keep supervising the other slots
                log(f"could not restart {slot}: {e}")
        return None

    def lost(self) -> str | None:
        """Why no engine can be restarted any more, or None (by default they always can)."""
        return None

    def release(self, reason: str) -> Release:
        for slot in self.slots:
            clusters.stop_slot_engine(self.cluster, slot)
        log(f"{reason}; stopped them and gave back {','.join(self.slots)}")
        return Release(reason=reason, workers=len(self.slots), slots=tuple(self.slots))

    def take_up(self, grant: Grant) -> None:
        self.slots = list(grant.slots)
        for slot in self.slots:
            self.restart(slot)
        log(f"engines back on {','.join(self.slots)}")


class LocalSlots(SlotEngines):
    """Engines on this machine's reserved slots, each pinned to its slot."""

    def launch(self, slot: str) -> None:
        clusters.start_slot_engines(self.cluster, [slot], self.slots)


class SlurmSteps(SlotEngines):
    """Engines as steps of Slurm job ``job``: one per worker, on a GPU Slurm binds (the
    slot names the engine's worker of the reservation, not a GPU index)."""

    def __init__(self, cluster, slots: list[str], job: int):
        super().__init__(cluster, slots)
        self.job = job

    def launch(self, slot: str) -> None:
        clusters.start_engine(self.cluster, slot, environment=EngineContract(slot=slot).env(), command=srun_engine_cmd(self.job))

    def lost(self) -> str | None:
        return None if slurm_job_running(self.job) else f"Slurm job {self.job} ended"

    def take_up(self, grant: Grant) -> None:
        self.job = grant.slurm_job
        super().take_up(grant)


class SwarmServices(EngineHost):
    """Engines the hub runs as Docker Swarm services: the hub starts, stops and brings
    them back; the server only says when they are idle."""

    def __init__(self, workers: int):
        self.workers = workers

    def release(self, reason: str) -> Release:
        log(f"{reason}; the hub stops them and frees their GPUs")
        return Release(reason=reason, workers=self.workers)

    def take_up(self, grant: Grant) -> None:
        log(f"the hub started {grant.workers} engine(s) again")


def host_for(contract: ServerContract, cluster) -> EngineHost:
    """The engine host of the server ``contract`` describes, over ``cluster``."""
    if contract.controller_secret:
        return SwarmServices(contract.workers)
    if contract.slurm_job:
        return SlurmSteps(cluster, list(contract.slots), contract.slurm_job)
    return LocalSlots(cluster, list(contract.slots))


def srun_engine_cmd(slurm_job: int) -> list[str]:
    """The command of an engine that is one step of Slurm job ``slurm_job``: one task on
    one node with one GPU of the job, as Slurm chooses (``--exact``: only its own share,
    so the steps run side by side); the step ends when the engine does, or at srun's
    first SIGINT (ipyparallel's stop), not its second."""
    return ["srun", f"--jobid={slurm_job}", "--ntasks=1", "--nodes=1", "--gpus=1", "--exact", "--quiet",
            "--quit-on-interrupt", "--kill-on-bad-exit=1", "--job-name=pdl-engine", sys.executable, "-m",
            "pdl.runtime.slurm_boot"]


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
