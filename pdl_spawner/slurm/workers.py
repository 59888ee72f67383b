"""Slurm's workers: GPUs of one Slurm job per server, submitted as the user's account.

:class:`SlurmJobGpus` is the Slurm kind's
:class:`~pdl_spawner.core.worker_source.WorkerSource`. PDL keeps no table of its own:
what is free, who holds what and who waits are read from Slurm each time (``squeue``,
``sinfo``); Slurm's own queue orders the requests (:attr:`SlurmJobGpus.own_queue`), a
job's time limit is the session (:meth:`SlurmJobGpus.extend`), and the spawn form adds
the partition and time limit a user may choose (:mod:`pdl_spawner.slurm.choices`).
"""

from __future__ import annotations

import asyncio
import time

from tornado import web

from pdl.lease import ExtendAnswer, Extended, Grant, Refusal
from pdl.limits import duration
from pdl_spawner.accounts import unix_accounts
from pdl_spawner.core.reservations import SlotLedger
from pdl_spawner.core.usage import GpuReading, SchedulerLimits, WorkerUsage
from pdl_spawner.core.worker_source import GpusReadAtOnce
from pdl_spawner.host.workers import HostWorkers
from pdl_spawner.hub.db_thread import off_loop
from pdl_spawner.slurm import form as slurm_form
from pdl_spawner.slurm import jobs as slurm_jobs
from pdl_spawner.slurm import time_limits
from pdl_spawner.slurm.cli import SlurmError
from pdl_spawner.slurm.jobs import SlurmJob

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
#: :attr:`SlurmJobGpus.capacity` before Slurm has been asked (no bound yet).
UNREAD_CAPACITY = 1 << 20

#: GPUs of each partition, as last read from Slurm: partition ("": the default) -> count.
PARTITION_GPUS: dict[str, int] = {}


