"""How to split one global batch over ranks of unequal speed so that they finish a step
together. Pure, no torch: every rank computes the same plan from the same numbers.

A rank's time for a step of ``b`` images, in micro-batches of at most ``limit`` images
(its memory's limit; None: no limit), is modelled as ``k * overhead_s + per_image_s * b``
with ``k = ceil(b / limit)`` (:class:`SpeedFit`, fitted from a few timed steps at two
sizes by :func:`fit_speed`). :func:`plan_split` keeps the global batch fixed, so the
learning rate need not change, gives every rank at least ``min_batch`` images and then
each further image to the rank that would finish soonest with it: the slowest rank's
time, the step's, is then as small as whole images allow.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from pdl.line_fit import line_through

#: Ranks whose step times differ by more than this fraction are worth balancing.
IMBALANCE = 0.10

#: "auto": balance when the ranks' speeds differ by more than :data:`IMBALANCE`;
#: "on": always; "off": never (an even split).
MODES = ("auto", "on", "off")
_mode = "auto"


def set_mode(mode: str) -> None:
    """This process's default mode for balanced batches (``%%distributed --balance``
    sets "on" on every rank for its cell, ``--no-balance`` "off"); ValueError (one line) else."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"balance must be one of {', '.join(MODES)}, got {mode!r}")
    _mode = mode


def current_mode() -> str:
    return _mode


@dataclass(frozen=True)
class SpeedFit:
    """One rank's step time model: ``overhead_s + per_image_s * images`` (seconds)."""

    overhead_s: float
    per_image_s: float

    def step_s(self, images: int, limit: int | None = None) -> float:
        """Seconds for a step of ``images``, in micro-batches of at most ``limit`` (None: one)."""
        parts = math.ceil(images / limit) if limit and images > limit else 1
        return parts * self.overhead_s + self.per_image_s * images


def fit_speed(samples: Sequence[tuple[int, float]]) -> SpeedFit:
    """The least-squares line through ``(images, seconds)`` samples of at least two
    sizes; ValueError (one line) otherwise. The overhead is at least 0 and the time per
    image more than 0, whatever noise the samples hold."""
    sizes = {b for b, _ in samples}
    if len(sizes) < 2:
        raise ValueError(f"fitting a rank's speed needs steps of two batch sizes or more, got {sorted(sizes)}")
    _, slope = line_through(samples)
    mean_b = sum(b for b, _ in samples) / len(samples)
    mean_t = sum(t for _, t in samples) / len(samples)
    slope = max(slope, 1e-3 * mean_t / mean_b, 1e-12)  # noise can tilt a flat line below 0
    return SpeedFit(overhead_s=max(0.0, mean_t - slope * mean_b), per_image_s=slope)


@dataclass(frozen=True)
class Plan:
    """Images per rank for one step of ``global_batch``: ``batches[r]`` for rank r,
    each in micro-batches of at most ``limits[r]`` images (None: one batch)."""

    global_batch: int
    batches: tuple[int, ...]
    limits: tuple[int | None, ...]
    fits: tuple[SpeedFit, ...] | None = None

    def __post_init__(self):
        if sum(self.batches) != self.global_batch:
            raise ValueError(f"the ranks' batches {list(self.batches)} do not add up to {self.global_batch}")
        if len(self.limits) != len(self.batches):
            raise ValueError(f"{len(self.limits)} memory limits for {len(self.batches)} ranks")

    @property
    def world(self) -> int:
        return len(self.batches)

    def offset(self, rank: int) -> int:
        """Where rank ``rank``'s images start in the step's global batch."""
        return sum(self.batches[:rank])

    def micro_batches(self, rank: int) -> tuple[int, ...]:
        """Rank ``rank``'s micro-batch sizes: as even as its limit allows, adding up to its batch."""
        b, limit = self.batches[rank], self.limits[rank]
        parts = math.ceil(b / limit) if limit and b > limit else 1
        return tuple(b // parts + (1 if i < b % parts else 0) for i in range(parts)) if b else ()

    def loss_weight(self, images: int) -> float:
        """The factor of a mean loss over ``images`` images: ``images * world / global_batch``,
        so that the ranks' gradients, averaged by DDP or Horovod, are the mean over the
        global batch whatever each rank's share."""
        return images * self.world / self.global_batch

    def predicted_step_s(self) -> float | None:
        """The step's time as the fits predict it (the slowest rank's); None without fits."""
        if self.fits is None:
            return None
        return max(f.step_s(b, lim) for f, b, lim in zip(self.fits, self.batches, self.limits))

    def for_batch(self, global_batch: int, min_batch: int = 1) -> Plan:
        """The same ranks' plan for another global batch (an epoch's last, shorter step)."""
        if self.fits is None:
            return even_split(global_batch, self.world, self.limits)
        return plan_split(global_batch, self.fits, self.limits, min_batch=min_batch)


def even_split(global_batch: int, world: int, limits: Sequence[int | None] | None = None) -> Plan:
    """``global_batch`` split as evenly as whole images allow (plain data parallelism)."""
    if world < 1 or global_batch < 0:
        raise ValueError(f"need a world of 1 rank or more and a batch >= 0, got {world} and {global_batch}")
    batches = tuple(global_batch // world + (1 if r < global_batch % world else 0) for r in range(world))
    return Plan(global_batch, batches, tuple(limits) if limits is not None else (None,) * world)


def plan_split(global_batch: int, fits: Sequence[SpeedFit], limits: Sequence[int | None] | None = None,
               *, min_batch: int = 2) -> Plan:
    """Split ``global_batch`` so that the slowest rank's modelled step is as short as
    whole images allow, every rank getting at least ``min_batch``. ValueError (one line,
    naming the least valid batch) when ``global_batch < min_batch * ranks``."""
    world = len(fits)
    limits = tuple(limits) if limits is not None else (None,) * world
    if world < 1:
        raise ValueError("a plan needs at least one rank")
    if global_batch < min_batch * world:
        raise ValueError(f"a global batch of {global_batch} is too small for {world} ranks: "
                         f"use at least {min_batch * world} ({min_batch} a rank)")
    batches = [min_batch] * world
    heap = [(fits[r].step_s(min_batch + 1, limits[r]), r) for r in range(world)]
    heapq.heapify(heap)
    for _ in range(global_batch - min_batch * world):
        _, r = heapq.heappop(heap)
        batches[r] += 1
        heapq.heappush(heap, (fits[r].step_s(batches[r] + 1, limits[r]), r))
    return Plan(global_batch, tuple(batches), limits, tuple(fits))


def imbalance(fits: Sequence[SpeedFit], images: int) -> float:
    """How much longer the slowest rank takes than the fastest for the same ``images``:
    0.25 means 25% longer."""
    times = [f.step_s(images) for f in fits]
    return max(times) / min(times) - 1 if min(times) > 0 else math.inf
