"""Ctrl-C on an engine reaches the user's cell only (:class:`CellInterrupts`).

The notebook interrupts a rank with SIGINT, and interrupts it again when it is still
running :data:`pdl_magics.cell_watch.STOP_TIMEOUT_S` later. Python raises
``KeyboardInterrupt`` wherever the main thread is at that moment: inside PDL's own work
around the cell (tearing down the process group after the first interrupt, publishing
the last ``pdl.log`` snapshot) it would escape :func:`pdl.runtime.engine.run_cell` and
read as a failure of PDL. While a :class:`CellInterrupts` is held, SIGINT is only noted:
one that came before the user's code started stops it as it starts; one that comes
after it ended is dropped (the rank has stopped, which is what it asked for).

PDL's wind-down can itself take seconds on a busy machine. So that the notebook does
not take a rank that is winding down for one stuck in native code, the rank reports
the moment its user's code stopped: :func:`report_stopped` publishes
:data:`pdl.engine_channel.STOPPED_KEY` (``pdl_magics.cell_watch`` reads it).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

from pdl.engine_channel import STOPPED_KEY



def report_stopped(publish: Callable[[dict], None]) -> None:
    """Tell the notebook, through ``publish`` (``publish_data``), that this rank's
    user's code has stopped at an interrupt: what follows is PDL's wind-down."""
    publish({STOPPED_KEY: time.time()})


class CellInterrupts:
    """``with CellInterrupts() as interrupts:`` around one cell's run on the main thread;
    ``with interrupts.delivered():`` around the user's code. Off the main thread (where
    Python delivers no signal) both do nothing."""

    def __init__(self):
        self.noted = False  # a SIGINT arrived while held, before the user's code started
        self._user_handler = None
        self._on_main = threading.current_thread() is threading.main_thread()

    def _note(self, signum, frame) -> None:
        self.noted = True

    def __enter__(self) -> CellInterrupts:
        if self._on_main:
            found = signal.signal(signal.SIGINT, self._note)
            # None: a handler not set from Python; the cell then gets Python's own
            self._user_handler = signal.default_int_handler if found is None else found
        return self

    def __exit__(self, *exc) -> None:
        if self._on_main:
            signal.signal(signal.SIGINT, self._user_handler)

    @contextmanager
    def delivered(self):
        """SIGINT raises ``KeyboardInterrupt`` in the body, through the handler the cell
        found (or set for itself); raises it at once if one was noted before."""
        if not self._on_main:
            yield
            return
        try:
            signal.signal(signal.SIGINT, self._user_handler)
            if self.noted:
                self.noted = False
                raise KeyboardInterrupt
            yield
        finally:
            # what the cell left in place (its own handler, say) is what the next cell finds
            self._user_handler = signal.signal(signal.SIGINT, self._note)
            self.noted = False
