"""``pdl-usage``: the hub's usage report, run by the admin.

    pdl-usage --since 2026-12-01 [--until 2026-12-31] [--csv] [--state-dir .pdl/hub]

prints worker-hours per person per day (UTC): one line per day and person (hours, two
decimals), or CSV with the same columns (hours, four decimals). The report comes from
where the hub keeps it (:func:`usage_source`): its usage book
(:mod:`pdl_spawner.hub.usage_book`), or on Slurm Slurm's own accounting
(:mod:`pdl_spawner.slurm.accounting`), as the settings the hub wrote to its state folder
say. When it cannot be read, one line says why (exit status 1).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import sys
from pathlib import Path

from pdl_spawner.admin.view import SETTINGS_FILE
from pdl_spawner.admin.view import usage_source as kind_source
from pdl_spawner.hub.usage_book import COLUMNS, FILE_NAME, UsageBook


def usage_source(state_dir: Path):
    """Where the report of the hub with ``state_dir`` comes from: its cluster kind's own
    (Slurm's accounting), as the hub wrote its settings there
    (:data:`pdl_spawner.admin.view.SETTINGS_FILE`), else its usage book."""
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
