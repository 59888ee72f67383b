"""Balanced batches: each rank's share of every step's global batch, sized to its speed.

Every rank walks the same shared-seed permutation of the data each epoch, cut into
``ceil(n / B)`` consecutive chunks of as equal sizes as whole images allow (``B``, or a
few images fewer when ``B`` does not divide ``n``): step ``s`` takes chunk ``s`` and cuts
it into the ranks' slices, of the sizes the :class:`~pdl.balance.plan.Plan` gives for
it, so every rank runs the same number of steps and every image is seen once an epoch. A rank whose slice is more than its memory
holds runs it in micro-batches, under DDP's ``no_sync`` (Horovod: as that many
backward passes) but the last. Each micro-batch's mean loss is weighted by
``images * world / B`` (:meth:`Part.scaled`), so that the gradient DDP or Horovod
averages is the mean over the global batch, as on one process.

While training, each rank times the forward passes of its steps (from a part's start to
:meth:`Part.scaled`: its own compute, no collective in between); every
``rebalance_every`` steps the ranks share their paces over the steps since the last
check (:mod:`pdl.balance.pace`: the lower quartile of the step times, and how sure it
is). When one rank is slower than the fastest by more than
:data:`~pdl.balance.plan.IMBALANCE` and beyond the noise, in
:data:`~pdl.balance.pace.CHECKS_IN_A_ROW` checks in a row, the speeds are refitted to
the measured paces and the split planned again (the same on every rank). Equal ranks
keep their even split on a busy machine: bursts of other processes, or one that shares
a rank's core for part of a check, are noise to these checks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch

from pdl.balance.pace import CHECKS_IN_A_ROW, MIN_STEPS, Pace, slowest_apart
from pdl.balance.plan import Plan, SpeedFit, even_split, imbalance, plan_split
from pdl.collectives import Collectives


def permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The epoch's order of ``n`` images, the same on every rank: a function of (seed, epoch)."""
    mixed = int(np.random.SeedSequence([seed, epoch, 0]).generate_state(1, np.uint64)[0])
    return torch.randperm(n, generator=torch.Generator().manual_seed(mixed))


