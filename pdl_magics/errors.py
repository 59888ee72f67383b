"""Errors the notebook side raises, each rendering as the user should see it."""

from __future__ import annotations

import re


class DistributedUsageError(ValueError):
    """Bad input to a distributed run (a count, a backend); nothing was run."""


#: ``ename`` of a rank whose engine process died during the cell.
ENGINE_DIED = "EngineDied"

#: An ANSI escape sequence (the colours of an engine's traceback).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def first_line(text: str) -> str:
    """The first non-empty line of ``text``, without ANSI escape codes ("" when none)."""
    return next((line.strip() for line in _ANSI.sub("", str(text)).splitlines() if line.strip()), "")


class RankFailed(Exception):
    """One rank raised, or its engine died; carries that rank's remote traceback.

    IPython shows :meth:`_render_traceback_`: a header naming the rank and its
    host, then the traceback exactly as the engine formatted it. ``str()`` is one
    line, ``rank R on HOST raised NAME: <the first line of the remote value>`` (or
    ``... died: <why>``), without colours: what a log or a kernel reply's ``evalue``
    shows once beside the traceback.
    """

    def __init__(self, rank: int, host: str, failure: dict, note: str = ""):
        self.rank = rank
        self.host = host
        self.ename = failure["ename"]
        self.evalue = failure["evalue"]
        self.remote_traceback = list(failure.get("traceback") or [])
        self.note = note
        what = "died" if self.ename == ENGINE_DIED else f"raised {self.ename}"
        super().__init__(f"rank {rank} on {host} {what}: {first_line(self.evalue)}")

    @property
    def engine_died(self) -> bool:
        return self.ename == ENGINE_DIED

    def _render_traceback_(self) -> list[str]:
        if self.engine_died:
            header = (f"Rank {self.rank} on host {self.host} died: {self.evalue}. Its engine is restarted "
                      "on the same slot (variables on that rank are lost); rerun the cell.")
        else:
            header = f"Rank {self.rank} on host {self.host} raised {self.ename}:"
        lines = [header, *self.remote_traceback]
        if self.note:
            lines.append(self.note)
        return lines


class EnginesReleased(RuntimeError):
    """The cell's engines were stopped while it ran: the user's server released them at
    the session's end (the hub's session limit, a Slurm job's time limit). IPython shows
    the one line of why, not the engines' deaths; the next cell asks for engines again."""

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


class RanksInterrupted(KeyboardInterrupt):
    """Every rank of the cell stopped on the user's interrupt (already said on stderr).

    It is a KeyboardInterrupt, and the kernel's reply names it so; IPython shows that
    one word instead of a traceback through PDL's own frames.
    """

    def _render_traceback_(self) -> list[str]:
        return ["KeyboardInterrupt"]


RanksInterrupted.__name__ = RanksInterrupted.__qualname__ = "KeyboardInterrupt"


class RanksStuck(RuntimeError):
    """Some ranks did not stop after an interrupt or a peer's failure."""
