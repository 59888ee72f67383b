"""A small set of real images in CINIC-10's layout, with nothing downloaded.

scikit-learn's wheel ships 1,797 real handwritten digits (``load_digits``: 8x8
grayscale scans of 43 people's writing, 0..16 ink levels). :func:`write_digits`
scales each to 32x32, writes it as an RGB PNG, and files digit ``d`` under the
``d``-th CINIC-10 class folder, so the notebook, the cache and the benchmarks read
it as they read CINIC-10. The split is stratified and fixed: per class, 60 % train,
20 % valid, 20 % test (1,078 / 359 / 360 images). Unlike the synthetic sample, it
behaves like real data: classes overlap, some writers are hard, a recipe can
overfit it or diverge on it.

    pdl-cinic10-digits ~/data/cinic10        # or: python -m pdl_cinic10.digits ROOT

Needs scikit-learn (``pip install scikit-learn``; PDL's ``test`` extra has it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from . import CLASSES, IMAGE_SIZE, SPLITS

__all__ = ["write_digits", "SPLIT_FRACTIONS", "main"]

#: Share of each class in train, valid, test (in SPLITS order).
SPLIT_FRACTIONS = (0.6, 0.2, 0.2)


def write_digits(root: str | os.PathLike) -> Path:
    """Write ``root/<split>/<class>/digit-NNNN.png`` and return ``root``.

    Deterministic: the same files every time (a class's images, in scikit-learn's
    order, are shuffled with a fixed seed, then cut 60/20/20). Written into a
    temporary folder and renamed, so ``root`` never holds half a set. Raises
    FileExistsError if ``root`` exists and is not empty; ImportError, in one line,
    without scikit-learn.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("writing the digits set needs scikit-learn: pip install scikit-learn") from None
    root = Path(root).expanduser()
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} exists and is not empty; give a new folder")
    digits = load_digits()
    pixels = (digits.images * (255 / 16)).round().astype(np.uint8)  # [N, 8, 8], 0..16 -> 0..255
    building = root.with_name(f".{root.name}.building")
    shutil.rmtree(building, ignore_errors=True)  # what an interrupted run left
    rng = np.random.default_rng(0)
    for label, name in enumerate(CLASSES):
        members = rng.permutation(np.flatnonzero(digits.target == label))
        cuts = np.cumsum([round(f * len(members)) for f in SPLIT_FRACTIONS[:-1]])
        for split, indices in zip(SPLITS, np.split(members, cuts)):
            folder = building / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in indices:
                image = Image.fromarray(pixels[i]).resize((IMAGE_SIZE, IMAGE_SIZE), Image.BICUBIC)
                image.convert("RGB").save(folder / f"digit-{i:04d}.png")
    root.parent.mkdir(parents=True, exist_ok=True)
    if root.exists():
        root.rmdir()
    os.rename(building, root)
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pdl-cinic10-digits",
        description="Write scikit-learn's real handwritten digits as 32x32 PNGs in CINIC-10's layout.")
    parser.add_argument("root", help="a new (or empty) folder, e.g. ~/data/cinic10")
    args = parser.parse_args(argv)
    try:
        root = write_digits(args.root)
    except (FileExistsError, ImportError) as e:
        print(f"pdl-cinic10-digits: {e}", file=sys.stderr)
        return 1
    counts = {split: sum(1 for _ in (root / split).glob("*/*.png")) for split in SPLITS}
    print(f"pdl-cinic10-digits: {root}: " + ", ".join(f"{n} {split}" for split, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
