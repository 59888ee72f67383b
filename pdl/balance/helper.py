""":func:`balanced_batches`, the user's entry to :mod:`pdl.balance`, and the probe that
fits each rank's speed (and, on a GPU, its memory's limit) before the first step."""


from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from pdl.balance.batches import BalancedBatches, initial_plan
from pdl.balance.plan import MODES, SpeedFit, current_mode, fit_speed
from pdl.collectives import Collectives, for_backend

def balanced_batches(n_images: int, global_batch: int, *, probe: Callable[[int], object] | None = None,
                     seed: int = 0, backend: str | Collectives = "auto", mode: str | None = None,
                     device: torch.device | str = "cpu", memory_limit: int | None = None,
                     rebalance_every: int = 20, log: Callable[[str], object] | None = print) -> BalancedBatches:
    """The steps of each epoch over ``n_images`` images, ``global_batch`` a step split over
    the ranks to their speeds. Call it on every rank with the same arguments.

    ``probe(b)``: one forward and backward pass on ``b`` images *without gradient sync*
    (e.g. on ``ddp.module``); timed on each rank at two sizes to fit its speed (and, on a
    GPU, the images its memory holds), then the ranks share their fits. Without it the
    split starts even and follows the forward times measured while training.
    ``mode``: "auto" (default, or what ``%%distributed --balance`` set), "on", "off" (an
    even split, no probe, no rebalancing). ``backend``: as :func:`pdl.collectives.for_backend`'s,
    or the collectives themselves.
    ``memory_limit``: the most images of one micro-batch on this rank (default: from the
    probe on a GPU, else none). ``log``: where rank 0 says when it balances.
    """
    mode = mode or current_mode()
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    comm = backend if isinstance(backend, Collectives) else for_backend(backend)
    device = torch.device(device)
    fits, limits = None, [memory_limit] * comm.world
    if probe is not None and mode != "off" and comm.world > 1:
        fit, limit = measure(probe, global_batch // comm.world, device)
        limit = memory_limit or limit
        rows = comm.all_gather_floats([fit.overhead_s, fit.per_image_s, float(limit or 0)])
        fits = [SpeedFit(overhead, per_image) for overhead, per_image, _ in rows]
        limits = [int(lim) or None for _, _, lim in rows]
    plan, line = initial_plan(global_batch, fits, limits, mode=mode)
    if line and log is not None and comm.rank == 0:
        log(line)
    return BalancedBatches(n_images, plan, rank=comm.rank, seed=seed, comm=comm,
                           rebalance_every=0 if mode == "off" or comm.world == 1 else rebalance_every,
                           device=device, log=log)


#: Timed calls of the probe at each of its two sizes (at least), after one untimed warm-up call.
PROBE_REPEATS = 3
#: Seconds of timed calls at each size (at least): a rank under a CPU quota (a cgroup, a
#: container's ``--cpus``) runs short bursts at full speed, and only a window of many
#: quota periods shows the pace it keeps.
PROBE_MIN_S = 0.3


def measure(probe: Callable[[int], object], share: int, device: torch.device) -> tuple[SpeedFit, int | None]:
    """This rank's speed, fitted from the mean time of a call of ``probe`` at a quarter of
    and at its even ``share`` (each timed over :data:`PROBE_REPEATS` calls and
    :data:`PROBE_MIN_S` seconds at least) and, on a GPU, the most images one pass fits in
    90% of the memory it may use (None elsewhere)."""
    small, large = max(2, share // 4), max(4, share)
    if large <= small:
        large = small + 2
    samples, peaks = [], {}
    for size in (small, large):
        probe(size)  # warm-up: kernels chosen, memory pooled
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        calls, started = 0, time.perf_counter()
        while calls < PROBE_REPEATS or time.perf_counter() - started < PROBE_MIN_S:
            probe(size)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            calls += 1
        samples.append((size, (time.perf_counter() - started) / calls))
        if device.type == "cuda":
            peaks[size] = torch.cuda.max_memory_allocated(device)
    return fit_speed(samples), (gpu_limit(peaks, device) if peaks else None)


def gpu_limit(peaks: dict[int, int], device: torch.device) -> int | None:
    """Images per pass that fit 90% of the GPU memory this process may use, from the
    peak bytes at two sizes (linear in the images); None when memory does not grow."""
    (small, low), (large, high) = sorted(peaks.items())
    per_image = (high - low) / (large - small)
    if per_image <= 0:
        return None
    free, _ = torch.cuda.mem_get_info(device)
    budget = 0.9 * (free + torch.cuda.memory_reserved(device))
    base = low - per_image * small
    return max(1, math.floor((budget - base) / per_image))
