"""GPU-hours of PDL's jobs from Slurm's own accounting (``sacct``): the usage report on Slurm.

On Slurm the hub's own book (:mod:`pdl_spawner.hub.usage_book`) is not the record: a
job's GPUs are held from its start to its end as slurmdbd records them, whether the
hub was up or not. :class:`SlurmAccounting` reads every job that ran in a span of days
(``sacct --json --allusers``, as the hub's user; JSON, as everywhere in
:mod:`pdl_spawner.slurm`, since job names are users' text) and keeps PDL's reservations
(:func:`~pdl_spawner.slurm.jobs.pdl_owner`: the name ``pdl:<user>[:<server>]`` and the
account agree), each job's GPUs (its allocated ``gres/gpu`` TRES; Slurm must account
it: ``AccountingStorageTRES=gres/gpu``) times the seconds it ran in each UTC day, as
the book's rows (kind ``slurm``, worker ``gpu``). A job still running counts until now.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Mapping

from pdl_spawner.hub.usage_book import Usage
from pdl_spawner.slurm.cli import SlurmCommands
from pdl_spawner.slurm.jobs import DEFAULT_ACCOUNT_PREFIX, pdl_owner

#: The kind the rows of Slurm's accounting carry.
KIND = "slurm"
#: Seconds a report is reused for the same days (the admin view reads it at every refresh).
REUSE_S = 30.0
_DAY_S = 86400


def sacct_argv(since: float, until: float) -> list[str]:
    """``sacct`` arguments for every user's jobs that ran between ``since`` and ``until``
    (epoch seconds; Slurm reads the times in the machine's local time), as JSON."""
    def local(epoch: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))

    return ["sacct", "--json", "--allusers", "--starttime", local(since), "--endtime", local(until)]


def job_gpus(job: Mapping) -> dict[str, int]:
    """GPU type ("" untyped) -> count of a job's allocated GPUs, from its TRES: the typed
    entries (``gpu:a100``) where Slurm accounts them, else the untyped ``gpu``."""
    typed: dict[str, int] = {}
    untyped = 0
    for tres in (job.get("tres") or {}).get("allocated") or []:
        name = str(tres.get("name") or "")
        if tres.get("type") != "gres" or not (name == "gpu" or name.startswith("gpu:")):
            continue
        count = int(tres.get("count") or 0)
        if name == "gpu":
            untyped += count
        else:
            typed[name.split(":", 1)[1]] = typed.get(name.split(":", 1)[1], 0) + count
    return typed or ({"": untyped} if untyped else {})


def day_spans(start: float, end: float) -> list[tuple[str, float]]:
    """(UTC day, seconds) of each day that ``[start, end)`` (epoch seconds) overlaps."""
    spans = []
    while start < end:
        day = dt.datetime.fromtimestamp(start, dt.timezone.utc).date()
        next_day = dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc).timestamp() + _DAY_S
        spans.append((day.isoformat(), min(end, next_day) - start))
        start = next_day
    return spans


def usage_rows(jobs: list[Mapping], since: float, until: float, now: float,
               account_prefix: str = DEFAULT_ACCOUNT_PREFIX) -> list[Usage]:
    """The GPU-seconds of PDL's jobs in ``jobs`` (``sacct --json``'s), by day, hub user
    and GPU type, within ``[since, until)`` (epoch seconds); a job with no end yet
    counts until ``now``. Sorted by day, then user and GPU type."""
    seconds: dict[tuple[str, str, str], float] = {}
    for job in jobs:
        owner = pdl_owner(str(job.get("name") or ""), str(job.get("user") or ""), account_prefix)
        times = job.get("time") or {}
        start = float(times.get("start") or 0)
        end = float(times.get("end") or 0) or now
        if owner is None or start <= 0:
            continue
        for gpu_type, count in job_gpus(job).items():
            for day, span in day_spans(max(start, since), min(end, until, now)):
                key = (day, owner[0], gpu_type)
                seconds[key] = seconds.get(key, 0.0) + span * count
    return [Usage(day, user, KIND, "gpu", gpu_type, s) for (day, user, gpu_type), s in sorted(seconds.items())]


class SlurmAccounting:
    """The usage report of a hub on Slurm, from ``sacct`` run with ``slurm_env`` (PATH,
    SLURM_CONF...) for the jobs of accounts named with ``account_prefix``; the same
    ``report`` as :class:`~pdl_spawner.hub.usage_book.UsageBook`'s."""

    def __init__(self, slurm_env: Mapping[str, str], account_prefix: str = DEFAULT_ACCOUNT_PREFIX):
        self.commands = SlurmCommands(dict(slurm_env))
        self.account_prefix = account_prefix
        self._last: tuple[tuple[str, str | None], float, list[Usage]] | None = None

    def report(self, since: str, until: str | None = None) -> list[Usage]:
        """The rows from day ``since`` to ``until`` (both included; ISO dates, UTC; None:
        today on); the same days asked again within :data:`REUSE_S` get the same rows.
        Raises :class:`~pdl_spawner.slurm.cli.SlurmError` when sacct fails, ValueError
        when its output is not Slurm's JSON. Blocking."""
        now = time.time()
        if self._last is not None and self._last[0] == (since, until) and now - self._last[1] < REUSE_S:
            return self._last[2]
        start = dt.datetime.fromisoformat(since).replace(tzinfo=dt.timezone.utc).timestamp()
        end = (dt.datetime.fromisoformat(until).replace(tzinfo=dt.timezone.utc).timestamp() + _DAY_S
               if until else now)
        text = asyncio.run(self.commands.run(sacct_argv(start, min(end, now))))
        jobs = json.loads(text).get("jobs")
        if not isinstance(jobs, list):
            raise ValueError("sacct --json gave no list of jobs")
        rows = usage_rows(jobs, start, end, now, self.account_prefix)
        self._last = ((since, until), now, rows)
        return rows
