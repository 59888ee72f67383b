"""How far a Slurm job's time limit may be extended (pure: Slurm's time strings in,
minutes out). The hub extends a user's job as one of Slurm's administrators
(``scontrol update TimeLimit``), which Slurm does not hold to the QOS or the partition;
so the hub holds it to them itself, and says which limit refused, in Slurm's words.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Slurm's words for no limit.
UNLIMITED = ("UNLIMITED", "INFINITE", "NONE", "N/A", "")


def minutes(text: str) -> int | None:
    """Slurm's time (``"1-02:03:04"``, ``"02:03:04"``, ``"03:04"``, ``"45"``, minutes
    and seconds rounded up) in whole minutes; None for no limit (``UNLIMITED``, empty).
    ValueError (one line) for anything else."""
    text = text.strip()
    if text.upper() in UNLIMITED or text.startswith("Partition_Limit"):
        return None
    days, dash, rest = text.rpartition("-")
    parts = rest.split(":")
    if (dash and not days.isdigit()) or not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        raise ValueError(f"not a Slurm time: {text[:40]!r}")
    numbers = [int(p) for p in parts]
    if len(numbers) == 1:  # minutes
        hours, mins, secs = 0, numbers[0], 0
    elif len(numbers) == 2:  # minutes:seconds
        hours, (mins, secs) = 0, numbers
    else:
        hours, mins, secs = numbers
    return (int(days or 0) * 24 + hours) * 60 + mins + (1 if secs else 0)


@dataclass(frozen=True)
class Cap:
    """A limit on a job's time: ``minutes``, and who sets it, in Slurm's words
    (``"Slurm QOS lab allows jobs of at most 02:00:00 (MaxWall)"``)."""

    minutes: int
    why: str


def extended_limit(current_min: int, step_min: int, caps: list[Cap]) -> tuple[int | None, str]:
    """``(the new time limit in minutes, "")``: ``current_min + step_min``, down to the
    lowest of ``caps``; ``(None, why)`` when the job is at that cap already."""
    target = current_min + step_min
    if caps:
        lowest = min(caps, key=lambda c: c.minutes)
        if current_min >= lowest.minutes:
            return None, lowest.why
        target = min(target, lowest.minutes)
    return target, ""
