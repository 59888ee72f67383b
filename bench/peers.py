"""The named peer of PDL's CINIC-10 benchmarks: the pytorch-cifar style recipe.

This is how the original PDL poster trained CINIC-10 (kuangliu/pytorch-cifar's
``main.py`` on an ImageFolder): every sample is a PNG opened and decoded by PIL
in ``__getitem__``, padded-crop and flip per sample, converted to a float
tensor and normalised, batched by a ``DataLoader`` with worker processes; the
model trains in fp32 with plain SGD (lr 0.1, momentum 0.9, weight decay 5e-4)
and cosine annealing over the epochs. torchvision is not used (it has no build
for this torch); its transforms are reproduced with numpy, per sample, as
``RandomCrop(32, padding=4)``, ``RandomHorizontalFlip()``, ``ToTensor()`` and
``Normalize(mean, std)`` do them.

With ``arrays`` (uint8 images in memory, as torchvision's ``CIFAR10`` dataset holds
them) instead of a folder, each sample becomes a PIL image in ``__getitem__``
(``Image.fromarray``, as ``CIFAR10`` does) instead of a decoded PNG; the rest is the same.

Also: :func:`bench_root`, the PNG folder every benchmark reads.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from pdl_cinic10.data import split_files
from pdl_cinic10.sample import make_sample
from pdl_cinic10.train import MEAN, STD

__all__ = ["bench_root", "ImageFolderPNG", "ArrayImages", "peer_loader", "peer_optimizer", "peer_fit"]


def bench_root(per_class: int, test_per_class: int | None = None) -> Path:
    """A CINIC-10-layout PNG folder of the synthetic sample, ``per_class`` train images a class.

    The real CINIC-10 at ``$CINIC10_DIR`` is used when that is set. Otherwise
    the sample is built once under ``~/.cache/pdl/bench/`` and reused.
    """
    if os.environ.get("CINIC10_DIR"):
        return Path(os.environ["CINIC10_DIR"]).expanduser()
    test_per_class = test_per_class or max(40, per_class // 5)
    root = Path.home() / ".cache" / "pdl" / "bench" / f"sample-{per_class}-{test_per_class}"
    if not (root / ".complete").exists():
        make_sample(root, train_per_class=per_class, test_per_class=test_per_class, valid_per_class=1)
        (root / ".complete").touch()
    return root


def cifar_transform(pixels: np.ndarray, train: bool) -> torch.Tensor:
    """pytorch-cifar's per-sample transforms on one uint8 [32, 32, 3] image: a float32
    [3, 32, 32] normalised tensor (random crop and flip when ``train``)."""
    if train:
        padded = np.pad(pixels, ((4, 4), (4, 4), (0, 0)))  # RandomCrop(32, padding=4): zero padding
        top, left = random.randint(0, 8), random.randint(0, 8)
        pixels = padded[top : top + 32, left : left + 32]
        if random.random() < 0.5:  # RandomHorizontalFlip()
            pixels = pixels[:, ::-1]
    x = torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1).float() / 255  # ToTensor()
    return (x - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)  # Normalize()


class ImageFolderPNG(torch.utils.data.Dataset):
    """``(float32 [3, 32, 32] normalised, label)`` per PNG of ``root/<split>``, decoded on access."""

    def __init__(self, root: str | os.PathLike, split: str, *, train: bool):
        self.samples = split_files(root, split)
        self.labels = [label for label, _ in self.samples]
        self.train = train

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        label, path = self.samples[i]
        with Image.open(path) as image:
            pixels = np.array(image.convert("RGB"))  # [32, 32, 3] uint8, writable
        return cifar_transform(pixels, self.train), label


class ArrayImages(torch.utils.data.Dataset):
    """``(float32 [3, 32, 32] normalised, label)`` per image of uint8 ``images`` [N, 32, 32, 3]
    held in memory, each made a PIL image on access as torchvision's ``CIFAR10`` does."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, *, train: bool):
        self.images, self.labels, self.train = images, [int(v) for v in labels], train

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        pixels = np.array(Image.fromarray(self.images[i]))
        return cifar_transform(pixels, self.train), self.labels[i]


