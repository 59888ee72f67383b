"""``pdl.log(step=..., loss=...)``: training metrics the notebook shows live.

Inside a ``%%distributed`` cell each rank's calls are published to the notebook
through ipyparallel's data channel (``publish_data``), at most
:data:`PUBLISH_EVERY_S` apart, with the last call always sent when the cell ends.
The notebook draws rank 0's progress bar and loss curve from them
(:mod:`pdl_magics.progress`); nothing parses stdout.

Anywhere else (a plain script, IPython, a non-distributed notebook cell) the same
call prints one updating text progress line to stderr, so training code runs
unchanged everywhere.
"""

from __future__ import annotations

import math
import sys
import time
from numbers import Real
from typing import TextIO

#: Key under which a rank's metrics travel on ipyparallel's data channel.
DATA_KEY = "pdl.metrics"
#: Minimum seconds between two publications from one rank.
PUBLISH_EVERY_S = 0.25
#: Points of history kept per cell; older points are thinned out, never the latest.
MAX_POINTS = 400


class Recorder:
    """The metrics of one cell on one rank: the latest values and a thinned history.

    ``snapshot()`` is what travels to the notebook: ``{"step", "total", "values",
    "history": [[step, {name: value}], ...], "time": epoch s, "count": calls}``.
    """

    def __init__(self) -> None:
        self.step: int | None = None
        self.total: int | None = None
        self.values: dict[str, float] = {}
        self.history: list[list] = []
        self.count = 0
        self._stride = 1  # keep one call in every `_stride` in the history

    def add(self, step: int | None, total: int | None, values: dict[str, float]) -> None:
        self.count += 1
        self.step = self.count if step is None else int(step)
        if total is not None:
            self.total = int(total)
        self.values = values
        if self.count % self._stride == 0:
            self.history.append([self.step, values])
            if len(self.history) > MAX_POINTS:
                self.history = self.history[::2]
                self._stride *= 2

    def snapshot(self) -> dict:
        history = self.history
        if not history or history[-1][0] != self.step:
            history = [*history, [self.step, self.values]]
        return {"step": self.step, "total": self.total, "values": self.values,
                "history": history, "time": time.time(), "count": self.count}


def _check(values: dict) -> dict[str, float]:
    clean = {}
    for name, value in values.items():
        if hasattr(value, "item"):  # a 0-d tensor or numpy scalar
            value = value.item()
        if not isinstance(value, Real) or isinstance(value, bool):
            raise TypeError(f"pdl.log: {name} must be a number, got {type(value).__name__}")
        clean[name] = float(value)
    return clean


class TextProgress:
    """One progress line on ``stream``, rewritten in place (``\r``) at each update."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.shown = False

    def update(self, snap: dict) -> None:
        self.stream.write("\r" + progress_line(snap))
        self.stream.flush()
        self.shown = True

    def close(self, outcome: str) -> None:
        """End the line; an outcome other than "ok" is appended, e.g. ``[interrupted]``."""
        if self.shown:
            self.stream.write("\n" if outcome == "ok" else f"  [{outcome}]\n")
            self.stream.flush()


class _Channel:
    """Where this process's metrics go: the notebook (in an engine cell) or a text line."""

    def __init__(self) -> None:
        self.recorder: Recorder | None = None  # set while an engine runs a cell
        self._publish = None
        self._last_sent = 0.0
        self._text = Recorder()
        self._line = TextProgress(sys.stderr)

    # engine side, called by pdl.runtime.engine.run_cell
    def begin_cell(self, publish) -> None:
        self.recorder, self._publish, self._last_sent = Recorder(), publish, 0.0

    def end_cell(self) -> None:
        if self.recorder is not None and self.recorder.count and self._publish is not None:
            self._send()
        self.recorder = self._publish = None

    def _send(self) -> None:
        self._publish({DATA_KEY: self.recorder.snapshot()})
        self._last_sent = time.monotonic()

    def log(self, step, total, values) -> None:
        values = _check(values)
        if self.recorder is None:
            self._text.add(step, total, values)
            snap = self._text.snapshot()
            self._line.update(snap)
            if snap["total"] is not None and snap["step"] >= snap["total"]:
                self._line.close("ok")
                self._text, self._line = Recorder(), TextProgress(sys.stderr)
            return
        self.recorder.add(step, total, values)
        if time.monotonic() - self._last_sent >= PUBLISH_EVERY_S:
            self._send()


_channel = _Channel()


def begin_cell(publish) -> None:
    """Engine side (:func:`pdl.runtime.engine.run_cell`): until :func:`end_cell`, :func:`log`
    records for the notebook and sends snapshots with ``publish({DATA_KEY: snapshot})``
    (ipyparallel's ``publish_data``) at most every :data:`PUBLISH_EVERY_S` seconds."""
    _channel.begin_cell(publish)


def end_cell() -> None:
    """Engine side: send the cell's last snapshot (if it logged anything) and go back
    to writing a text progress line."""
    _channel.end_cell()


def log(step: int | None = None, total: int | None = None, **values) -> None:
    """Record training progress: ``pdl.log(step=i, total=n, loss=..., img_per_s=...)``.

    ``step`` counts from 1 (default: the number of calls so far); ``total`` is the
    number of steps expected, for a progress bar; every other keyword is a metric
    (a number or a 0-d tensor). Cheap enough to call every step.
    """
    _channel.log(step, total, values)


def progress_line(snap: dict) -> str:
    """One line of text for a snapshot: ``step 12/100 (12%)  loss 1.234  img_per_s 512``."""
    step, total = snap["step"], snap["total"]
    head = f"step {step}/{total} ({100 * step / total:.0f}%)" if total else f"step {step}"
    parts = [head] + [f"{k} {_fmt(v)}" for k, v in snap["values"].items()]
    return "  ".join(parts)


def _fmt(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return str(v)
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.4g}"
