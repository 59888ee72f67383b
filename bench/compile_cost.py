"""torch.compile on or off in PDL's recipe, on a GPU: what compiling costs and what it gives back.

    python bench/compile_cost.py [--cinic-size 90000] [--epochs 4]

Runs ``fit`` in this process on this machine's first GPU, each case twice, compile
on then off, with ``Hyper.for_data``'s settings (bf16 and channels_last on):

- **digits, width 16 and width 64**: the real digits (``pdl_cinic10.digits``),
  each run to its default epochs; the time to 97 % test accuracy counts from the
  call (the model's first steps, compiling, every evaluation).
- **CINIC-sized**: ``--cinic-size`` random 32x32 images in memory (throughput only),
  width 64, ``--epochs`` epochs.

Prints a table (first epoch, median later epoch, seconds to 97 %) and, per case,
the ratio compile-off time / compile-on time to 97 % (digits) or of the whole run
(CINIC-sized): above 1 compiling paid. Without a CUDA GPU it says so in one line
and exits 0 (``fit`` never compiles on a CPU).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main(argv=None) -> dict[str, float]:
    args = _parse(argv)
    import torch

    if not torch.cuda.is_available():
        print("compile_cost: no CUDA GPU here; fit compiles only on a GPU, so there is nothing to compare")
        return {}
    from _common import real_images_root
    from pdl_cinic10.cache import load

    device = torch.device("cuda")
    root = str(real_images_root())
    digits = load(root, "train", device=device), load(root, "test", device=device)
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (args.cinic_size, 3, 32, 32), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (args.cinic_size,), generator=generator)
    big = (images.to(device), labels.to(device)), (images[:2000].to(device), labels[:2000].to(device))
    cases = {"digits, width 16": (digits, {}), "digits, width 64": (digits, {"width": 64}),
             f"{args.cinic_size:,} CINIC-sized images, width 64": (big, {"width": 64, "epochs": args.epochs})}
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, data {root}\n")
    print("| case | compile | batch | first epoch (s) | later epochs, median (s) | 97 % after (s) | total (s) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    ratios = {}
    for name, ((train, test), settings) in cases.items():
        measured = {}
        for compile_on in (True, False):
            measured[compile_on] = run = _fit(train, test, compile=compile_on, **settings)
            print(f"| {name} | {'on' if compile_on else 'off'} | {run['batch']} | {run['epochs'][0]:.1f} | "
                  f"{statistics.median(run['epochs'][1:]):.2f} | "
                  f"{f'{run[0.97]:.1f}' if run[0.97] is not None else 'not reached'} | {run['total']:.1f} |",
                  flush=True)
        key = 0.97 if name.startswith("digits") else "total"
        if measured[True][key] is not None and measured[False][key] is not None:
            ratios[name] = measured[False][key] / measured[True][key]
    print()
    for name, ratio in ratios.items():
        print(f"ratio compile off / on ({name}, {'time to 97 %' if name.startswith('digits') else 'whole run'}): "
              f"{ratio:.2f}")
    return ratios


def _fit(train, test, **settings) -> dict:
    """One run of fit: each epoch's seconds, the seconds to 97 % (None: never), the total."""
    import torch

    from pdl_cinic10.model import ResNet18
    from pdl_cinic10.train import Hyper, fit

    started = time.perf_counter()
    hp = Hyper.for_data(len(train[1]), 1, **settings)
    torch.manual_seed(0)
    tested_at = []
    history = fit(ResNet18(width=hp.width), train, test, hp, device=train[0].device,
                  log=lambda _: tested_at.append(time.perf_counter() - started))["history"]
    return {"batch": hp.batch_size, "epochs": [r["seconds"] for r in history],
            0.97: next((t for r, t in zip(history, tested_at) if r["test_acc"] >= 0.97), None),
            "total": time.perf_counter() - started}


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cinic-size", type=int, default=90_000, help="CINIC-sized images in memory; default 90000")
    p.add_argument("--epochs", type=int, default=4, help="epochs of the CINIC-sized case; default 4")
    return p.parse_args(argv)


if __name__ == "__main__":
    main()
    sys.exit(0)
