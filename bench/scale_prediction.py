"""Scaling prediction: what ``%pdl scale`` predicts for a training step on two nodes vs
the step DDP really takes there, over links of several speeds.

    .venv/bin/python bench/scale_prediction.py [--mbit 50,100,200] [--width 16] [--batch 64] [--steps 15]

Needs root and ``tc``: two simulated nodes (network namespaces on a bridge, each
engine on a CPU of its own, ``tests/harness/linked_nodes.py``), each node's outgoing
traffic shaped to the rate. The model is the notebook's ResNet-18 (``--width``) on
``--batch`` random CINIC-shaped images a rank, under DDP (gloo). For each rate:
``%pdl scale`` (``session.scale``) measures the step without communication and the
link, and predicts the step on two nodes; then ``--steps`` real DDP steps are timed
(forward, backward with the all-reduce, optimizer step; the slowest rank's time, the
median). Prints a table of predicted vs measured step time and scaling efficiency (the
step on one node over the step on two), then the ratio of predicted to measured step
time furthest from 1.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import statistics
from pathlib import Path

from _common import machine, positive_numbers, simulation

SETUP = """
import time, torch
from pdl_cinic10.model import ResNet18
torch.manual_seed(0)
torch.set_num_threads(1)
net = torch.nn.parallel.DistributedDataParallel(ResNet18(width={width}))
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
xs, ys = torch.rand({batch}, 3, 32, 32), torch.randint(0, 10, ({batch},))
def step():
    return torch.nn.functional.cross_entropy(net(xs), ys)
"""

TIME_STEPS = """
times = []
for i in range({steps} + 1):
    started = time.perf_counter()
    opt.zero_grad()
    step().backward()
    opt.step()
    times.append(time.perf_counter() - started)
times[1:]
"""


def main(argv=None) -> float:
    args = parse(argv)
    linked_nodes = simulation("linked_nodes", "scale_prediction")
    rates = args.mbit
    from pdl_magics import DistributedSession

    print(f"# scale prediction: {machine()}")
    print(f"# ResNet-18 width {args.width}, batch {args.batch} a rank, 2 nodes; {args.steps} timed steps a rate")
    os.environ["PDL_WORKERS"] = "2"
    os.environ.pop("PDL_CLUSTER_DIR", None)
    quiet = {"out": io.StringIO(), "err": io.StringIO(), "preflight": False}
    rows = []
    with linked_nodes.linked_engines(2, str(Path.home() / ".cache" / "pdl" / "bench" / "linked-profile")) as (
            cluster, nodes):
        session = DistributedSession(cluster_file=cluster.cluster_file, preflight=False)
        try:
            session.run(SETUP.format(width=args.width, batch=args.batch), 2, **quiet)
            for mbit in rates:
                linked_nodes.shape(nodes, mbit)
                report = session.scale("step", "net", args.batch, 2)
                [predicted] = [r for r in report.rows if r["link"] == "measured" and r["nodes"] == 2]
                result = session.run(TIME_STEPS.format(steps=args.steps), 2, **quiet)
                measured = statistics.median(max(ranks) for ranks in zip(*(ast.literal_eval(v) for v in result.values)))
                compute = report.profile.one_node_s()
                rows.append((mbit, report.measured.bandwidth_bytes_s * 8 / 1e6, predicted, measured, compute))
        finally:
            session.close()
    print("| link (tc) | measured link | predicted step | measured step | predicted / measured "
          "| predicted efficiency | measured efficiency |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for mbit, link, predicted, measured, compute in rows:
        print(f"| {mbit:g} Mbit/s | {link:.0f} Mbit/s | {predicted['step_s'] * 1e3:.0f} ms | {measured * 1e3:.0f} ms "
              f"| {predicted['step_s'] / measured:.2f} | {predicted['efficiency']:.2f} | {compute / measured:.2f} |")
    worst = max((p["step_s"] / m for _, _, p, m, _ in rows), key=lambda r: abs(r - 1))
    print(f"\nratio predicted / measured step (furthest from 1): {worst:.2f}")
    return worst


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mbit", type=positive_numbers, default="50,100,200", help="the links' rates, Mbit/s")
    p.add_argument("--width", type=int, default=16, help="the ResNet-18's width")
    p.add_argument("--batch", type=int, default=64, help="images a rank a step")
    p.add_argument("--steps", type=int, default=15, help="timed DDP steps a rate")
    return p.parse_args(argv)


if __name__ == "__main__":
    main()
