"""The scaling model of ``%pdl scale`` (pdl/scaling.py): ring all-reduce with buckets
overlapping the backward pass, checked against sums a user can do by hand."""

from __future__ import annotations

import pytest

from pdl.scaling import Link, StepProfile, fit_comm_cpu, fit_link, predict, table

pytestmark = pytest.mark.unit

MIB = 1024 * 1024


def test_a_ring_allreduce_sends_twice_the_data_over_the_slowest_link():
    link = Link(latency_s=1e-3, bandwidth_bytes_s=100e6)
    assert link.ring_allreduce_s(100e6, 1) == 0
    assert link.ring_allreduce_s(100e6, 2) == pytest.approx(2 * 1e-3 + 1.0)
    assert link.ring_allreduce_s(100e6, 4) == pytest.approx(6 * 1e-3 + 1.5)
    assert Link.gbit(1).bandwidth_bytes_s == 125e6


def test_a_links_latency_and_bandwidth_are_recovered_from_an_allreduce_sweep():
    truth = Link(latency_s=2e-4, bandwidth_bytes_s=12.5e6)
    sweep = [(size, truth.ring_allreduce_s(size, 3)) for size in (1e3, 1e5, 1e6, 8e6)]
    fitted = fit_link(sweep, nodes=3)
    assert fitted.latency_s == pytest.approx(truth.latency_s)
    assert fitted.bandwidth_bytes_s == pytest.approx(truth.bandwidth_bytes_s)
    with pytest.raises(ValueError, match="engines on 2 nodes or more, got 1"):
        fit_link(sweep, nodes=1)


def test_a_links_bandwidth_is_its_sustained_rate_even_when_small_messages_go_out_in_a_burst():
    """A shaped link lets a small message through at once (its token bucket's burst):
    the bandwidth comes from the large all-reduces only, the latency from the smallest."""
    truth = Link(latency_s=1e-3, bandwidth_bytes_s=6.25e6)
    burst = 64 * 1024
    sweep = [(size, truth.ring_allreduce_s(max(size - burst, 0), 3)) for size in (4096, 65536, 1 * MIB, 8 * MIB)]
    fitted = fit_link(sweep, nodes=3)
    assert fitted.bandwidth_bytes_s == pytest.approx(truth.bandwidth_bytes_s, rel=1e-9)
    assert fitted.latency_s == pytest.approx(truth.latency_s - 4096 / 6.25e6 / 3, rel=1e-9)  # less 4 KiB's share


def test_one_node_is_its_compute_and_a_slow_link_makes_the_step_wait_for_bandwidth():
    profile = StepProfile(forward_s=0.1, backward_s=0.2, grad_bytes=100 * MIB, images=64)
    alone = predict(profile, Link.gbit(1), 1)
    assert (alone.step_s, alone.efficiency, alone.bottleneck) == (pytest.approx(0.3), pytest.approx(1.0), "compute")
    slow = predict(profile, Link.gbit(1), 8)
    # 4 buckets of 25 MiB, each 2*7/8 * 25 MiB / 125 MB/s = 0.367 s after the first is ready at 0.15 s
    assert slow.step_s == pytest.approx(0.15 + 4 * (14 * 50e-6 + 14 / 8 * 25 * MIB / 125e6), rel=1e-6)
    assert slow.bottleneck == "bandwidth" and slow.efficiency < 0.25
    assert slow.images_per_s == pytest.approx(8 * 64 / slow.step_s)


def test_a_fast_link_hides_the_allreduce_behind_the_backward_pass():
    profile = StepProfile(forward_s=0.1, backward_s=0.2, grad_bytes=100 * MIB, images=64)
    fast = predict(profile, Link.gbit(100), 8)
    assert fast.bottleneck == "compute" and fast.efficiency > 0.95


def test_many_small_messages_make_the_step_wait_for_latency():
    profile = StepProfile(forward_s=0.001, backward_s=0.002, grad_bytes=4096, images=8, bucket_bytes=1024)
    assert predict(profile, Link(latency_s=5e-3, bandwidth_bytes_s=1e9), 16).bottleneck == "latency"


