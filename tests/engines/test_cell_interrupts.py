"""pdl/runtime/interrupts.py: SIGINT reaches a cell's user code, never PDL's steps around
it. Real signals, in a fresh interpreter (signal handlers belong to the main thread)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit


def run_main(code: str) -> str:
    """:data:`PRELUDE`, then ``code``, as the main program of a new interpreter; returns
    what it printed."""
    done = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


PRELUDE = """
import signal, threading, time
from pdl.runtime.interrupts import CellInterrupts

# what an engine's kernel sets around each execute request (ipykernel's pre_handler_hook),
# whatever the interpreter inherited: a shell's background job (`cmd &`) starts with SIGINT
# ignored, and an interpreter that inherits SIG_IGN keeps it
signal.signal(signal.SIGINT, signal.default_int_handler)

def interrupt_me():
    # to this thread itself: its C handler has run when pthread_kill returns, so Python runs
    # its handler right after (os.kill to the process may reach another thread of it, whose
    # handler a loaded machine ran after the sleep: the cell went on past its interrupt)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)
    time.sleep(0.2)
"""


def test_an_interrupt_after_the_users_code_is_dropped_and_one_in_it_is_raised():
    printed = run_main("""
    with CellInterrupts() as interrupts:
        try:
            with interrupts.delivered():
                interrupt_me()
                print("not reached")
        except KeyboardInterrupt:
            print("cell interrupted")
        interrupt_me()  # PDL's wind-down: noted, never raised
        print("wind-down finished")
    print("handler back:", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    """)
    assert printed.split("\n")[:3] == ["cell interrupted", "wind-down finished", "handler back: True"]


def test_an_interrupt_before_the_users_code_stops_it_as_it_starts():
    printed = run_main("""
    with CellInterrupts() as interrupts:
        interrupt_me()  # while PDL prepares the cell
        print("preparation finished")
        try:
            with interrupts.delivered():
                print("not reached")
        except KeyboardInterrupt:
            print("cell interrupted")
        with interrupts.delivered():
            print("the next cell runs")
    """)
    assert printed.split("\n")[:3] == ["preparation finished", "cell interrupted", "the next cell runs"]


def test_a_handler_the_cell_sets_is_what_the_next_cell_finds():
    printed = run_main("""
    def own(signum, frame):
        print("own handler")
    with CellInterrupts() as interrupts:
        with interrupts.delivered():
            signal.signal(signal.SIGINT, own)
    with CellInterrupts() as interrupts:
        with interrupts.delivered():
            interrupt_me()
    print("after:", signal.getsignal(signal.SIGINT) is own)
    """)
    assert printed.split("\n")[:2] == ["own handler", "after: True"]
