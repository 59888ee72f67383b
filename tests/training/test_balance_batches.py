"""Balanced batches on three real CPU-slot engines (gloo): the gradient of a step split
(2, 5, 9) over the ranks, with or without micro-batches, under DDP and Horovod, is the
gradient of the same 16 images on one process (pdl/balance/batches.py)."""

from __future__ import annotations

import ast
import importlib.util

import pytest
import torch

from engines_harness import Recorder
from pdl.balance.batches import permutation

needs_horovod = pytest.mark.skipif(not importlib.util.find_spec("horovod"),
                                   reason="Horovod is not installed (scripts/setup --horovod)")

#: Two steps of SGD with momentum over 32 images, 16 a step split (2, 5, 9).
STEPS, GLOBAL, SPLIT = 2, 16, (2, 5, 9)

MODEL = """
import torch
torch.manual_seed(7)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
"""

DATA = """
g = torch.Generator().manual_seed(11)
x = torch.randn(32, 6, generator=g, dtype=torch.float64)
y = torch.randn(32, 1, generator=g, dtype=torch.float64)
"""


def balanced_cell(backend: str, limits: tuple) -> str:
    wrap = ("net = torch.nn.parallel.DistributedDataParallel(model)\n"
            "opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)\n") if backend == "torch" else (
            "net = model\nhvd.broadcast_parameters(model.state_dict(), root_rank=0)\n"
            "opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),\n"
            "                               named_parameters=model.named_parameters())\n")
    return MODEL + DATA + wrap + f"""
from pdl.balance.batches import BalancedBatches
from pdl.balance.plan import Plan
from pdl.collectives import for_backend
comm = for_backend()
batches = BalancedBatches(32, Plan({GLOBAL}, {SPLIT!r}, {limits!r}), rank=comm.rank, comm=comm, rebalance_every=0)
parts = []
for step in batches.epoch(0):
    opt.zero_grad()
    for part in step.parts(net, opt):
        parts.append(len(part.indices))
        part.scaled(torch.nn.functional.mse_loss(net(x[part.indices]), y[part.indices])).backward()
    opt.step()
(parts, torch.cat([p.detach().flatten() for p in model.parameters()]).tolist())
"""


def one_process_reference() -> list[float]:
    namespace: dict = {}
    exec(MODEL + DATA, namespace)
    model, x, y = namespace["model"], namespace["x"], namespace["y"]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    order = permutation(32, seed=0, epoch=0)
    for s in range(STEPS):
        chunk = order[s * GLOBAL:(s + 1) * GLOBAL]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[chunk]), y[chunk]).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["torch", pytest.param("horovod", marks=needs_horovod)])
@pytest.mark.parametrize(("limits", "parts"), [
    ((None, None, None), [[2, 2], [5, 5], [9, 9]]),
    ((None, 2, 4), [[2, 2], [2, 2, 1, 2, 2, 1], [3, 3, 3, 3, 3, 3]]),
], ids=["whole", "micro-batches"])
def test_a_balanced_step_is_the_one_process_step_on_the_same_images(pdl_session, backend, limits, parts):
    out, err = Recorder(), Recorder()
    result = pdl_session.run(balanced_cell(backend, limits), 3, backend=backend, out=out, err=err)
    reference = torch.tensor(one_process_reference(), dtype=torch.float64)
    ranks = [ast.literal_eval(v) for v in result.values]
    assert [r[0] for r in ranks] == parts
    for _, params in ranks:
        torch.testing.assert_close(torch.tensor(params, dtype=torch.float64), reference, rtol=0, atol=1e-10)
