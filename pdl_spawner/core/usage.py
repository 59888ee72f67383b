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

