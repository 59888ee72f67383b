"""The usage book: worker-hours per person per day, kept by the hub across restarts.

The hub's metrics sampler (:class:`pdl_spawner.hub.metrics.PDLMetrics`) adds, at each
reading, the seconds each person's workers were held since the last one
(:meth:`UsageBook.add`) to ``<PDL_STATE_DIR>/usage.sqlite``, a row per day (UTC: the
day of the reading), person, kind, worker (``gpu`` or ``cpu``) and GPU type. Only the
hub writes it (mode 0600 in the state folder, 0700); ``pdl-usage``
(:mod:`pdl_spawner.admin.usage_report`), run by the admin, prints it:

    pdl-usage --since 2026-12-01 [--until 2026-12-31] [--csv] [--state-dir .pdl/hub]

one line per day and person (hours, two decimals), or CSV with the same columns (hours,
four decimals). On Slurm the report comes from Slurm's own accounting instead
(:mod:`pdl_spawner.slurm.accounting`).
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path

from pdl_spawner.hub.sqlite_file import connect

#: The book's file in the hub's state folder.
FILE_NAME = "usage.sqlite"
SCHEMA = ("CREATE TABLE IF NOT EXISTS usage (day TEXT NOT NULL, user TEXT NOT NULL, kind TEXT NOT NULL, "
          "worker TEXT NOT NULL, gpu_type TEXT NOT NULL, seconds REAL NOT NULL, "
          "PRIMARY KEY (day, user, kind, worker, gpu_type))",)
COLUMNS = ("day", "user", "kind", "worker", "gpu_type", "hours")


@dataclass(frozen=True)
class Usage:
    """Seconds ``user``'s workers of one kind, worker and GPU type were held on ``day`` (ISO, UTC)."""

    day: str
    user: str
    kind: str
    worker: str
    gpu_type: str
    seconds: float

    @property
    def hours(self) -> float:
        return self.seconds / 3600.0


def day_of(epoch_s: float) -> str:
    """The UTC day (``YYYY-MM-DD``) of an epoch time in seconds."""
    return dt.datetime.fromtimestamp(epoch_s, dt.timezone.utc).date().isoformat()


class UsageBook:
    """The book in the SQLite file ``path`` (made on the first write, by the hub, whose
    umask keeps it its own)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def add(self, at: float, amounts: dict[tuple[str, str, str, str], float]) -> None:
        """Add ``amounts`` ((user, kind, worker, gpu_type) -> seconds) to the day of
        ``at`` (epoch seconds). Blocks."""
        if not amounts:
            return
        db = connect(self.path, SCHEMA)  # the hub's umask is 077: the file is its own
        try:
            day = day_of(at)
            db.executemany(
                "INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (day, user, kind, worker, gpu_type) "
                "DO UPDATE SET seconds = seconds + excluded.seconds",
                [(day, *key, seconds) for key, seconds in amounts.items() if seconds > 0])
        finally:
            db.close()

    def report(self, since: str, until: str | None = None) -> list[Usage]:
        """The rows from day ``since`` to ``until`` (both included; ISO dates; None: today
        on), by day then person. [] when nothing was written yet."""
        if not self.path.exists():
            return []
        db = connect(self.path, SCHEMA)
        try:
            rows = db.execute("SELECT day, user, kind, worker, gpu_type, seconds FROM usage WHERE day >= ? "
                              "AND day <= ? ORDER BY day, user, kind, worker, gpu_type",
                              (since, until or "9999-12-31")).fetchall()
        finally:
            db.close()
        return [Usage(*row) for row in rows]


def summary_rows(book: UsageBook, now: float) -> list[dict]:
    """Per person (by name): ``gpu_week_h``, ``gpu_month_h``, ``cpu_week_h``,
    ``cpu_month_h``, the worker-hours of this week (from Monday) and this month (from the
    1st), UTC, at ``now`` (epoch seconds); for the admin view."""
    today = dt.datetime.fromtimestamp(now, dt.timezone.utc).date()
    monday = (today - dt.timedelta(days=today.weekday())).isoformat()
    first = today.replace(day=1).isoformat()
    people: dict[str, dict] = {}
    for usage in book.report(min(monday, first), today.isoformat()):
        row = people.setdefault(usage.user, {"user": usage.user, "gpu_week_h": 0.0, "gpu_month_h": 0.0,
                                             "cpu_week_h": 0.0, "cpu_month_h": 0.0})
        if usage.day >= monday:
            row[f"{usage.worker}_week_h"] += usage.hours
        if usage.day >= first:
            row[f"{usage.worker}_month_h"] += usage.hours
    return [people[name] for name in sorted(people)]
