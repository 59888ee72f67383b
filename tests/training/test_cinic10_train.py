"""Training: augmentation, schedule, single-process fit, and a 2-rank gloo run."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pdl_cinic10.data import load_split
from pdl_cinic10.model import ResNet18
from pdl_cinic10.sample import make_sample
from pdl_cinic10.train import MEAN, Hyper, augment, evaluate, fit, lr_factor, merge_batchnorm_statistics, normalize


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    return make_sample(tmp_path_factory.mktemp("sample"))


@pytest.mark.unit
def test_augment_is_a_reflect_padded_crop_with_optional_flip():
    batch = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    out = augment(batch, torch.Generator().manual_seed(0))

    assert out.shape == batch.shape and out.dtype == torch.uint8
    seen = set()
    for image, result in zip(batch.numpy(), out.numpy()):
        padded = np.pad(image, ((0, 0), (4, 4), (4, 4)), mode="reflect")
        crops = {(dy, dx): padded[:, dy : dy + 32, dx : dx + 32] for dy in range(9) for dx in range(9)}
        matches = [
            (offset, flip)
            for offset, crop in crops.items()
            for flip in (False, True)
            if np.array_equal(crop[..., ::-1] if flip else crop, result)
        ]
        assert matches, "output is not a crop (+flip) of the reflect-padded input"
        seen.add(matches[0])
    assert len(seen) > 20  # the crops and flips really vary per image


@pytest.mark.unit
def test_augment_is_reproducible_from_the_generator():
    batch = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    first = augment(batch, torch.Generator().manual_seed(3))
    assert torch.equal(first, augment(batch, torch.Generator().manual_seed(3)))
    assert not torch.equal(first, augment(batch, torch.Generator().manual_seed(4)))


@pytest.mark.unit
def test_normalize_centres_the_dataset_mean():
    mean_image = (torch.tensor(MEAN) * 255).round().to(torch.uint8).view(1, 3, 1, 1).expand(2, 3, 4, 4)
    out = normalize(mean_image)
    assert out.dtype == torch.float32 and out.abs().max() < 0.01


@pytest.mark.unit
def test_lr_warms_up_linearly_then_decays_to_zero():
    total, warmup = 100, 10
    factors = [lr_factor(step, total, warmup) for step in range(total)]
    assert factors[:warmup] == pytest.approx([(s + 1) / warmup for s in range(warmup)])
    assert factors[warmup] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(factors[warmup:], factors[warmup + 1 :]))
    assert factors[-1] < 0.001


@pytest.mark.integration
def test_single_process_fit_learns_the_sample(sample):
    torch.manual_seed(0)
    train, test = load_split(sample, "train"), load_split(sample, "test")
    hp = Hyper(epochs=5, batch_size=64, width=16)
    lines = []

    result = fit(ResNet18(width=hp.width), train, test, hp, device="cpu", log=lines.append)

    assert result["test_acc"] >= 0.6  # chance is 0.1
    assert [r["epoch"] for r in result["history"]] == [1, 2, 3, 4, 5]
    assert result["history"][-1]["train_loss"] < result["history"][0]["train_loss"]
    assert len(lines) == 5
    assert re.fullmatch(r"epoch 5/5  train loss \d\.\d{3}  test acc \d+\.\d%  \d+ img/s", lines[-1])
    assert evaluate(result["model"], *test, device="cpu", tta=True) == result["test_acc"]


@pytest.mark.integration
def test_stop_at_ends_after_the_first_epoch_that_reaches_it_on_the_same_schedule(sample):
    """A stopped run is the full run cut short: the epochs it did are the same epochs."""
    train, test = load_split(sample, "train"), load_split(sample, "test")
    hp = Hyper(epochs=4, batch_size=64, width=4)
    torch.manual_seed(0)
    full = fit(ResNet18(width=hp.width), train, test, hp, device="cpu", log=lambda _: None)["history"]
    target = full[1]["test_acc"]  # reached at epoch 2 at the latest
    first = next(r["epoch"] for r in full if r["test_acc"] >= target)
    torch.manual_seed(0)
    cut = fit(ResNet18(width=hp.width), train, test, hp, device="cpu", log=lambda _: None, stop_at=target)
    assert [r["epoch"] for r in cut["history"]] == list(range(1, first + 1))
    # the same steps at the same rates (a changed schedule moves the loss by far more)
    assert [r["train_loss"] for r in cut["history"]] == pytest.approx([r["train_loss"] for r in full[:first]],
                                                                     rel=1e-5)


class _LeftHalf(torch.nn.Module):
    """Logits from the left half of the image only: its mirror image scores differently."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3 * 32 * 16, 10)

    def forward(self, x):
        return self.linear(x[..., :16].flatten(1))


