"""How far the notebook tests' small run lands from its bound, seed by seed: where
tests/harness/notebook_run.py's ``SMALL_RUN_EPOCHS`` comes from.

    .venv/bin/python bench/small_run_spread.py [epochs=6,8,10] [seeds=0-3] [balance=off|on|auto] [batch=recipe|N]

Each run is the tests' small run of the notebook's recipe, on 3 CPU ranks (gloo,
``torch.multiprocessing``, one thread each): a width-16 ResNet-18 trained with
``Hyper.for_data`` on the generated 1000-image sample (no CINIC10_DIR), with the
recipe's batch (8 a rank) or ``batch`` images a rank, balanced batches ``balance``
(default off: an even split; on: split to the ranks' timing, as "auto" does where
engines share a core), for each
number of epochs and each seed. Prints one line per run (epochs, seed, each epoch's
test accuracy in %, seconds) and, per number of epochs, the lowest and highest final
accuracy against the tests' 50 % bound. The sample is synthetic: these figures describe
the test's run, not the recipe's accuracy, which docs/benchmarks.md measures on real
images. 4 s an epoch on 2 cores with the recipe's batch.

Measured here (2 cores, the recipe's batch, balance off): after 5 epochs over seeds 0-3,
74.5-93.2 % (34-42 s a run on a loaded 2-core AMD EPYC VM). With the rate's earlier floor
(``LR_SCALE`` from 0.5: lr 0.05 instead of 0.025) the same runs ended at 81.0-89.2 % on one
machine and at 43.2-89.5 % on another, where seed 0 stalled (train loss near 1.7; 46.5 %
after 8 epochs): the floor is 0.25 since. With balance on (the earlier floor), the split follows the ranks' timing and the run no longer depends on
its seed only: 5 of 18 runs of 6 to 15 epochs stalled between 44 % and 48 % (train loss
near 1.7), the others ended at 85-96 %. The tests' small run therefore splits evenly
(``PDL_BALANCE=off``).
``SPREAD_LOG=1`` prints rank 0's log (the epochs' lines and the balancer's).
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time

RANKS = 3
BOUND = 50.0  #: the tests' bound on the small run's final accuracy, in %


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, port: int, epochs: int, seed: int, balance: str, batch: int | None, sample_dir: str,
              results) -> None:
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
        hp = Hyper.for_data(len(train[1]), RANKS, epochs=epochs, width=16, batch_size=batch, seed=seed)
        torch.manual_seed(hp.seed)
        shown = os.environ.get("SPREAD_LOG")  # rank 0's epoch and balancer lines
        result = fit(ResNet18(width=hp.width), train, test, hp, device="cpu", backend="torch", balance=balance,
                     log=lambda line: print(line, flush=True) if shown else None)
        if rank == 0:
            results.put([round(h["test_acc"] * 100, 1) for h in result["history"]])
        dist.barrier()  # every rank done before any closes its connections (gloo aborts a peer otherwise)
    finally:
        dist.destroy_process_group()


def seed_range(text: str) -> list[int]:
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def main(argv: list[str]) -> dict[int, list[float]]:
    import torch.multiprocessing as mp

    try:
        settings = {"epochs": "6,8,10", "seeds": "0-3", "balance": "off", "batch": "recipe",
                    **dict(a.split("=", 1) for a in argv)}
        epochs_list, seeds = [int(e) for e in settings["epochs"].split(",")], seed_range(settings["seeds"])
        batch = None if settings["batch"] == "recipe" else int(settings["batch"])
    except ValueError:
        sys.exit("usage: small_run_spread.py [epochs=6,8,10] [seeds=0-3] [balance=off|on|auto] [batch=recipe|N]")
    context = mp.get_context("spawn")
    finals: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        missing = os.path.join(scratch, "no-cinic10")
        for epochs in epochs_list:
            for seed in seeds:
                results = context.Queue()
                started = time.perf_counter()
                mp.spawn(rank_main, args=(free_port(), epochs, seed, settings["balance"], batch, missing, results),
                         nprocs=RANKS)
                accuracy = results.get()
                print(f"epochs {epochs} seed {seed}: {accuracy} ({time.perf_counter() - started:.0f} s)", flush=True)
                finals.setdefault(epochs, []).append(accuracy[-1])
    for epochs, values in finals.items():
        print(f"{epochs} epochs: final accuracy {min(values)} % to {max(values)} % over {len(values)} seeds "
              f"(bound {BOUND:g} %)")
    return finals


if __name__ == "__main__":
    main(sys.argv[1:])
