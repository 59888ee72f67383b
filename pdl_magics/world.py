"""The members of a distributed cell's world, and how a cell calls into an engine."""

from __future__ import annotations

from dataclasses import dataclass, field


def call_engine(fname, *args):
    """Call ``pdl.engine.<fname>`` on an engine (imported there, not pickled)."""
    import pdl.engine

    return getattr(pdl.engine, fname)(*args)


@dataclass
class Rank:
    """One member of the world: which engine it is and where it runs."""

    rank: int
    engine_id: int
    host: str
    addr: str
    slot: str


@dataclass
class CellResult:
    """What a successful run returns: each rank's value (repr of the last expression)."""

    values: list = field(default_factory=list)
