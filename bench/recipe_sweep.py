"""One training run of the recipe on real images, one line of results: how the
recipe's choices were measured (docs/benchmarks.md, "The recipe on real images").

    .venv/bin/python bench/recipe_sweep.py [world=N] [stop=ACCURACY] [root=DIR] [FIELD=VALUE ...]

``Hyper.for_data`` chooses every setting for the data (default: the real digits,
``pdl_cinic10.digits``) and ``world`` ranks (default 1); ``FIELD=VALUE`` overrides
any of ``Hyper``'s fields, as the notebook's environment variables do. One process
stands in for the ``world`` ranks: it trains with their global batch, so the
schedule, the learning rate and the steps are those of the distributed run (only
BatchNorm sees the global batch rather than each rank's share). ``stop`` ends the
run at the first epoch that reaches that test accuracy.

Prints the settings, each epoch's training loss and test accuracy, the epoch and
the seconds at which 97 % and 98 % were first reached, and the total time.
"""

from __future__ import annotations

import sys
import time


def main(argv: list[str]) -> dict:
    started = time.perf_counter()
    import torch

    import pdl
    from _common import real_images_root
    from pdl_cinic10.cache import load
    from pdl_cinic10.model import ResNet18
    from pdl_cinic10.train import Hyper, fit

    try:
        settings = dict(arg.split("=", 1) for arg in argv)
    except ValueError:
        sys.exit("usage: recipe_sweep.py [world=N] [stop=ACCURACY] [root=DIR] [FIELD=VALUE ...]")
    world = int(settings.pop("world", 1))
    stop = settings.pop("stop", None)
    root = str(real_images_root(settings.pop("root", None)))
    train, test = load(root, "train"), load(root, "test")
    hp = Hyper.for_data(len(train[1]), world, **settings)
    hp.batch_size *= world  # one process standing in for `world` ranks
    torch.manual_seed(hp.seed)
    tested_at = []
    pdl.log = lambda **_: None  # one line at the end, not a progress bar
    history = fit(ResNet18(width=hp.width), train, test, hp, device="cpu", stop_at=float(stop) if stop else None,
                  log=lambda _: tested_at.append(time.perf_counter() - started))["history"]

    def first(target: float) -> str:
        return next((f"epoch {r['epoch']} at {t:.0f} s" for r, t in zip(history, tested_at)
                     if r["test_acc"] >= target), "not reached")

    print(" ".join(argv) or "(defaults)",
          f"| width {hp.width}, global batch {hp.batch_size}, {hp.epochs} epochs",
          "| train loss " + " ".join(f"{r['train_loss']:.2f}" for r in history),
          "| test acc % " + " ".join(f"{100 * r['test_acc']:.0f}" for r in history),
          f"| 97 %: {first(0.97)} | 98 %: {first(0.98)} | total {time.perf_counter() - started:.0f} s")
    return {"history": history}


if __name__ == "__main__":
    main(sys.argv[1:])
