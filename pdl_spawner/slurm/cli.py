"""Slurm's own commands, run by the hub: the one place PDL talks to Slurm.

Reading (``squeue``, ``sinfo``, ``scontrol``) runs as the hub's user; a reservation is submitted as the
user's own Unix account (``sbatch`` as that uid, with its groups), so Slurm's limits,
fair share and accounting apply to the person, not to the hub. Cancelling runs as the
hub's user (root can cancel any job; PDL cancels only jobs it submitted, by id).
Every call runs off the event loop as a subprocess, with a time limit, and fails with
:class:`SlurmError`, one line naming the command and what Slurm said.
"""

from __future__ import annotations

import asyncio
import os
import pwd

from pdl_spawner.slurm import jobs as slurm_jobs
from pdl_spawner.slurm import qos as slurm_qos
from pdl_spawner.core.usage import GpuReading
from pdl_spawner.slurm.jobs import SlurmJob, SlurmNode

#: Seconds one Slurm command may take before the hub gives up on it.
COMMAND_TIMEOUT_S = 30.0
#: Seconds the step that reads a job's GPU use may take.
GPU_USE_TIMEOUT_S = 15.0
#: Seconds slurmctld may take to learn an association that sacctmgr has just added.
ASSOCIATION_WAIT_S = 15.0


class SlurmError(RuntimeError):
    """A Slurm command failed: ``str()`` is one line naming the command, ``said`` what
    Slurm said (without its own ``sbatch: error:`` prefix)."""

    def __init__(self, command: str, said: str):
        self.command, self.said = command, said
        super().__init__(f"{command}: {said}")


def _what_slurm_said(command: str, output: bytes, returncode: int) -> str:
    said = " ".join(output.decode(errors="replace").split())[:300]
    for prefix in (f"{command}: ", "error: "):
        while said.startswith(prefix):
            said = said[len(prefix):]
    return said or f"exit status {returncode}"


