"""Faults on a real local cluster of three CPU-slot engines: an engine killed in the
middle of a cell, and ranks that stop making progress (the hang watchdog)."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time

import pytest

from engines_harness import Recorder, strip_ansi
from fault_cells import ALL_REDUCE_LOOP
from pdl.process import pid_alive
from pdl_magics import RankFailed

pytestmark = pytest.mark.integration

ALL_REDUCE = """
import torch, torch.distributed as dist
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
t.item()
"""

PIDS = "import os\n(os.getpid(), os.environ['PDL_SLOT'])"


def pids_and_slots(session):
    return [eval(v) for v in session.run(PIDS, 3, out=Recorder(), err=Recorder()).values]


def test_an_engine_killed_mid_cell_fails_the_cell_naming_it_and_the_cluster_heals(pdl_session):
    before = pids_and_slots(pdl_session)
    victim = before[1][0]
    pdl_session.run("kept = rank * 10", 3, out=Recorder(), err=Recorder())
    killed = []

    def kill_rank1(text):
        if "loop running" in text and not killed:
            killed.append(time.monotonic())
            os.kill(victim, signal.SIGKILL)

    with pytest.raises(RankFailed) as info:
        pdl_session.run(
            ALL_REDUCE_LOOP, 3, out=Recorder(on_write=kill_rank1), err=Recorder(),
        )
    failed_after = time.monotonic() - killed[0]
    assert failed_after < 30, f"the cell took {failed_after:.0f} s to fail after the engine died"
    error = info.value
    assert error.rank == 1 and error.engine_died
    shown = strip_ansi("\n".join(error._render_traceback_()))
    assert f"Rank 1 on host {socket.gethostname()} died" in shown, shown
    assert "rerun the cell" in shown
    assert not pid_alive(victim)

    # the next cell runs on all three ranks: a fresh engine on the dead one's slot
    after = pids_and_slots(pdl_session)
    assert [slot for _, slot in after] == [slot for _, slot in before]
    assert after[1][0] != victim and [p for p, _ in after][::2] == [p for p, _ in before][::2]
    assert pdl_session.run(ALL_REDUCE, 3, out=Recorder(), err=Recorder()).values == ["6.0"] * 3
    # the other ranks kept their variables; the replaced one starts empty
    kept = pdl_session.run("globals().get('kept')", 3, out=Recorder(), err=Recorder()).values
    assert kept == ["0", None, "20"]


@pytest.mark.timing
def test_the_watchdog_shows_every_ranks_stack_and_ctrl_c_stops_the_hang(pdl_session):
    pids = [p for p, _ in pids_and_slots(pdl_session)]
    pdl_session.run("kept = rank + 100", 3, out=Recorder(), err=Recorder())
    pressed = []

    def press_ctrl_c_after_the_report(text):
        if "Still waiting" in text and not pressed:
            pressed.append(threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)))
            pressed[0].start()

    err = Recorder(on_write=press_ctrl_c_after_the_report)
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            pdl_session.run(
                """
import time, torch.distributed as dist
print("entering", flush=True)
if rank == 0:
    dist.barrier()  # the others never arrive
else:
    time.sleep(600)
""",
                3, hang_timeout_s=2, out=Recorder(), err=err,
            )
    finally:
        for timer in pressed:
            timer.cancel()
    assert pressed, f"the watchdog never reported:\n{err.text()}"
    assert time.monotonic() - started < 60
    text = strip_ansi(err.text())
    report = text[text.index("No rank has made progress"):text.index("Still waiting")]
    assert re.search(r"No rank has made progress for [23] s", report), report
    sections = re.split(r"--- rank (\d) \(.*\), most recent call last ---\n", report)
    stacks = dict(zip(sections[1::2], sections[2::2]))
    assert sorted(stacks) == ["0", "1", "2"], report
    assert "dist.barrier()  # the others never arrive" in stacks["0"] and "in barrier" in stacks["0"]
    for rank in "12":
        assert "time.sleep(600)" in stacks[rank] and "barrier" not in stacks[rank]
    assert "pdl/runtime/engine.py" not in report and "ipyparallel" not in report  # the user's frames only
    assert "Interrupted: all 3 ranks stopped." in text

    # no kernel restart: the same engines, their variables, and working collectives
    assert [p for p, _ in pids_and_slots(pdl_session)] == pids
    assert pdl_session.run("kept", 3, out=Recorder(), err=Recorder()).values == ["100", "101", "102"]
    assert pdl_session.run(ALL_REDUCE, 3, out=Recorder(), err=Recorder()).values == ["6.0"] * 3


@pytest.mark.timing
def test_the_watchdog_stays_quiet_while_ranks_make_progress_or_when_off(pdl_session):
    err = Recorder()
    pdl_session.run("import time\nfor i in range(8):\n    print(i, flush=True)\n    time.sleep(0.5)",
                    3, hang_timeout_s=2, out=Recorder(), err=err)
    pdl_session.run("import time\ntime.sleep(3)", 3, hang_timeout_s=0, out=Recorder(), err=err)
    assert "No rank has made progress" not in err.text()
