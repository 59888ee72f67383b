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
  reason such as ``Resources``), or that has not started within :data:`SETTLE_S`, is
  cancelled and refused in one line with Slurm's reason. With the form's "wait in the queue",
  the job stays in Slurm's queue instead: the spawn page shows Slurm's pending reason,
  the job's position and Slurm's estimated start; cancelling the spawn cancels the job.
- **Idle engines** (``engine_idle_timeout``): the server stops its steps, the hub
  cancels the job (its GPUs go back to Slurm), and the next cell's request submits a
  new one (once the cancelled one has left Slurm's queue: :data:`ENDING_WAIT_S`),
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

import asyncio
import contextlib
import os
import time
from dataclasses import replace

from jupyterhub.spawner import LocalProcessSpawner
from tornado import web
from traitlets import Dict, Enum, Integer, List, Unicode, default

from pdl.contract import ServerContract
from pdl.lease import ExtendAnswer, Extended, Grant, Refusal
from pdl_spawner.accounts import unix_accounts
from pdl_spawner.hub.db_thread import off_loop
from pdl_spawner.core.gpu_types import GpuTypeChoice
from pdl_spawner.host.server import HostServer
from pdl_spawner.core.reservations import SlotLedger
from pdl_spawner.core.spawner import SpawnerCore
from pdl_spawner.core.usage import SchedulerLimits, WorkerUsage
from pdl_spawner.slurm.choices import SlurmChoices
from pdl_spawner.slurm import jobs as slurm_jobs
from pdl_spawner.slurm import placement as slurm_placement
from pdl_spawner.slurm.cli import SlurmCommands, SlurmError
from pdl_spawner.slurm import time_limits
from pdl_spawner.slurm.jobs import SlurmJob
from pdl_spawner.slurm.kind import KIND

#: Seconds a spawn that does not wait in the queue gives its job to start while Slurm
#: has not looked at it yet (reason ``None``; its scheduler does within a few seconds).
SETTLE_S = 15.0
#: Minutes an extension adds to a job spawned without a time limit of its own.
EXTEND_STEP_MIN = 60
#: Seconds between looks at a job waiting to start.
JOB_POLL_S = 1.0
#: Seconds a new job waits for this server's earlier jobs to leave Slurm's queue: a
#: cancelled job holds its GPUs while it completes (its processes' SIGTERM grace,
#: Slurm's KillWait, 30 s by default, then the site's epilog), and Slurm would refuse
#: the new job for GPUs that are the server's own. Then it is submitted anyway.
ENDING_WAIT_S = 60.0
#: :attr:`PDLSlurmSpawner.worker_capacity` before Slurm has been asked (no bound yet).
UNREAD_CAPACITY = 1 << 20


class PDLSlurmSpawner(GpuTypeChoice, SlurmChoices, HostServer, SpawnerCore, LocalProcessSpawner):
    """A user's server on the login node or in its job; their GPUs a Slurm job, their engines its steps."""

    kind_name = KIND.name

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

    #: A job can end under a running server (its time limit, scancel): the server then
    #: records a release, and the next cell asks for a new job through the lease.
    always_watch_lease = True
    #: The job's time limit is the session's (PDL_SESSION_LIMIT_S does not apply); its user
    #: may ask for more time, within the QOS, the partition and ``max_time_limit``.
    applies_session_limit = False
    session_extendable = True

    #: GPUs of each partition, as last read from Slurm: partition ("": the default) -> count.
    _capacity: dict[str, int] = {}
    #: Whether this hub process has logged that Slurm's QOS cannot be read (once is enough).
    _qos_unreadable_logged = False

    # -- Slurm ------------------------------------------------------------------------

    @property
    def slurm(self) -> SlurmCommands:
        path = os.environ.get("PATH", "/usr/bin:/bin")
        return SlurmCommands({"PATH": path, "LANG": "C.UTF-8", **self.slurm_env}, self.slurm_bin_dir)

    @property
    def job_name(self) -> str:
        return slurm_jobs.job_name(self.user.name, self.name)

    @property
    def worker_kind(self) -> str:
        return "gpu"

    worker_unit = "GPUs"

    @property
    def worker_capacity(self) -> int:
        """The GPUs of the partition's usable nodes, as last read from Slurm
        (:meth:`read_capacity`, :meth:`worker_usage`). Never asks Slurm itself (it is
        read on the event loop): before the first read, ``max_workers`` (else no bound),
        which only a form's first look uses; the spawn checks again once it has read."""
        known = PDLSlurmSpawner._capacity.get(self.chosen_partition)
        if known is None:
            return self.max_workers or UNREAD_CAPACITY
        return max(1, known)

    async def read_capacity(self) -> None:
        """Read the partition's GPUs from Slurm, off the event loop, the first time this
        hub process needs them (503 in one line when Slurm does not answer)."""
        partition = self.chosen_partition
        if partition not in PDLSlurmSpawner._capacity:
            try:
                gpus, types = await asyncio.to_thread(self.slurm.partition_gpus_sync, partition)
            except SlurmError as e:
                raise web.HTTPError(503, str(e), reason=str(e)) from None
            PDLSlurmSpawner._capacity[partition] = gpus
            SlurmChoices.known_gpu_types[partition] = types

    @property
    def holder_name(self) -> str:
        """Slurm names a job's holder by its Unix account."""
        return self.account

    async def scheduler_limits(self) -> SchedulerLimits:
        """The limits of the QOS the user's jobs run under (:mod:`pdl_spawner.slurm.qos`);
        none when Slurm cannot say (no accounting: logged once per hub process)."""
        try:
            qos = await self.slurm.qos_limits(self.account, list(self.sbatch_args), self.slurm_account)
        except SlurmError as e:
            if not PDLSlurmSpawner._qos_unreadable_logged:
                PDLSlurmSpawner._qos_unreadable_logged = True
                self.log.warning("Slurm's QOS limits cannot be shown to users: %s", e)
            return SchedulerLimits()
        return SchedulerLimits(workers=qos.gpu_cap, note=qos.note())

    async def extend_session(self, now: float | None = None) -> ExtendAnswer:
        """More time for the job holding the GPUs: its time limit raised by the spawn's
        (:attr:`chosen_time_limit`, else :data:`EXTEND_STEP_MIN`) minutes, up to the
        lowest of the QOS's MaxWall, the partition's MaxTime and ``max_time_limit``, which
        the hub holds it to (as one of Slurm's administrators, its ``scontrol update``
        would pass them); else a refusal naming the limit in Slurm's words."""
        if not self.job_id:
            return Refusal("Not extended: no Slurm job holds your GPUs now (the next cell asks for one)")
        try:
            current = time_limits.minutes(await self.slurm.job_time_limit(self.job_id))
            if current is None:
                return Refusal(f"Not extended: Slurm job {self.job_id} has no time limit")
            caps = await self._time_caps()
        except (SlurmError, ValueError) as e:
            return Refusal(f"Not extended: {e}")
        target, why = time_limits.extended_limit(current, self.chosen_time_limit or EXTEND_STEP_MIN, caps)
        if target is None:
            return Refusal(f"Not extended: {why}")
        try:
            await self.slurm.set_time_limit(self.job_id, target)
        except SlurmError as e:
            return Refusal(f"Not extended: {e}")
        self.log.info("Extended Slurm job %d of %s to %d min", self.job_id, self.owner, target)
        return Extended(ends_at=0.0)  # the server reads the new end from squeue

    async def _time_caps(self) -> list[time_limits.Cap]:
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

    async def worker_usage(self) -> WorkerUsage:
        nodes, jobs, default_part = await asyncio.gather(self.slurm.nodes(), self.slurm.jobs(),
                                                         self.slurm.default_partition())
        partition = self.chosen_partition
        SlurmChoices.known_gpu_types[partition] = slurm_jobs.partition_gpu_types(
            nodes, partition=partition, default_partition=default_part)
        PDLSlurmSpawner._capacity[partition] = slurm_jobs.gpu_usage(
            nodes, jobs, partition=partition, default_partition=default_part).total
        return slurm_jobs.gpu_usage(nodes, jobs, partition=partition, default_partition=default_part,
                                    exclude_job=self.job_id or None, gpu_type=self.chosen_gpu_type)

    def gpu_types_for(self, options: dict) -> list[str]:
        """The GRES types of the partition ``options`` name, as last read from Slurm."""
        return self.partition_gpu_types(options)

    async def gpu_type_usage(self) -> dict[str, tuple[int, int]]:
        """GPU type ("" : any) -> (free, total) GPUs of this spawn's partition, for the form."""
        nodes, jobs, default_part = await asyncio.gather(self.slurm.nodes(), self.slurm.jobs(),
                                                         self.slurm.default_partition())
        partition = self.chosen_partition
        found = {}
        for kind in ["", *slurm_jobs.partition_gpu_types(nodes, partition=partition, default_partition=default_part)]:
            usage = slurm_jobs.gpu_usage(nodes, jobs, partition=partition, default_partition=default_part,
                                         gpu_type=kind)
            found[kind] = (usage.free, usage.total)
        return found

    # -- the reservation: one job -------------------------------------------------------

    async def waiting(self):
        """The PDL jobs waiting in Slurm's queue, as (user, GPUs), for the spawn form."""
        if not self.queue_timeout:
            return None
        try:
            jobs = await self.slurm.jobs()
        except SlurmError:
            return []
        waiting = [(slurm_jobs.pdl_job_owner(j, self.account_prefix), j.gpus) for j in jobs if j.waiting]
        return [(owner[0], gpus) for owner, gpus in waiting if owner is not None]

    async def claim_workers(self) -> list[str]:
        """The spawn's GPUs, one job submitted as the user's account (made here, once the
        request is checked); Slurm's own queue orders the requests, so it waits there
        (not in PDL's) when the spawn asked to wait."""
        await self.read_capacity()
        n = self.requested_workers()
        partition, time_limit = self.chosen_partition, self.chosen_time_limit  # a bad choice: 400, nothing made
        self.log.info("%s asks Slurm for %d %sGPU(s) in partition %s, time limit %s", self.owner, n,
                      f"{self.chosen_gpu_type} " if self.chosen_gpu_type else "", partition or "(default)",
                      f"{time_limit} min" if time_limit else "(default)")
        await self.ensure_account()
        if self.slurm_account:
            try:
                if await self.slurm.ensure_association(self.account, self.slurm_account):
                    self.log.info("Added %s to Slurm account %s", self.account, self.slurm_account)
            except SlurmError as e:
                message = f"Could not add you to Slurm account {self.slurm_account}: {e}"
                raise web.HTTPError(503, message, reason=message) from None
        self.told_limits = await self.user_limits()
        return await self.take_workers(n, wait=self.wants_queue)

    async def take_workers(self, n: int, *, wait: bool = False) -> list[str]:
        """Submit a job for ``n`` GPUs as the user and wait until it runs: until Slurm
        gives a pending reason, at most :data:`SETTLE_S` (then the job is cancelled and
        the spawn refused with Slurm's reason, HTTP 409), or, with ``wait``, up to
        ``queue_timeout`` in Slurm's queue.
        Returns the engines' slots ``gpu:0..n-1``; the job is :attr:`job_id`."""
        await self.slurm.cancel_named(self.account, self.job_name)  # left by a crash mid-spawn
        await self._wait_earlier_jobs_ended()
        argv = slurm_jobs.sbatch_argv(self.job_name, n, partition=self.chosen_partition,
                                      time_limit_min=self.chosen_time_limit,
                                      cpus_per_gpu=self.cpus_per_gpu, account=self.slurm_account,
                                      extra=tuple(self.sbatch_args), gpu_type=self.chosen_gpu_type)
        try:
            self.job_id = await self.slurm.submit(argv, account=self.account)
        except SlurmError as e:
            message = f"Slurm refused a job for {n} GPU(s) in partition {self.chosen_partition or '(default)'}: {e.said}"
            raise web.HTTPError(409, message, reason=message) from None
        self.log.info("Submitted Slurm job %d for %d GPU(s) of %s", self.job_id, n, self.owner)
        started = False
        try:
            await self._wait_running(n, wait)
            started = True
        finally:
            self.show_waiting(None)
            if not started:
                await asyncio.shield(self._cancel_job())
        return [f"gpu:{i}" for i in range(n)]

    async def _wait_earlier_jobs_ended(self) -> None:
        """Wait, at most :data:`ENDING_WAIT_S`, until no job of this server's name and
        account holds GPUs (one cancelled a moment ago still completes)."""
        deadline = time.monotonic() + ENDING_WAIT_S
        while True:
            ending = [j.id for j in await self.slurm.jobs()
                      if j.user == self.account and j.name == self.job_name and j.holding]
            if not ending:
                return
            if time.monotonic() > deadline:
                self.log.warning("Slurm job(s) %s of %s still hold GPUs %d s after their end; asking anyway",
                                 ",".join(map(str, ending)), self.owner, ENDING_WAIT_S)
                return
            await asyncio.sleep(JOB_POLL_S)

    async def _wait_running(self, n: int, wait: bool) -> None:
        t0 = time.monotonic()
        limit = self.queue_timeout if wait else SETTLE_S
        while True:
            jobs = await self.slurm.jobs()
            job = next((j for j in jobs if j.id == self.job_id), None)
            if job is None or not (job.waiting or job.holding):
                raise web.HTTPError(500, f"Slurm job {self.job_id} ended before it started")
            if job.state == "RUNNING":
                return
            if job.never_starts:
                message = f"Slurm will not start your job for {n} GPU(s): {job.reason} (partition {job.partition})"
                raise web.HTTPError(409, message, reason=message)
            if wait:
                self.show_waiting(slurm_jobs.pending_message(job, jobs))
            waited_s = time.monotonic() - t0
            # not waiting: refused once Slurm has looked at the job and not started it
            if (not wait and job.reason != "None") or waited_s > limit:
                raise self._refusal(n, job, waited=wait)
            await asyncio.sleep(JOB_POLL_S)

    def _refusal(self, n: int, job: SlurmJob, *, waited: bool) -> web.HTTPError:
        gpus = f"{n} {self.chosen_gpu_type} GPU(s)" if self.chosen_gpu_type else f"{n} GPU(s)"
        if waited:
            message = f"Waited {self.queue_timeout} s in Slurm's queue for {gpus} (reason {job.reason}); try again"
        else:
            message = (f"Slurm cannot start {gpus} for you now (reason {job.reason}). Tick 'wait in the "
                       f"queue' to wait in Slurm's queue, or ask for fewer.")
        return web.HTTPError(409, message, reason=message)

    def _take_ending_job(self) -> int:
        """The job id :meth:`clear_state` kept (0: none), taken: whoever takes it cancels it."""
        job_id, self.ending_job_id = self.ending_job_id, 0
        return job_id

    async def _cancel_job(self) -> None:
        job_id, self.job_id = self.job_id, 0
        job_id = job_id or self._take_ending_job()
        if job_id:
            await self.slurm.cancel(job_id)
            self.log.info("Cancelled Slurm job %d of %s", job_id, self.owner)

    async def release(self) -> None:
        """Cancel this server's job, and any other PDL job of its name and account."""
        if self.gpu_idle_flag_s:
            await self.record_gpu_idle(None)
        self.forget_port()
        self.slots = []
        self.server_node = None
        await self._cancel_job()
        if not unix_accounts.account_exists(self.account):  # no account: no job can be its
            return
        try:
            await self.slurm.cancel_named(self.account, self.job_name)
        except SlurmError as e:  # e.g. no such account any more: nothing of it can run
            self.log.warning("could not cancel the Slurm jobs of %s by name: %s", self.owner, e)

    def release_blocking(self) -> list[str]:
        """From clear_state (on the hub's worker thread): cancel the job clear_state kept
        by its id (not :attr:`job_id`, which a new spawn may have set meanwhile), then the
        server's PDL jobs by name. Nothing by name before the account exists (a first
        spawn): no job can be its."""
        try:
            job_id = self._take_ending_job()
            if job_id:
                self.slurm.cancel_sync(job_id)
                self.log.info("Cancelled Slurm job %d of %s", job_id, self.owner)
            if unix_accounts.account_exists(self.account):
                self.slurm.cancel_named_sync(self.account, self.job_name)
        except (SlurmError, web.HTTPError) as e:
            self.log.warning("could not cancel the Slurm jobs of %s: %s", self.owner, e)
        return []

    # -- idle engines -----------------------------------------------------------------

    async def reclaim_idle_workers(self) -> list[str]:
        """Cancel the job: its GPUs go back to Slurm. A job that has already ended (its
        time limit, scancel) is only forgotten, and logged as such. Nothing for a server
        that runs in its job: the job hosts it (its server records no release)."""
        if not self.job_id or self.server_node is not None:
            return []
        found = await self.slurm.job(self.job_id)
        if found is None or not (found.holding or found.waiting):
            self.log.info("Slurm job %d of %s has ended", self.job_id, self.owner)
            self.job_id, self.slots = 0, []
            return []
        job = f"Slurm job {self.job_id}"
        await self._cancel_job()
        self.slots = []
        return [job]

    async def grant_workers_again(self, n: int) -> Grant:
        """A new job for ``n`` GPUs, granted once it runs (its slots and job id);
        HTTP 409 for a server that runs in its job (its engines never leave it)."""
        if self.server_node is not None:
            message = f"your server runs in Slurm job {self.job_id}, whose GPUs are its engines' until it stops"
            raise web.HTTPError(409, message, reason=message)
        self.slots = await self.take_workers(n)
        self.log.info("Granted Slurm job %d (%d GPU(s)) to %s again", self.job_id, n, self.owner)
        return Grant(workers=n, slots=tuple(self.slots), job=self.job_id)

    # -- GPUs held idle ---------------------------------------------------------------

    async def gpu_use(self) -> list[float] | None:
        """Each GPU of the running job's use (percent), read on its nodes by a step the hub
        starts in it as the user (:meth:`~pdl_spawner.slurm.cli.SlurmCommands.gpu_use`);
        None without a running job, or when a GPU has no reading."""
        if not self.job_id:
            return None
        try:
            job = await self.slurm.job(self.job_id)
        except SlurmError:
            return None
        if job is None or job.state != "RUNNING":
            return None
        return await self.slurm.gpu_use(job, self.account, self.nvidia_smi or "nvidia-smi")

    async def record_gpu_idle(self, since: float | None) -> None:
        """The flag, in :attr:`flags_db`, where the admin view reads it."""
        await off_loop(SlotLedger(self.flags_db).flag_gpu_idle, self.owner, since)

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

    def watch_lease(self) -> None:
        """Not for a server in its job: it records no release (its engines stay while the
        job hosts it), and the job's end ends the server too."""
        if self.server_node is None:
            super().watch_lease()

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
