"""The real-image set (pdl_cinic10.digits): scikit-learn's handwritten digits written
into CINIC-10's layout, as the notebook, the cache and the benchmarks read it."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from pdl_cinic10 import CLASSES, SPLITS
from pdl_cinic10.data import load_split
from pdl_cinic10.digits import main, write_digits


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return write_digits(tmp_path_factory.mktemp("d") / "digits")


def _tree_hash(root) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.png")):
        h.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return h.hexdigest()


@pytest.mark.unit
def test_every_digit_lands_once_in_a_stratified_split(digits):
    from sklearn.datasets import load_digits

    counts = {split: len(load_split(digits, split)[1]) for split in SPLITS}
    assert counts == {"train": 1078, "valid": 359, "test": 360}
    assert sum(counts.values()) == len(load_digits().target)
    for split in SPLITS:
        labels = load_split(digits, split)[1].numpy()
        per_class = np.bincount(labels, minlength=len(CLASSES))
        assert per_class.min() >= 0.9 * per_class.max()  # stratified: every class about as large
    names = [p.name for p in digits.rglob("*.png")]
    assert len(names) == len(set(names))  # no image in two splits


@pytest.mark.unit
def test_images_are_the_real_scans_scaled_to_32_pixels(digits):
    """The pixels are scikit-learn's digits (not the synthetic sample): an image shrunk
    back to 8x8 matches its source scan."""
    from PIL import Image
    from sklearn.datasets import load_digits

    source = load_digits()
    images, labels = load_split(digits, "test")
    assert images.shape[1:] == (3, 32, 32) and images.dtype.__str__() == "torch.uint8"
    path = sorted((digits / "test" / CLASSES[3]).glob("*.png"))[0]
    index = int(path.stem.split("-")[1])
    assert source.target[index] == 3
    small = np.asarray(Image.open(path).convert("L").resize((8, 8), Image.BOX), dtype=float)
    assert np.abs(small - source.images[index] * 255 / 16).mean() < 20


@pytest.mark.unit
def test_writing_is_deterministic_and_never_overwrites(digits, tmp_path, capsys):
    again = write_digits(tmp_path / "again")
    assert _tree_hash(again) == _tree_hash(digits)
    assert main([str(digits)]) == 1
    assert "exists and is not empty; give a new folder" in capsys.readouterr().err
    assert main([str(tmp_path / "third")]) == 0
    assert "1078 train, 359 valid, 360 test" in capsys.readouterr().out
