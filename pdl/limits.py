"""The words that tell a user their limits, the same on the spawn form (hub side) and
in the Cluster panel and cells (their server): what they may hold and hold, how long
is left, and what ends a session."""

from __future__ import annotations


def holding_line(may_hold: int, holds: int, note: str = "") -> str:
    """``"You may hold 3 workers; you hold 1."`` (a worker: one GPU, or one CPU slot,
    with its engine), then ``note`` (the scheduler's own limits, one line) when there is one."""
    line = f"You may hold {may_hold} workers; you hold {holds}."
    return f"{line} {note}" if note else line


def duration(seconds: float) -> str:
    """``"1 h 05 min"``, ``"9 min"``, ``"40 s"``: a time (left, or a limit), rounded down."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"


def session_limit_why(limit_s: float) -> str:
    """What ends a session on a hub with a session limit of ``limit_s`` seconds."""
    return f"the hub's session limit of {duration(limit_s)}"