class SlurmJobGpus(GpusReadAtOnce, HostWorkers):
    """A Slurm server's GPUs (see the module docstring); made with its
    :class:`~pdl_spawner.slurm.spawner.PDLSlurmSpawner`, whose job id and settings it uses."""

    kind = "gpu"
    unit = "GPUs"
    own_queue = True
    #: A job can end under a running server (its time limit, scancel): the server then
    #: records a release, and the next cell asks for a new job through the lease. The
    #: job's time limit is the session's (PDL_SESSION_LIMIT_S does not apply); its user
    #: may ask for more time, within the QOS, the partition and ``max_time_limit``.
    ends_grants = True

    def lease_watched(self) -> bool:
        """Not for a server in its job: it records no release (its engines stay while the
        job hosts it), and the job's end ends the server too."""
        return self.spawner.server_node is None

    #: Whether this hub process has logged that Slurm's QOS cannot be read (once is enough).
    _qos_unreadable_logged = False

    @property
    def holder_name(self) -> str:
        """Slurm names a job's holder by its Unix account."""
        return self.spawner.account

    @property
    def queue_db(self) -> str:
        """The GPU-idle flags' file; PDL's queue is never used here (Slurm's own is the
        queue, :attr:`own_queue`)."""
        return self.spawner.flags_db

    # -- how many ---------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """The GPUs of the partition's usable nodes, as last read from Slurm
        (:meth:`read_capacity`, :meth:`usage`). Never asks Slurm itself (it is read on
        the event loop): before the first read, ``max_workers`` (else no bound), which
        only a form's first look uses; the spawn checks again once it has read."""
        known = PARTITION_GPUS.get(self.spawner.chosen_partition)
        if known is None:
            return self.spawner.max_workers or UNREAD_CAPACITY
        return max(1, known)

    async def read_capacity(self) -> None:
        """Read the partition's GPUs from Slurm, off the event loop, the first time this
        hub process needs them (503 in one line when Slurm does not answer)."""
        spawner = self.spawner
        partition = spawner.chosen_partition
        if partition not in PARTITION_GPUS:
            try:
                gpus, types = await asyncio.to_thread(spawner.slurm.partition_gpus_sync, partition)
            except SlurmError as e:
                raise web.HTTPError(503, str(e), reason=str(e)) from None
            PARTITION_GPUS[partition] = gpus
            spawner.known_gpu_types[partition] = types

    async def scheduler_limits(self) -> SchedulerLimits:
        """The limits of the QOS the user's jobs run under (:mod:`pdl_spawner.slurm.qos`);
        none when Slurm cannot say (no accounting: logged once per hub process)."""
        spawner = self.spawner
        try:
            qos = await spawner.slurm.qos_limits(spawner.account, list(spawner.sbatch_args), spawner.slurm_account)
        except SlurmError as e:
            if not SlurmJobGpus._qos_unreadable_logged:
                SlurmJobGpus._qos_unreadable_logged = True
                self.log.warning("Slurm's QOS limits cannot be shown to users: %s", e)
            return SchedulerLimits()
        return SchedulerLimits(workers=qos.gpu_cap, note=qos.note())

    async def usage(self) -> WorkerUsage:
        spawner = self.spawner
        nodes, jobs, default_part = await asyncio.gather(spawner.slurm.nodes(), spawner.slurm.jobs(),
                                                         spawner.slurm.default_partition())
        partition = spawner.chosen_partition
        spawner.known_gpu_types[partition] = slurm_jobs.partition_gpu_types(
            nodes, partition=partition, default_partition=default_part)
        PARTITION_GPUS[partition] = slurm_jobs.gpu_usage(
            nodes, jobs, partition=partition, default_partition=default_part).total
        return slurm_jobs.gpu_usage(nodes, jobs, partition=partition, default_partition=default_part,
                                    exclude_job=spawner.job_id or None, gpu_type=spawner.chosen_gpu_type)

    def gpu_types_for(self, options: dict) -> list[str]:
        """The GRES types of the partition ``options`` name, as last read from Slurm."""
        return self.spawner.partition_gpu_types(options)

    async def gpu_type_usage(self) -> dict[str, tuple[int, int]]:
        """GPU type ("" : any) -> (free, total) GPUs of this spawn's partition, for the form."""
        slurm = self.spawner.slurm
        nodes, jobs, default_part = await asyncio.gather(slurm.nodes(), slurm.jobs(), slurm.default_partition())
        partition = self.spawner.chosen_partition
        found = {}
        for kind in ["", *slurm_jobs.partition_gpu_types(nodes, partition=partition, default_partition=default_part)]:
            usage = slurm_jobs.gpu_usage(nodes, jobs, partition=partition, default_partition=default_part,
                                         gpu_type=kind)
            found[kind] = (usage.free, usage.total)
        return found

    # -- what a user may choose -----------------------------------------------------------

    def more_options(self) -> dict[str, str]:
        """``partition`` and ``time_limit``, where the admin offers a choice."""
        spawner, more = self.spawner, {}
        if len(spawner.partitions) > 1:
            more["partition"] = slurm_form.valid_partitions(spawner.partitions)
        if spawner.max_time_limit:
            more["time_limit"] = slurm_form.valid_time_limits(spawner.max_time_limit)
        return more

    def form_fields(self) -> str:
        spawner = self.spawner
        return slurm_form.render_fields(partitions=list(spawner.partitions), max_time_min=spawner.max_time_limit,
                                        default_time_min=spawner.time_limit)

    def parse_form(self, formdata: dict) -> dict:
        spawner = self.spawner
        return slurm_form.parse_fields(formdata, partitions=list(spawner.partitions),
                                       max_time_min=spawner.max_time_limit)

    def session_line(self) -> str:
        """The job's time limit where the admin set one and offers no choice (a choice
        is the form's own field); else ""."""
        spawner = self.spawner
        if spawner.time_limit and not spawner.max_time_limit:
            return (f"Your job's time limit is {duration(spawner.time_limit * 60)}: your engines are then released, "
                    f"your notebook keeps its state, and the next cell asks for GPUs again.")
        return ""

    async def extend(self) -> ExtendAnswer:
        """More time for the job holding the GPUs: its time limit raised by the spawn's
        (``chosen_time_limit``, else :data:`EXTEND_STEP_MIN`) minutes, up to the lowest of
        the QOS's MaxWall, the partition's MaxTime and ``max_time_limit``, which the hub
        holds it to (as one of Slurm's administrators, its ``scontrol update`` would pass
        them); else a refusal naming the limit in Slurm's words."""
        spawner = self.spawner
        job_id = spawner.job_id
        if not job_id:
            return Refusal("Not extended: no Slurm job holds your GPUs now (the next cell asks for one)")
        try:
            current = time_limits.minutes(await spawner.slurm.job_time_limit(job_id))
            if current is None:
                return Refusal(f"Not extended: Slurm job {job_id} has no time limit")
            caps = await spawner.time_caps()
        except (SlurmError, ValueError) as e:
            return Refusal(f"Not extended: {e}")
        target, why = time_limits.extended_limit(current, spawner.chosen_time_limit or EXTEND_STEP_MIN, caps)
        if target is None:
            return Refusal(f"Not extended: {why}")
        try:
            await spawner.slurm.set_time_limit(job_id, target)
        except SlurmError as e:
            return Refusal(f"Not extended: {e}")
        self.log.info("Extended Slurm job %d of %s to %d min", job_id, self.owner_key, target)
        return Extended(ends_at=0.0)  # the server reads the new end from squeue

    # -- the reservation: one job -------------------------------------------------------

    async def waiting(self) -> list[tuple[str, int]]:
        """The PDL jobs waiting in Slurm's queue, as (user, GPUs), for the spawn form."""
        try:
            jobs = await self.spawner.slurm.jobs()
        except SlurmError:
            return []
        prefix = self.spawner.account_prefix
        waiting = [(slurm_jobs.pdl_job_owner(j, prefix), j.gpus) for j in jobs if j.waiting]
        return [(owner[0], gpus) for owner, gpus in waiting if owner is not None]

    async def prepare(self, n: int) -> None:
        """The spawn's job is submitted as the user's account: made here, once the request
        is checked; with ``slurm_account``, the user added to it (503 in one line when
        Slurm says no)."""
        spawner = self.spawner
        partition, time_limit = spawner.chosen_partition, spawner.chosen_time_limit  # a bad choice: 400, nothing made
        gpu_type = spawner.chosen_gpu_type
        self.log.info("%s asks Slurm for %d %sGPU(s) in partition %s, time limit %s", self.owner_key, n,
                      f"{gpu_type} " if gpu_type else "", partition or "(default)",
                      f"{time_limit} min" if time_limit else "(default)")
        await spawner.ensure_account()
        if spawner.slurm_account:
            try:
                if await spawner.slurm.ensure_association(spawner.account, spawner.slurm_account):
                    self.log.info("Added %s to Slurm account %s", spawner.account, spawner.slurm_account)
            except SlurmError as e:
                message = f"Could not add you to Slurm account {spawner.slurm_account}: {e}"
                raise web.HTTPError(503, message, reason=message) from None

    async def take(self, n: int, *, wait: bool = False) -> list[str]:
        """Submit a job for ``n`` GPUs as the user and wait until it runs: until Slurm
        gives a pending reason, at most :data:`SETTLE_S` (then the job is cancelled and
        the spawn refused with Slurm's reason, HTTP 409), or, with ``wait``, up to
        ``queue_timeout`` in Slurm's queue.
        Returns the engines' slots ``gpu:0..n-1``; the job is the spawner's ``job_id``."""
        spawner = self.spawner
        await spawner.slurm.cancel_named(spawner.account, spawner.job_name)  # left by a crash mid-spawn
        await self._wait_earlier_jobs_ended()
        argv = slurm_jobs.sbatch_argv(spawner.job_name, n, partition=spawner.chosen_partition,
                                      time_limit_min=spawner.chosen_time_limit,
                                      cpus_per_gpu=spawner.cpus_per_gpu, account=spawner.slurm_account,
                                      extra=tuple(spawner.sbatch_args), gpu_type=spawner.chosen_gpu_type)
        try:
            spawner.job_id = await spawner.slurm.submit(argv, account=spawner.account)
        except SlurmError as e:
            message = (f"Slurm refused a job for {n} GPU(s) in partition "
                       f"{spawner.chosen_partition or '(default)'}: {e.said}")
            raise web.HTTPError(409, message, reason=message) from None
        self.log.info("Submitted Slurm job %d for %d GPU(s) of %s", spawner.job_id, n, self.owner_key)
        started = False
        try:
            await self._wait_running(n, wait)
            started = True
        finally:
            spawner.show_waiting(None)
            if not started:
                await asyncio.shield(spawner.cancel_job())
        return [f"gpu:{i}" for i in range(n)]

    async def _wait_earlier_jobs_ended(self) -> None:
        """Wait, at most :data:`ENDING_WAIT_S`, until no job of this server's name and
        account holds GPUs (one cancelled a moment ago still completes)."""
        spawner = self.spawner
        deadline = time.monotonic() + ENDING_WAIT_S
        while True:
            ending = [j.id for j in await spawner.slurm.jobs()
                      if j.user == spawner.account and j.name == spawner.job_name and j.holding]
            if not ending:
                return
            if time.monotonic() > deadline:
                self.log.warning("Slurm job(s) %s of %s still hold GPUs %d s after their end; asking anyway",
                                 ",".join(map(str, ending)), self.owner_key, ENDING_WAIT_S)
                return
            await asyncio.sleep(JOB_POLL_S)

    async def _wait_running(self, n: int, wait: bool) -> None:
        spawner = self.spawner
        t0 = time.monotonic()
        limit = spawner.queue_timeout if wait else SETTLE_S
        while True:
            jobs = await spawner.slurm.jobs()
            job = next((j for j in jobs if j.id == spawner.job_id), None)
            if job is None or not (job.waiting or job.holding):
                raise web.HTTPError(500, f"Slurm job {spawner.job_id} ended before it started")
            if job.state == "RUNNING":
                return
            if job.never_starts:
                message = f"Slurm will not start your job for {n} GPU(s): {job.reason} (partition {job.partition})"
                raise web.HTTPError(409, message, reason=message)
            if wait:
                spawner.show_waiting(slurm_jobs.pending_message(job, jobs))
            waited_s = time.monotonic() - t0
            # not waiting: refused once Slurm has looked at the job and not started it
            if (not wait and job.reason != "None") or waited_s > limit:
                raise self._refusal(n, job, waited=wait)
            await asyncio.sleep(JOB_POLL_S)

    def _refusal(self, n: int, job: SlurmJob, *, waited: bool) -> web.HTTPError:
        gpu_type = self.spawner.chosen_gpu_type
        gpus = f"{n} {gpu_type} GPU(s)" if gpu_type else f"{n} GPU(s)"
        if waited:
            message = (f"Waited {self.spawner.queue_timeout} s in Slurm's queue for {gpus} (reason {job.reason}); "
                       f"try again")
        else:
            message = (f"Slurm cannot start {gpus} for you now (reason {job.reason}). Tick 'wait in the "
                       f"queue' to wait in Slurm's queue, or ask for fewer.")
        return web.HTTPError(409, message, reason=message)

    async def release(self) -> None:
        """Cancel this server's job, and any other PDL job of its name and account."""
        spawner = self.spawner
        if spawner.gpu_idle_flag_s:
            await self.record_gpu_idle(None)
        spawner.forget_port()
        spawner.slots = []
        spawner.server_node = None
        await spawner.cancel_job()
        if not unix_accounts.account_exists(spawner.account):  # no account: no job can be its
            return
        try:
            await spawner.slurm.cancel_named(spawner.account, spawner.job_name)
        except SlurmError as e:  # e.g. no such account any more: nothing of it can run
            self.log.warning("could not cancel the Slurm jobs of %s by name: %s", self.owner_key, e)

    def release_blocking(self) -> list[str]:
        """From clear_state (on the hub's worker thread): cancel the job clear_state kept
        by its id (not the spawner's ``job_id``, which a new spawn may have set meanwhile),
        then the server's PDL jobs by name. Nothing by name before the account exists (a
        first spawn): no job can be its."""
        spawner = self.spawner
        try:
            job_id = spawner.take_ending_job()
            if job_id:
                spawner.slurm.cancel_sync(job_id)
                self.log.info("Cancelled Slurm job %d of %s", job_id, self.owner_key)
            if unix_accounts.account_exists(spawner.account):
                spawner.slurm.cancel_named_sync(spawner.account, spawner.job_name)
        except (SlurmError, web.HTTPError) as e:
            self.log.warning("could not cancel the Slurm jobs of %s: %s", self.owner_key, e)
        return []

    # -- the engine lease -----------------------------------------------------------------

    async def reclaim_idle(self) -> list[str]:
        """Cancel the job: its GPUs go back to Slurm. A job that has already ended (its
        time limit, scancel) is only forgotten, and logged as such. Nothing for a server
        that runs in its job: the job hosts it (its server records no release)."""
        spawner = self.spawner
        if not spawner.job_id or spawner.server_node is not None:
            return []
        found = await spawner.slurm.job(spawner.job_id)
        if found is None or not (found.holding or found.waiting):
            self.log.info("Slurm job %d of %s has ended", spawner.job_id, self.owner_key)
            spawner.job_id, spawner.slots = 0, []
            return []
        job = f"Slurm job {spawner.job_id}"
        await spawner.cancel_job()
        spawner.slots = []
        return [job]

    async def take_back(self) -> list[str]:
        """GPUs held idle past their release, enforced: the job cancelled as for idle
        engines (a job's time limit, the session here, Slurm enforces itself). Nothing
        for a server that runs in its job: its GPUs go back when it stops."""
        return await self.reclaim_idle()

    async def grant_again(self, n: int) -> Grant:
        """A new job for ``n`` GPUs, granted once it runs (its slots and job id);
        HTTP 409 for a server that runs in its job (its engines never leave it)."""
        spawner = self.spawner
        if spawner.server_node is not None:
            message = f"your server runs in Slurm job {spawner.job_id}, whose GPUs are its engines' until it stops"
            raise web.HTTPError(409, message, reason=message)
        spawner.slots = await self.take(n)
        self.log.info("Granted Slurm job %d (%d GPU(s)) to %s again", spawner.job_id, n, self.owner_key)
        return Grant(workers=n, slots=tuple(spawner.slots), job=spawner.job_id)

    # -- GPUs held idle ---------------------------------------------------------------

    def look_key(self) -> int:
        """A look at the GPUs is of one job."""
        return self.spawner.job_id

    async def look_at_gpus(self) -> list[GpuReading] | None:
        """Each GPU of the running job: its use and memory, read on its nodes by a step the
        hub starts in it as the user (:meth:`~pdl_spawner.slurm.cli.SlurmCommands.gpu_readings`);
        None without a running job, or when a GPU has no reading."""
        spawner = self.spawner
        if not spawner.job_id:
            return None
        try:
            job = await spawner.slurm.job(spawner.job_id)
        except SlurmError:
            return None
        if job is None or job.state != "RUNNING":
            return None
        return await spawner.slurm.gpu_readings(job, spawner.account, spawner.nvidia_smi or "nvidia-smi")

    async def record_gpu_idle(self, since: float | None) -> None:
        """The flag, in the spawner's ``flags_db``, where the admin view reads it."""
        await off_loop(SlotLedger(self.spawner.flags_db).flag_gpu_idle, self.owner_key, since)
