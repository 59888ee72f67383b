"""Mixed workers: the CINIC-10 notebook on engines of unequal speed, each step's batch
split evenly (what plain DDP does) vs balanced to each engine's speed.

    .venv/bin/python bench/mixed_workers.py [--quotas 0.6,0.3,0.15] [--epochs 8] [--data DIR]

Needs root: each of three local CPU engines runs under a CPU quota of its own (a cgroup,
``tests/harness/cpu_quota.py``), the way a slower machine would be slower. The
notebook's training cells (``notebooks/cinic10_distributed.ipynb``), unchanged but for
their ``%%distributed`` line, run on real images (``--data``, else
``$CINIC10_DIR``, else scikit-learn's digits) three times from the same seed:

- **equal**: every engine at the quotas' mean, so the same CPU in all;
- **even split** (the peer): the unequal quotas, balancing off (``--no-balance``);
- **balanced**: the unequal quotas, the notebook's default (``auto``).

Prints one row per run: the split of the global batch fit settled on (its last line
on the split, or "even"), the median seconds an epoch, and the final test accuracy;
then the ratio of the even split's seconds an epoch to the balanced one's, and the
balanced run's accuracy less the equal run's.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import re
import statistics
from pathlib import Path

import nbformat

from _common import machine, positive_numbers, real_images_root, simulation

REPO = Path(__file__).resolve().parent.parent

NOTEBOOK = REPO / "notebooks" / "cinic10_distributed.ipynb"
RESULT = "(result['test_acc'], [h['seconds'] for h in result['history']])"


def training_cells() -> list[str]:
    """The notebook's ``%%distributed`` cells without that first line."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return [c.source.split("\n", 1)[1] for c in nb.cells
            if c.cell_type == "code" and c.source.startswith("%%distributed")]


def run_notebook(session, quotas: list[float], balance: str) -> dict:
    """One run of the notebook's cells on three engines under ``quotas`` (fractions of a
    core, by rank): ``{"split", "epoch_s", "acc"}``."""
    ranks = {r.rank: r.engine_id for r in session.world(3)}
    pids = session.engines.pids()
    log = io.StringIO()
    with simulation("cpu_quota", "mixed_workers").quotas({pids[ranks[rank]]: share for rank, share in enumerate(quotas)}, name="pdl-bench-quota"):
        for cell in training_cells():
            session.run(cell, 3, out=log, err=io.StringIO(), balance=balance, preflight=False)
        result = session.run(RESULT, 3, out=io.StringIO(), err=io.StringIO(), preflight=False)
    acc, seconds = ast.literal_eval(result.values[0])
    splits = re.findall(r"(?:as|now) ([\d, ]+?)(?: of \d+)?$", log.getvalue(), flags=re.M)
    return {"split": splits[-1] if splits else "even", "epoch_s": statistics.median(seconds), "acc": acc}


def main(argv=None) -> float:
    args = parse(argv)
    simulation("cpu_quota", "mixed_workers")  # exits here, in one line, where quotas cannot be set
    quotas = args.quotas
    if len(quotas) != 3 or not all(0 < q <= 1 for q in quotas):
        raise SystemExit(f"--quotas: three fractions of a core in (0, 1] are valid, got {args.quotas!r}")
    root = real_images_root(args.data)
    os.environ.update(CINIC10_DIR=str(root), CINIC10_EPOCHS=str(args.epochs), CINIC10_WIDTH=str(args.width))
    from pdl_magics import DistributedSession

    print(f"# mixed workers: {machine()}")
    print(f"# data {root}; {args.epochs} epochs, width {args.width}; quotas {quotas} of a core")
    mean = sum(quotas) / len(quotas)
    runs = {"equal": ([mean] * 3, "auto"), "even split": (quotas, "off"), "balanced": (quotas, "auto")}
    rows = {}
    session = DistributedSession(local_slots=[f"cpu:{i}" for i in range(3)], preflight=False)
    try:
        for name, (shares, balance) in runs.items():
            rows[name] = run_notebook(session, shares, balance)
    finally:
        session.close()
    print("| run | quotas (cores) | split of the batch | s / epoch (median) | test accuracy |")
    print("|---|---|---|---:|---:|")
    for name, row in rows.items():
        shares = ", ".join(f"{q:.2f}" for q in runs[name][0])
        print(f"| {name} | {shares} | {row['split']} | {row['epoch_s']:.1f} | {row['acc']:.1%} |")
    ratio = rows["even split"]["epoch_s"] / rows["balanced"]["epoch_s"]
    print(f"\nratio even split / balanced (s / epoch): {ratio:.2f}")
    print(f"accuracy balanced - equal: {(rows['balanced']['acc'] - rows['equal']['acc']) * 100:+.1f} points")
    return ratio


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quotas", type=positive_numbers, default="0.6,0.3,0.15", help="each engine's share of a core, by rank")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--width", type=int, default=16, help="the ResNet-18's width")
    p.add_argument("--data", help="real images in CINIC-10's layout (default: $CINIC10_DIR, else the digits)")
    return p.parse_args(argv)


if __name__ == "__main__":
    main()
