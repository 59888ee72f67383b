"""What a cluster kind supplies to the core: its workers, as one small protocol object.

:class:`~pdl_spawner.core.spawner.SpawnerCore` owns the rules (limits, the form, the
queue, the engine lease's answers, the session and GPU-idle clocks); where the workers
come from is a kind's, behind :class:`WorkerSource`. A kind's spawner names its source's
class (``worker_source = LedgerSlots``); the core makes one per spawner
(:attr:`SpawnerCore.workers <pdl_spawner.core.spawner.SpawnerCore.workers>`) and calls
nothing else of the kind's. So a kind built on another spawner library (KubeSpawner,
say) implements this object beside that library, and shares no method name with the
core but JupyterHub's own hooks.

A source is made with its spawner (``source_class(spawner)``), whose user, name and
kind-specific settings it reads. Counts are workers (a GPU, or a CPU slot); times are
epoch seconds. Members with a body here are defaults a source may keep.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from typing import Any, Protocol, runtime_checkable

from pdl.lease import ExtendAnswer, Grant
from pdl_spawner.core.usage import GpuReading, SchedulerLimits, WorkerUsage, gpu_memory_of


@runtime_checkable
class WorkerSource(Protocol):
    """The workers of one user's server, as a cluster kind hands them out."""

    #: What one worker is, in the spawn form: "gpu" or "cpu".
    kind: str
    #: The unit workers are counted in, in messages ("workers" or "GPUs").
    unit: str

    # -- who and where ----------------------------------------------------------------

    @property
    @abstractmethod
    def owner_key(self) -> str:
        """This server's key in the hub's queue and logs (``user/name``)."""
        ...

    @property
    @abstractmethod
    def holder_name(self) -> str:
        """This user's name among :meth:`usage`'s holders."""
        ...

    @property
    @abstractmethod
    def queue_db(self) -> str:
        """The SQLite file of the hub's fair queue (one per hub)."""
        ...

    @abstractmethod
    def lease_url(self) -> str | None:
        """``http://host:port/<server base_url>/pdl/api/lease`` of this server; None when unknown."""
        ...

    @abstractmethod
    def lease_token(self) -> str | None:
        """The server's own API token, which its lease API accepts."""
        ...

    # -- how many ---------------------------------------------------------------------

    @property
    @abstractmethod
    def capacity(self) -> int:
        """The most workers one request could get, known without I/O (the pool's size, or a cap)."""
        ...

    async def read_capacity(self) -> None:
        """Learn what :attr:`capacity` and :meth:`gpu_types_for` need, off the event loop."""

    @abstractmethod
    async def usage(self) -> WorkerUsage:
        """The workers there are (of the spawn's GPU type), and who holds them, this
        server's own not counted."""
        ...

    async def scheduler_limits(self) -> SchedulerLimits:
        """What the cluster's own scheduler lets this user hold; none by default."""
        return SchedulerLimits()

    def gpu_types_for(self, options: dict) -> list[str]:
        """The GPU types a spawn with ``options`` may choose among, as last read ([]: one type)."""
        return []

    async def gpu_type_usage(self) -> dict[str, tuple[int, int]]:
        """GPU type ("" : any) -> (free, total), for the form (read only where types are offered)."""
        return {}

    def more_options(self) -> dict[str, str]:
        """Options besides ``workers``, ``queue`` and ``gpu_type`` a user may set, each with
        what is valid for it (the refusal's one line); the source checks their values."""
        return {}

    def form_fields(self) -> str:
        """HTML of the source's own fields, added after the core's in the spawn form."""
        return ""

    def parse_form(self, formdata: dict) -> dict:
        """The options of the source's own form fields (``formdata``: name -> list of
        values); ValueError (one line) for a bad one."""
        return {}

    def session_line(self) -> str | None:
        """The spawn form's line about the session, where the source has its own (Slurm's
        job time limit; "" for none); None: the core's session limit says it."""
        return None

    # -- taking and giving back -------------------------------------------------------

    #: True where the cluster's scheduler queues requests itself (Slurm): the core then
    #: hands a spawn that asked to wait to :meth:`take` (``wait=True``) instead of
    #: PDL's fair queue, and the form lists :meth:`waiting`.
    own_queue = False

    async def waiting(self) -> list[tuple[str, int]]:
        """(user, workers) waiting in the scheduler's own queue, in its order (with
        :attr:`own_queue`)."""
        return []

    async def prepare(self, n: int) -> None:
        """Before a spawn's ``n`` workers are taken (its options checked): what the
        cluster needs first (Slurm: the user's account and association); nothing by default."""

    @abstractmethod
    async def take(self, n: int) -> Any:
        """Take ``n`` free workers for this server, or raise
        :class:`~pdl_spawner.core.usage.NotEnoughWorkers`; what it returns is the
        source's (the ledger's slots, or nothing where Swarm assigns the GPUs later). A
        source with :attr:`own_queue` also takes ``wait`` (keyword): wait in its queue."""
        ...

    @abstractmethod
    def ready_to_start(self) -> bool:
        """True once this spawn holds its workers (it waits in the queue no longer)."""
        ...

    @abstractmethod
    async def reclaim_idle(self) -> list[str] | None:
        """Give back the workers of engines released by their server (logged where the
        admin view reads it, in ``spawner.reclaim_reason()``'s words): what was
        reclaimed, empty when nothing was held, None when they are kept because the
        user still uses them (a later look tries again)."""
        ...

    @abstractmethod
    async def grant_again(self, n: int) -> Grant:
        """Bring back engines for a lease request of ``n`` (already checked) workers: the
        grant for the user's server; HTTPError (one line) when they cannot be had."""
        ...

    @abstractmethod
    async def take_back(self) -> list[str]:
        """Take this server's workers back now, whatever its server does (a session's
        end, GPUs held idle past their release): what was taken back, for the log."""
        ...

    #: True where the cluster's scheduler ends a grant itself (Slurm: a job's time limit):
    #: the hub's session limit does not apply, the lease is watched even without idle
    #: reclaim (the next cell asks again), and a wish for more time is :meth:`extend`'s.
    ends_grants = False

    def lease_watched(self) -> bool:
        """False where this server records no release and its lease needs no watch (a
        Slurm server running inside its job); True by default."""
        return True

    async def extend(self) -> ExtendAnswer | None:
        """The answer to the user's wish for more time, where the source decides it
        (Slurm: the job's time limit); None: the core's session limit does."""
        return None

    # -- GPU use --------------------------------------------------------------------------

    async def gpu_use(self) -> list[float] | None:
        """The use (percent) of each GPU this server holds, read by the hub; None where
        the hub cannot read it (the default)."""
        return None

    async def gpu_memory(self) -> list[tuple[float, float]] | None:
        """Each GPU this server holds: (memory used, memory in all) in bytes, read by the
        hub right after :meth:`gpu_use` in each sample (a source that reads both at once
        may answer from that reading); None where the hub cannot read it (the default)."""
        return None

    async def record_gpu_idle(self, since: float | None) -> None:
        """Keep the GPU-idle flag (since when, None: lifted) where the admin view reads it;
        nowhere by default."""


