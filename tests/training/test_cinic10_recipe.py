"""The recipe's rule (pdl_cinic10.recipe): every setting from the data's size and the
world size, bounded so that no size of data or world gets a recipe that diverges."""

from __future__ import annotations

import pytest

from pdl_cinic10.data import steps_per_epoch
from pdl_cinic10.recipe import (LR_SCALE, MAX_GLOBAL_BATCH, MIN_BATCH_PER_RANK, MIN_STEPS_PER_EPOCH,
                                MIN_TOTAL_STEPS, WARMUP_MIN_STEPS, Hyper, global_batch, peak_lr,
                                warmup_steps)

SIZES = [300, 1_078, 5_000, 20_000, 90_000, 270_000, 1_000_000]
WORLDS = range(1, 9)


@pytest.mark.unit
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("world", WORLDS)
def test_every_size_and_world_gets_enough_steps_a_safe_rate_and_a_real_warmup(n, world):
    hp = Hyper.for_data(n, world)
    batch = hp.batch_size * world
    steps = steps_per_epoch(n, world, hp.batch_size)
    total = hp.epochs * steps

    assert hp.batch_size >= MIN_BATCH_PER_RANK
    assert batch <= max(MAX_GLOBAL_BATCH, MIN_BATCH_PER_RANK * world)
    # enough optimizer steps an epoch, unless even the smallest batch a rank cannot give them
    assert steps >= MIN_STEPS_PER_EPOCH or hp.batch_size == MIN_BATCH_PER_RANK
    assert total >= MIN_TOTAL_STEPS
    assert LR_SCALE[0] * hp.lr <= peak_lr(hp.lr, batch) <= LR_SCALE[1] * hp.lr
    assert WARMUP_MIN_STEPS <= warmup_steps(hp.warmup_epochs, steps, total) <= total // 2


@pytest.mark.unit
def test_the_case_that_diverged_gets_a_batch_the_data_can_carry():
    """The issue's run: about 1,000 real images on 3 ranks took a global batch of 768
    (2 steps an epoch, peak rate 0.3 after 2 steps) and stayed at chance."""
    hp = Hyper.for_data(1_078, 3)
    assert hp.batch_size * 3 <= 48 and steps_per_epoch(1_078, 3, hp.batch_size) >= 22
    assert peak_lr(hp.lr, hp.batch_size * 3) <= 0.05
    assert hp.width == 16


@pytest.mark.unit
def test_cinic10_sized_data_gets_the_standard_network_and_a_large_batch():
    hp = Hyper.for_data(90_000, 1)
    assert (hp.width, hp.batch_size, hp.epochs) == (64, MAX_GLOBAL_BATCH, 15)
    assert global_batch(90_000, 8) == MAX_GLOBAL_BATCH


@pytest.mark.unit
def test_overrides_replace_the_rule_and_may_come_as_text():
    hp = Hyper.for_data(1_078, 2, epochs="4", width=None, batch_size=16, bf16="false")
    assert (hp.epochs, hp.width, hp.batch_size, hp.bf16) == (4, Hyper.for_data(1_078, 2).width, 16, False)


@pytest.mark.unit
@pytest.mark.parametrize("overrides, message", [
    ({"epoch": 3}, "unknown setting epoch; use epochs, batch_size"),
    ({"epochs": "many"}, "epochs must be int; got 'many'"),
    ({"epochs": 2.5}, "epochs must be int; got 2.5"),
    ({"compile": "maybe"}, "compile must be bool; got 'maybe'"),
])
def test_a_wrong_override_is_refused_in_one_line_naming_what_is_valid(overrides, message):
    with pytest.raises(ValueError) as info:
        Hyper.for_data(1_000, 1, **overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.unit
def test_no_data_or_no_ranks_is_refused():
    with pytest.raises(ValueError, match="n_train and world_size must be >= 1"):
        Hyper.for_data(0, 1)
