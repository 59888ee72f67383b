"""How far the notebook tests' small run lands from its bound, seed by seed: where
tests/harness/notebook_run.py's ``SMALL_RUN_EPOCHS`` comes from.

    .venv/bin/python bench/small_run_spread.py [epochs=6,12] [seeds=0-7] [balance=off|on|auto]

Each run is the tests' small run of the notebook's recipe, on 3 CPU ranks (gloo,
``torch.multiprocessing``, one thread each): a width-16 ResNet-18 trained with
``Hyper.for_data`` on the generated 1000-image sample (no CINIC10_DIR), batch 32 per
rank, for each number of epochs and each seed. Prints one line per run (epochs, seed,
each epoch's test accuracy in %) and, per number of epochs, the lowest and highest
final accuracy against the tests' 50 % bound. The sample is synthetic: these figures
describe the test's run, not the recipe's accuracy, which docs/benchmarks.md measures
on real images. About 1 min per run on 3 cores.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile

RANKS = 3
BOUND = 50.0  #: the tests' bound on the small run's final accuracy, in %


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, port: int, epochs: int, seed: int, balance: str, sample_dir: str, results) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    try:
        from pdl_cinic10.data import load_split, resolve_root
        from pdl_cinic10.model import ResNet18
        from pdl_cinic10.train import Hyper, fit

        root, _ = resolve_root(sample_dir)  # missing: the generated sample
        train, test = load_split(root, "train"), load_split(root, "test")
        hp = Hyper.for_data(len(train[1]), RANKS, epochs=epochs, width=16, batch_size=32, seed=seed)
        torch.manual_seed(hp.seed)
        result = fit(ResNet18(width=hp.width), train, test, hp, device="cpu", backend="torch", balance=balance,
                     log=lambda line: None)
        if rank == 0:
            results.put([round(h["test_acc"] * 100, 1) for h in result["history"]])
    finally:
        dist.destroy_process_group()


def seed_range(text: str) -> list[int]:
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def main(argv: list[str]) -> dict[int, list[float]]:
    import torch.multiprocessing as mp

    try:
        settings = {"epochs": "6,12", "seeds": "0-7", "balance": "off", **dict(a.split("=", 1) for a in argv)}
        epochs_list, seeds = [int(e) for e in settings["epochs"].split(",")], seed_range(settings["seeds"])
    except ValueError:
        sys.exit("usage: small_run_spread.py [epochs=6,12] [seeds=0-7] [balance=off|on|auto]")
    context = mp.get_context("spawn")
    finals: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        missing = os.path.join(scratch, "no-cinic10")
        for epochs in epochs_list:
            for seed in seeds:
                results = context.Queue()
                mp.spawn(rank_main, args=(free_port(), epochs, seed, settings["balance"], missing, results),
                         nprocs=RANKS)
                accuracy = results.get()
                print(f"epochs {epochs} seed {seed}: {accuracy}", flush=True)
                finals.setdefault(epochs, []).append(accuracy[-1])
    for epochs, values in finals.items():
        print(f"{epochs} epochs: final accuracy {min(values)} % to {max(values)} % over {len(values)} seeds "
              f"(bound {BOUND:g} %)")
    return finals


if __name__ == "__main__":
    main(sys.argv[1:])
