"""Time to a target test accuracy on real images: PDL's recipe vs the seed's pytorch-cifar recipe.

    .venv/bin/python bench/time_to_accuracy.py [-n WORKERS] [--targets 0.97 0.98] [--root DIR]
                                               [--peer-epochs 20] [--peer-width 64] [--skip-peer]

The data is real: by default scikit-learn's handwritten digits written into
CINIC-10's layout (:mod:`pdl_cinic10.digits`, 1,078 train / 360 test images, made
once under ``~/.cache/pdl/bench/digits``); ``--root`` (or ``$CINIC10_DIR``) names
another folder in that layout, e.g. the real CINIC-10. Three rows, one run, one
machine, the same images:

- **pytorch-cifar, the seed's settings** (``bench/peers.py``): ResNet-18 width 64,
  SGD lr 0.01, batch 100, cosine over 200 epochs as ``main.py`` has it, fp32, PIL
  decoding each PNG in a DataLoader of 2 workers, in one process that uses every core
  (a subprocess of this script; its clock starts once torch is imported).
- **PDL, the same ResNet-18**: ``%%distributed`` on ``-n`` workers (default: one a
  core, or every GPU), :meth:`Hyper.for_data` with the width held at 64.
- **PDL, its own choice**: :meth:`Hyper.for_data` as the notebook uses it (its
  network width too).

PDL's clock starts when its cell starts: loading the cached splits, building the
model, training and each epoch's evaluation all count (the split cache is built
before any clock, a one-time cost per node that ``bench/data_pipeline.py``
reports). Every row stops at the first epoch that reaches the highest target.
Prints the table and the ratios peer time / PDL time (> 1: PDL is sooner).
``--skip-peer`` leaves the peer's row out (no ratios): the GPU check uses it, since on
a GPU the peer's PIL pipeline takes most of the run's time.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import sys
from pathlib import Path

from _common import local_slots, machine, real_images_root, run_script

BENCH = str(Path(__file__).resolve().parent)

PDL_CELL = """
import time
t0 = time.perf_counter()
import torch
from pdl_cinic10.cache import load
from pdl_cinic10.model import ResNet18
from pdl_cinic10.train import Hyper, fit
train, test = load({root!r}, "train", device=device), load({root!r}, "test", device=device)
hp = Hyper.for_data(len(train[1]), world_size, width={width!r})
torch.manual_seed(hp.seed)
tested_at = []  # rank 0's log is called after each epoch's test
result = fit(ResNet18(width=hp.width), train, test, hp, device=device, stop_at={stop_at!r},
             log=lambda line: tested_at.append(time.perf_counter() - t0))
{{"curve": [(h["test_acc"], t) for h, t in zip(result["history"], tested_at)],
  "width": hp.width, "batch": hp.batch_size * world_size, "epochs": hp.epochs}}
"""

PEER_SCRIPT = """
import json, sys, time
import torch
t0 = time.perf_counter()
sys.path.insert(0, {bench!r})
from peers import peer_fit
from pdl_cinic10.model import ResNet18
torch.manual_seed(0)
curve = []
peer_fit(ResNet18(width={width}), {root!r},
         epochs={epochs}, batch_size=100, workers=2, lr=0.01, schedule_epochs=200, stop_at={stop_at!r},
         on_epoch=lambda r: curve.append((r["test_acc"], time.perf_counter() - t0)))
