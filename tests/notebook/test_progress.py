"""``pdl.log`` on the engines drives rank 0's live progress in the notebook."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from engines_harness import Recorder
from pdl import metrics
from pdl_magics import progress

LOOP = """
import time, pdl
for i in range(1, 41):
    pdl.log(step=i, total=40, loss=4.0 / i, img_per_s=100.0 + rank)
    time.sleep(0.05)
"""


@pytest.mark.unit
def test_progress_line_names_step_total_and_metrics():
    snap = {"step": 12, "total": 100, "values": {"loss": 1.23456, "img_per_s": 512.3}}
    assert metrics.progress_line(snap) == "step 12/100 (12%)  loss 1.235  img_per_s 512"
    assert metrics.progress_line({**snap, "total": None}).startswith("step 12  loss")


@pytest.mark.unit
def test_recorder_thins_old_points_but_keeps_the_latest():
    rec = metrics.Recorder()
    for i in range(1, 5001):
        rec.add(i, 5000, {"loss": 1.0 / i})
    snap = rec.snapshot()
    assert len(snap["history"]) <= metrics.MAX_POINTS + 1
    assert snap["history"][0][0] <= 20 and snap["history"][-1] == [5000, {"loss": 1.0 / 5000}]
    steps = [s for s, _ in snap["history"]]
    assert steps == sorted(steps)


@pytest.mark.unit
def test_log_rejects_non_numbers_naming_the_metric():
    with pytest.raises(TypeError, match="pdl.log: loss must be a number, got str"):
        metrics.log(step=1, loss="high")


@pytest.mark.unit
def test_loss_curve_draws_lower_loss_higher_on_the_page():
    svg = progress.loss_curve_svg([[1, {"loss": 2.0}], [2, {"loss": 1.0}], [3, {"loss": float("nan")}]], "loss",
                                  width=100, height=50)
    points = re.search(r'points="([^"]+)"', svg).group(1).split()
    (x1, y1), (x2, y2) = (tuple(map(float, p.split(","))) for p in points)
    assert len(points) == 2 and x2 > x1 and y2 > y1  # SVG y grows downwards
    assert progress.loss_curve_svg([[1, {"loss": 2.0}]], "loss") == ""


@pytest.mark.unit
def test_outside_a_distributed_cell_log_prints_one_text_line():
    code = "import pdl\nfor i in range(1, 4):\n    pdl.log(step=i, total=3, loss=1.0 / i)\nprint('after')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    stderr = done.stderr.decode()  # bytes: text mode would turn each \r into a newline
    assert done.returncode == 0, stderr
    assert stderr == "\rstep 1/3 (33%)  loss 1\rstep 2/3 (67%)  loss 0.5\rstep 3/3 (100%)  loss 0.3333\n"
    assert done.stdout == b"after\n"


@pytest.mark.integration
def test_rank0_progress_shows_live_as_text_outside_jupyter(pdl_session):
    out, err = Recorder(), Recorder()
    pdl_session.run(LOOP, 3, out=out, err=err)
    updates = [s for _, s in err.writes if s.startswith("\rstep ")]
    assert len(updates) >= 3, err.text()  # several updates while the cell ran, not one at the end
    assert updates[-1] == "\rstep 40/40 (100%)  loss 0.1  img_per_s 100"  # rank 0's values
    assert pdl_session.last_metrics[2]["values"]["img_per_s"] == 102.0  # every rank's are kept


@pytest.mark.integration
def test_rank0_progress_is_a_widget_in_jupyter(pdl_session, monkeypatch):
    views = []

    class Recording(progress.WidgetProgress):
        def __init__(self):
            super().__init__(display=lambda box: None)
            self.values_seen = []
            views.append(self)

        def update(self, snap):
            super().update(snap)
            self.values_seen.append(self.bar.value)

    monkeypatch.setattr(progress, "in_widget_frontend", lambda: True)
    monkeypatch.setattr(progress, "WidgetProgress", Recording)
    pdl_session.run(LOOP, 3, out=Recorder(), err=Recorder())
    (view,) = views
    assert len(set(view.values_seen)) >= 3 and view.values_seen == sorted(view.values_seen)
    assert (view.bar.value, view.bar.max, view.bar.bar_style) == (40, 40, "success")
    assert "<polyline" in view.curve.value and "loss" in view.curve.value
