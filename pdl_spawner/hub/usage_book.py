"""The usage book: worker-hours per person per day, kept by the hub across restarts.

The hub's metrics sampler (:class:`pdl_spawner.hub.metrics.PDLMetrics`) adds, at each
reading, the seconds each person's workers were held since the last one
(:meth:`UsageBook.add`) to ``<PDL_STATE_DIR>/usage.sqlite``, a row per day (UTC: the
day of the reading), person, kind, worker (``gpu`` or ``cpu``) and GPU type. Only the
hub writes it (mode 0600 in the state folder, 0700); ``pdl-usage`` (:func:`main`), run
by the admin, prints it:

    pdl-usage --since 2026-12-01 [--until 2026-12-31] [--csv] [--state-dir .pdl/hub]

one line per day and person (hours, two decimals), or CSV with the same columns (hours,
four decimals). On Slurm the report comes from Slurm's own accounting instead
(:mod:`pdl_spawner.slurm.accounting`), as the hub's settings in its state folder say;
``pdl-usage`` says in one line, exit status 1, when it cannot be read.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import sys
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


def usage_source(state_dir: Path):
    """Where the report of the hub with ``state_dir`` comes from: its cluster kind's own
    (Slurm's accounting), as the hub wrote its settings there
    (:data:`pdl_spawner.admin.view.SETTINGS_FILE`), else its usage book."""
    from pdl_spawner.admin.view import SETTINGS_FILE
    from pdl_spawner.admin.view import usage_source as kind_source

    settings = state_dir / SETTINGS_FILE
    found = kind_source(json.loads(settings.read_text())) if settings.exists() else None
    return found or UsageBook(state_dir / FILE_NAME)


def _date(text: str) -> str:
    try:
        return dt.date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date: use YYYY-MM-DD, e.g. 2026-12-01") from None


def main(argv: list[str] | None = None) -> int:
    """``pdl-usage``: print the report (see the module's doc); 0, 1 when it cannot be read,
    or 2 for bad arguments."""
    parser = argparse.ArgumentParser(prog="pdl-usage", description="Worker-hours per person per day (UTC), "
                                     "as the hub recorded them.")
    parser.add_argument("--since", type=_date, required=True, help="first day, YYYY-MM-DD")
    parser.add_argument("--until", type=_date, help="last day, YYYY-MM-DD (default: today)")
    parser.add_argument("--csv", action="store_true", help="CSV with a header line")
    parser.add_argument("--state-dir", default=os.environ.get("PDL_STATE_DIR", ".pdl/hub"),
                        help="the hub's state folder (default: $PDL_STATE_DIR, else .pdl/hub)")
    args = parser.parse_args(argv)
    if not Path(args.state_dir).is_dir():
        parser.error(f"--state-dir {args.state_dir} is not a folder: name the hub's PDL_STATE_DIR")
    try:
        rows = usage_source(Path(args.state_dir)).report(args.since, args.until)
    except (OSError, RuntimeError, ValueError) as e:  # Slurm's SlurmError is a RuntimeError
        print(f"pdl-usage: {e}", file=sys.stderr)
        return 1
    if args.csv:
        out = csv.writer(sys.stdout)
        out.writerow(COLUMNS)
        out.writerows([(u.day, u.user, u.kind, u.worker, u.gpu_type, f"{u.hours:.4f}") for u in rows])
        return 0
    if not rows:
        print(f"No workers were held from {args.since} to {args.until or 'today'}.")
        return 0
    print(f"{'day':<10}  {'user':<16}  {'kind':<6}  {'worker':<6}  {'gpu_type':<10}  {'hours':>8}")
    for u in rows:
        print(f"{u.day:<10}  {u.user:<16}  {u.kind:<6}  {u.worker:<6}  {u.gpu_type or '-':<10}  {u.hours:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
