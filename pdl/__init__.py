"""PDL core: what the hub side, the notebook side and the engines share.

- :mod:`pdl.slots`: the machine's pool of worker slots (GPUs, or CPU shares) and
  the environment that pins one engine to one slot.
- :mod:`pdl.engine`: code that runs inside each ipyparallel engine (process-group
  setup, running a cell, aborting a group).
- :mod:`pdl.engine_boot`: the engine/controller process entry point.
- :mod:`pdl.netaddr`: the address and interface peers on other machines reach.
- :mod:`pdl.metrics`: :func:`log`, training metrics the notebook shows live.
"""

from pdl.metrics import log

__all__ = ["log"]
__version__ = "0.1.0"
