"""The members of a distributed cell's world, and how a cell calls into an engine.

Pure data and functions (no I/O): :class:`Rank`, rank order (:func:`rank_order`),
local ranks (:func:`local_ranks`), :class:`CellResult`, and :func:`call_engine`,
the one function the notebook side ships to engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pdl.slots import slot_index


def call_engine(fname, *args):
    """Call ``pdl.runtime.engine.<fname>`` on an engine (imported there, not pickled)."""
    import pdl.runtime.engine

    return getattr(pdl.runtime.engine, fname)(*args)


@dataclass
class Rank:
    """One member of the world: which engine it is and where it runs."""

    rank: int
    engine_id: int
    host: str
    addr: str
    slot: str


def rank_order(host: str | None, slot: str, engine_id: int) -> tuple:
    """Sort key of rank order: by host, then slot index, then engine id (ranks on
    one host are contiguous, as Horovod and local ranks need)."""
    return (host or "", slot_index(slot), engine_id)


def local_ranks(hosts: Sequence[str]) -> list[int]:
    """Each rank's index among the ranks on its host, for ranks whose hosts are ``hosts``."""
    seen: dict[str, int] = {}
    local = []
    for host in hosts:
        local.append(seen.get(host, 0))
        seen[host] = local[-1] + 1
    return local


@dataclass
class CellResult:
    """What a successful run returns: each rank's value (repr of the last expression)."""

    values: list = field(default_factory=list)