class SlurmCommands:
    """Slurm's commands with ``env`` (PATH, SLURM_CONF...), found in ``bin_dir`` ("" : on PATH)."""

    def __init__(self, env: dict[str, str], bin_dir: str = ""):
        self.env = dict(env)
        self.bin_dir = bin_dir

    def _argv(self, argv: list[str]) -> list[str]:
        return [os.path.join(self.bin_dir, argv[0]) if self.bin_dir else argv[0], *argv[1:]]

    async def run(self, argv: list[str], *, account: str | None = None, timeout: float = COMMAND_TIMEOUT_S) -> str:
        """Run ``argv`` (as ``account``'s uid, gid and groups when given) and return its
        stdout; :class:`SlurmError` when it fails or takes longer than ``timeout`` s."""
        kwargs: dict = {}
        env = dict(self.env)
        if account is not None:
            entry = pwd.getpwnam(account)
            kwargs.update(user=entry.pw_uid, group=entry.pw_gid,
                          extra_groups=os.getgrouplist(entry.pw_name, entry.pw_gid), cwd=entry.pw_dir)
            env.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name)
        else:
            kwargs["cwd"] = "/"
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._argv(argv), env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, **kwargs)
        except OSError as e:
            raise SlurmError(argv[0], f"cannot run it ({e.strerror}); is Slurm's client installed on the hub's "
                                      f"machine?") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise SlurmError(argv[0], f"no answer within {timeout:g} s (is slurmctld up?)") from None
        if proc.returncode != 0:
            raise SlurmError(argv[0], _what_slurm_said(argv[0], err or out, proc.returncode))
        return out.decode(errors="replace")

    def run_sync(self, argv: list[str], *, timeout: float = COMMAND_TIMEOUT_S) -> str:
        """:meth:`run` as the hub's user, blocking: for the few places that cannot await
        (a first look at the GPUs there are; JupyterHub's synchronous clear_state)."""
        import subprocess

        try:
            done = subprocess.run(self._argv(argv), env=self.env, cwd="/", stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=timeout)
        except OSError as e:
            raise SlurmError(argv[0], f"cannot run it ({e.strerror}); is Slurm's client installed on the hub's "
                                      f"machine?") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(argv[0], f"no answer within {timeout:g} s (is slurmctld up?)") from None
        if done.returncode != 0:
            raise SlurmError(argv[0], _what_slurm_said(argv[0], done.stderr or done.stdout, done.returncode))
        return done.stdout.decode(errors="replace")

    def partition_gpus_sync(self, partition: str) -> tuple[int, list[str]]:
        """GPUs of the usable nodes of ``partition`` ("" : the default one) and their
        types (:func:`~pdl_spawner.slurm.jobs.partition_gpu_types`), blocking."""
        default = slurm_jobs.default_partition(self.run_sync(["scontrol", "-o", "show", "partition"]))
        nodes = slurm_jobs.parse_nodes(self.run_sync(["sinfo", "--json"]))
        mine = slurm_jobs.in_partition(partition, nodes, default)
        return (sum(n.gpus for n in mine if n.usable),
                slurm_jobs.partition_gpu_types(nodes, partition=partition, default_partition=default))

    async def jobs(self) -> list[SlurmJob]:
        """Every job in Slurm's queue (pending, running, completing), all users."""
        return slurm_jobs.parse_jobs(await self.run(["squeue", "--all", "--json"]))

    async def job(self, job_id: int) -> SlurmJob | None:
        """Job ``job_id``, or None once Slurm has forgotten it."""
        return next((j for j in await self.jobs() if j.id == job_id), None)

    async def nodes(self) -> list[SlurmNode]:
        return slurm_jobs.parse_nodes(await self.run(["sinfo", "--json"]))

    async def default_partition(self) -> str:
        return slurm_jobs.default_partition(await self.run(["scontrol", "-o", "show", "partition"]))

    async def submit(self, argv: list[str], *, account: str) -> int:
        """Submit ``sbatch`` ``argv`` as ``account``; the new job's id."""
        return slurm_jobs.parse_job_id(await self.run(argv, account=account))

    async def job_time_limit(self, job_id: int) -> str:
        """Job ``job_id``'s time limit as Slurm writes it (``squeue -o %l``: ``"1:00:00"``, ``"UNLIMITED"``)."""
        return (await self.run(["squeue", "-h", "-j", str(job_id), "-o", "%l"])).strip()

    async def partition_max_time(self, partition: str) -> str:
        """The longest job ``partition`` allows, as Slurm writes it (``sinfo -o %l``)."""
        lines = (await self.run(["sinfo", "-h", "-p", partition, "-o", "%l"])).split()
        return lines[0] if lines else ""

    async def set_time_limit(self, job_id: int, minutes: int) -> None:
        """Set job ``job_id``'s time limit (``scontrol update``, as one of Slurm's administrators)."""
        await self.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={minutes}"])

    async def qos_limits(self, user: str, sbatch_args: list[str], account: str = "") -> slurm_qos.QosLimits:
        """The limits of the QOS that ``user``'s PDL jobs run under (:func:`pdl_spawner.slurm.qos.qos_of`),
        from ``sacctmgr``; SlurmError (one line) when Slurm does not answer or knows no such QOS."""
        associations = await self.run(["sacctmgr", "--noheader", "--parsable2", "list", "associations",
                                       f"users={user}", f"format={','.join(slurm_qos.ASSOCIATION_FIELDS)}"])
        name = slurm_qos.qos_of(sbatch_args, associations, account)
        output = await self.run(["sacctmgr", "--noheader", "--parsable2", "list", "qos", name,
                                 f"format={','.join(slurm_qos.QOS_FIELDS)}"])
        try:
            return slurm_qos.parse_qos(name, output)
        except ValueError as e:
            raise SlurmError("sacctmgr", str(e)) from None

    async def ensure_association(self, user: str, account: str) -> bool:
        """Make Unix user ``user`` a member of Slurm account ``account`` (``sacctmgr``, as
        the hub: root is one of Slurm's administrators), unless it is already; so the
        account's limits and QOS apply to the user's jobs. True when it was added."""
        listed = await self.run(["sacctmgr", "--noheader", "--parsable2", "list", "associations",
                                 f"users={user}", f"accounts={account}", "format=User"])
        if user in listed.split():
            return False
        await self.run(["sacctmgr", "--immediate", "add", "user", user, f"account={account}"])
        await self._controller_knows(user, account)
        return True

    async def _controller_knows(self, user: str, account: str, timeout: float = ASSOCIATION_WAIT_S) -> None:
        """Wait until slurmctld has the association slurmdbd just made (it is pushed to
        the controller, which an sbatch right after could beat), at most ``timeout`` s."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            known = await self.run(["scontrol", "-o", "show", "assoc_mgr", "flags=assoc", f"users={user}",
                                    f"accounts={account}"])
            if f"UserName={user}(" in known:
                return
            if asyncio.get_running_loop().time() > deadline:
                raise SlurmError("scontrol", f"slurmctld does not know {user} in account {account} "
                                             f"{timeout:g} s after sacctmgr added it")
            await asyncio.sleep(0.2)

    async def gpu_readings(self, job: SlurmJob, account: str,
                           nvidia_smi: str = "nvidia-smi") -> list[GpuReading] | None:
        """The use and memory of each GPU running ``job`` holds, read on its nodes by a
        step of ``account``'s (its owner: Slurm lets no one else, root included, start
        a step in a job); None when it cannot be read (:func:`~pdl_spawner.slurm.jobs.parse_gpu_readings`)."""
        if not job.node_gpus:
            return None
        try:
            out = await self.run(slurm_jobs.gpu_use_argv(job, nvidia_smi), account=account, timeout=GPU_USE_TIMEOUT_S)
        except SlurmError:
            return None
        return slurm_jobs.parse_gpu_readings(out, job)

    async def cancel(self, *job_ids: int) -> None:
        """Cancel these jobs (those already gone are no error)."""
        if job_ids:
            try:
                await self.run(["scancel", *map(str, job_ids)])
            except SlurmError as e:
                if not _already_gone(e):
                    raise

    def cancel_sync(self, *job_ids: int) -> None:
        """:meth:`cancel`, blocking."""
        if job_ids:
            try:
                self.run_sync(["scancel", *map(str, job_ids)])
            except SlurmError as e:
                if not _already_gone(e):
                    raise

    async def cancel_named(self, account: str, name: str) -> None:
        """Cancel every job of ``account`` named ``name`` (none is no error)."""
        await self.run(["scancel", f"--user={account}", f"--name={name}"])

    def cancel_named_sync(self, account: str, name: str) -> None:
        """:meth:`cancel_named`, blocking."""
        self.run_sync(["scancel", f"--user={account}", f"--name={name}"])


def _already_gone(error: SlurmError) -> bool:
    """Whether scancel's ``error`` says only that the job has ended already."""
    return "Invalid job id" in str(error) or "already completing or completed" in str(error)
