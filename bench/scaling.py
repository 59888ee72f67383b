"""Weak scaling of DDP training: PDL engines vs torchrun, same script, same placement.

    .venv/bin/python bench/scaling.py [--max-n 3] [--batch 32] [--width 16] [--steps 10] [--warmup 3] [--repeats 3]

One training function (:data:`TRAIN`) is run for N = 1 .. ``--max-n`` processes by
two launchers:

- **PDL**: a local :class:`~pdl_magics.DistributedSession` whose pool is
  ``--max-n`` slots (this machine's GPUs, else CPU slots); the function is
  sent as the cell, on the first N engines.
- **torchrun**: ``python -m torch.distributed.run --standalone --nproc_per_node N``
  (what ``torchrun`` runs) on a script made of :data:`WORKER` + :data:`TRAIN`.
  Each worker first applies the environment a PDL engine in slot ``LOCAL_RANK``
  of the same pool gets (:func:`pdl.slots.engine_env`: ``CUDA_VISIBLE_DEVICES``,
  ``OMP_NUM_THREADS``/``MKL_NUM_THREADS``, ``PDL_CPUS``) and pins itself with
  :func:`pdl.runtime.boot.pin_cpus`, before importing torch, as an engine does.
  The threads and cores each rank ends up with are printed for both launchers.

The function builds the CINIC-10 ResNet-18 (``--width``) from a fixed seed, wraps
it in DDP (NCCL on a GPU, gloo on the CPU), makes a fixed random batch of
``--batch`` CINIC-shaped uint8 images [B, 3, 32, 32] per rank (converted to float
in [0, 1] every step), runs ``--warmup`` untimed SGD steps, then times
``--steps`` steps (forward, backward with the gradient all-reduce, optimizer
step). Throughput is images/s over all ranks from the slowest rank's time; only
the steps are timed, not start-up. Each repeat runs every N under both
launchers, the launcher that goes first alternating between repeats.

Prints a table of median images/s, the weak-scaling efficiency
E(N) = ips(N) / (N * ips(1)) per launcher (per-rank work is fixed, so E = 1 is
perfect), and the ratio E_pdl(2) / E_torchrun(2).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import local_slots, machine

#: The training run both launchers execute; defines ``train``.
TRAIN = '''
def train(device, world_size, batch, width, warmup, steps):
    """Time DDP SGD steps; return {"ips": images/s over all ranks (slowest rank's time),
    "threads"/"interop": torch's intra-op/inter-op threads, "cpus": this process's cores,
    "device": str}."""
    import os, time
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from pdl_cinic10.model import ResNet18

    torch.manual_seed(0)
    module = ResNet18(width=width).to(device)
    net = DistributedDataParallel(module, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    images = torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8, device=device)
    labels = torch.randint(0, 10, (batch,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        optimizer.zero_grad()
        loss_fn(net(images.float().div_(255)), labels).backward()
        optimizer.step()

    def barrier():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.all_reduce(torch.zeros(1, device=device))

    for _ in range(warmup):
        step()
    barrier()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    barrier()
    elapsed = torch.tensor(time.perf_counter() - started, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"ips": batch * world_size * steps / elapsed.item(), "threads": torch.get_num_threads(),
            "interop": torch.get_num_interop_threads(), "cpus": cpus, "device": str(device)}
'''

#: Head of the torchrun script: argv = slots (comma-separated), result dir, train kwargs (JSON).
#: Places the worker as a PDL engine in its slot, forms the group, runs ``train``
#: (appended below) and writes ``<result dir>/<rank>.json``.
WORKER = '''
import json, os, sys
from pdl.runtime.boot import pin_cpus
from pdl.slots import engine_env

slots, result_dir, kwargs = sys.argv[1].split(","), sys.argv[2], json.loads(sys.argv[3])
os.environ.update(engine_env(slots[int(os.environ["LOCAL_RANK"])], slots))
pin_cpus()

import torch
import torch.distributed as dist

device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)
dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
'''

WORKER_TAIL = '''
result = train(device, dist.get_world_size(), **kwargs)
with open(os.path.join(result_dir, f"{dist.get_rank()}.json"), "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
# Skip interpreter teardown: gloo's threads can abort it ("terminate called without
# an active exception"), which torchrun reports as a failed run.
sys.stdout.flush()
os._exit(0)
'''

LAUNCHERS = ("pdl", "torchrun")


def main(argv=None) -> float:
    """Run the benchmark; return E_pdl(2) / E_torchrun(2) (median images/s)."""
    args = _parse(argv)
    from pdl_magics import DistributedSession

    ns = range(1, args.max_n + 1)
    slots = local_slots(args.max_n)
    kwargs = dict(batch=args.batch, width=args.width, warmup=args.warmup, steps=args.steps)
    ips = {(launcher, n): [] for launcher in LAUNCHERS for n in ns}
    placement = {}  # (launcher, n) -> per-rank results of the last run
    session = DistributedSession(local_slots=slots)
    with tempfile.TemporaryDirectory(prefix="pdl-scaling-") as tmp:
        script = Path(tmp, "worker.py")
        script.write_text(WORKER + TRAIN + WORKER_TAIL)
        try:
            for repeat in range(args.repeats):
                order = LAUNCHERS if repeat % 2 == 0 else LAUNCHERS[::-1]
                for launcher in order:
                    for n in ns:
                        if launcher == "pdl":
                            ranks = _run_pdl(session, n, kwargs)
                        else:
                            ranks = _run_torchrun(script, n, slots, kwargs, Path(tmp, f"r{repeat}n{n}"))
                        ips[launcher, n].append(ranks[0]["ips"])
                        placement[launcher, n] = ranks
                        print(f"repeat {repeat + 1}/{args.repeats}  {launcher:<8} N={n}  "
                              f"{ranks[0]['ips']:8.1f} img/s", flush=True)
        finally:
            session.close()

    med = {key: statistics.median(runs) for key, runs in ips.items()}
    eff = {(launcher, n): med[launcher, n] / (n * med[launcher, 1]) for launcher, n in med}
    _header(args, slots, placement)
    print("| N | PDL img/s (median, min–max) | torchrun img/s (median, min–max) "
          "| E_pdl(N) | E_torchrun(N) | PDL / torchrun img/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in ns:
        cells = [f"{med[l, n]:.1f} ({min(ips[l, n]):.1f}–{max(ips[l, n]):.1f})" for l in LAUNCHERS]
        print(f"| {n} | {cells[0]} | {cells[1]} | {eff['pdl', n]:.2f} | {eff['torchrun', n]:.2f} "
              f"| {med['pdl', n] / med['torchrun', n]:.2f} |")
    ratio = eff["pdl", 2] / eff["torchrun", 2]
    print(f"\nratio E_pdl(2) / E_torchrun(2): {ratio:.2f}")
    return ratio


def _run_pdl(session, n: int, kwargs: dict) -> list[dict]:
    """Run ``train`` as a cell on the first ``n`` engines; each rank's result."""
    call = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    values = session.run(f"{TRAIN}\ntrain(device, world_size, {call})", n, out=io.StringIO()).values
    return [ast.literal_eval(v) for v in values]


def _run_torchrun(script: Path, n: int, slots: list[str], kwargs: dict, result_dir: Path) -> list[dict]:
    """Run ``script`` under torchrun with ``n`` workers; each rank's result."""
    result_dir.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
           str(script), ",".join(slots), str(result_dir), json.dumps(kwargs)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun with {n} workers failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    return [json.loads(Path(result_dir, f"{rank}.json").read_text()) for rank in range(n)]


def _header(args, slots: list[str], placement: dict) -> None:
    """Machine, workload, and where each rank ran under each launcher (the largest N)."""
    n = args.max_n
    where = {
        launcher: "; ".join(f"rank {r}: {p['device']}, cores {p['cpus']}, threads {p['threads']}+{p['interop']}"
                            for r, p in enumerate(placement[launcher, n]))
        for launcher in LAUNCHERS
    }
    same = "same" if where["pdl"] == where["torchrun"] else "DIFFERENT"
    cores = [c for p in placement["pdl", n] for c in p["cpus"] or []]
    shared = len(cores) > len(set(cores))
    print(f"\nWeak scaling, ResNet-18 width {args.width}, batch {args.batch} per rank, {args.steps} "
          f"timed steps after {args.warmup}, {args.repeats} repeats; pool {','.join(slots)}; {machine()}")
    print(f"placement at N={n}, threads intra-op+inter-op ({same} for both launchers"
          f"{'; some ranks share cores: oversubscribed' if shared else ''}):")
    for launcher in LAUNCHERS:
        print(f"  {launcher}: {where[launcher]}")
    print()


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-n", type=int, default=3, help="largest number of ranks (>= 2); default 3")
    p.add_argument("--batch", type=int, default=32, help="images per rank per step; default 32")
    p.add_argument("--width", type=int, default=16, help="ResNet-18 width; default 16")
    p.add_argument("--steps", type=int, default=10, help="timed steps per run; default 10")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first; default 3")
    p.add_argument("--repeats", type=int, default=3, help="runs per launcher and N; default 3")
    args = p.parse_args(argv)
    if args.max_n < 2:
        p.error("--max-n must be at least 2")
    return args


if __name__ == "__main__":
    sys.exit(0 if main() > 0 else 1)
