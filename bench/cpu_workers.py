"""CPU workers vs one process with as many threads: does splitting the cores into
PDL workers cost training speed?

    .venv/bin/python bench/cpu_workers.py [-n CORES] [--epochs 3] [--repeats 3] [--root DIR]

Both train the same network on the same real images with the same global batch, as
:meth:`Hyper.for_data` chooses for ``-n`` workers (default: one a core):

- **PDL**: ``%%distributed`` on ``-n`` CPU workers of a local cluster whose pool is
  this machine's cores (each engine pinned to its core, one thread), ``fit``.
- **One process**: ``fit`` in one process (a subprocess of this script) with
  ``torch.set_num_threads(n)`` and the whole global batch.

The figure is the training images per second of the last epoch (``fit``'s
``images_per_sec``: training steps only, not evaluation), the median of
``--repeats`` runs, the two alternating which goes first. Prints the table and the
ratio PDL / one process (1 = splitting costs nothing).
"""

from __future__ import annotations

import argparse
import ast
import io
import sys

from _common import machine, median_table, real_images_root, run_script

FIT = """
import torch
from pdl_cinic10.cache import load
from pdl_cinic10.model import ResNet18
from pdl_cinic10.train import Hyper, fit
train, test = load({root!r}, "train"), load({root!r}, "test")
hp = Hyper.for_data(len(train[1]), {workers}, epochs={epochs}, tta=False)
hp.batch_size = hp.batch_size * {workers} // world_size   # the same global batch however many ranks
torch.manual_seed(0)
result = fit(ResNet18(width=hp.width), train, test, hp, device="cpu", log=lambda line: None)
measured = (result["history"][-1]["images_per_sec"], hp.width, hp.batch_size * world_size)
"""
#: PDL's cell: FIT, whose last expression is rank 0's result.
PDL_CELL = FIT + "measured\n"
#: The one-process run: FIT with every thread, printing its result.
ONE_PROCESS = "import json, torch\ntorch.set_num_threads({workers})\nworld_size = 1\n" + FIT \
    + "print('RESULT', json.dumps(measured))\n"


def main(argv=None) -> float:
    """Run the benchmark; return PDL's images/s over one process's."""
    args = _parse(argv)
    from pdl_cinic10.cache import load
    from pdl_magics import DistributedSession

    root = str(real_images_root(args.root))
    load(root, "train"), load(root, "test")
    cell = PDL_CELL.format(root=root, workers=args.n, epochs=args.epochs)
    alone = ONE_PROCESS.format(root=root, workers=args.n, epochs=args.epochs)
    session = DistributedSession(local_slots=[f"cpu:{i}" for i in range(args.n)], preflight=False)
    runs = {"pdl": [], "one": []}
    shape = None
    try:
        for repeat in range(args.repeats):
            for key in (("pdl", "one") if repeat % 2 == 0 else ("one", "pdl")):
                if key == "pdl":
                    ips, width, batch = ast.literal_eval(session.run(cell, args.n, out=io.StringIO()).values[0])
                else:
                    ips, width, batch = run_script(alone, "one-process", env={"OMP_NUM_THREADS": ""})
                runs[key].append(ips)
                shape = (width, batch)
                print(f"{key} {ips:.0f} img/s", flush=True)
    finally:
        session.close()
    print(f"\n{machine()}\nResNet-18 width {shape[0]}, global batch {shape[1]}, data {root}\n")
    return median_table(("training on the CPU", "img/s (median)"),
                        {"pdl": f"PDL: {args.n} workers, one core and thread each",
                         "one": f"one process, {args.n} threads"},
                        runs, f"PDL {args.n} workers / one process {args.n} threads")


def _parse(argv):
    from pdl.slots import cpu_count

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=cpu_count(), help="workers and threads; default: one a core")
    p.add_argument("--epochs", type=int, default=3, help="epochs a run; the last one is timed")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--root", help="CINIC-10-layout folder; default $CINIC10_DIR, else the digits set")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(0 if main() > 0 else 1)
