"""What every PDL spawner shares: the worker count and its limits, the spawn form,
reserving workers (at once or in the fair queue), and the hub's side of the engine lease.

:class:`SpawnerCore` is a mixin placed after the spawner's own mixins and before
JupyterHub's spawner base class (``class PDLLocalSpawner(HostServer, SpawnerCore,
LocalProcessSpawner)``).
A spawner adds only its own I/O and specs, by providing:

- :attr:`SpawnerCore.worker_kind` (``"gpu"`` or ``"cpu"``, for the form) and
  :attr:`SpawnerCore.worker_capacity` (the most workers a request could ever get,
  known without I/O);
- ``owner_key``, ``queue_db`` and ``ready_to_start()`` (:mod:`~pdl_spawner.core.queueing`);
- ``worker_usage()``: the workers and who else holds them (:mod:`~pdl_spawner.core.queueing`);
- :meth:`SpawnerCore.take_workers`: take ``n`` free workers, or raise
  :class:`~pdl_spawner.core.usage.NotEnoughWorkers`; what it returns is the spawner's (the
  ledger's slots, or nothing where Swarm assigns the GPUs later);
- :meth:`SpawnerCore.reclaim_idle_workers` and :meth:`SpawnerCore.grant_workers_again`:
  the two halves of the engine lease (:mod:`~pdl_spawner.core.idle_engines`), with
  ``lease_url()`` and ``lease_token()``.

The core owns the rules: every count, whatever its source (the form, a REST body, a
lease request), passes :meth:`SpawnerCore.checked_workers` against the same
:attr:`SpawnerCore.workers_limit`; only ``workers`` and ``queue`` are options a user
may set, and those the spawner adds (:meth:`SpawnerCore.more_user_options`); a request
is refused (HTTP 409, one line) while others wait in the queue, and when it asks for
more than are free; takes are serialised within the hub process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from tornado import web
from traitlets import Float, Integer, Tuple, default, validate
from traitlets.config import LoggingConfigurable

from pdl.lease import Grant, Refusal
from pdl.limits import holding_line
from pdl_spawner.core import form
from pdl_spawner.core.gpu_idle import GpuIdleWatch
from pdl_spawner.core.idle_engines import IdleEngines, idle_reason
from pdl_spawner.core.queueing import NotFreeYet, QueueingSpawner
from pdl_spawner.core.session_limit import SessionLimit
from pdl_spawner.core.usage import NotEnoughWorkers, SchedulerLimits, WorkerUsage
from pdl_spawner.settings.values import port_range_problem

#: Seconds after a clock's time that the hub looks (a wait may end a moment early).
CLOCK_SLACK_S = 0.05
#: Seconds between the hub's looks at a release it kept (a GPU the server still holds
#: open), until it can reclaim it: closing a device is no change of the lease.
KEPT_RECHECK_S = 1.0


class SpawnerCore(QueueingSpawner, IdleEngines, SessionLimit, GpuIdleWatch, LoggingConfigurable):
    """Mixin: the worker rules every PDL spawner shares (see the module docstring).

    Configurable: its settings, and those of the mixins it gathers, are ``c.SpawnerCore.<name>``
    for every kind (a kind's own section, ``c.PDLLocalSpawner.<name>``, wins over it)."""

    port_range = Tuple(
        Integer(), Integer(), default_value=(20000, 32000), config=True,
        help="""Ports (both included) the hub picks each server's ports from: its Jupyter
        server's (on Swarm published on its node's address, so free on every node) and, on
        Swarm, its ipyparallel controller's. Below Linux's ephemeral range (32768+), where
        the users' controllers and engines get their ZeroMQ ports: picked from there, a
        port free when the hub chose it could be taken by another user's cluster before
        the server binds it. As root on one machine, a server's processes may bind only
        their own server's port of the range (pdl_spawner.host.port_filter).""",
    )

    @validate("port_range")
    def _validate_port_range(self, proposal):
        problem = port_range_problem(tuple(proposal.value))
        if problem:
            raise ValueError(f"port_range {problem}")
        return tuple(proposal.value)

    default_workers = Integer(
        1, config=True,
        help="Workers pre-filled in the spawn form, and asked for when a request names none; "
        "at most what one request may have (a default of 3 on a 2-core machine's pool of 2 is 2).",
    )

    max_workers = Integer(
        0, config=True,
        help="Most workers (GPUs, or CPU slots) one user may reserve; 0 means as many as there are.",
    )

    session_warning_s = Float(
        600.0, config=True,
        help="Seconds before a server's session ends (on Slurm: its job's time limit) from which its user is "
        "warned, in the Cluster panel and by each %%distributed cell.",
    )

    process_limit = Integer(
        4096, config=True,
        help="""Processes and threads each user may have at once. On the embedded default
        and Slurm's login node, all their servers, kernels and engines together, when the
        hub runs as root (a pids cgroup per account: pdl_spawner.host.account_limits); on
        Swarm, in each of their containers (the notebook's, each engine's). Past it,
        starting one more fails in that user's processes only (Python: BlockingIOError,
        errno 11); everyone else and the hub go on. A PyTorch engine runs some tens of
        threads. 0: no limit.""",
    )

    @validate("process_limit")
    def _validate_process_limit(self, proposal):
        if proposal.value < 0:
            raise ValueError(f"process_limit must be 0 (no limit) or a number of processes, got {proposal.value}")
        return proposal.value

    #: What one worker is, in the spawn form: "gpu" or "cpu".
    worker_kind = "gpu"

    #: The cluster kind's name (its plug-in's, :mod:`pdl_spawner.kinds`), told to the
    #: server (``PDL_KIND``), which picks its engine host by it.
    kind_name = ""

    #: What this server was told of its user's limits when it started (:meth:`user_limits`):
    #: the most workers they may hold, and the scheduler's own limits in one line.
    told_limits: tuple[int, str] = (0, "")

    #: Serialises takes within the hub process: (the loop it belongs to, the lock).
    _take_lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
    #: The last look found a release the spawner could not reclaim yet (a GPU still open).
    _reclaim_kept = False

    # -- what the spawner provides ------------------------------------------------------

    @property
    def worker_capacity(self) -> int:
        """The most workers one request could get, known without I/O (the pool's size, or a cap)."""
        raise NotImplementedError

    async def take_workers(self, n: int) -> Any:
        """Take ``n`` free workers for this server, or raise :class:`NotEnoughWorkers`."""
        raise NotImplementedError

    async def reclaim_idle_workers(self) -> list[str] | None:
        """Give back the workers of engines released for idleness (and log the reclaim
        where the admin view reads it); returns what was reclaimed, empty when nothing was
        held, None when the workers are kept because the user still uses them (then
        nothing else is done for the lease until a later look frees them)."""
        raise NotImplementedError

    async def grant_workers_again(self, n: int) -> Grant:
        """Bring back engines for a lease request of ``n`` (already checked) workers; the
        grant for the user's server. HTTPError (one line) when they cannot be had."""
        raise NotImplementedError

    async def scheduler_limits(self) -> SchedulerLimits:
        """What the cluster's own scheduler lets this user hold; none by default (the
        Slurm spawner reads the user's QOS)."""
        return SchedulerLimits()

    @property
    def holder_name(self) -> str:
        """This user's name among :meth:`worker_usage`'s holders (the hub user's name by default)."""
        return self.user.name

    def more_user_options(self) -> dict[str, str]:
        """Options besides ``workers`` and ``queue`` that this spawner lets users set,
        each with what is valid for it (for the refusal's one line); the spawner checks
        their values. None by default."""
        return {}

    # -- how many ---------------------------------------------------------------------

    @property
    def workers_limit(self) -> int:
        """The most workers one request may ask for: ``max_workers``, within :attr:`worker_capacity`."""
        return min(self.max_workers or self.worker_capacity, self.worker_capacity)

    @property
    def workers_default(self) -> int:
        """``default_workers``, within :attr:`workers_limit` (and at least 1)."""
        return max(1, min(self.default_workers, self.workers_limit))

    async def user_limits(self, usage: WorkerUsage | None = None) -> tuple[int, str]:
        """(the most workers this user may hold: :attr:`workers_limit` within the
        scheduler's cap and the cluster's size, ``usage.total``, read when not given;
        the scheduler's limits in one line, "" for none), for the spawn form and the
        user's server (:attr:`told_limits`)."""
        limits = await self.scheduler_limits()
        usage = usage if usage is not None else await self.worker_usage()
        caps = [self.workers_limit, usage.total] + ([] if limits.workers is None else [limits.workers])
        return min(caps), limits.note

    def told_contract(self) -> dict[str, Any]:
        """The :class:`~pdl.contract.ServerContract` fields every kind tells its server: its
        kind, the idle timeout, the user's limits (:attr:`told_limits`), the session's warning,
        limit and end (the limit only with an end: Slurm's session is its job's), and the
        spawn's GPU type."""
        workers_limit, limits_note = self.told_limits
        return dict(kind=self.kind_name, idle_timeout_s=self.engine_idle_timeout, workers_limit=workers_limit,
                    limits_note=limits_note,
                    session_warn_s=self.session_warning_s, session_ends_at=self.session_ends_at,
                    session_limit_s=self.session_limit_s if self.session_ends_at else 0.0,
                    session_extendable=self.session_extendable, gpu_type=self.chosen_gpu_type)

    async def read_capacity(self) -> None:
        """Learn what :attr:`worker_capacity` needs, off the event loop, before a count
        is checked; nothing by default (a spawner that asks its cluster overrides it)."""

    def checked_workers(self, n) -> int:
        """``n`` if it is a whole number within :attr:`workers_limit`, else HTTPError(400)
        naming the valid range: the one check for every source of a count (the form,
        the REST body, a lease request)."""
        try:
            form.check_workers(n, maximum=self.workers_limit)
        except ValueError as e:
            raise web.HTTPError(400, str(e), reason=str(e)) from None
        return n

    def requested_workers(self) -> int:
        """``workers`` from the user options (``default_workers`` when absent), or
        HTTPError(400) naming the valid options: any other key (``image``, ``volumes``,
        ``env``, ...) is refused."""
        try:
            return form.requested_workers(self.user_options, default=self.workers_default,
                                          maximum=self.workers_limit, more=self.more_user_options())
        except ValueError as e:
            raise web.HTTPError(400, str(e), reason=str(e)) from None

    @default("apply_user_options")
    def _default_apply_user_options(self):
        # PDL applies user_options itself (requested_workers, when it reserves): a hook
        # that does nothing, so JupyterHub does not log "Received unhandled user_options"
        # for the workers each spawn names. An admin's own c.Spawner.apply_user_options
        # still wins over this default.
        return lambda spawner, user_options: None

    # -- the spawn form ---------------------------------------------------------------

    @default("options_form")
    def _default_options_form(self):
        return self.render_options_form

    async def render_options_form(self, spawner=None) -> str:
        """The spawn form: how many workers, what is free, who holds the rest (names
        only to admins), the user's own limit and holding, and the queue when it is on."""
        usage = await self.worker_usage()
        may_hold, note = await self.user_limits(usage)
        holds = usage.holders.get(self.holder_name, 0)
        others = {who: k for who, k in usage.holders.items() if who != self.holder_name}
        return form.render_form(
            waiting=await self.waiting(), kind=self.worker_kind, pool_size=usage.total, free=usage.free,
            holders=others, default=self.workers_default,
            maximum=max(1, min(self.workers_limit, usage.total)), show_names=bool(self.user.admin),
            limits=holding_line(may_hold, holds, note), session=self.session_form_line(),
        )

    def options_from_form(self, formdata):
        try:
            options = {"workers": form.parse_workers(formdata, maximum=self.workers_limit)}
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None
        if form.wants_queue(formdata):
            options["queue"] = True
        return options

    # -- reserving ----------------------------------------------------------------------

    def not_enough(self, wanted: int, usage: WorkerUsage) -> web.HTTPError:
        """HTTP 409: one line saying what is free (of the spawn's GPU type, where it chose
        one), names of holders only to admins."""
        kind = self.chosen_gpu_type
        message = form.not_enough_message(wanted, usage.free, usage.total, usage.holders,
                                          show_names=bool(self.user.admin),
                                          unit=f"{kind} {self.worker_unit}" if kind else self.worker_unit)
        return web.HTTPError(409, message, reason=message)

    def take_lock(self) -> asyncio.Lock:
        """The hub process's lock around a look at what is free and the take."""
        loop = asyncio.get_running_loop()
        if SpawnerCore._take_lock is None or SpawnerCore._take_lock[0] is not loop:
            SpawnerCore._take_lock = (loop, asyncio.Lock())
        return SpawnerCore._take_lock[1]

    async def reserve_workers(self, n: int | None = None, *, spawning: bool = True) -> Any:
        """Take ``n`` workers (default: what the spawn asked for) at once, or raise
        HTTPError: 400 for a count outside :attr:`workers_limit`, 409 (one line) when
        others wait in the queue or not enough are free. ``spawning``: for a spawn
        (else for engines a cell asks back), which the refusal's advice fits."""
        n = self.requested_workers() if n is None else self.checked_workers(n)
        async with self.take_lock():
            await self.refuse_while_others_wait(spawning=spawning)
            try:
                return await self.take_workers(n)
            except NotEnoughWorkers as e:
                raise self.not_enough(e.wanted, e.usage) from None

    async def wait_for_workers(self) -> Any:
        """Wait in the queue (:meth:`QueueingSpawner.wait_in_queue`) for the workers the
        spawn asked for, then take them."""
        n = self.requested_workers()

        async def take():
            async with self.take_lock():
                try:
                    return await self.take_workers(n)
                except NotEnoughWorkers:
                    raise NotFreeYet() from None

        return await self.wait_in_queue(n, take)

    async def claim_workers(self) -> Any:
        """The spawn's workers: waiting in the queue when it asked to, else at once."""
        self.told_limits = await self.user_limits()
        taken = await (self.wait_for_workers() if self.wants_queue else self.reserve_workers())
        self.start_session()
        return taken

    # -- the engine lease ------------------------------------------------------------------

    def lease_needs_watch(self) -> bool:
        return super().lease_needs_watch() or self.session_limit_s > 0 or self.gpu_idle_flag_s > 0

    def lease_due_in_s(self) -> float:
        """Seconds until the hub's own clocks need a look at the lease, whatever the lease
        says (the next GPU reading, a GPU flag's start or its release taken back, the
        session's end taken back), a little after each; the long poll's longest wait
        where none is due sooner."""
        now = time.time()
        coming = [t - now for t in self.gpu_clock_times() + self.session_clock_times() if t > now]
        if self._reclaim_kept:  # a release the spawner kept (a GPU still open): looked at again soon
            coming.append(KEPT_RECHECK_S)
        return min([t + CLOCK_SLACK_S for t in coming] + [super().lease_due_in_s()])

    def reclaim_reason(self) -> str:
        """The hub's words for a release it reclaims, or workers it takes back: the
        session's end near it, else GPUs held idle near their release, else idle engines."""
        if self.session_ending():
            return self.session_reason()
        if self.gpu_release_near():
            return self.gpu_idle_reason()
        return idle_reason(self.engine_idle_timeout)

    async def tend_lease(self) -> None:
        """One look at the server's lease: answer a wish for more time
        (:meth:`~pdl_spawner.core.session_limit.SessionLimit.extend_session`); past the
        session's end, take back what the server still holds, whatever its lease says
        (a release that leaves a GPU open included); reclaim the workers of engines released (idle, or at the
        session's end), then answer a request to have them again (its count checked like
        a spawn's; a grant starts a new session). While an answer waits for the server to
        take it up, nothing: the release it still shows is the one the answer ends, and
        reclaiming then would take back the workers just granted. Nothing of the lease's
        text reaches the hub's log."""
        await self.sample_gpu_use()
        await self.tell_gpu_idle()
        lease = await self.read_lease()
        if lease is not None and lease.extend is not None:  # the user asks for more time
            await self.answer_extension(await self.extend_session())
        if self.session_over() or self.gpu_release_due():  # whatever the lease says: a release may leave a GPU open
            reason = self.reclaim_reason()
            taken = await self.take_back_workers()
            self.stop_session()
            await self.lift_gpu_idle()
            if taken:
                self.log.info("Took back %s from %s: %s", ",".join(taken), self.owner_key, reason)
            return
        if lease is None or lease.released is None:
            self._reclaim_kept = False
            return
        if lease.answer is not None:  # answered; until the server takes the grant up, its release is old news
            return
        reclaimed = await self.reclaim_idle_workers()
        self._reclaim_kept = reclaimed is None
        if reclaimed is None:  # kept: a GPU is still in use; no grant either until it is freed
            return
        if reclaimed:
            self.log.info("Reclaimed %s from %s: %s", ",".join(reclaimed), self.owner_key, self.reclaim_reason())
        self.stop_session()
        await self.lift_gpu_idle()
        if lease.want is None:
            return
        try:
            await self.read_capacity()
            answer = await self.grant_workers_again(self.checked_workers(lease.want.workers))
            self.start_session()
            answer = dataclasses.replace(answer, ends_at=self.session_ends_at)
        except web.HTTPError as e:
            answer = Refusal(e.reason or e.log_message or str(e))
        await self.answer_lease(answer)
