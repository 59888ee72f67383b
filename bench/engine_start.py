"""Engine start: engines forked from PDL's warm parent vs ipyparallel's own launcher, cold.

    .venv/bin/python bench/engine_start.py [-n 2] [--rounds 3]

Each round starts one local cluster per way, the two ways alternating (which goes first
flips every round, so load changes hit both alike), both with PDL's engine command
(:data:`pdl.engine_contract.ENGINE_COMMAND`) on the same slots:

- **warm**: PDL's launcher (:mod:`pdl_server.warm_engines`), the warm parent started
  before the controller, as a user's server does;
- **cold**: no warm parent, so PDL's launcher starts each engine as ipyparallel's own
  ``LocalEngineSetLauncher`` does, its own Python that imports everything (how every
  engine started before the warm parent, and how Slurm's steps still do).

Measured, per round and way: the seconds from asking for ``-n`` engines to the first
result of a call on all of them that imports what a first ``%%distributed`` cell does
(torch, torch.distributed, PDL's engine runtime); the CPU-seconds
of each engine process and its nanny by then, and the same with the warm parent's own
(its imports) shared over the ``-n`` engines; after one engine is killed (SIGKILL), the
seconds until its replacement answers. Prints medians per way and the ratios cold / warm.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time

import psutil
from _common import local_slots


def _cpu_s(pid: int) -> float:
    """CPU-seconds of ``pid`` and its live descendants (an engine and its nanny)."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def _answer():
    """What a first ``%%distributed`` cell makes an engine import (torch, its collectives,
    PDL's runtime), then its pid."""
    import os

    import torch.distributed  # noqa: F401
    import pdl.runtime.engine  # noqa: F401

    return os.getpid(), os.environ["PDL_SLOT"]


def one_round(way: str, slots: list[str], profile: str) -> dict:
    from pdl_server import clusters, warm_engines

    cluster = clusters.new_cluster(cluster_id=f"bench-{way}-{os.getpid()}-{time.monotonic_ns()}",
                                   profile_dir=profile)
    parent = None
    if way == "warm":
        parent = warm_engines.warm_up(cluster)
    clusters.start_controller(cluster)
    client = cluster.connect_client_sync()
    try:
        started = time.monotonic()
        clusters.start_slot_engines(cluster, slots, slots)
        client.wait_for_engines(len(slots), timeout=120)
        answers = client[:].apply_sync(_answer)
        pids = [pid for pid, _ in answers]
        first_s = time.monotonic() - started
        engines_cpu = [_cpu_s(pid) for pid in pids]
        parent_cpu = _cpu_s(parent.pid) - sum(engines_cpu) if parent is not None else 0.0
        victim, victim_slot = answers[0]
        os.kill(victim, signal.SIGKILL)
        while psutil.pid_exists(victim):
            time.sleep(0.01)
        started = time.monotonic()
        clusters.restart_slot_engine(cluster, victim_slot, slots)
        deadline = started + 60
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{way}: the replaced engine did not answer within 60 s")
            try:
                live = client[:].apply_sync(_answer)
            except Exception:  # noqa: BLE001 - the dead engine is still listed for a moment
                time.sleep(0.02)
                continue
            if len(live) == len(slots) and victim not in [pid for pid, _ in live]:
                break
            time.sleep(0.02)
        replace_s = time.monotonic() - started
    finally:
        client.close()
        cluster.stop_cluster_sync()
        warm_engines.stop_warm_parent(cluster)
    return dict(first_s=first_s, engine_cpu_s=statistics.mean(engines_cpu),
                shared_cpu_s=statistics.mean(engines_cpu) + parent_cpu / len(slots), replace_s=replace_s)


def main(argv=None) -> float:
    """Run the benchmark; return the ratio cold / warm of the CPU-seconds per engine start
    (the warm parent's imports shared over the engines)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2, help="engines per cluster (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both ways (default 3)")
    args = parser.parse_args(argv)
    if args.n < 1 or args.rounds < 1:
        parser.error("-n and --rounds must be at least 1")
    slots = local_slots(args.n)
    results: dict[str, list[dict]] = {"warm": [], "cold": []}
    with tempfile.TemporaryDirectory(prefix="pdl-bench-engines-") as folder:
        for r in range(args.rounds):
            for way in (("warm", "cold") if r % 2 == 0 else ("cold", "warm")):
                results[way].append(one_round(way, slots, os.path.join(folder, f"{way}-{r}")))
    rows = {way: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            for way, runs in results.items()}
    print(f"{args.n} engines on {', '.join(slots)}, {args.rounds} rounds, medians; "
          f"{os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print("| way | to first result (s) | CPU-s an engine | with the warm parent shared (CPU-s) | replaced (s) |")
    print("|---|---|---|---|---|")
    for way in ("cold", "warm"):
        row = rows[way]
        print(f"| {way} | {row['first_s']:.2f} | {row['engine_cpu_s']:.2f} | {row['shared_cpu_s']:.2f} "
              f"| {row['replace_s']:.2f} |")
    ratio = rows["cold"]["shared_cpu_s"] / rows["warm"]["shared_cpu_s"]
    print(f"cold / warm: to first result {rows['cold']['first_s'] / rows['warm']['first_s']:.1f}x, "
          f"CPU-s per engine start {ratio:.1f}x "
          f"(the engine alone {rows['cold']['engine_cpu_s'] / rows['warm']['engine_cpu_s']:.1f}x), "
          f"replacement {rows['cold']['replace_s'] / rows['warm']['replace_s']:.1f}x")
    return ratio


if __name__ == "__main__":
    main()
