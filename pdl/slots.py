"""Worker slots: one slot is one engine's share of the machine.

A slot is named ``"gpu:<index>"`` (one whole GPU) or ``"cpu:<index>"`` (a share of
the CPU cores when there is no GPU). These functions are pure, apart from
:func:`detect_gpus`, which asks ``nvidia-smi``.
"""

from __future__ import annotations

import os
import re

from pdl.engine_contract import EngineContract
from pdl.nvidia_smi import query_gpus

_SLOT_RE = re.compile(r"^(gpu|cpu):(\d+)$")


def cpu_count() -> int:
    """Cores this process may run on (its CPU affinity, which a container or a
    Slurm step narrows), at least 1."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def parse_slot(slot: str) -> tuple[str, int]:
    """Split ``"gpu:1"`` into ``("gpu", 1)``.

    Raises ValueError naming the valid forms for anything else.
    """
    m = _SLOT_RE.match(slot)
    if not m:
        raise ValueError(f"invalid slot {slot!r}: use 'gpu:<index>' or 'cpu:<index>'")
    return m.group(1), int(m.group(2))


def slot_index(slot: str | None) -> int:
    """The index of a slot (``"gpu:1"`` -> 1), for ordering; 0 for anything unparsable."""
    try:
        return parse_slot(slot)[1]
    except (TypeError, ValueError):
        return 0


def detect_gpus(nvidia_smi: str | None = None) -> list[str]:
    """Return the GPU indices visible on this machine as slot names.

    Uses ``nvidia-smi`` (:mod:`pdl.nvidia_smi`); returns ``[]`` when it is missing or fails.
    """
    return [f"gpu:{int(gpu['index'])}" for gpu in query_gpus(("index",), nvidia_smi=nvidia_smi)
            if gpu["index"].isdigit()]


def default_pool(cpu_slots: int | None = None) -> list[str]:
    """The machine's pool: every GPU if there are any, else ``cpu_slots`` CPU slots
    (None: one per core, :func:`cpu_count`, so engines never share a core)."""
    gpus = detect_gpus()
    if gpus:
        return gpus
    return [f"cpu:{i}" for i in range(cpu_slots or cpu_count())]


def cpus_for_slot(slot: str, pool_size: int, n_cpus: int) -> list[int]:
    """The CPU cores an engine in ``slot`` is pinned to.

    The machine's ``n_cpus`` cores are split evenly over the ``pool_size`` slots;
    when there are more slots than cores, slots share cores round-robin.
    """
    _, index = parse_slot(slot)
    per = max(1, n_cpus // max(1, pool_size))
    first = (index * per) % n_cpus
    return [(first + k) % n_cpus for k in range(per)]


def engine_env(slot: str, pool_size: int, n_cpus: int | None = None) -> dict[str, str]:
    """Environment that pins one engine process to ``slot``.

    A GPU slot sees only its GPU (``CUDA_VISIBLE_DEVICES``, counted in nvidia-smi's
    order, the PCI bus order, as slots are: ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, where
    CUDA would otherwise put the fastest GPU first); a CPU slot sees no GPU. Both get their share of CPU cores (the engine contract's ``cpus``, applied as CPU affinity by
    :mod:`pdl.runtime.boot`) and a matching thread count for OpenMP/MKL/torch.
    """
    kind, index = parse_slot(slot)
    n_cpus = n_cpus or os.cpu_count() or 1
    cpus = cpus_for_slot(slot, pool_size, n_cpus)
    threads = str(len(cpus))
    return {
        **EngineContract(slot=slot, cpus=tuple(cpus)).env(),
        "CUDA_VISIBLE_DEVICES": str(index) if kind == "gpu" else "",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
    }


def parse_slot_list(text: str) -> list[str]:
    """Parse ``"gpu:0,gpu:1"`` (as passed in ``PDL_SLOTS``), validating each slot."""
    slots = [s.strip() for s in text.split(",") if s.strip()]
    for s in slots:
        parse_slot(s)
    return slots
