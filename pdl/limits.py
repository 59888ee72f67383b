"""The line that tells a user their limit and what they hold, in the same words on the
spawn form (hub side) and in the Cluster panel (their server)."""

from __future__ import annotations


def holding_line(may_hold: int, holds: int, note: str = "") -> str:
    """``"You may hold 3 workers; you hold 1."`` (a worker: one GPU, or one CPU slot,
    with its engine), then ``note`` (the scheduler's own limits, one line) when there is one."""
    line = f"You may hold {may_hold} workers; you hold {holds}."
    return f"{line} {note}" if note else line
