"""GPUs held idle: the hub's watch over how much a server uses the GPUs it holds.

Work in progress (issue 31, item 4): the watch and its readings on the embedded
default; the flag in the panel and the admin view, the warning and the release come next.

The hub measures (it trusts no reading a user's server could write): on the embedded
default it asks ``nvidia-smi`` for the utilisation of the GPUs a server holds
(:meth:`GpuIdleWatch.gpu_use`, the spawner's own), at most every :data:`SAMPLE_EVERY_S`
seconds. A server whose GPUs all read 0 % on every sample for ``gpu_idle_flag_s`` seconds
is flagged (:meth:`GpuIdleWatch.gpu_idle_flag`); any reading above 0 ends it.
"""

from __future__ import annotations

import time

from traitlets import Float, HasTraits

from pdl.limits import duration

#: Seconds between two readings of a server's GPU use.
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

    _tracker: IdleGpuTracker | None = None
    _sampled_at = 0.0

    @property
    def gpu_tracker(self) -> IdleGpuTracker:
        if self._tracker is None:
            self._tracker = IdleGpuTracker()
        return self._tracker

    async def gpu_use(self) -> list[float] | None:
        """The use (percent) of each GPU this server holds, read by the hub; None where
        the hub cannot read it (the spawner's own; none by default)."""
        return None

    async def sample_gpu_use(self, now: float | None = None) -> None:
        """Read the GPU use when a sample is due (at most every :data:`SAMPLE_EVERY_S` s)."""
        now = time.time() if now is None else now
        if not self.gpu_idle_flag_s or now - self._sampled_at < SAMPLE_EVERY_S:
            return
        self._sampled_at = now
        self.gpu_tracker.observe(await self.gpu_use(), now)

    def gpu_idle_flag(self, now: float | None = None) -> str | None:
        """One line once the GPUs have read 0 % for ``gpu_idle_flag_s``; else None."""
        now = time.time() if now is None else now
        idle = self.gpu_tracker.idle_for(now)
        if not self.gpu_idle_flag_s or idle < self.gpu_idle_flag_s:
            return None
        return f"GPUs held idle: 0 % use for {duration(idle)}"
