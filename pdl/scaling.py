"""What more nodes, or a faster link, would do to a training step: a ring all-reduce
model with the backward pass overlapping the gradient buckets' all-reduces. Pure, no
torch: ``%pdl scale`` feeds it what it measured on the user's engines.

A step on one node takes ``forward_s + backward_s`` (computation only). With ``N``
nodes, one worker each, the gradient (``grad_bytes``) is all-reduced in buckets as DDP
makes them: the gradients in the order the backward pass makes them (``ready``, as
measured), the first bucket closed once it holds 1 MiB, each later one at
``bucket_bytes`` (25 MiB); a bucket is ready with its last gradient. Without that
order, the gradient is cut into buckets of ``bucket_bytes``, bucket ``k`` of ``K``
ready once that share of the backward pass is done. A bucket's ring all-reduce,
``2(N-1)`` messages of ``size/N`` each, takes ``2(N-1) * latency_s + 2(N-1)/N * size /
bandwidth``. The buckets are reduced one after another, each as soon as it is ready and
the previous one is done; the step ends with the later of the backward pass and the
last bucket.

Where the ranks compute on their CPUs, communication is not free for them: the
all-reduce's copies and sums and the kernel's network stack take CPU time
(``comm_cpu_s_per_byte``, a byte a rank sends and receives, ``2(N-1)/N`` of the gradient
in a ring) from the cores the backward pass runs on, and a host may give a rank's cores
only part of their time under a sustained load (a CPU quota, a busy host: ``cpu_rate``,
CPU seconds a second as measured over many passes). So the step is also at least the
rank's CPU work, the pass's and the all-reduce's, over ``cpu_rate``; the step is the
later of the two bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdl.line_fit import line_through

#: DDP's default bucket size (bytes), which the model assumes unless told otherwise.
DDP_BUCKET_BYTES = 25 * 1024 * 1024
#: DDP's first bucket (the gradients the backward pass makes first) closes at this size.
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
#: Link speeds every prediction is shown for besides the measured one, in Gbit/s.
LINKS_GBIT = (1, 10, 25, 100)
#: All-reduces of this many bytes or more tell a link's sustained bandwidth.
LARGE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Link:
    """A network link: one message's fixed cost and the bytes a second it carries."""

    latency_s: float
    bandwidth_bytes_s: float

    @classmethod
    def gbit(cls, gbit_s: float, latency_s: float = 50e-6) -> Link:
        """A link of ``gbit_s`` Gbit/s (1 Gbit = 10^9 bit) and ``latency_s`` a message."""
        return cls(latency_s, gbit_s * 1e9 / 8)

    def ring_allreduce_s(self, size_bytes: float, nodes: int) -> float:
        """Seconds a ring all-reduce of ``size_bytes`` over ``nodes`` takes (0 on one node)."""
        if nodes < 2:
            return 0.0
        steps = 2 * (nodes - 1)
        return steps * self.latency_s + steps / nodes * size_bytes / self.bandwidth_bytes_s


def fit_link(samples: list[tuple[float, float]], nodes: int) -> Link:
    """The link whose ring all-reduce over ``nodes`` matches ``(bytes, seconds)``
    samples of an all-reduce sweep, as Hockney's model is fitted: the bandwidth from
    the least-squares slope through the sizes of :data:`LARGE_BYTES` or more (the two
    largest sizes if fewer are that large), the sizes a gradient's buckets have; the
    latency from the smallest size, less its bandwidth term. Small messages are left
    out of the slope because links and TCP send them in bursts faster than their
    sustained rate. ValueError (one line) with fewer than two sizes or nodes."""
    if nodes < 2:
        raise ValueError(f"measuring a link needs engines on 2 nodes or more, got {nodes}")
    sizes = sorted({b for b, _ in samples})
    if len(sizes) < 2:
        raise ValueError("measuring a link needs all-reduces of two sizes or more")
    slope = max(_slope_over_large_sizes(samples), 1e-15)
    smallest = min(t for b, t in samples if b == sizes[0])
    steps = 2 * (nodes - 1)
    return Link(latency_s=max(smallest - slope * sizes[0], 0.0) / steps, bandwidth_bytes_s=steps / nodes / slope)


def fit_comm_cpu(samples: list[tuple[float, float]], nodes: int) -> float:
    """CPU seconds a rank spends a byte it sends and receives in an all-reduce, from
    ``(bytes, CPU seconds)`` samples of a sweep over ``nodes`` (a ring all-reduce moves
    ``2(N-1)/N`` of the tensor through each rank): the slope through the same sizes as
    :func:`fit_link`'s bandwidth, never below 0. ValueError (one line) as there."""
    if nodes < 2:
        raise ValueError(f"measuring a link needs engines on 2 nodes or more, got {nodes}")
    if len({b for b, _ in samples}) < 2:
        raise ValueError("measuring a link needs all-reduces of two sizes or more")
    return max(_slope_over_large_sizes(samples), 0.0) / (2 * (nodes - 1) / nodes)


