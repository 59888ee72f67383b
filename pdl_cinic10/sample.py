"""A small synthetic dataset in the official CINIC-10 layout.

Each class has a hue (10 around the colour wheel) and one of 5 stripe
orientations (0..90 degrees, randomly mirrored, so horizontal flips keep the
class). Both cues are jittered: hue alone confuses neighbouring classes, and
orientation alone confuses classes 5 apart, but neighbouring hues always
differ in orientation by >= 45 degrees. With strong pixel noise, random stripe
period and random shifts (stripe phase) a small CNN learns it well above the
10% chance level, while it is not trivial.
"""

from __future__ import annotations

import colorsys
import os
from pathlib import Path

import numpy as np
from PIL import Image

from . import CLASSES, IMAGE_SIZE, SPLITS

_HUES = np.arange(len(CLASSES)) / len(CLASSES)
_ANGLES = (2 * np.arange(len(CLASSES)) % 5) * (np.pi / 2) / 4  # radians, 0..pi/2
_GRAY_EVERY = 25  # every 25th image is saved as 8-bit grayscale, as in CINIC-10


def make_sample(
    root: str | os.PathLike,
    *,
    train_per_class: int = 100,
    test_per_class: int = 40,
    valid_per_class: int = 20,
    seed: int = 0,
) -> Path:
    """Write ``root/<split>/<class>/sample-NNNNN.png`` (32x32 PNGs) and return root.

    Deterministic given ``seed``; ``*_per_class`` are images per class per split.
    """
    counts = {"train": train_per_class, "valid": valid_per_class, "test": test_per_class}
    for split, count in counts.items():
        if count < 1:
            raise ValueError(f"{split}_per_class must be >= 1, got {count}")
    root = Path(root)
    for split in SPLITS:
        for name in CLASSES:
            (root / split / name).mkdir(parents=True, exist_ok=True)
        for label, i, image in _split_images(split, counts[split], seed):
            image.save(root / split / CLASSES[label] / f"sample-{i:05d}.png")
    return root


def sample_split(split: str, per_class: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The images of ``split`` that :func:`make_sample` writes with ``per_class`` images a
    class and ``seed``, in memory, with no file: ``(uint8 [N, 32, 32, 3] RGB, int64 labels
    [N])`` in class then file order, pixel for pixel what the PNGs decode to (the grayscale
    ones as RGB), as :func:`pdl_cinic10.data.load_split` reads them (channels last here)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    if per_class < 1:
        raise ValueError(f"per_class must be >= 1, got {per_class}")
    images = np.empty((per_class * len(CLASSES), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    labels = np.repeat(np.arange(len(CLASSES), dtype=np.int64), per_class)
    for n, (_, _, image) in enumerate(_split_images(split, per_class, seed)):
        images[n] = np.asarray(image.convert("RGB"))
    return images, labels


def _split_images(split: str, count: int, seed: int):
    """``(label, index, PIL image)`` of every image of ``split``, ``count`` a class: the
    one stream both :func:`make_sample` and :func:`sample_split` draw from."""
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    for label in range(len(CLASSES)):
        for i, pixels in enumerate(_class_images(label, count, rng)):
            image = Image.fromarray(pixels)
            if i % _GRAY_EVERY == _GRAY_EVERY - 1:
                image = image.convert("L")
            yield label, i, image


def _class_images(label: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` uint8 images [count, 32, 32, 3] of class ``label``."""
    hue = _HUES[label] + rng.normal(0.0, 0.08, count)
    saturation = rng.uniform(0.35, 0.8, count)
    value = rng.uniform(0.4, 0.75, count)
    base = np.array([colorsys.hsv_to_rgb(h % 1.0, s, v) for h, s, v in zip(hue, saturation, value)])

    angle = _ANGLES[label] + rng.normal(0.0, 0.1, count)
    angle = np.where(rng.random(count) < 0.5, angle, np.pi - angle)  # mirror
    period = rng.uniform(5.0, 9.0, count)
    phase = rng.uniform(0.0, 2 * np.pi, count)  # a random shift of the stripes
    amplitude = rng.uniform(0.2, 0.4, count)

    y, x = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE].astype(np.float64)
    along = x * np.cos(angle)[:, None, None] + y * np.sin(angle)[:, None, None]
    stripes = np.sin(2 * np.pi * along / period[:, None, None] + phase[:, None, None])
    shade = 1.0 + amplitude[:, None, None] * stripes  # [count, 32, 32]

    pixels = base[:, None, None, :] * shade[..., None]
    pixels += rng.normal(0.0, 0.12, pixels.shape)
    return (np.clip(pixels, 0.0, 1.0) * 255).round().astype(np.uint8)
