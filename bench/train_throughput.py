"""Training throughput per epoch: PDL's CINIC-10 recipe vs the pytorch-cifar style recipe.

    .venv/bin/python bench/train_throughput.py [--per-class 300] [--epochs 3] [--width auto] [--workers 2]
                                              [--in-memory]

The same ResNet-18 (``pdl_cinic10.model``, ``--width``: 64 on a GPU, 16 on a
CPU unless given) and the same PNG folder (the synthetic sample, or the real
CINIC-10 at ``$CINIC10_DIR``), in this process, on this machine's GPU or CPU.
``--in-memory``: the synthetic sample's images made in memory instead
(``pdl_cinic10.sample.sample_split``, the same pixels, no PNG written or decoded;
the peer then makes each a PIL image as torchvision's ``CIFAR10`` does), for a
machine with little time (the GPU check):

- **PDL**: ``pdl_cinic10.train.fit`` with its defaults: the split cache whole
  on the device, batched augmentation there, batch 256; on a GPU also bf16
  autocast and channels_last (torch.compile is off by default: it did not pay).
- **Peer** (``bench/peers.py``): pytorch-cifar's loop: PIL decode per sample in
  a DataLoader with ``--workers`` workers, batch 128, fp32, plain SGD.

Images/s are training images over training time (evaluation excluded), median
over the epochs after the first (which pays for start-up and compilation).
Prints a table and the ratio PDL / peer.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

import torch

from _common import median_table
from peers import bench_root, peer_fit


def main(argv=None) -> float:
    """Run the benchmark; return the ratio PDL / peer of median training images/s."""
    args = _parse(argv)
    from pdl_cinic10.cache import load
    from pdl_cinic10.model import ResNet18
    from pdl_cinic10.sample import sample_split
    from pdl_cinic10.train import Hyper, fit

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    width = args.width or (64 if device.type == "cuda" else 16)
    if args.in_memory:
        arrays = {"train": sample_split("train", args.per_class),
                  "test": sample_split("test", max(40, args.per_class // 5))}
        root, source = arrays, "the synthetic sample, in memory"
        train, test = (tuple(torch.from_numpy(a).to(device) for a in (x.transpose(0, 3, 1, 2).copy(), y))
                       for x, y in (arrays["train"], arrays["test"]))
    else:
        root = source = bench_root(args.per_class)
        train, test = load(root, "train", device=device), load(root, "test", device=device)

    torch.manual_seed(0)
    hp = Hyper(epochs=args.epochs, width=width)
    pdl = fit(ResNet18(width=width), train, test, hp, device=device, log=lambda line: print("pdl ", line))
    torch.manual_seed(0)
    peer = peer_fit(ResNet18(width=width), root, epochs=args.epochs, workers=args.workers, device=device,
                    on_epoch=lambda r: print(f"peer epoch {r['epoch']}  {r['images_per_sec']:.0f} img/s"))

    results = {"pdl": [h["images_per_sec"] for h in pdl["history"]][1:],
               "peer": [r["images_per_sec"] for r in peer][1:]}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"cpu ({os.cpu_count()} cores, {platform.processor() or platform.machine()})"
    print(f"\nResNet-18 width {width}, {len(train[1])} train images ({source}), {args.epochs} epochs "
          f"(first not counted), on {name}, torch {torch.__version__}\n")
    gpu = ", bf16, channels_last" if device.type == "cuda" else ""
    labels = {"pdl": f"PDL: data on device, batched augment, batch 256{gpu}",
              "peer": f"pytorch-cifar: PIL + DataLoader ({args.workers} workers), batch 128, fp32"
                      + (", images in memory" if args.in_memory else "")}
    return median_table(("recipe", "train img/s (median)"), labels, results,
                        "PDL / pytorch-cifar (median train img/s)")


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-class", type=int, default=300, help="synthetic train images per class; default 300")
    p.add_argument("--epochs", type=int, default=3, help="epochs per recipe, >= 2; default 3")
    p.add_argument("--width", type=int, default=0, help="ResNet-18 width; default 64 on a GPU, 16 on a CPU")
    p.add_argument("--workers", type=int, default=2, help="the peer's DataLoader workers; default 2")
    p.add_argument("--in-memory", action="store_true",
                   help="the synthetic sample made in memory: no PNG written or decoded by either recipe")
    args = p.parse_args(argv)
    if args.epochs < 2:
        p.error("--epochs must be >= 2 (the first epoch is not counted)")
    return args


if __name__ == "__main__":
    sys.exit(0 if main() > 0 else 1)
