"""Loading the CINIC-10 layout, the synthetic sample, and per-rank shards."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pdl_cinic10 import CLASSES, SPLITS
from pdl_cinic10.data import default_root, epoch_batches, load_split, resolve_root, shard_indices, steps_per_epoch
from pdl_cinic10.sample import make_sample, sample_split

REPO = Path(__file__).resolve().parents[2]
LAYOUT = "<root>/{train,valid,test}/<class>/*.png"


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("small")
    return make_sample(root, train_per_class=6, test_per_class=3, valid_per_class=2)


@pytest.mark.unit
def test_load_split_shapes_dtypes_and_order(small):
    for split, per_class in [("train", 6), ("valid", 2), ("test", 3)]:
        images, labels = load_split(small, split, workers=2)
        assert images.shape == (10 * per_class, 3, 32, 32) and images.dtype == torch.uint8
        assert labels.dtype == torch.int64
        assert labels.tolist() == [c for c in range(10) for _ in range(per_class)]

    images, _ = load_split(small, "train")
    files = sorted((small / "train" / "cat").glob("*.png"))  # class 3: images 18..23
    for k, file in enumerate(files):
        expected = torch.from_numpy(np.array(Image.open(file).convert("RGB"))).permute(2, 0, 1)
        assert torch.equal(images[3 * 6 + k], expected)


@pytest.mark.unit
def test_sample_is_deterministic_given_the_seed(tmp_path):
    def build(name, seed):
        return load_split(make_sample(tmp_path / name, train_per_class=3, seed=seed), "train")[0]

    assert torch.equal(build("a", 1), build("b", 1))
    assert not torch.equal(build("a", 1), build("c", 2))


@pytest.mark.unit
@pytest.mark.timing
def test_sample_default_sizes_and_speed(tmp_path):
    started = time.perf_counter()
    root = make_sample(tmp_path)
    assert time.perf_counter() - started < 5
    sizes = {split: len(list((root / split).glob("*/*.png"))) for split in SPLITS}
    assert sizes == {"train": 1000, "valid": 200, "test": 400}


@pytest.mark.unit
def test_the_sample_in_memory_is_what_its_pngs_decode_to(tmp_path):
    """sample_split (the GPU check's throughput data, no files) and make_sample's PNGs are
    the same images, grayscale ones included, in the same order."""
    root = make_sample(tmp_path, train_per_class=30, test_per_class=4, valid_per_class=1)
    for split, per_class in (("train", 30), ("test", 4)):
        images, labels = load_split(root, split)
        in_memory, in_memory_labels = sample_split(split, per_class)
        assert np.array_equal(images.permute(0, 2, 3, 1).numpy(), in_memory)
        assert np.array_equal(labels.numpy(), in_memory_labels)
    gray = sample_split("train", 30)[0][24]  # every 25th image of a class is grayscale
    assert np.array_equal(gray[..., 0], gray[..., 1]) and np.array_equal(gray[..., 1], gray[..., 2])


@pytest.mark.parametrize("split, per_class, message", [("training", 3, "split must be one of train, valid, test"),
                                                       ("train", 0, "per_class must be >= 1, got 0")])
def test_the_sample_in_memory_refuses_what_it_cannot_make(split, per_class, message):
    with pytest.raises(ValueError, match=message):
        sample_split(split, per_class)


def test_grayscale_png_is_converted_to_rgb(tmp_path):
    root = make_sample(tmp_path, train_per_class=1, test_per_class=1, valid_per_class=1)
    gray = np.arange(32 * 32, dtype=np.uint8).reshape(32, 32)
    Image.fromarray(gray, mode="L").save(root / "test" / "dog" / "sample-00000.png")

    images, _ = load_split(root, "test")

    assert images.shape == (10, 3, 32, 32)
    for channel in images[5]:
        assert torch.equal(channel, torch.from_numpy(gray))


@pytest.mark.unit
def test_wrong_image_size_is_a_clear_error(tmp_path):
    root = make_sample(tmp_path, train_per_class=1, test_per_class=1, valid_per_class=1)
    Image.new("RGB", (31, 32)).save(root / "valid" / "ship" / "big.png")

    with pytest.raises(ValueError, match=r"big\.png is 31x32; CINIC-10 images are 32x32"):
        load_split(root, "valid")


@pytest.mark.unit
def test_missing_split_or_class_folder_names_the_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(LAYOUT)):
        load_split(tmp_path, "train")
    for name in CLASSES[:-1]:
        (tmp_path / "train" / name).mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"no class folder truck in .*" + re.escape(LAYOUT)):
        load_split(tmp_path, "train")
    (tmp_path / "train" / "truck").mkdir()
    with pytest.raises(ValueError, match=r"no PNG files in .*airplane"):
        load_split(tmp_path, "train")
    with pytest.raises(ValueError, match="train, valid, test"):
        load_split(tmp_path, "validation")


@pytest.mark.unit
@pytest.mark.parametrize("n, world, batch", [(103, 4, 8), (90_000, 3, 256), (12, 3, 4), (7, 1, 3), (5, 5, 1)])
def test_every_sample_is_seen_exactly_once_per_epoch_across_ranks(n, world, batch):
    for epoch in range(3):
        per_rank = [epoch_batches(n, rank, world, batch, epoch=epoch, seed=7) for rank in range(world)]

        assert len({len(batches) for batches in per_rank}) == 1  # the same number of steps on every rank
        assert len(per_rank[0]) == steps_per_epoch(n, world, batch)
        sizes = [len(b) for batches in per_rank for b in batches]
        assert 0 < min(sizes) and max(sizes) <= batch
        seen = torch.cat([b for batches in per_rank for b in batches])
        assert seen.dtype == torch.int64 and sorted(seen.tolist()) == list(range(n))


@pytest.mark.unit
def test_too_few_images_for_the_ranks_is_a_clear_error():
    with pytest.raises(ValueError, match="need at least 4 \\* 1 images; got 3"):
        steps_per_epoch(3, 4, 8)


@pytest.mark.unit
def test_shards_change_with_epoch_and_seed_but_agree_across_calls():
    first = shard_indices(1000, 1, 2, epoch=0, seed=0)
    assert torch.equal(first, shard_indices(1000, 1, 2, epoch=0, seed=0))  # another rank's view
    assert not torch.equal(first, shard_indices(1000, 1, 2, epoch=1, seed=0))
    assert not torch.equal(first, shard_indices(1000, 1, 2, epoch=0, seed=1))
    assert not torch.equal(first.sort().values, torch.arange(500, 1000))  # shuffled, not a block


@pytest.mark.unit
@pytest.mark.parametrize("rank, world", [(2, 2), (-1, 2), (0, 0)])
def test_shard_rejects_bad_rank_or_world(rank, world):
    with pytest.raises(ValueError, match="rank must be in|world_size must be"):
        shard_indices(10, rank, world, epoch=0, seed=0)


@pytest.mark.unit
def test_default_root_honours_cinic10_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("CINIC10_DIR", str(tmp_path))
    assert default_root() == tmp_path
    monkeypatch.delenv("CINIC10_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_root() == tmp_path / "data" / "cinic10"


@pytest.mark.unit
def test_resolve_root_prefers_real_data_then_falls_back_to_the_sample(monkeypatch, tmp_path, small):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_root(small) == (small, False)

    root, is_sample = resolve_root(tmp_path / "empty")

    assert is_sample and root == tmp_path / "home" / ".cache" / "pdl" / "cinic10-sample"
    assert len(load_split(root, "train")[1]) == 1000
    assert resolve_root(tmp_path / "empty") == (root, True)


COUNTING_RESOLVER = """
import os, sys, time, pathlib
import pdl_cinic10.data as data
go, log, path = map(pathlib.Path, sys.argv[1:])
real = data.make_sample
def counting(root, **options):
    with open(log, "a") as file:
        file.write("build\\n")
    time.sleep(1.0)  # widen the window in which a second builder could start
    return real(root, **options)
data.make_sample = counting
(go.parent / f"ready-{os.getpid()}").touch()
while not go.exists():
    time.sleep(0.01)
root, is_sample = data.resolve_root(path)
print(root, is_sample)
"""


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_concurrent_resolve_root_builds_the_sample_once(tmp_path):
    home, sync = tmp_path / "home", tmp_path / "sync"
    sync.mkdir()
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", COUNTING_RESOLVER, str(sync / "go"), str(tmp_path / "builds.log"),
             str(tmp_path / "no-data")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(2)
    ]
    deadline = time.monotonic() + 60
    while len(list(sync.glob("ready-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    (sync / "go").touch()  # release both at once
    outputs = [process.communicate(timeout=60) for process in processes]

    sample = home / ".cache" / "pdl" / "cinic10-sample"
    for process, (out, err) in zip(processes, outputs):
        assert process.returncode == 0, err
        assert out.split() == [str(sample), "True"]
    assert (tmp_path / "builds.log").read_text() == "build\n"
    assert sorted(p.name for p in sample.parent.iterdir()) == ["cinic10-sample", "cinic10-sample.lock"]
    assert len(load_split(sample, "test")[1]) == 400
