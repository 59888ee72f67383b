"""What ``%pdl scale`` measures on each rank (:func:`measure`): the step's forward and
backward time with communication off, the gradient's bytes, and, among ranks on
different nodes, an all-reduce sweep that :func:`pdl.scaling.fit_link` turns into the
link's latency and bandwidth. Runs in a ``%%distributed`` cell's torch group."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from pdl.runtime.identity import describe

#: Timed forward and backward passes, after one untimed warm-up pass, in two halves,
#: one before the all-reduce sweep and one after it: each half at least MIN_PASSES // 2
#: + 1 passes, and more until PROFILE_MIN_S / 2 seconds of them, at most MAX_PASSES // 2.
#: A host that gives a rank's cores in slices (a CPU quota) shows within a second what
#: it gives under a sustained load; a shared virtual machine's core, whose speed wanders
#: by a fifth from one second to the next and by more over tens of seconds, is seen at
#: two moments as far apart as the sweep, which at a few hundred Mbit/s takes 20 s.
MIN_PASSES = 5
PROFILE_MIN_S = 2.0
MAX_PASSES = 200
#: Timed all-reduces of each size of the sweep, after one untimed: a shared link's
#: rate wavers more than a step's computation does.
SWEEP_REPEATS = 9
#: Bytes of the all-reduces of the sweep.
SWEEP_BYTES = (4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
#: Once an all-reduce of the sweep takes this long (seconds), larger ones are left out:
#: on a slow link the sizes measured so far tell its bandwidth already.
SWEEP_ENOUGH_S = 0.5


def measure(loss_fn: Callable[[], torch.Tensor], model: torch.nn.Module, device: torch.device | str = "cpu") -> dict:
    """This rank's step and, on the first rank of each node (by the engine's host name,
    :func:`pdl.runtime.identity.describe`), the sweep:
    ``{"forward_s", "backward_s", "cpu_s", "cpu_rate", "grad_bytes", "ready": [[fraction,
    bytes], ...], "host", "nodes", "sweep": [[bytes, s, cpu_s], ...]}``. ``forward_s``
    and ``backward_s``: a typical pass at full speed (:func:`_typical_pass`); ``cpu_s``:
    the median pass's CPU seconds (this process, all its threads) and ``cpu_rate``: CPU
    seconds a second over all the passes, both 0 unless ``device`` is a CPU; ``ready``:
    each gradient, in the order the backward pass makes them, with the fraction of that
    pass done when it is ready, from one more pass that notes each; ``sweep``: each
    size's median seconds and CPU seconds (0 unless on a CPU), empty with fewer than two
    nodes. ``loss_fn()`` computes one step's loss (the forward pass); ``model`` is the
    module it trains (a DDP wrapper's gradient sync is turned off while timing). The
    model's state (weights, BatchNorm statistics) and gradients are as they were
    afterwards. Every rank of the group must call it."""
    device = torch.device(device)
    kept_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    kept_grads = {p: p.grad for p in model.parameters()}
    model.zero_grad(set_to_none=True)  # else the first backward pass adds to the user's gradients
    with _quiet(model):
        _one_pass(loss_fn, model, device)  # warm-up
        passes = _passes(loss_fn, model, device)  # (forward s, backward s, CPU s)
        ready = _gradients_ready(loss_fn, model, device)
    host = describe()["host"]
    nodes, sweep = _sweep_across_nodes(host, device)
    if dist.is_initialized():
        dist.barrier()  # no rank's passes share the leaders' cores with their sweep
    with _quiet(model):
        passes += _passes(loss_fn, model, device)
    model.load_state_dict(kept_state)
    for param, grad in kept_grads.items():
        param.grad = grad
    params = [p for p in model.parameters() if p.requires_grad]
    on_cpu = device.type == "cpu"
    forward_s, backward_s = _typical_pass(passes, on_cpu)
    cpu_rate = sum(c for _, _, c in passes) / sum(f + b for f, b, _ in passes) if on_cpu else 0.0
    return {"forward_s": forward_s, "backward_s": backward_s,
            "cpu_s": statistics.median(c for _, _, c in passes) if on_cpu else 0.0, "cpu_rate": cpu_rate,
            "grad_bytes": sum(p.numel() * p.element_size() for p in params), "ready": ready, "host": host,
            "nodes": nodes, "sweep": sweep}


def _quiet(model: torch.nn.Module):
    """A context in which ``model``'s backward passes do not all-reduce (a DDP wrapper's
    ``no_sync``; nothing to turn off otherwise)."""
    return model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()


def _passes(loss_fn, model: torch.nn.Module, device: torch.device) -> list[tuple[float, float, float]]:
    """One half of the timed passes (see :data:`MIN_PASSES`), as :func:`_one_pass` gives each."""
    passes: list[tuple[float, float, float]] = []
    while len(passes) < MIN_PASSES // 2 + 1 or (
            sum(f + b for f, b, _ in passes) < PROFILE_MIN_S / 2 and len(passes) < MAX_PASSES // 2):
        passes.append(_one_pass(loss_fn, model, device))
    return passes


def _typical_pass(passes: list[tuple[float, float, float]], on_cpu: bool) -> tuple[float, float]:
    """(forward, backward) seconds of a typical pass where the host does not hold the
    rank up: on a CPU, the median pass's CPU seconds at the highest rate any pass got
    them (a pass a quota's pause fell into is slow by the pause, not by its work);
    elsewhere the median pass. Split as the fastest pass was split."""
    if on_cpu:
        best_rate = max(c / max(f + b, 1e-12) for f, b, c in passes)
        typical = statistics.median(c for _, _, c in passes) / max(best_rate, 1e-12)
    else:
        typical = statistics.median(f + b for f, b, _ in passes)
    forward, backward, _ = min(passes, key=lambda p: p[0] + p[1])
    return typical * forward / (forward + backward), typical * backward / (forward + backward)


def _one_pass(loss_fn, model: torch.nn.Module, device: torch.device) -> tuple[float, float, float]:
    """One forward and backward pass, its gradients dropped: (forward seconds, backward
    seconds, this process's CPU seconds in all)."""
    started, cpu_started = _now(device), time.process_time()
    loss = loss_fn()
    between = _now(device)
    loss.backward()
    ended = _now(device)
    cpu_s = time.process_time() - cpu_started
    model.zero_grad(set_to_none=True)
    return between - started, ended - between, cpu_s


def _gradients_ready(loss_fn, model: torch.nn.Module, device: torch.device) -> list[list[float]]:
    """One backward pass, noting when each parameter's gradient is whole:
    ``[[fraction of the pass, bytes], ...]`` in the order they became ready (the order
    DDP fills its buckets in after its first step)."""
    noted: list[tuple[float, int]] = []
    hooks = [p.register_post_accumulate_grad_hook(lambda p: noted.append((_now(device), p.numel() * p.element_size())))
             for p in model.parameters() if p.requires_grad]
    try:
        loss = loss_fn()
        started = _now(device)
        loss.backward()
        ended = _now(device)
    finally:
        for hook in hooks:
            hook.remove()
        model.zero_grad(set_to_none=True)
    span = max(ended - started, 1e-12)
    return [[min(1.0, max(0.0, (at - started) / span)), float(size)] for at, size in noted]


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _sweep_across_nodes(host: str, device: torch.device) -> tuple[int, list[list[float]]]:
    """(how many nodes the group spans, this rank's sweep: [bytes, seconds, CPU
    seconds] medians, or [] unless it is the first rank of its node and there are two
    nodes or more)."""
    if not dist.is_initialized():
        return 1, []
    hosts: list = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, host)
    leaders = sorted({h: r for r, h in reversed(list(enumerate(hosts)))}.values())
    group = dist.new_group(leaders)  # every rank takes part in making it
    if len(leaders) < 2 or dist.get_rank() not in leaders:
        return len(leaders), []
    on = device if dist.get_backend() == "nccl" else torch.device("cpu")
    sweep = []
    for size in SWEEP_BYTES:
        tensor = torch.zeros(size // 4, dtype=torch.float32, device=on)
        dist.all_reduce(tensor, group=group)  # warm-up: connections made, buffers sized
        times, cpu = [], []
        for _ in range(SWEEP_REPEATS):
            started, cpu_started = _now(on), time.process_time()
            dist.all_reduce(tensor, group=group)
            times.append(_now(on) - started)
            cpu.append(time.process_time() - cpu_started)
        sweep.append([float(size), statistics.median(times), statistics.median(cpu) if device.type == "cpu" else 0.0])
        slowest = torch.tensor([sweep[-1][1]], dtype=torch.float64, device=on)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)  # every leader decides alike
        if len(sweep) >= 2 and slowest.item() >= SWEEP_ENOUGH_S:
            break
    return len(leaders), sweep
