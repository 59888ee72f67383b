"""How a global batch is split over ranks of unequal speed (pdl/balance/plan.py): pure
arithmetic, checked against brute force and against what a user would compute by hand."""

from __future__ import annotations

import itertools
import random

import pytest

from pdl.balance.plan import Plan, SpeedFit, even_split, fit_speed, imbalance, plan_split

pytestmark = pytest.mark.unit

ONE_TWO_FOUR = [SpeedFit(0.0, 0.001), SpeedFit(0.0, 0.002), SpeedFit(0.0, 0.004)]


def test_ranks_one_two_and_four_times_slower_get_batches_in_the_ratio_four_two_one():
    plan = plan_split(70, ONE_TWO_FOUR)
    assert plan.batches == (40, 20, 10)
    even = even_split(70, 3)
    assert even.batches == (24, 23, 23)
    even_s = max(f.step_s(b) for f, b in zip(ONE_TWO_FOUR, even.batches))
    assert even_s / plan.predicted_step_s() == pytest.approx(92 / 40)


def test_equal_ranks_get_an_even_split():
    assert plan_split(64, [SpeedFit(0.01, 0.002)] * 4).batches == (16, 16, 16, 16)


def test_a_very_slow_rank_still_gets_the_least_batch():
    plan = plan_split(32, [SpeedFit(0.0, 0.001), SpeedFit(0.0, 1.0)], min_batch=2)
    assert plan.batches == (30, 2)


@pytest.mark.parametrize("seed", range(20))
def test_no_split_of_whole_images_has_a_shorter_slowest_rank(seed):
    rng = random.Random(seed)
    fits = [SpeedFit(rng.uniform(0, 0.02), rng.uniform(0.0005, 0.005)) for _ in range(3)]
    limits = [rng.choice([None, 4, 7]) for _ in range(3)]
    total = rng.randint(6, 24)
    plan = plan_split(total, fits, limits, min_batch=2)
    assert sum(plan.batches) == total and min(plan.batches) >= 2
    best = min(max(f.step_s(b, lim) for f, b, lim in zip(fits, split, limits))
               for split in itertools.product(range(2, total + 1), repeat=3) if sum(split) == total)
    assert plan.predicted_step_s() == pytest.approx(best)


def test_past_its_memory_limit_a_rank_runs_micro_batches_that_cost_an_overhead_each():
    plan = plan_split(30, [SpeedFit(0.010, 0.001), SpeedFit(0.010, 0.001)], [None, 4])
    assert plan.micro_batches(1) == tuple(sorted(plan.micro_batches(1), reverse=True))
    assert max(plan.micro_batches(1)) <= 4 and sum(plan.micro_batches(1)) == plan.batches[1]
    assert plan.batches[0] > plan.batches[1]  # each micro-batch's overhead makes rank 1 slower per image
    assert plan.micro_batches(0) == (plan.batches[0],)
    assert Plan(16, (2, 5, 9), (None, 2, 4)).micro_batches(2) == (3, 3, 3)


def test_the_loss_weights_make_the_ranks_average_the_mean_over_the_global_batch():
    plan = Plan(16, (2, 5, 9), (None, None, None))
    weights = [plan.loss_weight(b) for b in plan.batches]
    assert weights == [2 * 3 / 16, 5 * 3 / 16, 9 * 3 / 16]
    # DDP averages over 3 ranks: sum_r weight_r * mean_r / 3 == sum of all losses / 16
    assert sum(w * b for w, b in zip(weights, plan.batches)) / 3 == pytest.approx(sum(b * b for b in plan.batches) / 16)


def test_a_global_batch_too_small_for_the_ranks_is_refused_naming_the_least():
    with pytest.raises(ValueError, match="a global batch of 5 is too small for 3 ranks: use at least 6"):
        plan_split(5, ONE_TWO_FOUR)
    with pytest.raises(ValueError, match="do not add up to 16"):
        Plan(16, (2, 5, 8), (None,) * 3)


def test_an_epochs_last_short_step_is_planned_for_the_same_ranks():
    plan = plan_split(70, ONE_TWO_FOUR)
    assert plan.for_batch(7, min_batch=1).batches == (4, 2, 1)
    assert even_split(70, 3).for_batch(7).batches == (3, 2, 2)