def _slope_over_large_sizes(samples: list[tuple[float, float]]) -> float:
    """The least-squares slope of ``(bytes, value)`` samples through the sizes of
    :data:`LARGE_BYTES` or more (the two largest sizes if fewer are that large)."""
    sizes = sorted({b for b, _ in samples})
    large = [b for b in sizes if b >= LARGE_BYTES]
    large = large if len(large) >= 2 else sizes[-2:]
    _, slope = line_through([(b, v) for b, v in samples if b in large])
    return slope


@dataclass(frozen=True)
class StepProfile:
    """One worker's step, measured with communication off."""

    forward_s: float
    backward_s: float
    grad_bytes: int
    images: int
    bucket_bytes: int = DDP_BUCKET_BYTES
    #: ``(fraction of the backward pass, bytes)`` for each gradient in the order it is
    #: ready; empty: unknown, taken as spread evenly over the pass
    ready: tuple[tuple[float, float], ...] = ()
    #: CPU seconds the rank's processes spend on one forward and backward pass, all
    #: their threads; 0: not measured (the ranks compute on GPUs), no CPU bound
    cpu_s: float = 0.0
    #: CPU seconds a second the rank's processes got over many passes in a row (about
    #: the threads' count on a host that gives its cores fully, less under a quota)
    cpu_rate: float = 0.0
    #: CPU seconds a byte a rank sends and receives in an all-reduce costs it
    #: (:func:`fit_comm_cpu`)
    comm_cpu_s_per_byte: float = 0.0

    def one_node_s(self) -> float:
        """The step on one node, without communication: the pass, or the rank's CPU
        work for it at ``cpu_rate`` where that is longer (seconds)."""
        return max(self.forward_s + self.backward_s, self.cpu_bound_s(1))

    def cpu_bound_s(self, nodes: int) -> float:
        """The least a step on ``nodes`` nodes can take for the rank's CPU work (the
        pass's and the all-reduce's) at ``cpu_rate`` (seconds; 0 where not measured)."""
        if self.cpu_s <= 0 or self.cpu_rate <= 0:
            return 0.0
        moved = 2 * (nodes - 1) / nodes * self.grad_bytes
        return (self.cpu_s + self.comm_cpu_s_per_byte * moved) / self.cpu_rate

    def buckets(self) -> list[tuple[float, float]]:
        """``(fraction of the backward pass when ready, bytes)`` of each bucket, in the
        order they are reduced (see the module docstring)."""
        if not self.ready:
            count = max(1, -(-self.grad_bytes // self.bucket_bytes))
            return [((k + 1) / count, min(self.bucket_bytes, self.grad_bytes - k * self.bucket_bytes))
                    for k in range(count)]
        buckets, size, last = [], 0.0, 0.0
        for fraction, nbytes in self.ready:
            size, last = size + nbytes, max(last, fraction)
            if size >= (DDP_FIRST_BUCKET_BYTES if not buckets else self.bucket_bytes):
                buckets.append((last, size))
                size = 0.0
        if size:
            buckets.append((last, size))
        return buckets


@dataclass(frozen=True)
class Prediction:
    nodes: int
    step_s: float
    images_per_s: float
    #: the step on one node over the step on ``nodes`` (1.0: perfect scaling)
    efficiency: float
    #: "compute", "cpu" (the rank's CPU, computing and communicating), "latency" or
    #: "bandwidth": what the step waits for most
    bottleneck: str


def predict(profile: StepProfile, link: Link, nodes: int) -> Prediction:
    """The step on ``nodes`` nodes over ``link`` (see the module docstring). Its
    efficiency is the step on one node over it."""
    compute = profile.one_node_s()
    done = 0.0
    latency_total = bandwidth_total = 0.0
    for fraction, size in profile.buckets():
        ready = profile.forward_s + profile.backward_s * fraction
        took = link.ring_allreduce_s(size, nodes)
        latency_total += link.ring_allreduce_s(0, nodes)
        bandwidth_total += took - link.ring_allreduce_s(0, nodes)
        done = max(ready, done) + took
    cpu_bound = profile.cpu_bound_s(nodes)
    step = max(compute, done, cpu_bound)
    exposed = step - compute
    if exposed <= 0.05 * compute:
        bottleneck = "compute"
    elif cpu_bound >= done:
        bottleneck = "cpu"
    else:
        bottleneck = "latency" if latency_total > bandwidth_total else "bandwidth"
    return Prediction(nodes=nodes, step_s=step, images_per_s=nodes * profile.images / step,
                      efficiency=compute / step, bottleneck=bottleneck)


def table(profile: StepProfile, links: dict[str, Link], nodes: range = range(1, 33)) -> list[dict]:
    """One row per link and node count: ``{"link", "nodes", "step_s", "images_per_s",
    "efficiency", "bottleneck"}``, for ``%pdl scale`` to print and plot."""
    rows = []
    for name, link in links.items():
        for n in nodes:
            p = predict(profile, link, n)
            rows.append({"link": name, "nodes": n, "step_s": p.step_s, "images_per_s": p.images_per_s,
                         "efficiency": p.efficiency, "bottleneck": p.bottleneck})
    return rows