def test_the_table_has_every_link_and_node_count_and_efficiency_never_grows_with_nodes():
    profile = StepProfile(forward_s=0.05, backward_s=0.1, grad_bytes=45 * MIB, images=32)
    rows = table(profile, {"measured": Link(1e-4, 30e6), "10 Gbit": Link.gbit(10)})
    assert len(rows) == 2 * 32 and {r["link"] for r in rows} == {"measured", "10 Gbit"}
    for name in ("measured", "10 Gbit"):
        efficiency = [r["efficiency"] for r in rows if r["link"] == name]
        assert efficiency[0] == pytest.approx(1.0)
        assert all(a >= b - 1e-12 for a, b in zip(efficiency, efficiency[1:]))


def test_buckets_are_made_as_ddp_makes_them_from_the_order_gradients_are_ready():
    """DDP's first bucket closes at 1 MiB, later ones at 25 MiB, each ready with its last
    gradient: the first bucket's all-reduce overlaps the rest of the backward pass."""
    ready = ((0.05, 0.5 * MIB), (0.1, 0.75 * MIB), (0.2, 10 * MIB), (0.9, 0.25 * MIB), (1.0, 0.5 * MIB))
    profile = StepProfile(forward_s=0.1, backward_s=0.2, grad_bytes=12 * MIB, images=64, ready=ready)
    assert profile.buckets() == [(0.1, 1.25 * MIB), (1.0, 10.75 * MIB)]
    link = Link(latency_s=0, bandwidth_bytes_s=100 * MIB)  # 2 nodes: a bucket of s bytes takes s / 100 MiB/s
    step = predict(profile, link, 2).step_s
    first_done = 0.1 + 0.2 * 0.1 + 0.0125
    assert step == pytest.approx(max(first_done, 0.1 + 0.2) + 0.1075)  # the second waits for the pass's end
    evenly = predict(StepProfile(forward_s=0.1, backward_s=0.2, grad_bytes=12 * MIB, images=64), link, 2).step_s
    assert evenly == pytest.approx(0.3 + 0.12)  # one 12 MiB bucket, ready at the end


def test_the_cpu_an_allreduce_costs_a_rank_is_recovered_per_byte_it_moves():
    # 2 ns a byte a rank sends and receives; a ring over 4 nodes moves 1.5 times the tensor
    sweep = [(size, 1e-4 + 2e-9 * 1.5 * size) for size in (4e3, 1e6, 4e6, 16e6)]
    assert fit_comm_cpu(sweep, nodes=4) == pytest.approx(2e-9)
    with pytest.raises(ValueError, match="two sizes or more"):
        fit_comm_cpu(sweep[:1], nodes=4)


def test_on_cpus_the_step_is_at_least_the_ranks_cpu_work_at_the_rate_the_host_gives():
    # 40 ms forward and backward, 40 ms of CPU; 10 ns of CPU a byte moved; a 4 MB gradient
    link = Link(latency_s=0, bandwidth_bytes_s=50e6)
    free = StepProfile(forward_s=0.01, backward_s=0.03, grad_bytes=4_000_000, images=64)
    full = StepProfile(forward_s=0.01, backward_s=0.03, grad_bytes=4_000_000, images=64, cpu_s=0.04, cpu_rate=1.0,
                       comm_cpu_s_per_byte=10e-9)
    assert predict(full, link, 2).step_s == pytest.approx(predict(free, link, 2).step_s)  # the link decides
    # the host gives half of the time under a sustained load: (40 + 40) ms of CPU take 160 ms
    half = StepProfile(forward_s=0.01, backward_s=0.03, grad_bytes=4_000_000, images=64, cpu_s=0.04, cpu_rate=0.5,
                       comm_cpu_s_per_byte=10e-9)
    slowed = predict(half, link, 2)
    assert slowed.step_s == pytest.approx(0.16)
    assert predict(free, link, 2).step_s == pytest.approx(0.12)  # the gradient's 80 ms after the pass
    assert slowed.bottleneck == "cpu"
    alone = predict(half, link, 1)  # one node: the passes back to back, at half the time
    assert (alone.step_s, alone.bottleneck) == (pytest.approx(0.08), "compute")
    assert slowed.efficiency == pytest.approx(0.08 / 0.16)
