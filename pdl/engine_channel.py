"""What a rank tells the notebook while a cell runs, beside its output: the keys of the
cell's published data (``ipyparallel.datapub``, read from each result's ``data``) and the
signal that asks a rank where it is. The engines write them (:mod:`pdl.runtime`), the
notebook side reads them (:mod:`pdl_magics.cell_watch`); both name them through here.

``pdl.log`` snapshots travel under :data:`pdl.metrics.DATA_KEY`, the user API's own.
"""

from __future__ import annotations

import signal

#: Under this key a rank reports that its user's code stopped at an interrupt; the
#: value is the epoch second (:func:`pdl.runtime.interrupts.report_stopped`).
STOPPED_KEY = "pdl_stopped"
#: Under this key a rank publishes its main thread's stack when asked:
#: ``{"count": n, "stack": [lines]}`` (:mod:`pdl.runtime.stacks`).
STACK_KEY = "pdl.stacks"
#: The signal that asks a rank for its stack; the rank keeps running.
STACK_SIGNAL = signal.SIGUSR1
