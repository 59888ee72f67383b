"""Load CINIC-10 splits into tensors and shard them across ranks."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from . import CLASSES, IMAGE_SIZE, SPLITS
from .layout import LAYOUT, default_root, has_layout, sample_root
from .sample import make_sample

__all__ = ["load_split", "split_files", "decode_files", "shard_indices", "steps_per_epoch", "epoch_batches", "seed_from",
           "default_root", "resolve_root"]


def load_split(
    root: str | os.PathLike, split: str, *, workers: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read ``root/<split>/<class>/*.png`` into ``(images, labels)``.

    ``images`` is uint8 [N, 3, 32, 32] (RGB, grayscale PNGs converted),
    ``labels`` int64 [N] indexing CLASSES. Order: class, then file name.
    PNGs are decoded by a pool of ``workers`` threads (None: Python's default).
    :func:`pdl_cinic10.cache.load` returns the same from a cache built once.
    """
    files = split_files(root, split)
    images = decode_files([path for _, path in files], workers=workers)
    return (
        torch.from_numpy(images),
        torch.tensor([label for label, _ in files], dtype=torch.int64),
    )


def split_files(root: str | os.PathLike, split: str) -> list[tuple[int, Path]]:
    """``(label, path)`` of every PNG of ``split``, in class then file name order.

    Raises a one-line error naming the expected layout if a folder is missing or empty.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    split_dir = Path(root) / split
    if not split_dir.is_dir():
        raise FileNotFoundError(f"no split folder {split_dir}; expected CINIC-10 layout {LAYOUT}")
    missing = [name for name in CLASSES if not (split_dir / name).is_dir()]
    if missing:
        raise FileNotFoundError(
            f"no class folder {', '.join(missing)} in {split_dir}; expected CINIC-10 layout {LAYOUT}"
        )
    files = []
    for label, name in enumerate(CLASSES):
        class_dir = split_dir / name
        paths = sorted(class_dir.glob("*.png"))
        if not paths:
            raise ValueError(f"no PNG files in {class_dir}; expected CINIC-10 layout {LAYOUT}")
        files += [(label, path) for path in paths]
    return files


def decode_files(paths: list[Path], *, workers: int | None = 1) -> np.ndarray:
    """uint8 [len(paths), 3, 32, 32] RGB pixels of 32x32 PNGs, decoded by ``workers`` threads.

    Raises ValueError naming the file if an image is not 32x32.
    """
    images = np.empty((len(paths), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)

    def decode(i: int) -> None:
        with Image.open(paths[i]) as image:
            if image.size != (IMAGE_SIZE, IMAGE_SIZE):
                width, height = image.size
                raise ValueError(
                    f"{paths[i]} is {width}x{height}; CINIC-10 images are {IMAGE_SIZE}x{IMAGE_SIZE}"
                )
            images[i] = np.asarray(image.convert("RGB"))

    if workers == 1:
        for i in range(len(paths)):
            decode(i)
    else:
        with ThreadPoolExecutor(workers) as pool:
            for _ in pool.map(decode, range(len(paths))):
                pass
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2))


def shard_indices(n: int, rank: int, world_size: int, *, epoch: int, seed: int) -> torch.Tensor:
    """This rank's share of a per-epoch permutation of range(n).

    Every rank draws the same permutation for the same (epoch, seed) and takes
    a disjoint contiguous slice: together the ranks cover every index exactly
    once per epoch, and their shares differ in size by at most one.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1; got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}; got {rank}")
    if n < 0 or epoch < 0 or seed < 0:
        raise ValueError(f"n, epoch and seed must be >= 0; got n={n}, epoch={epoch}, seed={seed}")
    generator = torch.Generator().manual_seed(seed_from(seed, epoch))
    return torch.randperm(n, generator=generator).tensor_split(world_size)[rank]


def steps_per_epoch(n: int, world_size: int, batch_size: int) -> int:
    """Steps every rank takes per epoch: enough for the largest share in batches of ``batch_size``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    largest = -(-n // world_size)
    if n // world_size < -(-largest // batch_size):
        raise ValueError(f"need at least {world_size} * {-(-largest // batch_size)} images; got {n}")
    return -(-largest // batch_size)


def epoch_batches(
    n: int, rank: int, world_size: int, batch_size: int, *, epoch: int, seed: int
) -> list[torch.Tensor]:
    """This rank's batches of indices for one epoch.

    Every rank gets the same number of batches (:func:`steps_per_epoch`, so
    collectives stay in step), none empty and none larger than ``batch_size``;
    across the ranks every index in range(n) appears exactly once.
    """
    shard = shard_indices(n, rank, world_size, epoch=epoch, seed=seed)
    return list(shard.tensor_split(steps_per_epoch(n, world_size, batch_size)))


def seed_from(*numbers: int) -> int:
    """A well-mixed 64-bit seed from non-negative integers (e.g. seed, epoch)."""
    return int(np.random.SeedSequence(list(numbers)).generate_state(1, np.uint64)[0])


def resolve_root(path: str | os.PathLike | None = None) -> tuple[Path, bool]:
    """``(root, is_sample)``: ``path`` (default: default_root()) if it holds the
    official layout, else the synthetic sample under ``~/.cache/pdl/cinic10-sample``,
    built on first use. Safe to call from several processes at once: one builds
    it, the others wait for it and reuse it.
    """
    root = Path(path).expanduser() if path is not None else default_root()
    if has_layout(root):
        return root, False
    return _build_sample_once(sample_root()), True


def _build_sample_once(target: Path) -> Path:
    """Build the sample into a temp folder and rename it to ``target``, under a file lock."""
    if has_layout(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if has_layout(target):
            return target
        if target.is_dir():  # a broken cache (e.g. edited by hand): rebuild it
            shutil.rmtree(target)
        building = Path(tempfile.mkdtemp(prefix=f"{target.name}.building-", dir=target.parent))
        try:
            make_sample(building)
            os.rename(building, target)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
    return target
