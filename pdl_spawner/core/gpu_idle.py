"""GPUs held idle: the hub's watch over how much a server uses the GPUs it holds.

The hub measures (it trusts no reading a user's server could write): it asks
``nvidia-smi`` for the utilisation of the GPUs a server holds (its
:class:`~pdl_spawner.core.worker_source.WorkerSource`'s ``gpu_use``: on this machine for
the embedded default, by a step in the user's job on Slurm, by the hub's reader service
on Swarm), every ``gpu_sample_s`` seconds
(:data:`SAMPLE_EVERY_S` by default). A server whose GPUs all read 0 % on every sample for ``gpu_idle_flag_s`` seconds
is flagged (:meth:`GpuIdleWatch.gpu_idle_flag`); any reading above 0 ends it. The hub
tells the server (:class:`pdl.lease.GpuIdle`), whose Cluster panel and cells show it. With
``gpu_idle_release_s`` the flag carries a time from which the server releases the engines
as idle ones are; should it not, the hub takes the GPUs back itself shortly after.
"""

from __future__ import annotations

import time

from traitlets import Float, HasTraits, Unicode

from pdl.lease import GpuIdle, encode
from pdl.limits import duration
from pdl_spawner.hub import metrics
from pdl_spawner.core.session_limit import ENFORCE_AFTER_S, RELEASE_WINDOW_S

#: Seconds between two readings of a server's GPU use, by default.
SAMPLE_EVERY_S = 30.0


class IdleGpuTracker:
    """Since when every GPU of a reservation has read 0 % (pure: readings in)."""

    def __init__(self) -> None:
        self.idle_since: float | None = None

    def observe(self, utilisation: list[float] | None, now: float) -> None:
        """One sample: each held GPU's use in percent; None or [] (no reading) changes nothing."""
        if not utilisation:
            return
        if any(u > 0 for u in utilisation):
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now

    def idle_for(self, now: float) -> float:
        """Seconds every GPU has read 0 % (0 while any is used, or before a reading)."""
        return 0.0 if self.idle_since is None else max(0.0, now - self.idle_since)

    def forget(self) -> None:
        """The GPUs were given back: start over."""
        self.idle_since = None