def test_a_speed_is_fitted_from_two_sizes_and_noise_never_makes_it_negative():
    fit = fit_speed([(8, 0.018), (32, 0.042), (8, 0.018)])
    assert (fit.overhead_s, fit.per_image_s) == pytest.approx((0.010, 0.001))
    noisy = fit_speed([(8, 0.05), (16, 0.049)])
    assert noisy.per_image_s > 0 and noisy.overhead_s >= 0
    with pytest.raises(ValueError, match="two batch sizes or more, got \\[8\\]"):
        fit_speed([(8, 0.1), (8, 0.2)])


def test_imbalance_is_how_much_longer_the_slowest_rank_takes():
    assert imbalance(ONE_TWO_FOUR, 10) == pytest.approx(3.0)
    assert imbalance([SpeedFit(0.0, 0.001)] * 2, 10) == 0


# -- each epoch's steps on each rank (pdl/balance/batches.py), one process per rank simulated ------


def _batches(n, plan, rank, **kw):
    from pdl.balance.batches import BalancedBatches

    return BalancedBatches(n, plan, rank=rank, seed=3, rebalance_every=0, **kw)


@pytest.mark.parametrize("n", [16, 70, 71, 100, 1000])
def test_every_image_is_seen_once_an_epoch_and_every_rank_takes_the_same_steps(n):
    import torch

    plan = Plan(16, (2, 5, 9), (None, None, None), tuple(SpeedFit(0.0, 1.0 / b) for b in (2, 5, 9)))
    steps = [list(_batches(n, plan, rank).epoch(4)) for rank in range(3)]
    assert len({len(s) for s in steps}) == 1 and len(steps[0]) == -(-n // 16)
    seen = torch.cat([step.indices for rank_steps in steps for step in rank_steps])
    assert sorted(seen.tolist()) == list(range(n))
    for number in range(len(steps[0])):
        sizes = [len(steps[rank][number].indices) for rank in range(3)]
        assert sizes[0] <= sizes[1] <= sizes[2] and min(sizes) >= 1  # the slow rank keeps the smallest share
    epoch5 = torch.cat([s.indices for s in _batches(n, plan, 0).epoch(5)])
    assert not torch.equal(epoch5, torch.cat([s.indices for s in steps[0]])) or n <= 16


def test_fewer_images_than_ranks_still_give_every_rank_one():
    steps = list(_batches(2, even_split(8, 4), 3).epoch(0))
    assert [len(s.indices) for s in steps] == [1]


class _Gathered:
    """The ranks' rows as the all-gather would return them (each rank's pace: forward
    seconds of a step and their interval, then its plan's prediction): the seam where a
    drift in speed is injected."""

    rank, world = 0, 3

    def __init__(self, rows):
        self.rows = rows

    def all_gather_floats(self, values):
        return self.rows


TIMES = [1.0] * 20  # this rank's own steps; the rows injected are what counts


def test_a_rank_that_slows_down_gets_a_smaller_share_after_two_checks_in_a_row():
    lines = []
    batches = _batches(960, even_split(48, 3), 0, log=lines.append)
    # forward seconds for predicted 16 "image units" each: rank 2 now takes twice as long
    batches.comm = _Gathered([[1.0, 0.99, 1.01, 16.0], [1.0, 0.99, 1.01, 16.0], [2.0, 1.99, 2.01, 16.0]])
    assert batches.rebalance(TIMES) is False and lines == []  # once could be a burst
    assert batches.rebalance(TIMES) is True
    assert batches.plan.batches == (20, 19, 9)  # 2 : 2 : 1, whole images (a tie with 19, 19, 10)
    assert lines == ["pdl: the ranks' speeds changed; batches now 20, 19, 9 of 48"]
    for _ in range(3):  # balanced now: times within 10%, kept
        batches.comm = _Gathered([[1.0, 0.99, 1.01, 20.0], [1.0, 0.99, 1.01, 19.0], [1.05, 1.04, 1.06, 20.0]])
        assert batches.rebalance(TIMES) is False and batches.plan.batches == (20, 19, 9)


@pytest.mark.parametrize("rows", [
    [[1.0, 0.9, 1.15, 16.0], [1.0, 0.9, 1.1, 16.0], [1.2, 1.1, 1.3, 16.0]],  # 20% apart, intervals overlap
    [[1.0, 1.0, 1.0, 16.0], [1.0, 1.0, 1.0, 16.0], [1.08, 1.08, 1.08, 16.0]],  # beyond noise, within 10%
    [[1.0, 0.99, 1.01, 16.0], [0.0, 0.0, 0.0, 16.0], [2.0, 1.99, 2.01, 16.0]],  # a rank timed too few steps
], ids=["noise", "within 10%", "too few steps"])
def test_the_split_stays_while_the_ranks_are_within_noise_or_10_percent(rows):
    batches = _batches(960, even_split(48, 3), 0, log=pytest.fail)
    batches.comm = _Gathered(rows)
    assert not any(batches.rebalance(TIMES) for _ in range(10))
    assert batches.plan.batches == (16, 16, 16)


EQUAL = [1.0, 0.99, 1.01, 16.0]
SLOWER = [1.5, 1.49, 1.51, 16.0]


@pytest.mark.parametrize("checks", [
    [[EQUAL, EQUAL, SLOWER], [EQUAL, SLOWER, EQUAL]],  # a different rank slowest each check
    [[EQUAL, EQUAL, SLOWER], [EQUAL, EQUAL, [1.02, 1.01, 1.03, 16.0]]],  # a check within noise between
], ids=["another rank slowest", "a check within noise between"])
def test_apart_once_then_not_is_noise_and_keeps_the_split(checks):
    batches = _batches(960, even_split(48, 3), 0, log=pytest.fail)
    for rows in checks * 5:
        batches.comm = _Gathered(rows)
        assert batches.rebalance(TIMES) is False
    assert batches.plan.batches == (16, 16, 16)


def test_batchnorm_on_unequal_batches_is_one_plain_line_on_rank_0_once_and_no_warning():
    """Issue 48 (5): the note was a red UserWarning with a traceback line in the cell."""
    import warnings

    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    unequal, even = Plan(16, (6, 10), (None, None)), Plan(16, (8, 8), (None, None))
    last_step = Plan(15, (8, 7), (None, None))  # an even split of an odd batch: not balancing
    said: dict[int, list[str]] = {0: [], 1: []}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        for rank in (0, 1):
            batches = _batches(32, even, rank, log=said[rank].append)
            batches.warn_batchnorm(model, even)  # equal batches: nothing to say
            batches.warn_batchnorm(model, last_step)  # one image apart: nothing to say
            batches.warn_batchnorm(model, unequal)
            batches.warn_batchnorm(model, unequal)  # once
            batches.warn_batchnorm(torch.nn.SyncBatchNorm.convert_sync_batchnorm(model), unequal)
    assert said[1] == []
    assert said[0] == ["pdl: note: BatchNorm normalises each rank's batch, and the balanced batches differ in size "
                       "(6, 10); torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) gives statistics over the "
                       "global batch"]
    quiet: list[str] = []
    _batches(32, even, 0, log=quiet.append).warn_batchnorm(torch.nn.SyncBatchNorm.convert_sync_batchnorm(model),
                                                          unequal)
    assert quiet == []  # SyncBatchNorm: statistics over the global batch already


def test_auto_starts_even_whatever_the_probe_said_and_on_balances_to_it_at_once():
    """A probe of a second cannot tell a slower GPU from a neighbour's burst (issue 48):
    "auto" starts even and leaves the split to the checks while training."""
    from pdl.balance.batches import initial_plan

    fits = [SpeedFit(0.0, 0.01), SpeedFit(0.0, 0.02)]  # rank 1 took twice as long in the probe
    plan, line = initial_plan(30, fits, [None, None], mode="auto")
    assert plan.batches == (15, 15) and plan.fits == tuple(fits) and line is None
    plan, line = initial_plan(30, fits, [None, None], mode="on")
    assert plan.batches == (20, 10)
    assert line == "pdl: the slowest rank takes 2.0x the fastest's time: balancing the batch of 30 as 20, 10"
    assert initial_plan(30, fits, [None, None], mode="off") == (even_split(30, 2), None)
