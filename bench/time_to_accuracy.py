"""Time to a target test accuracy, end to end in ``%%distributed`` cells: PDL's recipe vs pytorch-cifar's.

    .venv/bin/python bench/time_to_accuracy.py [-n 2] [--target 0.80] [--per-class 300] [--epochs 10] [--peer-epochs 10]

Both recipes run as one cell each on the same ``-n`` engines of a local PDL
cluster (this machine's GPUs, or CPU slots), on the same PNG folder (the
synthetic sample, or the real CINIC-10 at ``$CINIC10_DIR``), with DDP:

- **PDL**: the split cache loaded onto each rank's device, ``pdl_cinic10.train.fit``
  with its recipe (label smoothing, Nesterov, warmup + cosine, flip TTA; bf16,
  channels_last and torch.compile on a GPU) on a ResNet-18 of ``--width`` (16).
- **Peer** (``bench/peers.py``): pytorch-cifar's ``main.py``: ImageFolder + PIL,
  DataLoader (2 workers per rank), fp32 ResNet-18 of ``--peer-width`` (64, the
  standard model), SGD lr 0.1 with cosine annealing over ``--peer-epochs``.

The clock starts when the cell starts (data loading, model building and
evaluation count) and stops at the end of the first epoch whose test accuracy
reaches ``--target``. The split cache is built before either cell runs (a
one-time cost per node; ``bench/data_pipeline.py`` reports it). Prints a table
and the ratio of the peer's time to PDL's (> 1: PDL is faster).
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import platform
import sys
from pathlib import Path

from _common import local_slots
from peers import bench_root

BENCH = str(Path(__file__).resolve().parent)

PDL_CELL = """
import time
t0 = time.perf_counter()
import torch
from pdl_cinic10.cache import load
from pdl_cinic10.model import ResNet18
from pdl_cinic10.train import Hyper, fit
train, test = load({root!r}, "train", device=device), load({root!r}, "test", device=device)
torch.manual_seed(0)
hp = Hyper(epochs={epochs}, width={width}, batch_size={batch})
tested_at = []  # rank 0's log is called after each epoch's test
result = fit(ResNet18(width=hp.width), train, test, hp, device=device,
             log=lambda line: tested_at.append(time.perf_counter() - t0))
[(h["test_acc"], t) for h, t in zip(result["history"], tested_at)]
"""

PEER_CELL = """
import sys, time
t0 = time.perf_counter()
sys.path.insert(0, {bench!r})
import torch
from peers import peer_fit
from pdl_cinic10.model import ResNet18
torch.manual_seed(0)
epochs_at = []
peer_fit(ResNet18(width={width}), {root!r}, epochs={epochs}, batch_size=128, workers=2, device=device,
         on_epoch=lambda r: epochs_at.append((r["test_acc"], time.perf_counter() - t0)))
epochs_at
"""


def main(argv=None) -> float:
    """Run the benchmark; return peer time / PDL time to the target (0 if PDL missed it)."""
    args = _parse(argv)
    from pdl_cinic10.cache import load
    from pdl_magics import DistributedSession

    root = str(bench_root(args.per_class))
    load(root, "train"), load(root, "test")  # build the cache once, before the clocks
    pool = local_slots(args.n)
    session = DistributedSession(local_slots=pool)
    try:
        device = ast.literal_eval(session.run("str(device)", args.n, out=io.StringIO()).values[0])
        pdl = _curve(session, args.n, PDL_CELL.format(root=root, epochs=args.epochs, width=args.width,
                                                      batch=args.batch))
        print("pdl ", _fmt(pdl), flush=True)
        peer = _curve(session, args.n, PEER_CELL.format(bench=BENCH, root=root, epochs=args.peer_epochs,
                                                        width=args.peer_width))
        print("peer", _fmt(peer), flush=True)
    finally:
        session.close()

    print(f"\n{args.n} ranks on {device} ({os.cpu_count()} cores, {platform.processor() or platform.machine()}), "
          f"data {root}, target test accuracy {args.target:.0%}\n")
    print("| recipe | time to target (s) | epochs | accuracy then | best accuracy | total time (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = {"pdl": (f"PDL: ResNet-18 width {args.width}, batch {args.batch}/rank", pdl),
            "peer": (f"pytorch-cifar: ResNet-18 width {args.peer_width}, batch 128/rank", peer)}
    reached = {}
    for key, (label, curve) in rows.items():
        hit = next(((i + 1, acc, t) for i, (acc, t) in enumerate(curve) if acc >= args.target), None)
        reached[key] = hit[2] if hit else None
        when = f"{hit[2]:.1f}" if hit else f"not reached (> {curve[-1][1]:.1f})"
        print(f"| {label} | {when} | {hit[0] if hit else '-'} | {f'{hit[1]:.1%}' if hit else '-'} | "
              f"{max(a for a, _ in curve):.1%} | {curve[-1][1]:.1f} |")
    if reached["pdl"] is None:
        print("\nPDL's recipe did not reach the target: no ratio")
        return 0.0
    peer_time = reached["peer"] if reached["peer"] is not None else peer[-1][1]
    bound = "" if reached["peer"] is not None else " (at least: the peer never reached it)"
    ratio = peer_time / reached["pdl"]
    print(f"\nratio pytorch-cifar / PDL (time to {args.target:.0%}): {ratio:.2f}{bound}")
    return ratio


def _curve(session, n: int, cell: str) -> list[tuple[float, float]]:
    """Run ``cell``; rank 0's [(test accuracy 0..1, seconds since the cell started)] per epoch."""
    result = session.run(cell, n, out=io.StringIO())
    return ast.literal_eval(result.values[0])


def _fmt(curve) -> str:
    return "  ".join(f"{acc:.1%}@{t:.0f}s" for acc, t in curve)


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=2, help="ranks (engines); default 2")
    p.add_argument("--target", type=float, default=0.80, help="test accuracy 0..1 to reach; default 0.80")
    p.add_argument("--per-class", type=int, default=300, help="synthetic train images per class; default 300")
    p.add_argument("--epochs", type=int, default=10, help="PDL recipe's epochs; default 10")
    p.add_argument("--width", type=int, default=16, help="PDL recipe's ResNet-18 width; default 16")
    p.add_argument("--batch", type=int, default=64, help="PDL recipe's images per rank per step; default 64")
    p.add_argument("--peer-epochs", type=int, default=10, help="pytorch-cifar's epochs; default 10")
    p.add_argument("--peer-width", type=int, default=64, help="pytorch-cifar's ResNet-18 width; default 64")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(0 if main() > 0 else 1)
