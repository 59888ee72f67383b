"""Data-parallel training of a classifier on CINIC-10 tensors.

Works in one process, or on every rank of an initialised torch.distributed
group or Horovod world (e.g. on ipyparallel engines): each rank trains on its
shard, DDP or ``hvd.DistributedOptimizer`` averages gradients, and evaluation
splits the test set across ranks. :mod:`pdl.collectives` hides which.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict
from typing import Callable

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import pdl
from pdl import checkpoint as ckpt

from pdl.balance.helper import balanced_batches
from pdl.collectives import Collectives, for_backend
from .compile_support import compile_problem
from .data import seed_from
from .recipe import Hyper, peak_lr, warmup_steps

__all__ = ["Hyper", "normalize", "augment", "lr_factor", "fit", "evaluate"]

MEAN = (0.47889522, 0.47227842, 0.43047404)
STD = (0.24205776, 0.23828046, 0.25874835)

Split = tuple[torch.Tensor, torch.Tensor]

#: Last number of the augmentation generator's seed (seed, rank, epoch, AUGMENT_STREAM):
#: keeps it apart from the data order's seed (seed, epoch), which seed_from pads with zeros.
AUGMENT_STREAM = 1


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 [B, 3, H, W] -> float32 standardised with the CINIC-10 channel mean/std."""
    mean = torch.tensor(MEAN, device=images.device).view(3, 1, 1)
    std = torch.tensor(STD, device=images.device).view(3, 1, 1)
    return (images.float() / 255 - mean) / std


def augment(batch: torch.Tensor, generator: torch.Generator, *, pad: int = 4) -> torch.Tensor:
    """Random crop of the ``pad``-pixel reflect-padded image, and a random
    horizontal flip (p=0.5), drawn per image from ``generator`` (a CPU generator).

    ``batch`` is [B, C, H, W] of any dtype and device; the result has the same
    shape. Batched: the batch is padded once, and one ``gather`` reads every
    image's crop (flipped or not) from it.
    """
    b, c, h, w = batch.shape
    shifts = torch.randint(0, 2 * pad + 1, (2, b, 1), generator=generator)
    flips = torch.rand(b, 1, generator=generator) < 0.5
    padded_w = w + 2 * pad
    rows = (torch.arange(h) + shifts[0]) * padded_w  # [B, H]: offsets of the crop's rows
    cols = torch.where(flips, torch.arange(w).flip(0), torch.arange(w)) + shifts[1]  # [B, W]
    index = (rows[:, :, None] + cols[:, None, :]).view(b, 1, h * w).to(batch.device)
    rows_pad = _reflect(torch.arange(-pad, h + pad), h).to(batch.device)
    cols_pad = _reflect(torch.arange(-pad, w + pad), w).to(batch.device)
    padded = batch.index_select(2, rows_pad).index_select(3, cols_pad)  # [B, C, H + 2 pad, W + 2 pad]
    return padded.flatten(2).gather(2, index.expand(b, c, h * w)).view(b, c, h, w)


def _reflect(index: torch.Tensor, size: int) -> torch.Tensor:
    """Mirror out-of-range indices back into 0..size-1 (edge pixel not repeated)."""
    index = index.abs()
    return torch.where(index >= size, 2 * (size - 1) - index, index)


