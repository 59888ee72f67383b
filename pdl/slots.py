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
from collections.abc import Sequence

from pdl.engine_contract import EngineContract
from pdl.nvidia_smi import MigDevice, mig_devices, query_gpus

_SLOT_RE = re.compile(r"^(gpu|mig|cpu):(\d+)$")
#: The kinds of slot that hold a GPU (a whole one, or a MIG device of one).
GPU_KINDS = ("gpu", "mig")


def usable_cores() -> list[int]:
    """The ids of the cores this process may run on (its CPU affinity, which a container,
    a cpuset or a Slurm step narrows), ascending; at least one."""
    try:
        return sorted(os.sched_getaffinity(0)) or [0]
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpu_count() -> int:
    """How many cores this process may run on (:func:`usable_cores`), at least 1."""
    return len(usable_cores())


def parse_slot(slot: str) -> tuple[str, int]:
    """Split ``"gpu:1"`` into ``("gpu", 1)``.

    Raises ValueError naming the valid forms for anything else.
    """
    m = _SLOT_RE.match(slot)
    if not m:
        raise ValueError(f"invalid slot {slot!r}: use 'gpu:<index>', 'mig:<index>' or 'cpu:<index>'")
    return m.group(1), int(m.group(2))


def slot_dirname(slot: str) -> str:
    """A slot's name as a folder's: ``"cpu:2"`` -> ``"cpu-2"`` (ValueError as :func:`parse_slot`)."""
    kind, index = parse_slot(slot)
    return f"{kind}-{index}"


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


def cpus_for_slot(slot: str, pool: Sequence[str], cores: Sequence[int]) -> list[int]:
    """The CPU cores (ids out of ``cores``) an engine in ``slot`` is pinned to.

    ``cores`` are split evenly over the slots of ``pool``, the machine's whole pool
    (every user's slots, in the pool's order), so that engines of different slots,
    one user's or two neighbours', never share a core while the machine has as many
    cores as the pool has slots; with more slots than cores, slots share cores
    round-robin. A slot outside ``pool`` counts as the one after its last.
    """
    parse_slot(slot)
    order = list(pool) if slot in pool else [*pool, slot]
    cores = sorted(cores) or [0]
    per = max(1, len(cores) // len(order))
    first = order.index(slot) * per
    return [cores[(first + k) % len(cores)] for k in range(per)]


def engine_env(slot: str, pool: Sequence[str], cores: Sequence[int] | None = None, *,
               nvidia_smi: str | None = None, slot_cgroups: Sequence[str] = ()) -> dict[str, str]:
    """Environment that pins one engine process to ``slot`` of the machine's ``pool``.

    A GPU slot sees only its GPU (``CUDA_VISIBLE_DEVICES``, counted in nvidia-smi's
    order, the PCI bus order, as slots are: ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, where
    CUDA would otherwise put the fastest GPU first); a MIG slot sees only its MIG
    device (by its UUID, which ``nvidia_smi`` -L lists; ValueError naming the devices
    there are where it lists no such one); a CPU slot sees no GPU. All get their share
    of the ``cores`` (default: :func:`usable_cores`) as :func:`cpus_for_slot` splits
    them over ``pool`` (the engine contract's ``cpus``, applied as CPU affinity by
    :mod:`pdl.runtime.boot`) and a matching thread count for OpenMP/MKL/torch. Where
    the hub keeps each slot's cgroups under ``slot_cgroups`` (the server contract's),
    the engine is told its slot's (``<folder>/<slot_dirname(slot)>``) to join.
    """
    kind, index = parse_slot(slot)
    cpus = cpus_for_slot(slot, pool, usable_cores() if cores is None else cores)
    threads = str(len(cpus))
    visible = str(index) if kind == "gpu" else ""
    if kind == "mig":
        migs = mig_slots(nvidia_smi)
        if slot not in migs:
            raise ValueError(f"no MIG device {slot} on this machine: nvidia-smi -L lists "
                             f"{', '.join(migs) or 'none'}")
        visible = migs[slot].uuid
    return {
        **EngineContract(slot=slot, cpus=tuple(cpus),
                         cgroups=tuple(f"{folder}/{slot_dirname(slot)}" for folder in slot_cgroups)).env(),
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
