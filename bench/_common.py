"""Helpers shared by the benchmarks in ``bench/``."""

from __future__ import annotations

import os
import platform


def local_slots(n: int) -> list[str]:
    """The slots a local PDL cluster of ``n`` engines uses: this machine's first ``n``
    GPUs, or ``n`` CPU slots when it has fewer GPUs than that.

    The list is the session's whole pool, so its length fixes each engine's share
    of the cores (:func:`pdl.slots.engine_env`).
    """
    from pdl.slots import default_pool

    pool = default_pool()
    return pool[:n] if len(pool) >= n else [f"cpu:{i}" for i in range(n)]


def machine() -> str:
    """One line: cores, processor, load average, and the torch / ipyparallel versions."""
    import ipyparallel
    import torch

    load = " / ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return (
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), load avg {load}; "
        f"python {platform.python_version()}, torch {torch.__version__}, ipyparallel {ipyparallel.__version__}"
    )
