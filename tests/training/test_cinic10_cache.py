"""The uint8 split cache: same tensors as the PNGs, built once, checked, rebuilt when broken."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pdl_cinic10.cache import CacheWarning, build, cache_dir_for, load, verify
from pdl_cinic10.data import load_split
from pdl_cinic10.sample import make_sample

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def sample(tmp_path) -> Path:
    return make_sample(tmp_path / "data", train_per_class=8, test_per_class=3, valid_per_class=2)


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.unit
def test_cache_holds_exactly_the_pngs_and_is_reused(sample, tmp_path):
    cache = tmp_path / "cache"
    images, labels = load(sample, "train", cache_dir=cache, workers=2)  # built in 2 processes

    expected = load_split(sample, "train")
    assert torch.equal(images, expected[0]) and torch.equal(labels, expected[1])
    assert files(cache) == [".train.lock", "train.images.npy", "train.json", "train.labels.npy"]
    manifest = json.loads((cache / "train.json").read_text())
    assert manifest["count"] == 80 and len(manifest["images_sha256"]) == 64
    assert verify(cache, "train") is None

    built = (cache / "train.images.npy").stat().st_mtime_ns
    again = load(sample, "train", cache_dir=cache)
    assert torch.equal(again[0], images)
    assert (cache / "train.images.npy").stat().st_mtime_ns == built  # read, not rebuilt


@pytest.mark.unit
@pytest.mark.parametrize("damage", ["flip a pixel", "truncate the images", "drop the labels", "garble the manifest"])
def test_a_corrupt_cache_is_detected_and_rebuilt(sample, tmp_path, damage):
    cache = tmp_path / "cache"
    good = load(sample, "test", cache_dir=cache, workers=1)
    images_file = cache / "test.images.npy"
    if damage == "flip a pixel":
        data = bytearray(images_file.read_bytes())
        data[-100] ^= 0x01
        images_file.write_bytes(bytes(data))
    elif damage == "truncate the images":
        images_file.write_bytes(images_file.read_bytes()[:-500])
    elif damage == "drop the labels":
        (cache / "test.labels.npy").unlink()
    else:
        (cache / "test.json").write_text("{not json")
    assert verify(cache, "test") is not None

    with pytest.warns(CacheWarning, match="rebuilding it"):
        images, labels = load(sample, "test", cache_dir=cache, workers=1)

    assert torch.equal(images, good[0]) and torch.equal(labels, good[1])
    assert verify(cache, "test") is None


@pytest.mark.unit
def test_a_changed_png_folder_rebuilds_the_cache(sample, tmp_path):
    cache = tmp_path / "cache"
    load(sample, "valid", cache_dir=cache)
    replaced = sample / "valid" / "ship" / "sample-00000.png"
    Image.new("RGB", (32, 32), (255, 0, 0)).save(replaced)
    os.utime(replaced, ns=(1, 1))

    with pytest.warns(CacheWarning, match="valid PNGs changed"):
        images, _ = load(sample, "valid", cache_dir=cache)

    ship0 = 8 * 2  # class 8, first image
    assert images[ship0].view(3, -1)[:, 0].tolist() == [255, 0, 0]


@pytest.mark.unit
def test_cache_location_is_per_dataset_and_configurable(sample, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CINIC10_CACHE", raising=False)
    default = cache_dir_for(sample)
    assert default.parent == tmp_path / "home" / ".cache" / "pdl" / "cinic10"
    assert default.name.startswith("data-") and default != cache_dir_for(tmp_path / "other" / "data")
    monkeypatch.setenv("CINIC10_CACHE", str(tmp_path / "node-cache"))
    assert cache_dir_for(sample) == tmp_path / "node-cache"
    assert cache_dir_for(sample, tmp_path / "given") == tmp_path / "given"


@pytest.mark.unit
def test_load_puts_the_split_on_the_device_and_rejects_a_bad_split(sample, tmp_path):
    images, labels = load(sample, "test", cache_dir=tmp_path / "c", device="meta")
    assert images.device.type == labels.device.type == "meta"
    assert images.shape == (30, 3, 32, 32) and images.dtype == torch.uint8
    with pytest.raises(ValueError, match="split must be one of train, valid, test; got 'val'"):
        load(sample, "val", cache_dir=tmp_path / "c")


COUNTING_BUILDER = """
import sys, time, pathlib
import pdl_cinic10.cache as cache
go, log, root, folder = sys.argv[1:]
real = cache._decode_parallel
def counting(*args):
    with open(log, "a") as f:
        f.write("decode\\n")
    time.sleep(1.0)  # widen the window in which a second builder could start
    return real(*args)
cache._decode_parallel = counting
pathlib.Path(go).with_name(f"ready-{__import__('os').getpid()}").touch()
while not pathlib.Path(go).exists():
    time.sleep(0.01)
images, labels = cache.load(root, "train", cache_dir=folder, workers=1)
print(len(labels), int(images.sum()))
"""


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_concurrent_builders_on_a_node_build_once_and_agree(sample, tmp_path):
    sync, cache, log = tmp_path / "sync", tmp_path / "cache", tmp_path / "decodes.log"
    sync.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", COUNTING_BUILDER, str(sync / "go"), str(log), str(sample), str(cache)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(3)
    ]
    deadline = time.monotonic() + 90
    while len(list(sync.glob("ready-*"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    (sync / "go").touch()  # release all three at once
    outputs = [p.communicate(timeout=120) for p in processes]

    for process, (_, err) in zip(processes, outputs):
        assert process.returncode == 0, err
    assert len({out for out, _ in outputs}) == 1  # the same split everywhere
    assert log.read_text() == "decode\n"  # one of them decoded, the others read its cache
    assert files(cache) == [".train.lock", "train.images.npy", "train.json", "train.labels.npy"]
    assert verify(cache, "train") is None


@pytest.mark.unit
def test_build_returns_a_cache_finished_while_it_waited(sample, tmp_path):
    cache = tmp_path / "cache"
    first = build(sample, "valid", cache, workers=1)
    again = build(sample, "valid", cache, workers=1)  # finds the valid cache under the lock
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
