"""Whether the ranks' step times differ by more than the machine's noise. Pure, no torch.

Another process only ever adds time to a step: a burst delays a few steps, a process
that shares a rank's core slows a stretch of them. A rank's own speed shows in its
quicker steps, so a rank's pace (:class:`Pace`) over a check's steps is their lower
quartile, with the interval in which the lower quartile lies at about 95 % confidence,
from the order of the steps' times alone (no shape of the noise assumed). The ranks
count as apart (:func:`slowest_apart`) only when the slowest rank's pace is more than
:data:`~pdl.balance.plan.IMBALANCE` above the fastest's and the two intervals do not
overlap. :class:`BalancedBatches <pdl.balance.batches.BalancedBatches>` re-splits only
after :data:`CHECKS_IN_A_ROW` checks in a row, on steps of their own, found the same
rank slowest (hysteresis): a split that followed the noise of a busy machine would
change again and again for ranks that are the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pdl.balance.plan import IMBALANCE

#: The quantile of a check's step times that stands for a rank's pace: the lower quartile.
QUANTILE = 0.25
#: Normal quantile of the confidence of a pace's interval (2: about 95 %).
CONFIDENCE_Z = 2.0
#: Checks in a row that must find the same rank slowest before the split changes.
CHECKS_IN_A_ROW = 2
#: Fewest timed steps a pace needs; a check with fewer decides nothing.
MIN_STEPS = 5


@dataclass(frozen=True)
class Pace:
    """One rank's step time over a check's steps, in seconds: the lower quartile and the
    interval it lies in (``low_s <= seconds <= high_s``)."""

    seconds: float
    low_s: float
    high_s: float

    @classmethod
    def of(cls, times_s: Sequence[float]) -> Pace:
        """The pace of steps that took ``times_s`` seconds; ValueError (one line) for none.
        The interval runs between the order statistics at ``n q -+ z sqrt(n q (1 - q))``."""
        if not times_s:
            raise ValueError("a pace needs the times of one step or more, got none")
        ordered, n = sorted(times_s), len(times_s)
        middle, spread = n * QUANTILE, CONFIDENCE_Z * math.sqrt(n * QUANTILE * (1 - QUANTILE))

        def at(position: float) -> float:  # the order statistic at a 1-based position, clamped
            return ordered[min(n, max(1, position)) - 1]

        return cls(at(math.ceil(middle)), at(math.floor(middle - spread)), at(math.ceil(middle + spread)))

    @classmethod
    def unknown(cls) -> Pace:
        """No pace: too few steps timed (every field 0)."""
        return cls(0.0, 0.0, 0.0)

    def as_floats(self) -> list[float]:
        """What a rank shares with the others: [seconds, low_s, high_s]."""
        return [self.seconds, self.low_s, self.high_s]


def slowest_apart(paces: Sequence[Pace], *, threshold: float = IMBALANCE) -> int | None:
    """The slowest rank when its pace is more than ``threshold`` (a fraction) above the
    fastest rank's and their intervals do not overlap; None when the ranks are within
    that (or a pace is unknown: nothing measured)."""
    if len(paces) < 2 or any(p.seconds <= 0 for p in paces):
        return None
    slow = max(range(len(paces)), key=lambda r: paces[r].seconds)
    fast = min(range(len(paces)), key=lambda r: paces[r].seconds)
    if paces[slow].seconds <= (1 + threshold) * paces[fast].seconds or paces[slow].low_s <= paces[fast].high_s:
        return None
    return slow
