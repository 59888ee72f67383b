"""``%pdl scale``'s prediction against the step DDP really takes, on two simulated
nodes whose link is shaped with ``tc`` to three rates (``tests/harness/linked_nodes.py``).

The model is a multilayer perceptron of about a million weights (a 4 MiB gradient, in
DDP's 1 MiB first bucket and one more), large enough that the link, not the computation,
decides the step at the slowest rate. For each rate, ``session.scale`` measures the step
without communication and the link, and predicts the step on two nodes; real DDP steps
(forward, backward with the all-reduce, optimizer step) are timed on the same engines
just before and just after, and the slowest rank's median step is the measured one. The issue's bounds:
the step within 15 %, the scaling efficiency (the step without communication over the
measured step) within 0.10. The same bounds hold on a host that gives each engine's core
only in slices (a CPU quota of half a core in every 100 ms, or 20 ms at 400 Mbit/s), where a prediction
from a few passes and the link alone missed by 21 % one way and 30 % the other.
"""

from __future__ import annotations

import ast
import io
import statistics
from pathlib import Path

import pytest

import cpu_quota
import linked_nodes

pytestmark = [pytest.mark.integration, pytest.mark.timing,
              pytest.mark.skipif(linked_nodes.problem() is not None, reason=str(linked_nodes.problem()))]

#: The links' rates (Mbit/s): the all-reduce from most to least of the step.
RATES_MBIT = (100, 200, 400)
#: Images a rank a step.
BATCH = 1024
#: Timed DDP steps a rate, half before and half after the prediction; the median is compared.
STEPS = 16
#: The host that gives cores in slices: each engine half a core, in periods of (us):
#: long ones, whose 50 ms pauses a probe of few passes caught, and short ones, where
#: what is tested is the rate alone. Each engine's period runs on a timer of its own,
#: which starts again whenever its engine has been idle for a period: two engines'
#: pauses fall at moments that drift from one step to the next, and a step that waits
#: for the other rank's gradients waits for its pause too, up to one pause a step (a
#: 250 ms step took 214 ms in the eight steps before a prediction and 306 in the eight
#: after it, in 100 ms periods), which no probe can know in advance.
SLICED_SHARE, LONG_SLICES_US, SHORT_SLICES_US = 0.5, 100_000, 20_000

SETUP = f"""
import time, torch
torch.manual_seed(0)
torch.set_num_threads(1)
net = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512), torch.nn.ReLU(),
    torch.nn.Linear(512, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
xs, ys = torch.rand({BATCH}, 256), torch.randint(0, 10, ({BATCH},))
def step():
    return torch.nn.functional.cross_entropy(net(xs), ys)
"""

#: Each timed step's parts, in seconds: (zero_grad and forward, backward with DDP's
#: all-reduces, optimizer step).
TIME_STEPS = f"""
times = []
for i in range({STEPS // 2} + 1):
    started = time.perf_counter()
    opt.zero_grad()
    loss = step()
    forward = time.perf_counter()
    loss.backward()
    backward = time.perf_counter()
    opt.step()
    times.append((forward - started, backward - forward, time.perf_counter() - backward))
times[1:]
"""


def cpu_times() -> list[int]:
    """Every core's time since boot, in clock ticks, as /proc/stat's first line has it
    (user, nice, system, idle, iowait, irq, softirq, steal)."""
    return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def machine_share(before: list[int], after: list[int]) -> str:
    """What the machine's cores did between two :func:`cpu_times`: busy and stolen (the
    hypervisor's), as shares of their time."""
    delta = [b - a for a, b in zip(before, after)]
    total = max(sum(delta), 1)
    busy = total - delta[3] - delta[4] - delta[7]
    return f"cores {busy / total:.0%} busy, {delta[7] / total:.0%} stolen"


@pytest.fixture(scope="module")
def linked_session(tmp_path_factory):
    from pdl_magics import DistributedSession

    with pytest.MonkeyPatch.context() as env, linked_nodes.linked_engines(
            2, str(tmp_path_factory.mktemp("linked-profile"))) as (cluster, nodes):
        env.setenv("PDL_WORKERS", "2")
        env.delenv("PDL_CLUSTER_DIR", raising=False)
        session = DistributedSession(cluster_file=cluster.cluster_file, preflight=False)
        try:
            session.run(SETUP, 2, out=io.StringIO(), err=io.StringIO(), preflight=False)
            yield session, nodes
        finally:
            session.close()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mbit", RATES_MBIT)
