"""Rank 0's live training progress in the cell: a progress bar and a loss curve.

Fed by ``pdl.log(...)`` calls on the engines (:mod:`pdl.metrics`), which arrive
as snapshots on ipyparallel's data channel. In a Jupyter frontend the view is
ipywidgets (a bar, a text line and an SVG loss curve); in a terminal IPython or
plain Python it is one text line rewritten in place.
"""

from __future__ import annotations

import math
from typing import TextIO

from pdl.metrics import TextProgress, progress_line


def loss_curve_svg(history: list, key: str, width: int = 360, height: int = 110) -> str:
    """An SVG line chart of metric ``key`` over steps; ``history`` is [[step, {key: v}], ...].

    Points without a finite value are skipped. Returns "" with fewer than 2 points.
    """
    pts = [(s, v[key]) for s, v in history if key in v and math.isfinite(v[key])]
    if len(pts) < 2:
        return ""
    (x0, x1) = (min(p[0] for p in pts), max(p[0] for p in pts))
    (y0, y1) = (min(p[1] for p in pts), max(p[1] for p in pts))
    pad = 6
    sx = (width - 2 * pad) / ((x1 - x0) or 1)
    sy = (height - 2 * pad) / ((y1 - y0) or 1)
    line = " ".join(f"{pad + (x - x0) * sx:.1f},{height - pad - (y - y0) * sy:.1f}" for x, y in pts)
    return (
        f'<svg class="pdl-curve" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f'<rect width="{width}" height="{height}" fill="none" stroke="#ccc"/>'
        f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{line}"/>'
        f'<text x="{pad}" y="12" font-size="10">{key} {y1:.4g}</text>'
        f'<text x="{pad}" y="{height - 2 * pad + 10}" font-size="10">{key} {y0:.4g}</text></svg>'
    )


def curve_key(values: dict) -> str | None:
    """The metric to plot: ``loss`` when logged, else the first one."""
    return "loss" if "loss" in values else next(iter(values), None)


class WidgetProgress:
    """An ipywidgets view: bar, text line and loss curve for rank 0."""

    def __init__(self, display=None):
        import ipywidgets as w

        self.bar = w.IntProgress(value=0, min=0, max=1, description="rank 0",
                                 layout=w.Layout(width="320px"))
        self.label = w.HTML()
        self.curve = w.HTML()
        self.box = w.VBox([w.HBox([self.bar, self.label]), self.curve])
        self.box.add_class("pdl-progress")
        if display is None:
            from IPython.display import display
        display(self.box)

    def update(self, snap: dict) -> None:
        step, total = snap["step"], snap["total"]
        self.bar.max = max(total or step, 1)
        self.bar.value = min(step, self.bar.max)
        self.label.value = f"<code>{progress_line(snap)}</code>"
        key = curve_key(snap["values"])
        if key is not None:
            self.curve.value = loss_curve_svg(snap["history"], key)

    def close(self, outcome: str) -> None:
        self.bar.bar_style = {"ok": "success", "interrupted": "warning"}.get(outcome, "danger")


def in_widget_frontend() -> bool:
    """True in a Jupyter kernel (ZMQ shell) with ipywidgets installed."""
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class LiveProgress:
    """Shows the latest snapshot from rank 0, creating its view on the first one."""

    def __init__(self, err: TextIO, widgets: bool | None = None):
        self.err = err
        self.widgets = in_widget_frontend() if widgets is None else widgets
        self.view = None
        self._last_count = 0

    def feed(self, snap: dict | None) -> None:
        if not snap or snap.get("count", 0) == self._last_count:
            return
        self._last_count = snap["count"]
        if self.view is None:
            self.view = WidgetProgress() if self.widgets else TextProgress(self.err)
        self.view.update(snap)

    def close(self, outcome: str) -> None:
        if self.view is not None:
            self.view.close(outcome)
