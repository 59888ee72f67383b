"""The few collectives training loops need, from torch.distributed or Horovod.

:func:`~pdl_cinic10.train.fit`, :func:`~pdl_cinic10.train.evaluate` and the balanced
batches (:mod:`pdl.balance`) call only these, so the same loop trains with
``%%distributed --backend torch`` (DDP) or ``--backend horovod``
(``hvd.DistributedOptimizer``). Horovod is imported only when it is the backend.
"""

from __future__ import annotations

import inspect
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

#: DDP's option that keeps rank 0's buffers at the start but syncs none before each
#: forward: ``forward_sync_buffers`` since torch 2.13 (which deprecates the older name),
#: ``broadcast_buffers`` before.
_NO_BUFFER_SYNC_EACH_STEP = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    else {"broadcast_buffers": False}
)

#: Backends :func:`for_backend` knows; "auto" picks the one initialised in this process.
BACKENDS = ("auto", "torch", "horovod")


class Collectives:
    """A communication backend: rank/world and in-place all-reduce/broadcast.

    The base class is a world of one process, where every collective is a no-op.
    """

    name = "none"
    rank, world = 0, 1

    def all_reduce_(self, tensor: torch.Tensor, op: str = "sum") -> None:
        """Replace ``tensor`` by its ``op`` ("sum" or "max") over all ranks."""

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> None:
        """Replace ``tensor`` by rank ``src``'s."""

    def all_gather_floats(self, values: list[float]) -> list[list[float]]:
        """Every rank's ``values`` (the same length on each), in rank order (float64)."""
        table = torch.zeros(self.world, len(values), dtype=torch.float64, device=self.tensor_device)
        table[self.rank] = torch.tensor(values, dtype=torch.float64)
        self.all_reduce_(table)
        return table.tolist()

    @property
    def tensor_device(self) -> torch.device:
        """Where this backend's collectives take tensors (NCCL: this rank's GPU)."""
        return torch.device("cpu")

    def distribute(self, module: nn.Module, optimizer: torch.optim.Optimizer):
        """Make every rank start from rank 0's weights and average gradients.

        Returns ``(net, optimizer)``: call ``net`` for the forward pass and
        step ``optimizer`` as usual.
        """
        return module, optimizer


class TorchCollectives(Collectives):
    """torch.distributed's default group; gradients are averaged by DDP."""

    name = "torch"

    def __init__(self) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def all_reduce_(self, tensor, op="sum"):
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)

    @property
    def tensor_device(self):
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def broadcast_(self, tensor, src=0):
        dist.broadcast(tensor, src=src)

    def distribute(self, module, optimizer):
        device_ids = [module_device(module)] if module_device(module).type == "cuda" else None
        # Broadcasts rank 0's state now. Not the BatchNorm buffers before every step (one more
        # collective a step; fit makes them rank 0's after each epoch), and gradients are views
        # of DDP's buffers (no copy): together 10 % more CPU worker speed (bench/cpu_workers.py).
        net = DistributedDataParallel(module, device_ids=device_ids, gradient_as_bucket_view=True,
                                      **_NO_BUFFER_SYNC_EACH_STEP)
        return net, optimizer


class HorovodCollectives(Collectives):
    """Horovod (``hvd.init()`` done); gradients are averaged by ``hvd.DistributedOptimizer``."""

    name = "horovod"

    def __init__(self) -> None:
        import horovod.torch as hvd

        self.hvd = hvd
        self.rank, self.world = hvd.rank(), hvd.size()

    def all_reduce_(self, tensor, op="sum"):
        self.hvd.allreduce_(tensor, op=self.hvd.Max if op == "max" else self.hvd.Sum)

    def broadcast_(self, tensor, src=0):
        self.hvd.broadcast_(tensor, root_rank=src)

    def distribute(self, module, optimizer):
        hvd = self.hvd
        hvd.broadcast_parameters(module.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=module.named_parameters())
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return module, optimizer


def for_backend(backend: str = "auto") -> Collectives:
    """The collectives of ``backend``; one process's no-ops when it is not initialised.

    "auto" means Horovod if it is initialised in this process (as on the engines
    of ``%%distributed --backend horovod``), else torch.distributed.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if backend in ("auto", "horovod") and _horovod_initialized():
        return HorovodCollectives()
    if backend == "horovod":
        raise RuntimeError("backend='horovod' but Horovod is not initialised; run under "
                           "%%distributed --backend horovod or call hvd.init() first")
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return TorchCollectives()
    return Collectives()


def module_device(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


def _horovod_initialized() -> bool:
    hvd = sys.modules.get("horovod.torch")
    return hvd is not None and hvd.is_initialized()
