"""Worker slots: one slot is one engine's share of the machine.

A slot is named ``"gpu:<index>"`` (one whole GPU), ``"mig:<n>"`` (the n-th MIG device
of the machine, in ``nvidia-smi -L``'s order, on a GPU split by MIG) or
``"cpu:<index>"`` (a share of the CPU cores when there is no GPU). These functions
are pure, apart from those that ask ``nvidia-smi`` (:func:`detect_gpus`,
:func:`mig_slots`, :func:`slot_types`, and :func:`engine_env` for a MIG slot).
"""

from __future__ import annotations

import os
import re

from pdl.engine_contract import EngineContract
from pdl.nvidia_smi import MigDevice, mig_devices, query_gpus

_SLOT_RE = re.compile(r"^(gpu|mig|cpu):(\d+)$")
#: The kinds of slot that hold a GPU (a whole one, or a MIG device of one).
GPU_KINDS = ("gpu", "mig")


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
        raise ValueError(f"invalid slot {slot!r}: use 'gpu:<index>', 'mig:<index>' or 'cpu:<index>'")
    return m.group(1), int(m.group(2))


def holds_gpu(slot: str) -> bool:
    """True for a slot of a whole GPU or of a MIG device (False for CPU slots and anything else)."""
    try:
        return parse_slot(slot)[0] in GPU_KINDS
    except (TypeError, ValueError):
        return False


def slot_index(slot: str | None) -> int:
    """The index of a slot (``"gpu:1"`` -> 1), for ordering; 0 for anything unparsable."""
    try:
        return parse_slot(slot)[1]
    except (TypeError, ValueError):
        return 0


def mig_slots(nvidia_smi: str | None = None) -> dict[str, MigDevice]:
    """``"mig:<n>"`` -> the n-th MIG device ``nvidia-smi -L`` lists ({} where no GPU is split)."""
    return {f"mig:{n}": device for n, device in enumerate(mig_devices(nvidia_smi=nvidia_smi))}


def detect_gpus(nvidia_smi: str | None = None) -> list[str]:
    """The GPU slots of this machine: ``gpu:<index>`` for each GPU ``nvidia-smi`` lists
    that MIG does not split, then ``mig:<n>`` for each MIG device; ``[]`` when
    nvidia-smi is missing or fails."""
    migs = mig_slots(nvidia_smi)
    split = {device.gpu for device in migs.values()}
    whole = [f"gpu:{int(gpu['index'])}" for gpu in query_gpus(("index",), nvidia_smi=nvidia_smi)
             if gpu["index"].isdigit() and int(gpu["index"]) not in split]
    return whole + list(migs)


def slot_types(nvidia_smi: str | None = None, migs: dict[str, MigDevice] | None = None) -> dict[str, str]:
    """GPU slot -> its type: nvidia-smi's name for a whole GPU (``"NVIDIA A100"``), the
    GPU's name and the MIG profile for a MIG device (``"NVIDIA A100 MIG 3g.20gb"``);
    {} without nvidia-smi. ``migs``: the :func:`mig_slots` already read (None: read them)."""
    types = {f"gpu:{r['index']}": r["name"] for r in query_gpus(("index", "name"), nvidia_smi=nvidia_smi)}
    migs = mig_slots(nvidia_smi) if migs is None else migs
    types.update({slot: device.type for slot, device in migs.items()})
    return types


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


def engine_env(slot: str, pool_size: int, n_cpus: int | None = None, *,
               nvidia_smi: str | None = None) -> dict[str, str]:
    """Environment that pins one engine process to ``slot``.

    A GPU slot sees only its GPU (``CUDA_VISIBLE_DEVICES``, counted in nvidia-smi's
    order, the PCI bus order, as slots are: ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, where
    CUDA would otherwise put the fastest GPU first); a MIG slot sees only its MIG
    device (by its UUID, which ``nvidia_smi`` -L lists; ValueError naming the devices
    there are where it lists no such one); a CPU slot sees no GPU. All get their share
    of CPU cores (the engine contract's ``cpus``, applied as CPU affinity by
    :mod:`pdl.runtime.boot`) and a matching thread count for OpenMP/MKL/torch.
    """
    kind, index = parse_slot(slot)
    n_cpus = n_cpus or os.cpu_count() or 1
    cpus = cpus_for_slot(slot, pool_size, n_cpus)
    threads = str(len(cpus))
    visible = str(index) if kind == "gpu" else ""
    if kind == "mig":
        migs = mig_slots(nvidia_smi)
        if slot not in migs:
            raise ValueError(f"no MIG device {slot} on this machine: nvidia-smi -L lists "
                             f"{', '.join(migs) or 'none'}")
        visible = migs[slot].uuid
    return {
        **EngineContract(slot=slot, cpus=tuple(cpus)).env(),
        "CUDA_VISIBLE_DEVICES": visible,
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
