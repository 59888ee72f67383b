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

__all__ = ["load_split", "shard_indices", "seed_from", "default_root", "resolve_root"]


def load_split(
    root: str | os.PathLike, split: str, *, workers: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read ``root/<split>/<class>/*.png`` into ``(images, labels)``.

    ``images`` is uint8 [N, 3, 32, 32] (RGB, grayscale PNGs converted),
    ``labels`` int64 [N] indexing CLASSES. Order: class, then file name.
    PNGs are decoded by a pool of ``workers`` threads (None: Python's default).
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
    paths, labels = [], []
    for label, name in enumerate(CLASSES):
        class_dir = split_dir / name
        files = sorted(class_dir.glob("*.png"))
        if not files:
            raise ValueError(f"no PNG files in {class_dir}; expected CINIC-10 layout {LAYOUT}")
        paths += files
        labels += [label] * len(files)

    images = np.empty((len(paths), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)

    def decode(i: int) -> None:
        with Image.open(paths[i]) as image:
            if image.size != (IMAGE_SIZE, IMAGE_SIZE):
                width, height = image.size
                raise ValueError(
                    f"{paths[i]} is {width}x{height}; CINIC-10 images are {IMAGE_SIZE}x{IMAGE_SIZE}"
                )
            images[i] = np.asarray(image.convert("RGB"))

    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(decode, range(len(paths))):
            pass
    return (
        torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(),
        torch.tensor(labels, dtype=torch.int64),
    )


def shard_indices(n: int, rank: int, world_size: int, *, epoch: int, seed: int) -> torch.Tensor:
    """This rank's ``n // world_size`` indices of a per-epoch permutation of range(n).

    Every rank draws the same permutation for the same (epoch, seed) and takes a
    disjoint slice, so all ranks run the same number of steps; the remainder
    ``n % world_size`` is left out of this epoch.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1; got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}; got {rank}")
    if n < 0 or epoch < 0 or seed < 0:
        raise ValueError(f"n, epoch and seed must be >= 0; got n={n}, epoch={epoch}, seed={seed}")
    generator = torch.Generator().manual_seed(seed_from(seed, epoch))
    permutation = torch.randperm(n, generator=generator)
    per_rank = n // world_size
    return permutation[rank * per_rank : (rank + 1) * per_rank]


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