class SpawnerWorkers(WorkerSource):
    """A base for a kind's source: made with its spawner (:attr:`spawner`), whose user
    holds the workers (:attr:`holder_name`) and whose log it writes to."""

    def __init__(self, spawner) -> None:
        self.spawner = spawner

    @property
    def log(self):
        return self.spawner.log

    @property
    def holder_name(self) -> str:
        """The hub user's name."""
        return self.spawner.user.name


class GpusReadAtOnce:
    """Mixin for a source that reads its GPUs' use and memory in one look
    (:meth:`look_at_gpus`, e.g. one Slurm step, one read of Swarm's GPU reader): the
    hub's :meth:`WorkerSource.gpu_use` and :meth:`WorkerSource.gpu_memory` of one sample
    come from one look, which is reused while at most half a sample old
    (``spawner.gpu_sample_s``) and for the same :meth:`look_key`."""

    spawner: Any
    #: The last look: (monotonic seconds, its key, the readings).
    _last_look: tuple[float, Any, list[GpuReading] | None] | None = None

    @abstractmethod
    async def look_at_gpus(self) -> list[GpuReading] | None:
        """Each GPU this server holds, read now; None when one has no reading."""
        ...

    def look_key(self) -> Any:
        """What a reused look must have been of (Slurm: the job); None by default."""
        return None

    async def held_gpu_readings(self) -> list[GpuReading] | None:
        """:meth:`look_at_gpus`, or the last look while fresh (see the class docstring)."""
        now, key, last = time.monotonic(), self.look_key(), self._last_look
        if last is not None and last[1] == key and now - last[0] < self.spawner.gpu_sample_s / 2:
            return last[2]
        readings = await self.look_at_gpus()
        self._last_look = (now, key, readings)
        return readings

    async def gpu_use(self) -> list[float] | None:
        readings = await self.held_gpu_readings()
        return [r.use_percent for r in readings] if readings else None

    async def gpu_memory(self) -> list[tuple[float, float]] | None:
        return gpu_memory_of(await self.held_gpu_readings())
