"""Horovod inside a running engine: join a world the notebook kernel set up.

The kernel runs Horovod's rendezvous server (:mod:`pdl_magics.horovod_driver`)
and sends each engine the ``HOROVOD_*`` environment of its rank; :func:`start`
applies it and calls ``hvd.init()``. The group bookkeeping (one group per
engine, torch or Horovod, and cutting its sockets) lives in :mod:`pdl.runtime.engine`.

Horovod is optional: nothing here imports it until a Horovod group is formed.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import Callable

from pdl.netaddr import iface_for

#: Seconds :func:`stop` waits for the ranks to agree on shutting down before
#: cutting the connections. Cutting at once is not safe: a send that gloo
#: queues on a connection cut at the same moment can wait for the gloo
#: timeout (seen about once in 20 backend switches).
STOP_STALL_S = 2.0

#: Errors Horovod raises on a rank whose peer failed or shut the group down.
_PEER_FAILURE_TEXT = ("Horovod has been shut down", "Connection closed by peer", "Connection reset by peer")


def start(env: dict[str, str], iface_addr: str):
    """Apply ``env`` (from :func:`pdl_magics.horovod_driver.rank_env`) and ``hvd.init()``.

    ``HOROVOD_GLOO_IFACE`` is set to the network interface holding
    ``iface_addr`` (``lo`` for 127.0.0.1), so gloo listens where peers reach it.
    Blocks until every rank of the world has joined; returns ``horovod.torch``.
    """
    import horovod.torch as hvd

    os.environ.update(env)
    os.environ["HOROVOD_GLOO_IFACE"] = iface_for(iface_addr)
    hvd.init()
    return hvd


def installed_version() -> str:
    """The installed Horovod distribution's version, e.g. ``0.28.1+pdl1``."""
    from importlib.metadata import version

    return version("horovod")


def fixed_for_hosts() -> bool:
    """True if the installed Horovod was built by ``scripts/build-horovod`` (label ``+pdlN``).

    Horovod 0.28.1 as released builds the gloo device of every process set
    (``hvd.init()`` makes one for the global set) from the machine's hostname
    instead of ``HOROVOD_GLOO_IFACE``: across hosts its ranks then advertise an
    address their peers cannot reach (127.0.1.1), or crash where the hostname
    does not resolve (containers). The build script patches that.
    """
    local = installed_version().partition("+")[2]
    return local.startswith("pdl")


def is_running() -> bool:
    """True if Horovod was imported and initialised in this process."""
    hvd = sys.modules.get("horovod.torch")
    return hvd is not None and hvd.is_initialized()


def stop(on_stall: Callable[[], object], stall_s: float = STOP_STALL_S) -> bool:
    """``hvd.shutdown()`` if Horovod is initialised here; returns whether it was.

    Shutdown is agreed on by the background threads of all ranks, so a peer
    blocked in a collective gets ``HorovodInternalError`` ("Horovod has been
    shut down") at once. If that agreement has not finished after ``stall_s``
    seconds (a peer is frozen or gone), ``on_stall()`` is called from another
    thread: it must cut the world's connections, which ends the wait.
    """
    if not is_running():
        return False
    watchdog = threading.Timer(stall_s, on_stall)
    watchdog.daemon = True
    watchdog.start()
    try:
        sys.modules["horovod.torch"].shutdown()  # ctypes: the GIL is released meanwhile
    finally:
        watchdog.cancel()
    reset_optimizers()
    return True


def reset_optimizers() -> int:
    """Forget the in-flight allreduces of every ``hvd.DistributedOptimizer`` here.

    A rank stopped between ``backward()`` and ``step()`` leaves its optimizer
    holding handles of the old world, and its next ``zero_grad()`` would refuse
    to run. Clearing them lets the same optimizer train on in the next world.
    Returns how many optimizers were reset.
    """
    from horovod.torch.optimizer import _DistributedOptimizer

    marker = _DistributedOptimizer.__dict__["synchronize"]
    count = 0
    for obj in gc.get_objects():
        if type(obj).__dict__.get("synchronize") is marker:  # hvd wraps by copying the class dict
            # what hvd's own load_state_dict() resets, and the group counters
            obj._handles = {}
            obj._synchronized = False
            obj._should_synchronize = True
            obj._allreduce_delay = {p: obj.backward_passes_per_step for p in obj._allreduce_delay}
            obj._group_counts = {g: 0 for g in getattr(obj, "_group_counts", {})}
            count += 1
    return count


def is_peer_failure(exc: BaseException) -> bool:
    """True for Horovod errors caused by another rank failing, not by this rank's code."""
    if type(exc).__name__ != "HorovodInternalError":
        return False
    return any(text in str(exc) for text in _PEER_FAILURE_TEXT)
