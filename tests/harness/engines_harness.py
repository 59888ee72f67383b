"""Shared helpers for tests that start a real local ipyparallel cluster.

:func:`local_session` is behind the ``pdl_session`` fixture (tests/conftest.py): being
module-scoped, each module that uses it gets one cluster of three CPU-slot engines,
started once and stopped when the module is done.
"""

from __future__ import annotations

import io
import re
import textwrap
import threading
import time

import pytest

from pdl_magics import DistributedSession

SLOTS = ["cpu:0", "cpu:1", "cpu:2"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


class Recorder(io.TextIOBase):
    """A text stream that remembers when each write happened."""

    def __init__(self, on_write=None):
        super().__init__()
        self.writes: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._on_write = on_write

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        with self._lock:
            self.writes.append((time.monotonic(), s))
        if self._on_write is not None:
            self._on_write(self.text())
        return len(s)

    def text(self) -> str:
        with self._lock:
            return "".join(s for _, s in self.writes)

    def first_time(self, needle: str) -> float | None:
        """monotonic time of the write that completed the first occurrence of ``needle``."""
        seen = ""
        with self._lock:
            writes = list(self.writes)
        for t, s in writes:
            seen += s
            if needle in seen:
                return t
        return None


def loop_cell(body: str) -> str:
    """A cell that runs ``body`` in a loop for up to 60 s: it imports ``time``, ``torch``
    and ``torch.distributed as dist``, defines ``a`` (a 64x64 tensor), counts iterations
    in ``steps`` and prints ``loop running`` on rank 0 at the fifth. ``body`` is the loop's
    body (indented by 4 spaces after its first line)."""
    return f"""
import time, torch, torch.distributed as dist
steps = 0
a = torch.randn(64, 64)
stop_at = time.time() + 60
while time.time() < stop_at:
    {body}
    steps += 1
    if steps == 5 and rank == 0:
        print("loop running", flush=True)
"""


def interrupt_running_loop(session, body: str, *, backend: str = "torch", n: int = 3):
    """Run :func:`loop_cell` of ``body`` on ``n`` ranks and press Ctrl-C a second after it
    runs. Asserts that ``run()`` raised KeyboardInterrupt; returns ``(seconds run()
    took, err Recorder)``."""
    return interrupt_cell(session, loop_cell(body), backend=backend, n=n)


def interrupt_cell(session, code: str, *, backend: str = "torch", n: int = 3):
    """Run ``code`` on ``n`` ranks and press Ctrl-C a second after rank 0 prints
    ``loop running``. Asserts that ``run()`` raised KeyboardInterrupt; returns
    ``(seconds run() took, err Recorder)``."""
    import os
    import signal

    timers = []

    def interrupt_soon(text):
        # once rank 0 reports the loop running, press Ctrl-C a second later
        if "loop running" in text and not timers:
            timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
            timers.append(timer)
            timer.start()

    out, err = Recorder(on_write=interrupt_soon), Recorder()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            session.run(code, n, backend=backend, out=out, err=err)
    finally:
        for timer in timers:
            timer.cancel()
    assert timers, "the loop never reported running"
    return time.monotonic() - started, err


def wind_down_fault(*, before: str = "", after: str = "", prelude: str = "") -> str:
    """A cell for :func:`interrupt_cell` whose rank 1, once interrupted, meets a fault in
    PDL's own wind-down of the cell: its process group's teardown
    (``pdl.runtime.engine.abort_group``) runs once with the lines ``before`` and ``after``
    around it (a function's body; ``os``, ``signal`` and ``time`` imported). The fault
    is injected at that one seam, where a busy machine stretches the wind-down and a
    second interrupt can land. The cell runs ``prelude`` first, sets ``kept = rank * 10``,
    counts its loop's iterations in ``steps`` and reports ``loop running`` on rank 0."""
    def body(lines: str) -> str:
        return textwrap.indent(textwrap.dedent(lines).strip(), "    ") + "\n" if lines.strip() else ""

    return f"""
import os, signal, time
import pdl.runtime.engine as pdl_engine
{textwrap.dedent(prelude).strip()}
kept = rank * 10
teardown = pdl_engine.abort_group
def faulty_teardown():
    pdl_engine.abort_group = teardown
{body(before)}    done = teardown()
{body(after)}    return done
steps = 0
try:
    while True:
        time.sleep(0.01)
        steps += 1
        if steps == 5 and rank == 0:
            print("loop running", flush=True)
except KeyboardInterrupt:
    if rank == 1:
        pdl_engine.abort_group = faulty_teardown
    raise
"""


def local_session(tmp_path_factory):
    """For the ``pdl_session`` fixture (``yield from``): a DistributedSession over three
    local CPU slots, engines already started, closed afterwards.

    The cluster's profile lives in a temporary IPYTHONDIR (not the user's
    ~/.ipython), and PDL_CLUSTER_FILE is unset so the session is local.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IPYTHONDIR", str(tmp_path_factory.mktemp("ipython")))
        mp.delenv("PDL_CLUSTER_FILE", raising=False)
        mp.delenv("PDL_SLOTS", raising=False)
        mp.setenv("PDL_STATUS_DIR", str(tmp_path_factory.mktemp("status")))  # not ~/.pdl/status
        session = DistributedSession(local_slots=SLOTS)
        try:
            # start the engines and the process group now, so tests time only their own cell
            session.run("pass", len(SLOTS), out=io.StringIO(), err=io.StringIO())
            yield session
        finally:
            session.close()


__all__ = ["SLOTS", "Recorder", "interrupt_cell", "interrupt_running_loop", "local_session", "strip_ansi",
           "wind_down_fault"]