def test_predicted_step_is_within_15_percent_of_the_measured_one(linked_session, mbit):
    session, nodes = linked_session
    check_prediction(session, nodes, mbit)


@pytest.mark.timeout(600)
@pytest.mark.skipif(cpu_quota.problem() is not None, reason=str(cpu_quota.problem()))
@pytest.mark.parametrize(("mbit", "period_us"), [(100, LONG_SLICES_US), (400, SHORT_SLICES_US)])
def test_the_prediction_holds_where_the_host_gives_each_engine_half_a_core_in_slices(linked_session, mbit,
                                                                                     period_us):
    """At 100 Mbit/s in 100 ms periods a profile of a few passes could catch a slice's
    pause and predicted 21 % too long (a 400 ms step spans four periods); at 400 the
    step's CPU work, the pass's and the all-reduce's, is more than half a core gives, and
    the link alone predicted 30 % too short: in periods short beside the step, so that
    the two engines' drifting pauses (:data:`SLICED_SHARE`) do not decide it."""
    session, nodes = linked_session
    with cpu_quota.quotas({pid: SLICED_SHARE for pid in session.engines.pids().values()}, name="pdl-test-sliced",
                          period_us=period_us):
        check_prediction(session, nodes, mbit)


def timed_steps(session) -> list[list[tuple[float, float, float]]]:
    """Per rank, :data:`STEPS` // 2 real DDP steps' parts (seconds), as :data:`TIME_STEPS` times them."""
    result = session.run(TIME_STEPS, 2, out=io.StringIO(), err=io.StringIO(), preflight=False)
    return [ast.literal_eval(v) for v in result.values]


def slowest_median(steps: list[list[tuple[float, float, float]]]) -> float:
    """The median, over the steps, of the slowest rank's step (seconds): what a step of
    the group took, as DDP waits for its slowest rank."""
    return statistics.median(max(sum(parts) for parts in at_step) for at_step in zip(*steps))


def check_prediction(session, nodes, mbit: int) -> None:
    """Shape the links to ``mbit``, predict the step with ``%pdl scale``, time real DDP
    steps, and hold the prediction to the issue's bounds (the message names the parts)."""
    linked_nodes.shape(nodes, mbit)
    cores_before = cpu_times()
    # real steps just before and just after the prediction, whose probe times passes
    # first and last (before and after its all-reduce sweep): a shared virtual machine's
    # core speeds up and slows down from one second to the next and over tens of seconds,
    # and the steps see the machine at the moments the probe saw it
    first = timed_steps(session)
    report = session.scale("step", "net", BATCH, 2)
    [predicted] = [r for r in report.rows if r["link"] == "measured" and r["nodes"] == 2]
    last = timed_steps(session)
    steps = [early + late for early, late in zip(first, last)]
    measured = slowest_median(steps)
    slowest = max(steps, key=lambda rank: statistics.median(sum(parts) for parts in rank))
    parts = "/".join(f"{statistics.median(p[i] for p in slowest) * 1e3:.0f}" for i in range(3))
    compute = report.profile.one_node_s()
    link = report.measured
    said = (f"at {mbit} Mbit/s (measured {link.bandwidth_bytes_s * 8 / 1e6:.0f}, {link.latency_s * 1e6:.0f} us): "
            f"predicted {predicted['step_s'] * 1e3:.0f} ms, measured {measured * 1e3:.0f} ms "
            f"({slowest_median(first) * 1e3:.0f} before the prediction, {slowest_median(last) * 1e3:.0f} after; "
            f"forward/backward with the all-reduce/optimizer {parts} ms); compute {compute * 1e3:.0f} ms "
            f"(forward {report.profile.forward_s * 1e3:.0f}; CPU {report.profile.cpu_s * 1e3:.0f} ms at "
            f"{report.profile.cpu_rate:.2f} CPU-s a second, the all-reduce's "
            f"{report.profile.cpu_bound_s(2) * report.profile.cpu_rate * 1e3 - report.profile.cpu_s * 1e3:.0f} ms); "
            f"{machine_share(cores_before, cpu_times())}")
    print(said)
    assert abs(predicted["step_s"] / measured - 1) <= 0.15, said
    assert abs(predicted["efficiency"] - compute / measured) <= 0.10, said