@pytest.mark.unit
def test_flip_tta_scores_the_mean_of_image_and_mirror_logits():
    torch.manual_seed(0)
    model = _LeftHalf()
    images = torch.randint(0, 256, (200, 3, 32, 32), dtype=torch.uint8)
    x = normalize(images)
    with torch.no_grad():
        labels = (model(x) + model(x.flip(3))).argmax(1)  # what a flip-TTA scorer predicts

    assert evaluate(model, images, labels, device="cpu", tta=True) == 1.0
    assert evaluate(model, images, labels, device="cpu", tta=False) < 0.9


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train_rank(rank: int, world: int, port: int, root: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(rank)  # different initial weights: DDP must make them equal
        train, test = load_split(root, "train", workers=1), load_split(root, "test", workers=1)
        hp = Hyper(epochs=4, batch_size=32, width=16)
        lines = []
        # a fixed, even split: with "auto" the split follows the ranks' timing, so the run
        # (and its accuracy after 4 epochs) would change from one machine load to the next
        result = fit(ResNet18(width=hp.width), train, test, hp, device="cpu", log=lines.append, balance="off")
        torch.save(
            {"state": result["model"].state_dict(), "test_acc": result["test_acc"], "lines": lines},
            Path(out) / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
def test_two_gloo_ranks_end_identical_and_learn(sample, tmp_path, monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # keep gloo on 127.0.0.1
    mp.spawn(_train_rank, args=(2, _free_port(), str(sample), str(tmp_path)), nprocs=2, join=True)

    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert rank0["state"].keys() == rank1["state"].keys()
    for name, tensor in rank0["state"].items():
        assert torch.equal(tensor, rank1["state"][name]), name
    assert rank0["test_acc"] == rank1["test_acc"] >= 0.5  # chance is 0.1
    epochs = [line for line in rank0["lines"] if line.startswith("epoch ")]
    assert len(epochs) == 4 and len(rank0["lines"]) == 4 and rank1["lines"] == []


def _merge_rank(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        from pdl.collectives import for_backend

        data = torch.arange(40, dtype=torch.float64).view(20, 2) ** 1.5  # rank 0 saw 5 rows, rank 1 15
        mine = data[:5] if rank == 0 else data[5:]
        layer = torch.nn.BatchNorm1d(2).double()
        layer.running_mean.copy_(mine.mean(0))
        layer.running_var.copy_(mine.var(0, unbiased=False))
        layer.num_batches_tracked.fill_(7 + rank)
        merge_batchnorm_statistics(for_backend("torch"), layer, share=len(mine) / len(data))
        torch.save(layer.state_dict(), Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
def test_batchnorm_statistics_after_an_epoch_are_all_the_ranks_images_weighted_by_their_share(tmp_path, monkeypatch):
    """Ranks that trained on batches of unequal size end the epoch holding the
    statistics of every rank's images together, not the smallest rank's."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_merge_rank, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)

    data = torch.arange(40, dtype=torch.float64).view(20, 2) ** 1.5
    for rank in range(2):
        state = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.allclose(state["running_mean"], data.mean(0), rtol=0, atol=1e-10)
        assert torch.allclose(state["running_var"], data.var(0, unbiased=False), rtol=0, atol=1e-9)
        assert state["num_batches_tracked"].item() == 7  # rank 0's
