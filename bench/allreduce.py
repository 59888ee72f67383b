"""Gradient all-reduce bandwidth: during DDP training on PDL engines vs a bare all_reduce.

    .venv/bin/python bench/allreduce.py [-n 2] [--batch 32] [--width 16] [--steps 10] [--warmup 3] [--iters 20]

Starts a local PDL cluster of ``-n`` engines (this machine's GPUs, else CPU
slots) and runs one cell (:data:`MEASURE`) on it:

- **training**: the CINIC-10 ResNet-18 (``--width``) in DDP (NCCL on GPUs,
  gloo on the CPU), SGD on a fixed random batch of ``--batch`` uint8 images per
  rank, ``--warmup`` untimed steps, then ``--steps`` timed ones, each after a
  barrier (so that ranks start it together). A DDP
  communication hook does what DDP's default one does (divide the bucket by
  the world size, ``all_reduce`` it asynchronously) and records when each
  bucket's all-reduce was launched and when it finished (CUDA events on a GPU).
  The all-reduce time of a step is the time during which at least one bucket
  was in flight (overlapping buckets are not counted twice); the bytes are the
  buckets' sizes (float32 gradients).
- **bare**: ``dist.all_reduce`` in a loop of ``--iters`` on idle engines, of
  tensors of the same bucket sizes (launched together, as DDP does, then
  waited for) and of one tensor of their total size; each bucket size alone too.

Training times are medians over the timed steps, per rank. A bucket's
all-reduce cannot finish before the last rank has launched it, so a rank that
launched early also counts waiting for its peers: the training time is given for
the rank that waited least (the minimum over ranks; most of the skew between
ranks excluded: the bandwidth estimate) and the one that waited most (the
maximum). Bare times are means over the loop, the maximum over ranks.
Bandwidths follow nccl-tests: algbw = bytes / time, busbw = algbw * 2 (N - 1) / N,
in GB/s (1e9 bytes/s). Prints the tables and the ratio training busbw (rank that
waited least) / bare busbw of the same buckets.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys

from _common import local_slots, machine

#: The cell: defines ``measure``, whose result (plain numbers) comes back as a repr.
MEASURE = '''
def measure(device, world_size, batch, width, warmup, steps, iters):
    """This rank's {"backend", "step_s", "train_s", "buckets": [{"index", "bytes",
    "train_s", "bare_s"}] in launch order, "together_s", "whole_s"}, in seconds."""
    import statistics, time
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from pdl_cinic10.model import ResNet18

    cuda = device.type == "cuda"

    def stamp():
        """Now: a CUDA event recorded on the current stream, or perf_counter seconds."""
        if not cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(a, b):
        return a.elapsed_time(b) / 1000 if cuda else b - a

    def sync():
        if cuda:
            torch.cuda.synchronize(device)
        dist.all_reduce(torch.zeros(1, device=device))

    launched = []  # (bucket index, bytes, start, end) of this step's buckets

    def timed_allreduce(state, bucket):
        buf = bucket.buffer().div_(world_size)
        start = stamp()

        def done(fut):
            launched.append((bucket.index(), buf.numel() * buf.element_size(), start, stamp()))
            return fut.value()[0]

        return dist.all_reduce(buf, async_op=True).get_future().then(done)

    torch.manual_seed(0)
    module = ResNet18(width=width).to(device)
    net = DistributedDataParallel(module, device_ids=[device] if cuda else None)
    net.register_comm_hook(None, timed_allreduce)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    images = torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8, device=device)
    labels = torch.randint(0, 10, (batch,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()

    step_s, busy_s, per_bucket = [], [], {}
    for i in range(warmup + steps):
        sync()
        launched.clear()
        ref = stamp()
        optimizer.zero_grad()
        loss_fn(net(images.float().div_(255)), labels).backward()
        optimizer.step()
        end = stamp()
        if cuda:
            torch.cuda.synchronize(device)
        if i < warmup:
            continue  # DDP rebuilds its buckets after the first step
        spans = sorted((seconds(ref, a), seconds(ref, b), index, size) for index, size, a, b in launched)
        busy, reach = 0.0, float("-inf")
        for a, b, index, size in spans:  # length of the union of [a, b]
            busy += max(0.0, b - max(a, reach))
            reach = max(reach, b)
            per_bucket.setdefault((index, size), []).append(b - a)
        order = [(index, size) for a, b, index, size in spans]
        step_s.append(seconds(ref, end))
        busy_s.append(busy)
    del net, optimizer, module

    def bare(fn):
        """Mean seconds of fn() over the loop, after two untimed calls."""
        for _ in range(2):
            fn()
        sync()
        started = time.perf_counter()
        for _ in range(iters):
            fn()
        if cuda:
            torch.cuda.synchronize(device)
        return (time.perf_counter() - started) / iters

    bufs = [torch.ones(size // 4, device=device) for index, size in order]
    whole = torch.ones(sum(size for index, size in order) // 4, device=device)
    buckets = [
        {"index": index, "bytes": size, "train_s": statistics.median(per_bucket[index, size]),
         "bare_s": bare(lambda b=b: dist.all_reduce(b))}
        for (index, size), b in zip(order, bufs)
    ]
    together = bare(lambda: [w.wait() for w in [dist.all_reduce(b, async_op=True) for b in bufs]])
    return {"backend": dist.get_backend(), "step_s": statistics.median(step_s),
            "train_s": statistics.median(busy_s), "buckets": buckets, "together_s": together,
            "whole_s": bare(lambda: dist.all_reduce(whole))}
'''


def main(argv=None) -> float:
    """Run the benchmark; return training busbw (rank that waited least) / bare busbw
    of the same buckets."""
    args = _parse(argv)
    from pdl_magics import DistributedSession

    slots = local_slots(args.n)
    session = DistributedSession(local_slots=slots)
    try:
        device = ast.literal_eval(session.run("str(device)", args.n, out=io.StringIO()).values[0])
        call = f"measure(device, world_size, {args.batch}, {args.width}, {args.warmup}, {args.steps}, {args.iters})"
        values = session.run(f"{MEASURE}\n{call}", args.n, out=io.StringIO()).values
        ranks = [ast.literal_eval(v) for v in values]
    finally:
        session.close()

    def over_ranks(get, how=max):
        return how(get(r) for r in ranks)

    n, buckets = args.n, ranks[0]["buckets"]
    total = sum(b["bytes"] for b in buckets)
    train_min, train_max = over_ranks(lambda r: r["train_s"], min), over_ranks(lambda r: r["train_s"])
    together, whole = over_ranks(lambda r: r["together_s"]), over_ranks(lambda r: r["whole_s"])
    step = over_ranks(lambda r: r["step_s"])
    print(f"\n{n} ranks on {device} ({ranks[0]['backend']}), pool {','.join(slots)}; ResNet-18 width "
          f"{args.width}, batch {args.batch} per rank, {args.steps} timed steps after {args.warmup}; "
          f"bare loops of {args.iters}; {machine()}")
    print(f"training step {1000 * step:.1f} ms (median, slowest rank); gradient all-reduce in flight "
          f"{1000 * train_min:.1f}-{1000 * train_max:.1f} ms of it (rank that waited least - most)\n")
    print("| measurement | bytes | time ms | algbw GB/s | busbw GB/s |")
    print("|---|---:|---:|---:|---:|")
    k = f"{len(buckets)} bucket(s)"
    rows = [
        (f"training: DDP gradient all-reduce, {k} per step, rank that waited least", train_min),
        ("training: the same, rank that waited most (includes waiting for peers)", train_max),
        (f"bare all_reduce: the same {k}, launched together", together),
        ("bare all_reduce: one tensor of the total size", whole),
    ]
    for label, seconds in rows:
        print(f"| {label} | {total} | {1000 * seconds:.2f} | {_gbps(total, seconds):.3f} "
              f"| {_gbps(total, seconds, n):.3f} |")
    print("\n| bucket (launch order) | bytes | training ms (least - most waiting) | training busbw GB/s "
          "| bare ms | bare busbw GB/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for i, b in enumerate(buckets):
        lo = over_ranks(lambda r: r["buckets"][i]["train_s"], min)
        hi = over_ranks(lambda r: r["buckets"][i]["train_s"])
        bare = over_ranks(lambda r: r["buckets"][i]["bare_s"])
        print(f"| {b['index']} | {b['bytes']} | {1000 * lo:.2f} - {1000 * hi:.2f} "
              f"| {_gbps(b['bytes'], lo, n):.3f} | {1000 * bare:.2f} | {_gbps(b['bytes'], bare, n):.3f} |")
    ratio = together / train_min  # same bytes: the busbw ratio is the inverse time ratio
    print(f"\nratio training busbw / bare busbw (same buckets): {ratio:.2f}; "
          f"vs one tensor: {whole / train_min:.2f}; "
          f"rank that waited most vs same buckets: {together / train_max:.2f}")
    return ratio


def _gbps(size: int, seconds: float, n: int | None = None) -> float:
    """algbw (``n`` None) or busbw (``n`` ranks) in GB/s for ``size`` bytes in ``seconds``."""
    algbw = size / seconds / 1e9
    return algbw if n is None else algbw * 2 * (n - 1) / n


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=2, help="ranks (engines), at least 2; default 2")
    p.add_argument("--batch", type=int, default=32, help="images per rank per step; default 32")
    p.add_argument("--width", type=int, default=16, help="ResNet-18 width; default 16")
    p.add_argument("--steps", type=int, default=10, help="timed training steps; default 10")
    p.add_argument("--warmup", type=int, default=3, help="untimed training steps first (>= 2); default 3")
    p.add_argument("--iters", type=int, default=20, help="timed all_reduce calls per bare loop; default 20")
    args = p.parse_args(argv)
    if args.n < 2 or args.warmup < 2:
        p.error("-n and --warmup must be at least 2")
    return args


if __name__ == "__main__":
    sys.exit(0 if main() > 0 else 1)
