"""The least-squares line through measured points, shared by the fits of a rank's speed
(:func:`pdl.balance.plan.fit_speed`) and of a link (:func:`pdl.scaling.fit_link`). Pure."""

from __future__ import annotations

from collections.abc import Sequence


def line_through(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(intercept, slope)`` of the least-squares line ``y = intercept + slope * x``
    through ``(x, y)`` points; ValueError (one line) unless they hold two x values or more."""
    if len({x for x, _ in points}) < 2:
        raise ValueError(f"a line needs points at two x values or more, got {sorted({x for x, _ in points})}")
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return mean_y - slope * mean_x, slope