def lr_factor(step: int, total_steps: int, warmup_steps: int) -> float:
    """Multiplier of the peak lr: linear warmup to 1 over ``warmup_steps``,
    then cosine decay to 0 at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def fit(
    model: nn.Module,
    train: Split,
    test: Split,
    hp: Hyper,
    *,
    device: str | torch.device,
    log: Callable[[str], object] = print,
    backend: str = "auto",
    checkpoint: str | os.PathLike | None = None,
    stop_at: float | None = None,
    balance: str | None = None,
) -> dict:
    """Train ``model`` for ``hp.epochs`` epochs and evaluate after each.

    ``train``/``test`` are ``(uint8 images [N,3,32,32], int64 labels [N])``, the
    same on every rank. ``log`` gets one line per epoch (and one on resuming, and one
    when ``hp.compile`` asks for torch.compile on a GPU that lacks what it needs:
    training then runs uncompiled, :mod:`~pdl_cinic10.compile_support`),
    on rank 0 only; progress
    (step, loss, epoch, img_per_s) goes to :func:`pdl.log` about 20 times an epoch,
    which a ``%%distributed`` cell shows as a live bar and loss curve.
    ``backend`` is "torch" (DDP), "horovod" (``hvd.DistributedOptimizer``) or
    "auto" (Horovod if it is initialised here, else torch.distributed); either
    way every rank starts from rank 0's weights.
    Each step takes the next ``hp.batch_size * world`` images of a fresh permutation
    each epoch and splits them over the ranks (:func:`pdl.balanced_batches`): evenly
    when the ranks are about as fast, else to their speeds, measured before the first
    epoch and while training, so that a slower GPU does not hold the others back; the
    gradient is the global batch's mean either way, so the learning rate is unchanged.
    ``balance``: "auto", "on" or "off" (default: the cell's, ``%%distributed
    --balance``/``--no-balance``, else "auto"). Every rank takes the same number of
    steps and together the ranks see every training image once an epoch. Both the
    permutation and the augmentations are functions of (hp.seed, epoch) (and rank), so
    a run with a fixed split (``balance="off"``, or ranks of equal speed) is
    reproducible epoch by epoch.

    ``checkpoint``: a file path (on rank 0's filesystem). If a checkpoint is
    there, training continues after its last epoch (weights, optimizer state,
    history), with results bit-identical to a run that was never stopped where
    the computation is deterministic (e.g. on a CPU with
    ``torch.use_deterministic_algorithms(True)`` and a fixed thread count); a
    finished run's checkpoint returns its result without training. After every
    epoch the state is saved there atomically (:func:`pdl.checkpoint.save`),
    so rerunning the cell after an interrupt or an engine's death loses at most
    one epoch. A checkpoint written with other hyperparameters or another world
    size raises ValueError naming the path and the differences.
    ``stop_at``: end after the first epoch whose test accuracy (0..1) reaches it,
    the schedule unchanged (as time-to-accuracy benchmarks measure it).
    Returns ``{"history": [{epoch, train_loss, test_acc, images_per_sec, seconds}, ...],
    "test_acc": final accuracy 0..1, "model": the trained (unwrapped) module}``.
    """
    device = torch.device(device)
    comm = for_backend(backend)
    rank, world = comm.rank, comm.world
    gpu = device.type == "cuda"
    module = _unwrap(model).to(device)
    if gpu and hp.channels_last:
        module = module.to(memory_format=torch.channels_last)

    images, labels = train
    if len(images) < world:
        raise ValueError(f"need at least {world} training images for {world} ranks; got {len(images)}")
    criterion = nn.CrossEntropyLoss(label_smoothing=hp.label_smoothing)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=gpu and hp.bf16)
    batches = balanced_batches(
        len(images), hp.batch_size * world, seed=hp.seed, backend=comm, mode=balance, device=device,
        probe=_probe(module, images, labels, criterion, autocast, device), log=log if rank == 0 else None)
    steps = batches.steps_per_epoch()
    total_steps = hp.epochs * steps
    warmup = warmup_steps(hp.warmup_epochs, steps, total_steps)
    peak = peak_lr(hp.lr, hp.batch_size * world)

    optimizer = torch.optim.SGD(
        module.parameters(),
        lr=peak,
        momentum=hp.momentum,
        nesterov=hp.nesterov,
        weight_decay=hp.weight_decay,
    )
    history = _resume(checkpoint, hp, world, module, optimizer, log if rank == 0 else None)
    net, optimizer = comm.distribute(module, optimizer)
    compile_off = compile_problem() if gpu and hp.compile else None
    if compile_off and rank == 0:
        log(f"torch.compile is off: {compile_off}")
    forward = torch.compile(net) if gpu and hp.compile and not compile_off else net

    step = len(history) * steps
    log_every = max(1, steps // 20)  # about 20 progress points per epoch
    for epoch in range(len(history), hp.epochs):
        net.train()
        generator = torch.Generator().manual_seed(seed_from(hp.seed, rank, epoch, AUGMENT_STREAM))
        _synchronize(device)
        started = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        seen = 0  # images of the global batches so far, every rank's
        mine = 0  # of which this rank's
        for balanced_step in batches.epoch(epoch):
            for group in optimizer.param_groups:
                group["lr"] = peak * lr_factor(step, total_steps, warmup)
            optimizer.zero_grad()  # set_to_none (torch >= 2.0); hvd.DistributedOptimizer takes no argument
            for part in balanced_step.parts(net, optimizer):
                x = augment(images[part.indices.to(images.device)].to(device, non_blocking=True), generator)
                y = labels[part.indices.to(labels.device)].to(device, non_blocking=True)
                with autocast:
                    loss = criterion(forward(_layout(normalize(x), module)), y)
                part.scaled(loss).backward()
                loss_sum += loss.detach().float() * len(part.indices)
                mine += len(part.indices)
            optimizer.step()
            seen += balanced_step.plan.global_batch
            step += 1
            if step % log_every == 0 or step == total_steps:  # .item() syncs a GPU: not every step
                pdl.log(step=step, total=total_steps, loss=loss.item(), epoch=epoch + 1,
                        img_per_s=seen / (time.perf_counter() - started))
        _synchronize(device)
        seconds = torch.tensor(time.perf_counter() - started, device=device)
        comm.all_reduce_(loss_sum)
        comm.all_reduce_(seconds, "max")
        merge_batchnorm_statistics(comm, module, share=mine / max(1, seen))  # every rank holds one model

        accuracy = evaluate(module, *test, device=device, backend=comm, tta=hp.tta, bf16=hp.bf16)
        record = {
            "epoch": epoch + 1,
            "train_loss": loss_sum.item() / seen,
            "test_acc": accuracy,
            "images_per_sec": len(images) / seconds.item(),
            "seconds": seconds.item(),
        }
        history.append(record)
        if checkpoint is not None:  # every rank calls it; rank 0 writes
            ckpt.save(checkpoint, model=module, optimizer=optimizer, hyper=asdict(hp), world=world,
                      history=history)
        if rank == 0:
            log(
                f"epoch {epoch + 1:>{len(str(hp.epochs))}}/{hp.epochs}"
                f"  train loss {record['train_loss']:.3f}"
                f"  test acc {100 * accuracy:.1f}%"
                f"  {record['images_per_sec']:.0f} img/s"
            )
        if stop_at is not None and accuracy >= stop_at:  # the same on every rank: summed counts
            break
    if not history:
        accuracy = evaluate(module, *test, device=device, backend=comm, tta=hp.tta, bf16=hp.bf16)
    return {
        "history": history,
        "test_acc": history[-1]["test_acc"] if history else accuracy,
        "model": module,
    }


def _resume(
    path: str | os.PathLike | None,
    hp: Hyper,
    world: int,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    log: Callable[[str], object] | None,
) -> list[dict]:
    """The history of the epochs done so far: [] without a checkpoint at ``path``,
    else that of the checkpoint, whose weights and optimizer state are loaded into
    ``module`` and ``optimizer`` (only once its settings are known to match)."""
    state = ckpt.read(path) if path is not None else None
    if state is None:
        return []
    if not {"hyper", "world", "history", "model", "optimizer"} <= state.keys():
        raise ValueError(f"checkpoint {path} was not written by fit (entries: {', '.join(state)})")
    saved = {**state["hyper"], "world size": state["world"]}
    wanted = {**asdict(hp), "world size": world}
    differ = [f"{k} {saved.get(k)!r} (now {v!r})" for k, v in wanted.items() if saved.get(k) != v]
    if differ:
        raise ValueError(f"checkpoint {path} was written with other settings: {', '.join(differ)}; "
                         "pass another checkpoint path, or delete it to start over")
    ckpt.restore(state, model=module, optimizer=optimizer)
    history = state["history"]
    if log is not None:
        log(f"resuming from {path}: {len(history)}/{hp.epochs} epochs done")
    return history


@torch.no_grad()
def evaluate(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    *,
    device: str | torch.device,
    batch_size: int = 1024,
    backend: str | Collectives = "auto",
    tta: bool = False,
    bf16: bool = True,
) -> float:
    """Top-1 accuracy 0..1 of ``model`` over all of ``images``/``labels``.

    ``tta``: score each image by the mean of its and its mirror image's logits.
    ``bf16``: under bfloat16 autocast on a GPU. When torch.distributed or
    Horovod is initialised (see ``fit``'s ``backend``), call it on every rank:
    each rank scores a contiguous slice and the counts are summed across ranks.
    """
    device = torch.device(device)
    comm = backend if isinstance(backend, Collectives) else for_backend(backend)
    rank, world = comm.rank, comm.world
    module = _unwrap(model)  # DDP's forward would run collectives; ranks' slices differ in size
    was_training = module.training
    module.eval()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda" and bf16)
    lo, hi = rank * len(labels) // world, (rank + 1) * len(labels) // world
    counts = torch.zeros(2, dtype=torch.int64, device=device)  # correct, total
    for start in range(lo, hi, batch_size):
        stop = min(start + batch_size, hi)
        x = _layout(normalize(images[start:stop].to(device, non_blocking=True)), module)
        y = labels[start:stop].to(device, non_blocking=True)
        with autocast:
            logits = module(x).float()
            if tta:
                logits = logits + module(x.flip(3)).float()
        counts[0] += (logits.argmax(1) == y).sum()
        counts[1] += stop - start
    module.train(was_training)
    comm.all_reduce_(counts)
    return counts[0].item() / max(1, counts[1].item())


def _layout(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """``x`` in the memory format of ``module``'s first conv weight (channels_last or not)."""
    weight = next((p for p in module.parameters() if p.dim() == 4), None)
    if weight is not None and weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous():
        return x.contiguous(memory_format=torch.channels_last)
    return x


def _probe(module: nn.Module, images: torch.Tensor, labels: torch.Tensor, criterion: nn.Module, autocast,
           device: torch.device) -> Callable[[int], None]:
    """One forward and backward pass of ``module`` (not yet distributed: no gradient
    sync) on the first ``b`` training images, leaving its weights, BatchNorm statistics
    and gradients as they were: what :func:`pdl.balanced_batches` times on each rank."""
    def probe(b: int) -> None:
        kept = {k: v.detach().clone() for k, v in module.state_dict().items()}
        idx = torch.arange(b) % len(images)
        x = normalize(images[idx.to(images.device)].to(device))
        with autocast:
            loss = criterion(module(_layout(x, module)), labels[idx.to(labels.device)].to(device))
        loss.backward()
        module.zero_grad(set_to_none=True)
        module.load_state_dict(kept)

    return probe


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


def merge_batchnorm_statistics(comm: Collectives, module: nn.Module, share: float) -> None:
    """Make every rank's buffers one model's: each BatchNorm's running mean and variance
    become those of all the ranks' images together, each rank's statistics weighted by
    ``share`` (the fraction of the epoch's images it saw; the shares sum to 1), so a
    rank that trained on small batches does not speak for the model alone; every
    other buffer (``num_batches_tracked``, a model's own) becomes rank 0's.

    The variance combines by the law of total variance: the weighted mean of the
    ranks' variances plus the weighted spread of their means."""
    if comm.world == 1:
        return
    merged = set()
    for layer in module.modules():
        mean, var = getattr(layer, "running_mean", None), getattr(layer, "running_var", None)
        if not (isinstance(mean, torch.Tensor) and isinstance(var, torch.Tensor)):
            continue
        moments = torch.stack([mean.double() * share, (var.double() + mean.double() ** 2) * share])
        comm.all_reduce_(moments)
        mean.copy_(moments[0])
        var.copy_(moments[1] - moments[0] ** 2)
        merged.update((id(mean), id(var)))
    for buffer in module.buffers():
        if id(buffer) not in merged:
            comm.broadcast_(buffer, src=0)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

