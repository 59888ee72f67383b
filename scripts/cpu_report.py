"""Where a test run's CPU went: the JSON lines of ``tests/harness/cpu_profile.py``
(``PDL_CPU_PROFILE=<prefix>``) summed by worker group (tests/harness/worker_groups.py),
most first, in CPU seconds: the group's own processes, the simulated swarm's nodes and
Docker's containers meanwhile (counted for the swarm folder's tests only: the others
do not use them, and their tests run beside the swarm's), and its wall seconds.

    python scripts/cpu_report.py [--top N] [--tests] FILE.jsonl...
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "harness"))
from worker_groups import worker_group  # noqa: E402

FIELDS = ("own_s", "swarm_s", "docker_s", "wall_s")
#: The worker group of the tests on the simulated swarm.
SWARM = "tests/swarm/"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=40, help="rows to print (default 40)")
    parser.add_argument("--tests", action="store_true", help="one row a test instead of a group")
    args = parser.parse_args(argv)
    sums: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(FIELDS, 0.0))
    for path in args.files:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            key = row["test"] if args.tests else worker_group(row["test"])
            on_swarm = worker_group(row["test"]) == SWARM
            for field in FIELDS:
                sums[key][field] += row[field] if on_swarm or field in ("own_s", "wall_s") else 0.0
    total = {f: sum(s[f] for s in sums.values()) for f in FIELDS}
    print(f"{'own':>8} {'swarm':>8} {'docker':>8} {'wall':>8}  (CPU seconds; wall seconds)")
    for key, s in sorted(sums.items(), key=lambda kv: -(kv[1]["own_s"] + kv[1]["swarm_s"]))[:args.top]:
        print(" ".join(f"{s[f]:8.0f}" for f in FIELDS), "", key)
    print(" ".join(f"{total[f]:8.0f}" for f in FIELDS), "", "all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
