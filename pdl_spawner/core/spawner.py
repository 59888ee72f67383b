"""What every PDL spawner shares: the worker count and its limits, the spawn form,
reserving workers (at once or in the fair queue), and the hub's side of the engine lease.

:class:`SpawnerCore` is placed before JupyterHub's spawner base class (``class
PDLLocalSpawner(HostServer, SpawnerCore, LocalProcessSpawner)``). What a kind supplies
is one object, its :class:`~pdl_spawner.core.worker_source.WorkerSource` (the spawner
names its class: ``worker_source = LedgerSlots``), held as :attr:`SpawnerCore.workers`:
what the workers are, what is free, taking them, giving them back and bringing them
back for the engine lease, their GPUs' use. The core calls no other method of a kind.

The core owns the rules: every count, whatever its source (the form, a REST body, a
lease request), passes :meth:`SpawnerCore.checked_workers` against the same
:attr:`SpawnerCore.workers_limit`; only ``workers``, ``queue``, ``gpu_type`` (where a
cluster has GPUs of two types or more) and the source's :meth:`more_options
<pdl_spawner.core.worker_source.WorkerSource.more_options>` are options a user may set;
a request is refused (HTTP 409, one line) while others wait in the queue, and when it
asks for more than are free; takes are serialised within the hub process. Its saved
state is its own key, ``"pdl"``, of the spawner's state (:data:`STATE_KEY`), beside the
keys of the spawner library and the kind, merged explicitly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from tornado import web
from traitlets import Float, Integer, Tuple, default, validate
from traitlets.config import LoggingConfigurable

from pdl import entry_ticket, hub_relay
from pdl.lease import Refusal
from pdl.limits import holding_line
from pdl_spawner.core import form
from pdl_spawner.core.admission import ADMISSIONS, Admission
from pdl_spawner.core.gpu_idle import GpuIdleWatch
from pdl_spawner.core.gpu_types import GpuTypeChoice
from pdl_spawner.core.idle_engines import IdleEngines, idle_reason
from pdl_spawner.core.queueing import NotFreeYet, QueueingSpawner
from pdl_spawner.core.session_limit import SessionLimit
from pdl_spawner.hub import metrics
from pdl_spawner.core.usage import NotEnoughWorkers, WorkerUsage
from pdl_spawner.core.worker_source import WorkerSource
from pdl_spawner.settings.values import port_range_problem

#: Seconds after a clock's time that the hub looks (a wait may end a moment early).
CLOCK_SLACK_S = 0.05
#: Seconds between the hub's looks at a release it kept (a GPU the server still holds
#: open), until it can reclaim it: closing a device is no change of the lease.
KEPT_RECHECK_S = 1.0
#: The core's own key in the spawner's saved state.
STATE_KEY = "pdl"


class SpawnerCore(GpuTypeChoice, QueueingSpawner, IdleEngines, SessionLimit, GpuIdleWatch, LoggingConfigurable):
    """Mixin: the worker rules every PDL spawner shares (see the module docstring).

    Configurable: its settings, and those of the mixins it gathers, are ``c.SpawnerCore.<name>``
    for every kind (a kind's own section, ``c.PDLLocalSpawner.<name>``, wins over it)."""

    port_range = Tuple(
        Integer(), Integer(), default_value=(20000, 32000), config=True,
        help="""Ports (both included) the hub picks each server's ports from: its Jupyter
        server's (on Swarm published on its node's address, so free on every node) and its
        ipyparallel controller's (on one machine and on Slurm, the 19 ports from the
        server's on). Below Linux's ephemeral range (32768+), where outgoing connections
        get their ports: a port found free there could be taken, by another user's process
        or a connection, before the server or controller binds it. As root on one machine,
        a server's processes may bind only their own server's ports of the range
        (pdl_spawner.host.port_filter).""",
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

    # -- what the kind provides ---------------------------------------------------------

    #: The kind's :class:`~pdl_spawner.core.worker_source.WorkerSource` class, made with
    #: the spawner (``worker_source(spawner)``).
    worker_source: type | None = None
    _workers: WorkerSource | None = None

    @property
    def workers(self) -> WorkerSource:
        """This spawner's source of workers (made the first time it is asked for)."""
        if self._workers is None:
            if self.worker_source is None:
                raise TypeError(f"{type(self).__name__} names no worker_source")
            self._workers = self.worker_source(self)
        return self._workers

    @property
    def worker_unit(self) -> str:
        """The unit workers are counted in, in messages ("workers" or "GPUs")."""
        return self.workers.unit

    @property
    def owner_key(self) -> str:
        return self.workers.owner_key

    def more_user_options(self) -> dict[str, str]:
        """Options besides ``workers`` and ``queue`` that users may set here, each with
        what is valid for it (for the refusal's one line): ``gpu_type`` where types are
        offered, and the source's own."""
        more = dict(self.workers.more_options())
        if self.offered_gpu_types:
            more["gpu_type"] = form.valid_gpu_types(self.offered_gpu_types)
        return more

    # -- how many ---------------------------------------------------------------------

    @property
    def workers_limit(self) -> int:
        """The most workers one request may ask for: ``max_workers``, within the source's capacity."""
        capacity = self.workers.capacity
        return min(self.max_workers or capacity, capacity)

    @property
    def workers_default(self) -> int:
        """``default_workers``, within :attr:`workers_limit` (and at least 1)."""
        return max(1, min(self.default_workers, self.workers_limit))

    async def user_limits(self, usage: WorkerUsage | None = None) -> tuple[int, str]:
        """(the most workers this user may hold: :attr:`workers_limit` within the
        scheduler's cap and the cluster's size, ``usage.total``, read when not given;
        the scheduler's limits in one line, "" for none), for the spawn form and the
        user's server (:attr:`told_limits`)."""
        limits = await self.workers.scheduler_limits()
        usage = usage if usage is not None else await self.workers.usage()
        caps = [self.workers_limit, usage.total] + ([] if limits.workers is None else [limits.workers])
        return min(caps), limits.note

    @property
    def entry_contract(self) -> dict[str, str]:
        """The contract's fields for the server's gate: the hub's public key for entry
        tickets (:mod:`pdl.entry_ticket`) and its relay mark (:mod:`pdl.hub_relay`), both
        derived from its cookie secret; none where this spawner has no hub's settings (a
        spawner made alone): its server then answers strangers as JupyterHub's does."""
        secret = (getattr(self.user, "settings", None) or {}).get("cookie_secret")
        if not (isinstance(secret, bytes) and secret):
            return {}
        return dict(entry_key=entry_ticket.public_key(secret), relay_mark=hub_relay.relay_mark(secret))

    def told_contract(self) -> dict[str, Any]:
        """The :class:`~pdl.contract.ServerContract` fields every kind tells its server: its
        kind, the idle timeout, the user's limits (:attr:`told_limits`), the session's warning,
        limit and end (the limit only with an end: Slurm's session is its job's), and the
        spawn's GPU type, and what the server's gate needs (:attr:`entry_contract`)."""
        workers_limit, limits_note = self.told_limits
        return dict(kind=self.kind_name, **self.entry_contract, idle_timeout_s=self.engine_idle_timeout,
                    workers_limit=workers_limit,
                    limits_note=limits_note,
                    session_warn_s=self.session_warning_s, session_ends_at=self.session_ends_at,
                    session_limit_s=self.session_limit_s if self.session_ends_at else 0.0,
                    session_extendable=self.session_extendable, gpu_type=self.chosen_gpu_type)

    def checked_workers(self, n) -> int:
        """``n`` if it is a whole number within :attr:`workers_limit`, else HTTPError(400)
        naming the valid range: the one check for every source of a count (the form,
        the REST body, a lease request)."""
        try:
            form.check_workers(n, maximum=self.workers_limit)
        except ValueError as e:
            metrics.refused(self._refusal_of(n))
            raise web.HTTPError(400, str(e), reason=str(e)) from None
        return n

    def _refusal_of(self, n) -> str:
        """The metrics' reason for refusing a count ``n``: above the limit, or no valid count."""
        above = isinstance(n, int) and not isinstance(n, bool) and n > self.workers_limit
        return "over_limit" if above else "bad_request"

    def requested_workers(self) -> int:
        """``workers`` from the user options (``default_workers`` when absent), or
        HTTPError(400) naming the valid options: any other key (``image``, ``volumes``,
        ``env``, ...) is refused."""
        try:
            return form.requested_workers(self.user_options, default=self.workers_default,
                                          maximum=self.workers_limit, more=self.more_user_options())
        except ValueError as e:
            metrics.refused(self._refusal_of((self.user_options or {}).get("workers")))
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

    async def waiting(self) -> list[tuple[str, int]] | None:
        """(user, workers) in queue order for the spawn form (the scheduler's, where the
        source queues itself); None when the queue is off."""
        if self.workers.own_queue:
            return await self.workers.waiting() if self.queue_timeout else None
        return await super().waiting()

    async def render_options_form(self, spawner=None) -> str:
        """The spawn form: how many workers, what is free, who holds the rest (names
        only to admins), the user's own limit and holding, and the queue when it is on."""
        usage = await self.workers.usage()
        may_hold, note = await self.user_limits(usage)
        holder = self.workers.holder_name
        holds = usage.holders.get(holder, 0)
        others = {who: k for who, k in usage.holders.items() if who != holder}
        html = form.render_form(
            waiting=await self.waiting(), kind=self.workers.kind, pool_size=usage.total, free=usage.free,
            holders=others, default=self.workers_default,
            maximum=max(1, min(self.workers_limit, usage.total)), show_names=bool(self.user.admin),
            limits=holding_line(may_hold, holds, note), session=self.session_form_line(),
        )
        if self.offered_gpu_types:
            html += form.render_gpu_types(await self.workers.gpu_type_usage())
        return html + self.workers.form_fields()

    def options_from_form(self, formdata):
        try:
            options = {"workers": form.parse_workers(formdata, maximum=self.workers_limit)}
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None
        if form.wants_queue(formdata):
            options["queue"] = True
        try:
            options.update(self.workers.parse_form(formdata))  # first: a partition decides the GPU types
            options.update(form.parse_gpu_type(formdata, self.workers.gpu_types_for(options)))
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None
        return options

    # -- reserving ----------------------------------------------------------------------

    def not_enough(self, wanted: int, usage: WorkerUsage) -> web.HTTPError:
        """HTTP 409: one line saying what is free (of the spawn's GPU type, where it chose
        one), names of holders only to admins."""
        kind = self.chosen_gpu_type
        message = form.not_enough_message(wanted, usage.free, usage.total, usage.holders,
                                          show_names=bool(self.user.admin),
                                          unit=f"{kind} {self.worker_unit}" if kind else self.worker_unit)
        metrics.refused("not_enough_free")
        return web.HTTPError(409, message, reason=message)

    def take_lock(self) -> asyncio.Lock:
        """The hub process's lock around a look at what is free and the take."""
        loop = asyncio.get_running_loop()
        if SpawnerCore._take_lock is None or SpawnerCore._take_lock[0] is not loop:
            SpawnerCore._take_lock = (loop, asyncio.Lock())
        return SpawnerCore._take_lock[1]

    async def admit_spawn(self, options: dict | None) -> Admission | None:
        """Answer a spawn request with ``options`` (its user options) before JupyterHub
        prepares the spawn (None: the options of this server's last spawn, as JupyterHub
        reads them): HTTPError 400 (one line) for options outside what is valid,
        409 (one line) when others wait in the queue or not enough workers are free,
        counting those admitted to other requests meanwhile
        (:mod:`pdl_spawner.core.admission`); else the spawn is admitted, its workers
        counted as held until its ``start()`` takes them: the admission. Nothing is taken
        here; where the scheduler keeps the queue (Slurm), and for a spawn that waits in
        PDL's queue, ``start()`` answers (None)."""
        if self.workers.own_queue:  # the scheduler answers, in start()
            return None
        if options is None:  # as JupyterHub does: the options of this server's last spawn
            options = (self.orm_spawner.user_options if self.orm_spawner is not None else None) or {}
        self.user_options = options
        await self.workers.read_capacity()
        n = self.requested_workers()
        if self.wants_queue:
            return None
        async with self.take_lock():
            await self.refuse_while_others_wait()
            gpu_type = self.chosen_gpu_type
            usage = (await self.workers.usage()).plus(ADMISSIONS.held_by_others(self.owner_key, gpu_type))
            if n > usage.free:
                raise self.not_enough(n, usage)
            return ADMISSIONS.admit(self.owner_key, self.workers.holder_name, n, gpu_type)

    async def reserve_workers(self, n: int | None = None, *, spawning: bool = True) -> Any:
        """Take ``n`` workers (default: what the spawn asked for) at once, or raise
        HTTPError: 400 for a count outside :attr:`workers_limit`, 409 (one line) when
        others wait in the queue or not enough are free. ``spawning``: for a spawn
        (else for engines a cell asks back), which the refusal's advice fits. The spawn's
        admission ends here, taken or not (within the take lock: no answer counts both)."""
        async with self.take_lock():
            try:
                n = self.requested_workers() if n is None else self.checked_workers(n)
                await self.refuse_while_others_wait(spawning=spawning)
                return await self.workers.take(n)
            except NotEnoughWorkers as e:
                raise self.not_enough(e.wanted, e.usage) from None
            finally:
                ADMISSIONS.drop(self.owner_key)

    async def wait_for_workers(self) -> Any:
        """Wait in the queue (:meth:`QueueingSpawner.wait_in_queue`) for the workers the
        spawn asked for, then take them."""
        n = self.requested_workers()

        async def take():
            async with self.take_lock():
                try:
                    return await self.workers.take(n)
                except NotEnoughWorkers:
                    raise NotFreeYet() from None

        return await self.wait_in_queue(n, take)

    async def claim_workers(self) -> Any:
        """The spawn's workers: waiting in the queue when it asked to (PDL's, or the
        scheduler's own where the source has one), else at once."""
        await self.workers.read_capacity()
        n = self.requested_workers()
        await self.workers.prepare(n)
        self.told_limits = await self.user_limits()
        if self.workers.own_queue:
            taken = await self.workers.take(n, wait=self.wants_queue)
        else:
            taken = await (self.wait_for_workers() if self.wants_queue else self.reserve_workers())
        self.start_session()
        return taken

    # -- saved state --------------------------------------------------------------------

    def get_state(self):
        """The spawner library's and the kind's state, and the core's under :data:`STATE_KEY`."""
        state = super().get_state()
        core = self.session_state()
        if core:  # nothing of the core's: no key (a stopped server leaves no state)
            state[STATE_KEY] = core
        return state

    def load_state(self, state):
        """The core's part from :data:`STATE_KEY`; a state saved before the core had a
        key of its own (a hub upgraded with its servers kept) has its fields at the top."""
        super().load_state(state)
        core = state.get(STATE_KEY, state if "session_ends_at" in state and STATE_KEY not in state else {})
        self.load_session_state(core if isinstance(core, dict) else {})

    def clear_state(self):
        super().clear_state()
        self.stop_session()
        metrics.gpu_use_gone(self.owner_key)

    # -- the engine lease ------------------------------------------------------------------

    def lease_needs_watch(self) -> bool:
        if not self.workers.lease_watched():
            return False
        return super().lease_needs_watch() or self.session_limit_s > 0 or self.gpu_idle_flag_s > 0

    def lease_due_in_s(self) -> float:
        """Seconds until the hub's own clocks need a look at the lease, whatever the lease
        says (the next GPU reading, a GPU flag's start or its release taken back, the
        session's end taken back), a little after each; the long poll's longest wait
        where none is due sooner."""
        now = time.time()
        coming = [t - now for t in self.gpu_clock_times() + self.session_clock_times() if t > now]
        sample_in = self.gpu_sample_due_in_s(now)
        if sample_in is not None:  # overdue (a slow look) is now, not the long poll's longest
            coming.append(sample_in)
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
            answer = await self.extend_session()
            metrics.extension(granted=not isinstance(answer, Refusal))
            await self.answer_extension(answer)
        if self.session_over() or self.gpu_release_due():  # whatever the lease says: a release may leave a GPU open
            reason = self.reclaim_reason()
            await metrics.count_until_now()
            taken = await self.workers.take_back()
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
        await metrics.count_until_now()
        reclaimed = await self.workers.reclaim_idle()
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
            await self.workers.read_capacity()
            answer = await self.workers.grant_again(self.checked_workers(lease.want.workers))
            self.start_session()
            answer = dataclasses.replace(answer, ends_at=self.session_ends_at)
        except web.HTTPError as e:
            answer = Refusal(e.reason or e.log_message or str(e))
        await self.answer_lease(answer)
