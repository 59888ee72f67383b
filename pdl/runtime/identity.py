"""Who an engine is: :func:`describe` (host, address, pid, slot, visible GPUs).

A leaf module (it imports only :mod:`pdl.netaddr` and :mod:`pdl.engine_contract`): the engine's call facade
(:mod:`pdl.runtime.engine`), the preflight's probe (:mod:`pdl.runtime.preflight`) and the Cluster
panel all read an engine's identity from here.
"""

from __future__ import annotations

import os
import socket

from pdl.engine_contract import EngineContract
from pdl.netaddr import host_addr


def describe() -> dict:
    """Who this engine is: ``{"host", "addr", "pid", "slot", "cuda_visible"}``.

    The host is ``$PDL_ENGINE_HOST`` when set (a Swarm task's node), else this
    machine's host name; the address is ``$PDL_ENGINE_ADDR`` when set (the interface
    collectives use), else :func:`pdl.netaddr.host_addr`.
    """
    contract = EngineContract.from_env()
    return {
        "host": contract.host or socket.gethostname(),
        "addr": contract.addr or host_addr(),
        "pid": os.getpid(),
        "slot": contract.slot,
        "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
