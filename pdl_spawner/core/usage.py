"""How many workers a hub offers and who holds them: the spawners' shared vocabulary.

A **worker** is one GPU (or, on a machine without GPUs, one CPU slot) with one
ipyparallel engine on it. Every count a user sees is a count of workers: the spawn
form's field and the REST option ``workers``, the limits ``default_workers`` and
``max_workers``, the lease's request, and ``%%distributed -n``. The local spawner
keeps workers as named slots of its ledger; the Swarm spawner as GPUs Swarm assigns.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorkerUsage:
    """Workers of the hub: ``total`` offered, ``holders`` (user, or ledger owner, ->
    workers held by others than the asking server), and ``free``."""

    total: int
    holders: dict[str, int] = field(default_factory=dict)

    @property
    def free(self) -> int:
        return max(0, self.total - sum(self.holders.values()))

    def plus(self, more: dict[str, int]) -> "WorkerUsage":
        """This usage with ``more`` (holder -> workers) held besides."""
        holders = dict(self.holders)
        for who, n in more.items():
            holders[who] = holders.get(who, 0) + n
        return WorkerUsage(self.total, holders)


class NotEnoughWorkers(RuntimeError):
    """A request asked for more workers than are free (``usage`` says what is). Nothing was taken."""

    def __init__(self, wanted: int, usage: WorkerUsage):
        self.wanted, self.usage = wanted, usage
        super().__init__(f"{wanted} worker(s) requested, {usage.free} of {usage.total} free")


@dataclass(frozen=True)
class SchedulerLimits:
    """What a cluster's own scheduler lets one user hold: at most ``workers`` at once
    (None: no cap of its own), and ``note``, one line naming its limits for the user
    ("" : none to name)."""

    workers: int | None = None
    note: str = ""


#: Bytes in one MiB, nvidia-smi's unit of memory.
MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuReading:
    """One GPU at the hub's reading: its use (percent) and, where read, its memory in use
    and in all (bytes; None: not read)."""

    use_percent: float
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None


def gpu_reading(values: list[str]) -> GpuReading | None:
    """nvidia-smi's ``utilization.gpu[, memory.used, memory.total]`` (csv, no units: MiB)
    as one reading; None when the use is no number (``[N/A]``). Memory that is missing or
    no number is not read."""
    try:
        use = float(values[0])
    except (IndexError, ValueError):
        return None
    try:
        used, total = (float(v) * MIB for v in values[1:3]) if len(values) >= 3 else (None, None)
    except ValueError:
        used = total = None
    return GpuReading(use, used, total)


def gpu_memory_of(readings: list[GpuReading] | None) -> list[tuple[float, float]] | None:
    """(memory in use, in all) in bytes of each reading; None when one has no memory read."""
    if not readings or any(r.memory_used_bytes is None or r.memory_total_bytes is None for r in readings):
        return None
    return [(r.memory_used_bytes, r.memory_total_bytes) for r in readings]
