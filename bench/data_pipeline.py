"""Data pipeline throughput: PDL's device-resident CINIC-10 pipeline vs an ImageFolder loader.

    .venv/bin/python bench/data_pipeline.py [--per-class 1000] [--batch 256] [--workers 2] [--epochs 3] [--device auto]

Both read the same PNG folder (the synthetic sample with ``--per-class`` train
images a class, or the real CINIC-10 at ``$CINIC10_DIR``) and produce the same
thing: shuffled, randomly cropped and flipped, normalised float batches on the
training device, one epoch after another.

- **PDL**: ``pdl_cinic10.cache.load`` (uint8 split cache, built once; its build
  and warm-load times are printed apart), the split whole on the device, and per
  epoch ``epoch_batches`` + batched ``augment`` + ``normalize`` there.
- **Peer** (``bench/peers.py``): pytorch-cifar's ImageFolder style: PIL decode and
  transforms per sample in ``__getitem__``, a ``DataLoader`` with ``--workers``
  worker processes, each batch copied to the device.

Prints a table of images/s (median over ``--epochs`` timed epochs, after one
warm-up epoch each) and the ratio PDL / peer.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time

import torch

from _common import median_table
from peers import bench_root, peer_loader


def main(argv=None) -> float:
    """Run the benchmark; return the ratio PDL / peer of median images/s."""
    args = _parse(argv)
    from pdl_cinic10.cache import load
    from pdl_cinic10.data import epoch_batches, seed_from
    from pdl_cinic10.train import augment, normalize

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    root = bench_root(args.per_class)
    cache = tempfile.mkdtemp(prefix="pdl-bench-cache-")
    try:
        started = time.perf_counter()
        load(root, "train", cache_dir=cache)
        build_s = time.perf_counter() - started
        started = time.perf_counter()
        images, labels = load(root, "train", device=device, cache_dir=cache)
        load_s = time.perf_counter() - started
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    n = len(labels)
    generator = torch.Generator().manual_seed(seed_from(0, 1))

    def pdl_epoch(epoch: int) -> None:
        for batch in epoch_batches(n, 0, 1, args.batch, epoch=epoch, seed=0):
            x = normalize(augment(images[batch.to(device)], generator))
            y = labels[batch.to(device)]
        _sync(device, x, y)

    loader = peer_loader(root, "train", batch_size=args.batch, workers=args.workers, train=True)

    def peer_epoch(epoch: int) -> None:
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        _sync(device, x, y)

    results = {"pdl": [], "peer": []}
    for name, run in (("pdl", pdl_epoch), ("peer", peer_epoch)):
        run(0)  # warm-up: first touch of the data, worker start-up
    for epoch in range(1, args.epochs + 1):  # alternate, so load changes hit both
        for name, run in (("pdl", pdl_epoch), ("peer", peer_epoch)):
            started = time.perf_counter()
            run(epoch)
            results[name].append(n / (time.perf_counter() - started))
            print(f"epoch {epoch}/{args.epochs}  {name:<4} {results[name][-1]:10.0f} img/s", flush=True)
    del loader

    print(f"\n{n} train images ({root}), batch {args.batch}, on {device} "
          f"({os.cpu_count()} cores, {platform.processor() or platform.machine()}), torch {torch.__version__}")
    print(f"PDL cache: built once in {build_s:.2f} s, loaded onto {device} in {load_s:.2f} s\n")
    labels = {"pdl": "PDL: uint8 cache on device, batched augment",
              "peer": f"ImageFolder + PIL per sample, DataLoader ({args.workers} workers)"}
    return median_table(("pipeline", "img/s (median)"), labels, results, "PDL / ImageFolder (median img/s)", 1)


def _sync(device: torch.device, *tensors: torch.Tensor) -> None:
    """Wait until the last batch exists (a GPU runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    for t in tensors:
        t.sum().item()


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-class", type=int, default=1000, help="synthetic train images per class; default 1000")
    p.add_argument("--batch", type=int, default=256, help="images per batch; default 256")
    p.add_argument("--workers", type=int, default=2, help="the peer's DataLoader workers; default 2")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per pipeline; default 3")
    p.add_argument("--device", default="auto", help="auto (GPU if any, else CPU), cpu or cuda")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(0 if main() > 0 else 1)
