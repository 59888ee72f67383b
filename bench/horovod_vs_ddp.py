"""Training-step throughput: Horovod vs torch DDP, on the same engines, model and batch.

    .venv/bin/python bench/horovod_vs_ddp.py [-n 2] [--batch 64] [--width 16] [--steps 20] [--repeats 3]

Starts a local PDL cluster (``-n`` engines over this machine's GPUs, or CPU
slots), then alternates the two backends ``--repeats`` times. Each run builds
the CINIC-10 ResNet-18 from the same seed, wraps it the way ``pdl_cinic10.train.fit``
does (DDP, or ``hvd.DistributedOptimizer`` + broadcasts), runs ``--warmup``
untimed SGD steps on a fixed random batch, then times ``--steps`` steps. A
step is forward, backward (gradient all-reduce), optimizer step. Throughput is
images/s over all ranks, from the slowest rank's time. Prints a table (median,
min, max over repeats) and the ratio Horovod / DDP of the medians.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import platform
import statistics
import sys

from _common import local_slots

STEP_CELL = """
import time, torch
from pdl.collectives import for_backend
from pdl_cinic10.model import ResNet18

comm = for_backend({backend!r})
torch.manual_seed(0)
module = ResNet18(width={width}).to(device)
optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
net, optimizer = comm.distribute(module, optimizer)
x = torch.randn({batch}, 3, 32, 32, device=device)
y = torch.randint(0, 10, ({batch},), device=device)
loss_fn = torch.nn.CrossEntropyLoss()

def step():
    optimizer.zero_grad()
    loss_fn(net(x), y).backward()
    optimizer.step()

def sync():
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    comm.all_reduce_(torch.zeros(1, device=device))  # a barrier

for _ in range({warmup}):
    step()
sync()
started = time.perf_counter()
for _ in range({steps}):
    step()
sync()
elapsed = torch.tensor(time.perf_counter() - started, device=device)
comm.all_reduce_(elapsed, "max")
del net, optimizer, module
{batch} * world_size * {steps} / elapsed.item()
"""

BACKENDS = {"torch": "DDP (torch.distributed)", "horovod": "Horovod"}


def main(argv=None) -> float:
    """Run the benchmark; return the ratio Horovod / DDP of median images/s."""
    args = _parse(argv)
    from pdl_magics import DistributedSession

    pool = local_slots(args.n)
    session = DistributedSession(local_slots=pool)
    results: dict[str, list[float]] = {b: [] for b in BACKENDS}
    try:
        device = ast.literal_eval(session.run("str(device)", args.n, out=io.StringIO()).values[0])
        for repeat in range(args.repeats):
            for backend in BACKENDS:
                cell = STEP_CELL.format(backend=backend, **vars(args))
                value = session.run(cell, args.n, backend=backend, out=io.StringIO()).values[0]
                results[backend].append(float(value))
                print(f"repeat {repeat + 1}/{args.repeats}  {backend:<8} {float(value):8.1f} img/s", flush=True)
    finally:
        session.close()

    _header(args, device)
    print("| backend | img/s (median) | min | max | ms/step |")
    print("|---|---:|---:|---:|---:|")
    medians = {}
    for backend, label in BACKENDS.items():
        runs = results[backend]
        medians[backend] = statistics.median(runs)
        ms = 1000 * args.batch * args.n / medians[backend]
        print(f"| {label} | {medians[backend]:.1f} | {min(runs):.1f} | {max(runs):.1f} | {ms:.1f} |")
    ratio = medians["horovod"] / medians["torch"]
    print(f"\nratio Horovod / DDP (median img/s): {ratio:.2f}")
    return ratio


def _header(args, device: str) -> None:
    import torch

    try:
        import horovod

        hvd_version = horovod.__version__
    except ImportError:
        hvd_version = "not installed"
    print(
        f"\n{args.n} ranks on {device} ({os.cpu_count()} cores, {platform.processor() or platform.machine()}), "
        f"ResNet-18 width {args.width}, batch {args.batch} per rank, {args.steps} timed steps "
        f"after {args.warmup}, {args.repeats} repeats; torch {torch.__version__}, horovod {hvd_version}\n"
    )


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=2, help="ranks (engines); default 2")
    p.add_argument("--batch", type=int, default=64, help="images per rank per step; default 64")
    p.add_argument("--width", type=int, default=16, help="ResNet-18 width; default 16")
    p.add_argument("--steps", type=int, default=20, help="timed steps per run; default 20")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first; default 5")
    p.add_argument("--repeats", type=int, default=3, help="runs per backend, alternating; default 3")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(0 if main() > 0 else 1)