def _dataset(source, split: str, train: bool) -> torch.utils.data.Dataset:
    """``source``: a CINIC-10-layout folder, or ``{split: (uint8 [N, 32, 32, 3], labels)}``."""
    if isinstance(source, dict):
        return ArrayImages(*source[split], train=train)
    return ImageFolderPNG(source, split, train=train)


def peer_loader(root, split: str, *, batch_size: int, workers: int, train: bool,
                rank: int = 0, world_size: int = 1, seed: int = 0) -> torch.utils.data.DataLoader:
    """pytorch-cifar's DataLoader (shuffled for training), sharded by a DistributedSampler.

    ``root``: a folder, or arrays in memory (:func:`_dataset`). Its ``workers`` processes
    start with each epoch and end with it, as in pytorch-cifar.
    """
    dataset = _dataset(root, split, train)
    sampler = torch.utils.data.DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=train, seed=seed
    )
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers)


def peer_optimizer(model: torch.nn.Module, epochs: int, lr: float = 0.1):
    """pytorch-cifar's SGD(lr, momentum=0.9, weight_decay=5e-4) and CosineAnnealingLR(T_max=epochs)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    return optimizer, torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)


def peer_fit(model: torch.nn.Module, root, *, epochs: int, batch_size: int = 128, workers: int = 2,
             device: str | torch.device = "cpu", on_epoch=None, lr: float = 0.1,
             schedule_epochs: int | None = None, stop_at: float | None = None) -> list[dict]:
    """pytorch-cifar's ``train()``/``test()`` loop, on this rank of any torch.distributed group.

    ``root``: a CINIC-10-layout folder, or ``{"train": ..., "test": ...}`` arrays in memory
    (:class:`ArrayImages`).

    fp32, cross-entropy, :func:`peer_optimizer` stepped per epoch; DDP when a
    group is initialised. ``on_epoch(record)`` is called after each epoch's test,
    where ``record`` is ``{epoch, seconds (training only), images_per_sec, test_acc}``.
    Returns the records.
    """
    import time

    import torch.distributed as dist

    device = torch.device(device)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    model = model.to(device)
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    optimizer, scheduler = peer_optimizer(model, schedule_epochs or epochs, lr)
    criterion = torch.nn.CrossEntropyLoss()
    train = peer_loader(root, "train", batch_size=batch_size, workers=workers, train=True,
                        rank=rank, world_size=world)
    test = _dataset(root, "test", train=False)
    test_x = torch.stack([test[i][0] for i in range(len(test))])
    test_y = torch.tensor(test.labels)
    records = []
    for epoch in range(epochs):
        train.sampler.set_epoch(epoch)
        net.train()
        started, seen = time.perf_counter(), 0
        for x, y in train:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            criterion(net(x), y).backward()
            optimizer.step()
            seen += len(y)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
        scheduler.step()
        record = {"epoch": epoch + 1, "seconds": seconds, "images_per_sec": seen * world / seconds,
                  "test_acc": _accuracy(model, test_x, test_y, device, rank, world)}
        records.append(record)
        if on_epoch is not None:
            on_epoch(record)
        if stop_at is not None and record["test_acc"] >= stop_at:
            break
    return records


@torch.no_grad()
def _accuracy(model, x, y, device, rank: int, world: int) -> float:
    """Top-1 accuracy 0..1 of ``model`` on already normalised ``x`` (pytorch-cifar's test())."""
    import torch.distributed as dist

    model.eval()
    lo, hi = rank * len(y) // world, (rank + 1) * len(y) // world
    counts = torch.zeros(2, dtype=torch.int64, device=device)
    for start in range(lo, hi, 500):
        stop = min(start + 500, hi)
        counts[0] += (model(x[start:stop].to(device)).argmax(1) == y[start:stop].to(device)).sum()
        counts[1] += stop - start
    if world > 1:
        dist.all_reduce(counts)
    model.train()
    return counts[0].item() / counts[1].item()
