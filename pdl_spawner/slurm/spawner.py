"""``PDLSlurmSpawner`` (entry point ``pdl-slurm``): GPUs reserved as a real Slurm job.

The user's server runs as the user's own Unix account, with the accounts, homes,
ports and process handling of :class:`~pdl_spawner.host.server.HostServer`, where
:attr:`PDLSlurmSpawner.server_placement` says (:mod:`~pdl_spawner.slurm.placement`):
on the hub's machine, the cluster's login node (``"login"``, the default), or as a
step of its own job on the job's batch host (``"allocation"``: the ``srun`` of that
step is the process the hub watches and signals here; the server, its kernels and its
controller listen on the node's address; the hub's API must listen where the nodes
reach it). What differs from the local spawner is who holds the GPUs: Slurm, and
nobody else.

- **The reservation is one Slurm job** per server, submitted by ``sbatch`` as the
  user's account (:mod:`~pdl_spawner.slurm.cli`), named ``pdl:<user>``, holding one
  GPU per task (:func:`~pdl_spawner.slurm.jobs.sbatch_argv`). PDL keeps no table of
  its own: what is free, who holds what and who waits are read from Slurm each time
  (``squeue``, ``sinfo``), and Slurm's limits (QOS, ``MaxTRESPerUser``, partition limits),
  fair share and accounting apply to the person. With :attr:`PDLSlurmSpawner.slurm_account`,
  PDL adds each user to that Slurm account (an association) and charges the jobs there.
- **Engines are job steps** of that job: the user's server runs one ``srun --jobid``
  per GPU (:mod:`pdl_server.clusters`), on the nodes Slurm chose, with the GPU Slurm
  bound, and its ipyparallel controller listens on :attr:`PDLSlurmSpawner.controller_ip`,
  where the compute nodes reach this machine (CurveZMQ on), or, for a server in its
  job, on its node's address.
- **Busy GPUs.** A spawn whose job Slurm has looked at and not started (a pending
  reason such as ``Resources``), or that has not started within :data:`~pdl_spawner.slurm.workers.SETTLE_S`, is
  cancelled and refused in one line with Slurm's reason. With the form's "wait in the queue",
  the job stays in Slurm's queue instead: the spawn page shows Slurm's pending reason,
  the job's position and Slurm's estimated start; cancelling the spawn cancels the job.
- **Idle engines** (``engine_idle_timeout``): the server stops its steps, the hub
  cancels the job (its GPUs go back to Slurm), and the next cell's request submits a
  new one (once the cancelled one has left Slurm's queue: :data:`~pdl_spawner.slurm.workers.ENDING_WAIT_S`),
  granted once it runs or refused with Slurm's reason. Not for a server in
  its job: the job hosts it, its engines stay, and its GPUs go back when it stops.
- **Stop, restart, crash.** Stopping the server cancels its jobs. The job id is in
  the spawner state, so a restarted hub re-attaches to a running server and its job;
  a job submitted just before a crash, before the state was saved, carries the
  server's name and is cancelled with the server (``scancel --user --name``). A server
  in its job that dies ends its step and its ``srun`` (:mod:`pdl_spawner.slurm.step_guard`):
  the hub's poll finds it gone and cancels the job.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace

from jupyterhub.spawner import LocalProcessSpawner
from tornado import web
from traitlets import Dict, Enum, Integer, List, Unicode, default

from pdl.contract import ServerContract
from pdl_spawner.host.server import HostServer
from pdl_spawner.core.spawner import SpawnerCore
from pdl_spawner.slurm.choices import SlurmChoices
from pdl_spawner.slurm import jobs as slurm_jobs
from pdl_spawner.slurm import placement as slurm_placement
from pdl_spawner.slurm.cli import SlurmCommands, SlurmError
from pdl_spawner.slurm import time_limits
from pdl_spawner.slurm.kind import KIND
from pdl_spawner.slurm.workers import SlurmJobGpus

class PDLSlurmSpawner(SlurmChoices, HostServer, SpawnerCore, LocalProcessSpawner):
    """A user's server on the login node or in its job; their GPUs a Slurm job, their engines its steps."""

    kind_name = KIND.name
    worker_source = SlurmJobGpus

    cpus_per_gpu = Integer(1, config=True, help="CPU cores each engine's task gets (sbatch --cpus-per-task).")

    sbatch_args = List(
        Unicode(), config=True,
        help="More sbatch options for every reservation, the admin's (e.g. ['--qos=lab']); users cannot set them.",
    )

    slurm_account = Unicode(
        "", config=True,
        help="""Slurm account of the reservations (sbatch --account). When set, PDL makes
        each user it spawns for a member of this account (sacctmgr add user, once), so the
        account's QOS and limits apply to them; empty: the users' default accounts, which
        the admin makes (needed where AccountingStorageEnforce is set).""",
    )

    slurm_env = Dict(
        Unicode(), config=True,
        help="""Environment of Slurm's commands, for the hub and the users' servers (the
        server runs srun). Default: SLURM_CONF from the hub's environment, when set.""",
    )

    @default("slurm_env")
    def _default_slurm_env(self):
        return {"SLURM_CONF": os.environ["SLURM_CONF"]} if os.environ.get("SLURM_CONF") else {}

    slurm_bin_dir = Unicode("", config=True, help="Folder of sbatch, scontrol, scancel and srun; empty: on PATH.")

    controller_ip = Unicode(
        config=True,
        help="""This machine's address as the compute nodes reach it: each user's
        ipyparallel controller listens there (CurveZMQ on). Required.""",
    )

    server_placement = Enum(
        list(slurm_placement.PLACEMENTS), default_value=slurm_placement.LOGIN, config=True,
        help="""Where each user's server runs: "login" (this machine; idle engines give the
        job back and the notebook stays) or "allocation" (a step of the user's job on its
        batch host: Slurm counts everything, the notebook ends with the job; the hub's API
        must listen where the nodes reach it: PDL_SLURM_SERVER sees to it). See
        pdl_spawner/slurm/placement.py.""",
    )

    flags_db = Unicode(
        "pdl-slurm-flags.sqlite", config=True,
        help="""SQLite file (relative to the hub's working directory) of the flags on GPUs
        held idle, which the admin view shows; Slurm keeps everything else.""",
    )

    job_id = Integer(0, help="This server's reservation job (spawner state); 0: none.")
    ending_job_id = Integer(0, help="The job of a server whose state was cleared, until it is cancelled; 0: none.")

    #: The node this server runs on inside its job (spawner state); None: on this machine.
    server_node: slurm_placement.ServerNode | None = None

    # -- Slurm ------------------------------------------------------------------------

    @property
    def slurm(self) -> SlurmCommands:
        path = os.environ.get("PATH", "/usr/bin:/bin")
        return SlurmCommands({"PATH": path, "LANG": "C.UTF-8", **self.slurm_env}, self.slurm_bin_dir)

    @property
    def job_name(self) -> str:
        return slurm_jobs.job_name(self.user.name, self.name)

    async def time_caps(self) -> list[time_limits.Cap]:
        """The limits on a job's time here, in Slurm's words: the QOS's MaxWall, the
        partition's MaxTime, and the admin's ``max_time_limit`` (minutes)."""
        caps = []
        with contextlib.suppress(SlurmError):  # no accounting: no QOS to hold to
            qos = await self.slurm.qos_limits(self.account, list(self.sbatch_args), self.slurm_account)
            wall = time_limits.minutes(qos.max_wall or "")
            if wall is not None:
                caps.append(time_limits.Cap(
                    wall, f"Slurm QOS {qos.name} allows jobs of at most {qos.max_wall} (MaxWall)"))
        partition = self.chosen_partition or await self.slurm.default_partition()
        max_time = await self.slurm.partition_max_time(partition)
        most = time_limits.minutes(max_time)
        if most is not None:
            caps.append(time_limits.Cap(most, f"partition {partition} allows jobs of at most {max_time} (MaxTime)"))
        if self.max_time_limit:
            caps.append(time_limits.Cap(self.max_time_limit,
                                        f"the hub allows jobs of at most {self.max_time_limit} min (max_time_limit)"))
        return caps

    # -- the reservation: one job -------------------------------------------------------

    def take_ending_job(self) -> int:
        """The job id :meth:`clear_state` kept (0: none), taken: whoever takes it cancels it."""
        job_id, self.ending_job_id = self.ending_job_id, 0
        return job_id

    async def cancel_job(self) -> None:
        """Cancel :attr:`job_id` (or the job :meth:`clear_state` kept), and forget it."""
        job_id, self.job_id = self.job_id, 0
        job_id = job_id or self.take_ending_job()
        if job_id:
            await self.slurm.cancel(job_id)
            self.log.info("Cancelled Slurm job %d of %s", job_id, self.owner)

    # -- the server ---------------------------------------------------------------------

    @property
    def server_address(self) -> str:
        """Where the hub reaches this server: its node's address when it runs in its job."""
        return self.server_node.addr if self.server_node else super().server_address

    async def launch_server(self):
        """On the login node as the local spawner does; with ``server_placement =
        "allocation"``, as a step of the job on its batch host (the srun runs here, as
        the user: this spawner's process handling watches and signals it)."""
        if self.server_placement != slurm_placement.ALLOCATION:
            return await super().launch_server()
        problem = slurm_placement.hub_api_problem(self.hub_connect_url or self.hub.api_url)
        if problem:
            raise web.HTTPError(500, problem, reason=problem)
        try:
            self.server_node = await slurm_placement.find_server_node(self.slurm, self.job_id)
        except SlurmError as e:
            raise web.HTTPError(500, f"cannot place the server in Slurm job {self.job_id}: {e}") from None
        srun = os.path.join(self.slurm_bin_dir, "srun") if self.slurm_bin_dir else "srun"
        step = slurm_placement.server_step_argv(self.job_id, self.server_node.name, list(self.cmd), srun=srun)
        self.log.info("Starting the server of %s in Slurm job %d on %s (%s)", self.owner, self.job_id,
                      self.server_node.name, self.server_node.addr)
        # LocalProcessSpawner.start runs `cmd` and binds where `ip` says: both are the
        # step's for this one launch, the admin's again afterwards
        configured_cmd, configured_ip = self.cmd, self.ip
        self.cmd, self.ip = step, self.server_node.addr
        try:
            await super().launch_server()
        finally:
            self.cmd, self.ip = configured_cmd, configured_ip
        return self.server_node.addr, self.port

    def get_env(self):
        env = super().get_env()
        if not self.controller_ip:
            message = "PDLSlurmSpawner.controller_ip (PDL_CONTROLLER_IP) is not set: the compute nodes' address of this machine"
            raise web.HTTPError(500, message, reason=message)
        env.update(self.slurm_env)
        if self.slurm_bin_dir:
            env["PATH"] = f"{self.slurm_bin_dir}:{env.get('PATH', '/usr/bin:/bin')}"
        return env

    def server_contract(self) -> ServerContract:
        """The host server's contract plus the job its engines are steps of and where the
        controller listens for them; a server in its job listens on its node, and its
        engines never idle out."""
        contract = replace(super().server_contract(), job=self.job_id, controller_ip=self.controller_ip)
        if self.server_node is None:
            return contract
        return replace(contract, controller_ip=self.server_node.addr, idle_timeout_s=0)

    def get_state(self):
        state = super().get_state()
        if self.job_id:
            state["slurm_job"] = self.job_id
        if self.server_node:
            state["slurm_server_node"] = self.server_node.state()
        return state

    def load_state(self, state):
        super().load_state(state)
        self.job_id = int(state.get("slurm_job", 0) or 0)
        self.server_node = slurm_placement.ServerNode.from_state(state.get("slurm_server_node"))

    def clear_state(self):
        # JupyterHub's stop polls the dead server, which clears the state before
        # release() runs: the id stays for release() or release_blocking to cancel by
        self.ending_job_id = self.job_id or self.ending_job_id
        self.job_id = 0
        super().clear_state()
        self.server_node = None
