"""Balanced batches pay off on ranks of unequal speed: three real CPU-slot engines made
1x, 2x and 4x slower on purpose, first by a per-image delay in the forward pass (a
slower GPU, as the CPU sees it), then by CPU quotas through cgroups (a slower machine).
The balanced step is timed side by side with the even split of the same global batch
and compared with what the probe's fitted speeds predict (pdl/balance)."""

from __future__ import annotations

import ast

import pytest

import cpu_quota
from engines_harness import Recorder

pytestmark = [pytest.mark.integration, pytest.mark.timing]

#: How much slower each rank is: 1x, 2x, 4x.
SLOWDOWN = (1, 2, 4)

#: Models: a small MLP, whose compute the delay dwarfs; a small CNN, whose compute is
#: large for its few weights (so that the all-reduce and the optimizer stay small on a
#: quarter of a core), on images large enough that the slowest rank's even step lasts
#: some 20 quota periods (cpu_quota.PERIOD_US): a step of a few periods is decided by
#: where in its period each rank is throttled, not by the quotas.
MLP = ("torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))",
       (4, 4, 4))
CNN = ("torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3, "
       "padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 1))",
       (3, 32, 32))

#: The cell: a small DDP model; ``delay_s`` a second per image times the rank's
#: slowdown in the forward pass (0: none); ``samples`` images, at least 15 global
#: batches. Times 12 steps of each split, in turn, after 3 warm-up steps; returns (even
#: step s, balanced step s, the balanced plan's predicted step s, the balanced batches).
CELL = """
import statistics, time, torch
import pdl
from pdl.balance.batches import BalancedBatches
from pdl.balance.plan import even_split
torch.set_num_threads(1)
torch.manual_seed(0)
delay = {delay_s} * {slowdown!r}[rank]
model = {model}
net = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
x, y = torch.randn({samples}, *{shape!r}), torch.randn({samples}, 1)

def forward(module, idx):
    out = module(x[idx])
    if delay:
        time.sleep(delay * len(idx))
    return torch.nn.functional.mse_loss(out, y[idx])

def probe(b):
    forward(model, torch.arange(b)).backward()
    model.zero_grad()

def step_time(step):
    started = time.perf_counter()
    opt.zero_grad()
    for part in step.parts(net, opt):
        part.scaled(forward(net, part.indices)).backward()
    opt.step()
    return time.perf_counter() - started

def step_times(first, second):
    # the two splits' steps in turn, so that a core that speeds up or slows down for
    # seconds (a shared virtual machine's) weighs on both alike
    times = []
    for one, other in zip(first.epoch(0), second.epoch(0)):
        times.append((step_time(one), step_time(other)))
        if len(times) == 15:
            break
    return tuple(statistics.median(split[3:]) for split in zip(*times))

GLOBAL = {global_batch}
even = BalancedBatches({samples}, even_split(GLOBAL, world_size), rank=rank, rebalance_every=0)
balanced = pdl.balanced_batches({samples}, GLOBAL, probe=probe, mode="on", rebalance_every=0, log=None)
(*step_times(even, balanced), balanced.plan.predicted_step_s(), list(balanced.plan.batches))
"""


def measure(session, model, **settings) -> tuple[float, float, float, list[int]]:
    code = CELL.format(slowdown=SLOWDOWN, model=model[0], shape=model[1], **settings)
    result = session.run(code, 3, out=Recorder(), err=Recorder(), balance="on")
    rows = [ast.literal_eval(v) for v in result.values]
    even = max(r[0] for r in rows)  # the step ends on every rank with the slowest one
    balanced = max(r[1] for r in rows)
    assert len({tuple(r[3]) for r in rows}) == 1 and len({r[2] for r in rows}) == 1  # one plan on every rank
    return even, balanced, rows[0][2], rows[0][3]


def test_a_slower_gpu_gets_a_smaller_share_and_the_step_speeds_up_as_the_model_says(pdl_session):
    even, balanced, ideal, batches = measure(pdl_session, MLP, delay_s=0.002, global_batch=96, samples=4096)
    assert batches[0] > batches[1] > batches[2] and sum(batches) == 96
    assert even / balanced >= 1.8, (even, balanced, batches)
    assert abs(balanced - ideal) <= 0.10 * ideal, (balanced, ideal, batches)


@pytest.mark.skipif(cpu_quota.problem() is not None, reason=str(cpu_quota.problem()))
def test_engines_on_cpu_quotas_get_shares_to_their_quotas(pdl_session):
    """The same on real compute: each engine limited to 0.6, 0.3 and 0.15 of a core
    (on a two-core machine, rank 0 on one core, ranks 1 and 2 on the other). The
    shares follow the quotas and the step is at least 1.5x faster (2.3x ideally). The
    model's prediction is not held to 10% here: under a quota the engine's other threads
    (ipyparallel's heartbeat and sockets) and DDP's hooks take a share of the core that
    the probe of the bare module does not see."""
    ranks = {r.rank: r.engine_id for r in pdl_session.world(3)}
    pids = pdl_session.engines.pids()
    shares = {pids[ranks[rank]]: 0.6 / slow for rank, slow in enumerate(SLOWDOWN)}
    with cpu_quota.quotas(shares):
        even, balanced, ideal, batches = measure(pdl_session, CNN, delay_s=0, global_batch=384, samples=6144)
    assert batches[0] > batches[1] > batches[2] and sum(batches) == 384, (even, balanced, ideal, batches)
    assert even / balanced >= 1.5, (even, balanced, batches)