class GpuIdleWatch(HasTraits):
    """Mixin of :class:`~pdl_spawner.core.spawner.SpawnerCore`: the watch over the GPU use
    of a server's reservation (see the module docstring)."""

    gpu_idle_flag_s = Float(
        0.0, config=True,
        help="""Seconds a server's GPUs must all read 0 % use (nvidia-smi) before it is flagged as
        holding them idle; 0: no watch.""",
    )

    gpu_idle_release_s = Float(
        0.0, config=True,
        help="""Seconds at 0 % GPU use after which a server's engines are released as idle ones
        are (the next cell asks for workers again); its user is warned from gpu_idle_flag_s on.
        0: flag only.""",
    )

    gpu_sample_s = Float(
        SAMPLE_EVERY_S, config=True,
        help="Seconds between two readings of a server's GPU use (with gpu_idle_flag_s).",
    )

    nvidia_smi = Unicode(
        "", config=True,
        help="""The nvidia-smi that reads the GPUs' use (on this machine for the embedded
        default, on the job's nodes on Slurm, in the GPU reader's image on Swarm); empty:
        the one on PATH.""",
    )

    _tracker: IdleGpuTracker | None = None
    _sampled_at = 0.0
    #: The flag last told the server: (since, release_at); None before the first.
    _told: tuple[float, float] | None = None
    #: The flag's ``since`` last recorded for the admin view (0: none); None before the first.
    _recorded: float | None = None

    @property
    def gpu_tracker(self) -> IdleGpuTracker:
        if self._tracker is None:
            self._tracker = IdleGpuTracker()
        return self._tracker

    async def sample_gpu_use(self, now: float | None = None) -> None:
        """Read the GPU use (and memory, where the kind reads it) when a sample is due (at
        most every ``gpu_sample_s`` seconds)."""
        now = time.time() if now is None else now
        if not self.gpu_idle_flag_s or now - self._sampled_at < self.gpu_sample_s:
            return
        self._sampled_at = now
        readings = await self.workers.gpu_use()
        metrics.gpu_use(self.owner_key, readings)
        metrics.gpu_memory(self.owner_key, await self.workers.gpu_memory())
        self.gpu_tracker.observe(readings, now)

    def gpu_sample_due_in_s(self, now: float) -> float | None:
        """Seconds (0 when overdue: the last look took longer than ``gpu_sample_s``) until
        the next reading is due; None without a watch."""
        if not self.gpu_idle_flag_s:
            return None
        return max(0.0, self._sampled_at + self.gpu_sample_s - now)

    def gpu_clock_times(self) -> list[float]:
        """When (epoch seconds) the flag's clocks need the hub to look again: the flag's
        start and the time to take the GPUs back (one past is done with); none without a
        watch. The next reading is :meth:`gpu_sample_due_in_s`'s."""
        if not self.gpu_idle_flag_s:
            return []
        times = []
        if self.gpu_tracker.idle_since is not None:
            times.append(self.gpu_tracker.idle_since + self.gpu_idle_flag_s)
        release_at = self.gpu_idle_notice().release_at
        if release_at:
            times.append(release_at + ENFORCE_AFTER_S)
        return times

    def gpu_idle_flag(self, now: float | None = None) -> str | None:
        """One line once the GPUs have read 0 % for ``gpu_idle_flag_s``; else None."""
        now = time.time() if now is None else now
        idle = self.gpu_tracker.idle_for(now)
        if not self.gpu_idle_flag_s or idle < self.gpu_idle_flag_s:
            return None
        return f"GPUs held idle: 0 % use for {duration(idle)}"

    def gpu_idle_notice(self, now: float | None = None) -> GpuIdle:
        """What the server is told: the flag (``since``, and ``release_at`` where the admin
        chose a release), or ``since`` 0 while none stands."""
        now = time.time() if now is None else now
        since = self.gpu_tracker.idle_since
        if not self.gpu_idle_flag_s or since is None or now - since < self.gpu_idle_flag_s:
            return GpuIdle(since=0.0)
        release_at = since + max(self.gpu_idle_release_s, self.gpu_idle_flag_s) if self.gpu_idle_release_s else 0.0
        return GpuIdle(since=since, release_at=release_at)

    async def tell_gpu_idle(self, now: float | None = None) -> None:
        """Tell the server the flag when it changes (and record it for the admin view)."""
        if not self.gpu_idle_flag_s:
            return
        notice = self.gpu_idle_notice(now)
        if notice.since != self._recorded:
            await self.workers.record_gpu_idle(notice.since or None)
            self._recorded = notice.since
        told = (notice.since, notice.release_at)
        if told != self._told and await self.fetch_lease(encode(notice), part="gpu-idle") is not None:
            self._told = told

    async def lift_gpu_idle(self) -> None:
        """The GPUs were given back: forget their readings and lift the flag at once, for
        the admin view and the server alike (their containers may take seconds to stop)."""
        self.gpu_tracker.forget()
        metrics.gpu_use_gone(self.owner_key)
        await self.tell_gpu_idle()

    def gpu_release_due(self, now: float | None = None) -> bool:
        """True from :data:`~pdl_spawner.core.session_limit.ENFORCE_AFTER_S` after the
        flag's release time: time for the hub to take the GPUs back itself."""
        now = time.time() if now is None else now
        release_at = self.gpu_idle_notice(now).release_at
        return bool(release_at) and now >= release_at + ENFORCE_AFTER_S

    def gpu_release_near(self, now: float | None = None) -> bool:
        """True from :data:`~pdl_spawner.core.session_limit.RELEASE_WINDOW_S` before the
        flag's release time: a release now is for the GPUs held idle."""
        now = time.time() if now is None else now
        release_at = self.gpu_idle_notice(now).release_at
        return bool(release_at) and now >= release_at - RELEASE_WINDOW_S

    def gpu_idle_reason(self, now: float | None = None) -> str:
        """The hub's words for GPUs released for idleness."""
        now = time.time() if now is None else now
        return f"GPUs held idle (0 % use) for {duration(self.gpu_tracker.idle_for(now))}"