print("RESULT", json.dumps(curve))
"""


def main(argv=None) -> dict:
    """Run the benchmark; return {"ratios": {"<row> <target>": peer time / that row's
    time, for every target both reached}, "own_reached": whether PDL's own choice
    reached every target}."""
    args = _parse(argv)
    from pdl_cinic10.cache import load
    from pdl_magics import DistributedSession

    root = str(real_images_root(args.root))
    load(root, "train"), load(root, "test")  # build the cache once, before the clocks
    stop_at = max(args.targets)
    peer = None if args.skip_peer else _peer_curve(root, args.peer_width, args.peer_epochs, stop_at)
    if peer is not None:
        print("peer", _fmt(peer), flush=True)

    pool = local_slots(args.n)
    session = DistributedSession(local_slots=pool)
    try:
        device = ast.literal_eval(session.run("str(device)", args.n, out=io.StringIO()).values[0])
        same = _pdl(session, args.n, PDL_CELL.format(root=root, width=args.peer_width, stop_at=stop_at))
        print("pdl ", _fmt(same["curve"]), flush=True)
        own = _pdl(session, args.n, PDL_CELL.format(root=root, width=None, stop_at=stop_at))
        print("pdl ", _fmt(own["curve"]), flush=True)
    finally:
        session.close()

    workers = f"{args.n} worker{'s' if args.n != 1 else ''}"
    print(f"\n{machine()}\nPDL: {workers} on {device}; pytorch-cifar: one process, "
          f"{os.cpu_count()} threads; data {root}\n")
    targets = sorted(args.targets)
    print("| recipe | network | " + " | ".join(f"time to {t:.0%} (s)" for t in targets)
          + " | best accuracy | total (s) |")
    print("|---|---|" + "---:|" * len(targets) + "---:|---:|")
    rows = {
        "peer": ("pytorch-cifar, seed's settings: lr 0.01, batch 100, 1 process",
                 f"ResNet-18 width {args.peer_width}", peer),
        "same": (f"PDL, same network: batch {same['batch']}, {workers}",
                 f"ResNet-18 width {same['width']}", same["curve"]),
        "own": (f"PDL, its own choice: batch {own['batch']}, {workers}",
                f"ResNet-18 width {own['width']}", own["curve"]),
    }
    if peer is None:
        del rows["peer"]
    reached = {key: {t: _reached(curve, t) for t in targets} for key, (_, _, curve) in rows.items()}
    for key, (label, network, curve) in rows.items():
        times = [f"{hit[1]:.1f} (epoch {hit[0]})" if hit else "not reached" for hit in reached[key].values()]
        print(f"| {label} | {network} | " + " | ".join(times)
              + f" | {max(a for a, _ in curve):.1%} | {curve[-1][1]:.1f} |")
    print()
    ratios = {}
    for key in ("own", "same") if peer is not None else ():
        for t in targets:
            mine, theirs = reached[key][t], reached["peer"][t]
            if mine and theirs:
                ratios[f"{key} {t}"] = theirs[1] / mine[1]
                print(f"ratio pytorch-cifar / PDL {'own choice' if key == 'own' else 'same network'} "
                      f"(time to {t:.0%}): {theirs[1] / mine[1]:.2f}")
            else:
                who = "PDL" if not mine else "pytorch-cifar"
                print(f"no ratio for PDL {'own choice' if key == 'own' else 'same network'} at {t:.0%}: "
                      f"{who} did not reach it")
    return {"ratios": ratios, "own_reached": all(reached["own"].values())}


def _peer_curve(root: str, width: int, epochs: int, stop_at: float) -> list[tuple[float, float]]:
    """The peer's [(test accuracy, seconds)] per epoch, from its own process."""
    script = PEER_SCRIPT.format(bench=BENCH, root=root, width=width, epochs=epochs, stop_at=stop_at)
    return [tuple(point) for point in run_script(script, "pytorch-cifar")]


def _pdl(session, n: int, cell: str) -> dict:
    """Rank 0's result of ``cell``: {"curve", "width", "batch", "epochs"}."""
    return ast.literal_eval(session.run(cell, n, out=io.StringIO()).values[0])


def _reached(curve, target: float) -> tuple[int, float] | None:
    """(epoch, seconds) of the first epoch at or above ``target``; None if none."""
    return next(((i + 1, t) for i, (acc, t) in enumerate(curve) if acc >= target), None)


def _fmt(curve) -> str:
    return "  ".join(f"{acc:.1%}@{t:.0f}s" for acc, t in curve)


def _parse(argv):
    from pdl.slots import default_pool

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=len(default_pool()),
                   help="PDL's workers; default: every GPU, else one a core")
    p.add_argument("--targets", type=float, nargs="+", default=[0.97, 0.98],
                   help="test accuracies 0..1 to time; default 0.97 0.98")
    p.add_argument("--root", help="CINIC-10-layout folder; default $CINIC10_DIR, else the digits set")
    p.add_argument("--peer-epochs", type=int, default=20, help="pytorch-cifar's epochs at most; default 20")
    p.add_argument("--peer-width", type=int, default=64,
                   help="the seed's ResNet-18 width, also PDL's same-network row; default 64")
    p.add_argument("--skip-peer", action="store_true", help="PDL's two rows only (no ratios)")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(0 if main()["own_reached"] else 1)
