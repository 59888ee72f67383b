"""Ctrl-C on ranks that are slow to stop: which ones PDL takes for stuck and restarts.

Against a real local cluster of three CPU-slot engines. A rank is stuck when it still
runs ``STOP_TIMEOUT_S`` after the interrupt reached it and after the last of its peers
stopped (``pdl_magics.cell_watch``); a rank that is only slow, on a busy machine or in
its own handler, keeps its engine and its variables.
"""

from __future__ import annotations

import ast
import socket

import pytest

from engines_harness import Recorder, interrupt_cell, wind_down_fault
from pdl_magics import cell_watch
from pdl_magics.cell_watch import STOP_TIMEOUT_S

# deadline: these wait for the product's stop limit of STOP_TIMEOUT_S seconds
pytestmark = [pytest.mark.integration, pytest.mark.deadline]

#: Seconds between one rank's stop and the next one's below: well under STOP_TIMEOUT_S,
#: while the last rank stops well after STOP_TIMEOUT_S from the interrupt.
STOP_GAP_S = 3.0


def rank_values(session, expression: str) -> list:
    """``expression``'s value on each of the three ranks, in rank order."""
    result = session.run(f"import os\n{expression}", 3, out=Recorder(), err=Recorder())
    return [ast.literal_eval(v) for v in result.values]


def loop_with_sigint_handler(handler_body: str) -> str:
    """A cell that installs a SIGINT handler (``handler_body``, with ``rank`` defined)
    for its loop only, sets ``kept`` to ``rank * 10`` and reports the loop running."""
    return f"""
import signal, time
kept = rank * 10
def on_sigint(signum, frame):
    {handler_body}
previous = signal.signal(signal.SIGINT, on_sigint)
try:
    steps = 0
    while True:
        time.sleep(0.01)
        steps += 1
        if steps == 5 and rank == 0:
            print("loop running", flush=True)
finally:
    signal.signal(signal.SIGINT, previous)
"""


def test_ranks_that_stop_one_after_another_keep_their_engines_and_state(pdl_session):
    """Rank r takes r * STOP_GAP_S seconds to stop (its own handler): rank 2 stops after
    STOP_TIMEOUT_S, but each rank within STOP_GAP_S of the one before. Nothing is stuck."""
    assert 2 * STOP_GAP_S > STOP_TIMEOUT_S > STOP_GAP_S + 1
    pids = rank_values(pdl_session, "os.getpid()")
    elapsed, err = interrupt_cell(
        pdl_session,
        # the handler runs once: PDL interrupts ranks again that have not stopped
        loop_with_sigint_handler(f"signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                 f"    time.sleep(rank * {STOP_GAP_S})\n    raise KeyboardInterrupt"),
    )
    assert "Interrupted: all 3 ranks stopped." in err.text()
    assert "restarting its engine" not in err.text(), err.text()
    assert elapsed < 2 * STOP_GAP_S + STOP_TIMEOUT_S + 10

    assert rank_values(pdl_session, "(os.getpid(), kept)") == [(pid, r * 10) for r, pid in enumerate(pids)]


def test_a_rank_that_ignores_interrupts_is_restarted_and_the_others_keep_their_state(pdl_session):
    pids = rank_values(pdl_session, "os.getpid()")
    elapsed, err = interrupt_cell(
        pdl_session,
        loop_with_sigint_handler("if rank != 1:\n        raise KeyboardInterrupt"),
    )
    host = socket.gethostname()
    assert (f"rank 1 ({host}) did not stop within {STOP_TIMEOUT_S:.0f} s (stuck in a collective or "
            "native code); restarting its engine: variables on that rank are lost.") in err.text()
    assert "rank 0 (" not in err.text() and "rank 2 (" not in err.text()
    assert elapsed < STOP_TIMEOUT_S + 30

    # a fresh engine on rank 1's slot, in a new process group; ranks 0 and 2 kept theirs
    after = rank_values(pdl_session, "import torch, torch.distributed as dist\nt = torch.ones(1)\n"
                                     "dist.all_reduce(t)\n(os.getpid(), globals().get('kept'), t.item())")
    assert [(kept, total) for _, kept, total in after] == [(0, 3.0), (None, 3.0), (20, 3.0)]
    assert [pid for pid, _, _ in after][::2] == pids[::2] and after[1][0] != pids[1]


#: A loop whose rank 1, once interrupted, takes STOP_TIMEOUT_S + SLOW_WIND_DOWN_S seconds
#: more in PDL's own wind-down of the cell (its process group's teardown), as a busy
#: machine stretches it. The fault is injected at that one seam: the cell wraps the
#: engine's teardown, once, with a sleep before it.
SLOW_WIND_DOWN_S = 3.0
SLOW_WIND_DOWN = wind_down_fault(before=f"time.sleep({STOP_TIMEOUT_S + SLOW_WIND_DOWN_S})")


def test_a_rank_whose_wind_down_outlasts_the_stop_limit_is_not_taken_for_stuck(pdl_session):
    """Rank 1's user's code stops at once, but PDL's teardown after it takes longer than
    STOP_TIMEOUT_S: the rank said its code stopped, so it keeps its engine and state."""
    pids = rank_values(pdl_session, "os.getpid()")
    elapsed, err = interrupt_cell(pdl_session, SLOW_WIND_DOWN)
    assert "Interrupted: all 3 ranks stopped." in err.text(), err.text()
    assert "restarting its engine" not in err.text(), err.text()
    assert elapsed > STOP_TIMEOUT_S + SLOW_WIND_DOWN_S  # the notebook waited for rank 1's wind-down

    assert rank_values(pdl_session, "(os.getpid(), kept)") == [(pid, r * 10) for r, pid in enumerate(pids)]


def test_a_rank_whose_wind_down_never_ends_is_restarted_after_the_wind_down_limit(pdl_session, monkeypatch):
    """Rank 1's user's code stops, then PDL's teardown hangs: after the wind-down limit
    (3 s here) its engine is replaced, in one line that says where it hung."""
    monkeypatch.setattr(cell_watch, "WIND_DOWN_TIMEOUT_S", 3.0)
    pids = rank_values(pdl_session, "os.getpid()")
    hung = wind_down_fault(before="time.sleep(600)")
    elapsed, err = interrupt_cell(pdl_session, hung)
    host = socket.gethostname()
    assert (f"rank 1 ({host}) stopped its code but did not end the cell within 3 s (stuck tearing down its "
            "process group); restarting its engine: variables on that rank are lost.") in err.text(), err.text()
    assert elapsed < STOP_TIMEOUT_S + 30

    after = rank_values(pdl_session, "(os.getpid(), globals().get('kept'))")
    assert [kept for _, kept in after] == [0, None, 20]
    assert [pid for pid, _ in after][::2] == pids[::2] and after[1][0] != pids[1]