@dataclass(frozen=True)
class Part:
    """One micro-batch of a rank's step: its images and its loss weight."""

    indices: torch.Tensor
    #: the factor of the micro-batch's mean loss: ``images * world / global batch``
    weight: float
    batches: "BalancedBatches"
    started: float

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` (the mean over this part's images) times :attr:`weight`; call it once,
        after the forward pass: the time since the part began is this rank's forward time."""
        self.batches.forward_done(self)
        return loss * self.weight


@dataclass(frozen=True)
class Step:
    """One step of an epoch on this rank: ``indices`` of its images, in ``plan``'s split."""

    number: int
    plan: Plan
    indices: torch.Tensor
    batches: "BalancedBatches"

    def parts(self, model: torch.nn.Module | None = None,
              optimizer: torch.optim.Optimizer | None = None) -> Iterator[Part]:
        """This step's micro-batches (one unless the rank's memory limit splits it).
        With a DDP ``model``, every part but the last runs under ``model.no_sync()``; with
        Horovod's ``optimizer``, it is told how many backward passes make the step."""
        sizes = self.plan.micro_batches(self.batches.rank)
        if optimizer is not None and hasattr(optimizer, "set_backward_passes_per_step"):
            optimizer.set_backward_passes_per_step(max(1, len(sizes)))
        self.batches.warn_batchnorm(model, self.plan)
        start = 0
        for i, size in enumerate(sizes):
            last = i == len(sizes) - 1
            quiet = model.no_sync() if not last and hasattr(model, "no_sync") else contextlib.nullcontext()
            with quiet:
                yield Part(self.indices[start:start + size], self.plan.loss_weight(size), self.batches,
                           self.batches.clock())
            start += size
        self.batches.step_done(self)


class BalancedBatches:
    """The steps of each epoch on this rank (see the module docstring). Build it on every
    rank with the same arguments: :func:`pdl.balance.balanced_batches` does."""

    def __init__(self, n_images: int, plan: Plan, *, rank: int, seed: int = 0, comm: Collectives | None = None,
                 rebalance_every: int = 20, device: torch.device | str = "cpu",
                 log: Callable[[str], object] | None = None):
        if n_images < 1:
            raise ValueError(f"need at least 1 image, got {n_images}")
        self.n_images, self.plan, self.rank, self.seed = n_images, plan, rank, seed
        self.comm = comm or Collectives()
        self.rebalance_every = rebalance_every
        self.device = torch.device(device)
        self.log = log
        self._forward_s = 0.0  # this step's forward seconds so far
        self._times: list[float] = []  # forward seconds of each full step since the last check
        self._steps_timed = 0
        self._suspect: int | None = None  # the rank the last check found slowest, beyond noise
        self._suspected = 0  # checks in a row that found it
        self._warned_batchnorm = False
        self._plans: dict[int, Plan] = {}

    # -- the data ---------------------------------------------------------------------

    def steps_per_epoch(self) -> int:
        return -(-self.n_images // self.plan.global_batch)

    def epoch(self, epoch: int) -> Iterator[Step]:
        """The epoch's steps (see the module docstring). A chunk smaller than the ranks
        (fewer images than ranks) is filled from the epoch's first images."""
        order = permutation(self.n_images, self.seed, epoch)
        world = self.plan.world
        for number, chunk in enumerate(order.tensor_split(self.steps_per_epoch())):
            if len(chunk) < world:
                chunk = torch.cat([chunk, order[:world - len(chunk)]])
            plan = self.plan_for(len(chunk))
            lo = plan.offset(self.rank)
            yield Step(number, plan, chunk[lo:lo + plan.batches[self.rank]], self)

    def plan_for(self, images: int) -> Plan:
        """The current plan, for a step of ``images`` (at least 2 a rank where there are enough)."""
        if images == self.plan.global_batch:
            return self.plan
        if images not in self._plans:
            self._plans[images] = self.plan.for_batch(images, min_batch=min(2, images // self.plan.world))
        return self._plans[images]

    # -- timing and rebalancing -------------------------------------------------------

    def clock(self) -> float:
        """Now, in seconds, with this rank's queued GPU work done."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def forward_done(self, part: Part) -> None:
        self._forward_s += self.clock() - part.started

    def step_done(self, step: Step) -> None:
        """Count a step (and time it, when it is a full step of the current plan); every
        ``rebalance_every`` steps, check the ranks' paces over the steps since the last
        check (a collective: every rank calls it at the same step)."""
        if step.plan is self.plan:
            self._times.append(self._forward_s)
        self._forward_s = 0.0
        self._steps_timed += 1
        if self.rebalance_every and self._steps_timed >= self.rebalance_every:
            self.rebalance(self._times)
            self._times, self._steps_timed = [], 0

    def rebalance(self, times_s: list[float]) -> bool:
        """Share this rank's pace over full steps that took ``times_s`` forward seconds
        each (unknown for fewer than :data:`~pdl.balance.pace.MIN_STEPS`) and its plan's
        prediction for one; plan again (True) when the ranks' paces have been apart
        beyond noise (:func:`~pdl.balance.pace.slowest_apart`) with the same rank slowest
        :data:`~pdl.balance.pace.CHECKS_IN_A_ROW` checks in a row."""
        plan = self.plan
        fits = plan.fits or (SpeedFit(0.0, 1.0),) * plan.world
        own = Pace.of(times_s) if len(times_s) >= MIN_STEPS else Pace.unknown()
        predicted = fits[self.rank].step_s(plan.batches[self.rank], plan.limits[self.rank])
        rows = self.comm.all_gather_floats([*own.as_floats(), predicted])
        paces = [Pace(*row[:3]) for row in rows]
        if any(pace.seconds <= 0 or row[3] <= 0 for pace, row in zip(paces, rows)):
            return False  # too few steps timed: no evidence either way
        slowest = slowest_apart(paces)
        if slowest is not None and slowest == self._suspect:
            self._suspected += 1
        else:
            self._suspect, self._suspected = slowest, int(slowest is not None)
        if self._suspected < CHECKS_IN_A_ROW:
            return False
        self._suspect, self._suspected = None, 0
        ratios = [pace.seconds / row[3] for pace, row in zip(paces, rows)]
        mean = sum(ratios) / len(ratios)
        refitted = tuple(SpeedFit(f.overhead_s * r / mean, f.per_image_s * r / mean) for f, r in zip(fits, ratios))
        new = plan_split(plan.global_batch, refitted, plan.limits, min_batch=min(2, min(plan.batches)))
        if new.batches == plan.batches:
            return False  # whole images allow no better split
        self.plan = new
        self._plans.clear()
        if self.log is not None and self.rank == 0:
            self.log(f"pdl: the ranks' speeds changed; batches now {', '.join(map(str, self.plan.batches))} "
                     f"of {plan.global_batch}")
        return True

    def warn_batchnorm(self, model: torch.nn.Module | None, plan: Plan) -> None:
        """Say once, in one plain line on rank 0 (its ``log``; no Python warning with a
        traceback line), when BatchNorm (not SyncBatchNorm) normalises batches that balancing
        made unequal: more than one image apart (an even split of a batch the ranks do not
        divide, such as an epoch's last, differs by one and says nothing)."""
        if self._warned_batchnorm or model is None or max(plan.batches) - min(plan.batches) <= 1:
            return
        batchnorm = (torch.nn.modules.batchnorm._BatchNorm,)  # noqa: SLF001 - torch's base of every BatchNorm
        if any(isinstance(m, batchnorm) and not isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules()):
            self._warned_batchnorm = True
            if self.log is not None and self.rank == 0:
                self.log(f"pdl: note: BatchNorm normalises each rank's batch, and the balanced batches differ in "
                         f"size ({', '.join(map(str, plan.batches))}); "
                         "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) gives statistics over the global batch")


def initial_plan(global_batch: int, fits: list[SpeedFit] | None, limits: list[int | None], *,
                 mode: str = "auto") -> tuple[Plan, str | None]:
    """The first plan and the line that says so (None when there is nothing to say):
    ``mode`` "on" balances to the fits (the probe's), "off" and "auto" split evenly.
    "auto" then follows the ranks' paces while training (:meth:`BalancedBatches.rebalance`,
    over checks of many steps): a probe of a second cannot tell a slower GPU from
    another process that shared a rank's core for that second."""
    world = len(limits)
    even = even_split(global_batch, world, limits)
    if fits is None or mode == "off":
        return even, None
    if mode == "auto":
        return replace(even, fits=tuple(fits)), None
    spread = imbalance(fits, max(1, global_batch // world))
    plan = plan_split(global_batch, fits, limits, min_batch=min(2, global_batch // world))
    return plan, (f"pdl: the slowest rank takes {1 + spread:.1f}x the fastest's time: balancing the batch of "
                  f"{global_batch} as {', '.join(map(str, plan.batches))}")
