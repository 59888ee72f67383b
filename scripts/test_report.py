"""The closing report of scripts/test, from the JUnit XML files of its pytest runs: the
slowest tests (set-up, call and tear-down together, in seconds), the counts of the whole
suite in one line (``tests: N passed, N failed, N skipped``), where the time went, and
where the CPU went (a part given with its CPU-seconds: the machine's, every process's,
the simulated clusters' containers too; on how many cores; how busy they were), and
last each failed test with the first line of why (the end of a long log is what a CI
page shows);
with ``--group-seconds FILE``, also the seconds of each worker group
(tests/harness/worker_groups.py) written to FILE as JSON (the figures for handing the
groups out longest first).

Usage: test_report.py [--slowest N] [--setup-s S] [--cores N] [--part "NAME=SECONDS[:CPU_SECONDS]"]...
                      [--group-seconds FILE] REPORT.xml...
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    """One test of a JUnit report: its pytest-style id, seconds, and how it ended."""

    test: str
    seconds: float
    ended: str  # "passed", "failed" (a failure or an error) or "skipped"
    group: str | None = None  # its worker group, where the report names it (a worker_group property)
    why: str = ""  # a failed test's message, on one line, at most WHY_CHARS characters


#: Characters of a failed test's message the report keeps.
WHY_CHARS = 400


def outcomes(path: str) -> list[Outcome]:
    """Every test case of the JUnit XML file ``path`` (a missing file: none: its run died)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return []
    found = []
    for case in root.iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        failure = case.find("failure") if case.find("failure") is not None else case.find("error")
        ended = ("failed" if failure is not None
                 else "skipped" if case.find("skipped") is not None else "passed")
        group = next((p.get("value") for p in case.iter("property") if p.get("name") == "worker_group"), None)
        why = " ".join((failure.get("message") or "").split())[:WHY_CHARS] if failure is not None else ""
        found.append(Outcome(f"{module}.py::{case.get('name', '?')}", float(case.get("time") or 0), ended, group,
                             why))
    return found


def group_seconds(tests: list[Outcome]) -> dict[str, float]:
    """Seconds of each worker group's tests, summed, longest first (tests without a group left out)."""
    seconds: dict[str, float] = {}
    for t in tests:
        if t.group is not None:
            seconds[t.group] = seconds.get(t.group, 0.0) + t.seconds
    return {group: round(s, 1) for group, s in sorted(seconds.items(), key=lambda item: (-item[1], item[0]))}


@dataclass(frozen=True)
class Part:
    """One pytest run of the suite: its name, wall-clock seconds, and the machine's busy
    CPU-seconds meanwhile (None where not measured)."""

    name: str
    seconds: float
    cpu_s: float | None = None


def cpu_line(parts: list[Part], cores: int | None) -> str | None:
    """``cpu: ...``: the CPU-seconds of the parts that have them, in all and by part, with
    how busy ``cores`` cores were (None when no part has them)."""
    measured = [p for p in parts if p.cpu_s is not None]
    if not measured:
        return None

    def busy(cpu_s: float, seconds: float) -> str:
        return f", {100 * cpu_s / (seconds * cores):.0f} % busy" if cores and seconds > 0 else ""

    total_cpu, total_s = sum(p.cpu_s for p in measured), sum(p.seconds for p in measured)
    on = f" on {cores} core{'s' if cores != 1 else ''}" if cores else ""
    each = "; ".join(f"{p.name} {p.cpu_s:.0f} CPU-s{busy(p.cpu_s, p.seconds)}" for p in measured)
    return f"cpu: tests {total_cpu:.0f} CPU-s{on}{busy(total_cpu, total_s)} ({each})"


def report(tests: list[Outcome], slowest: int, setup_s: float | None, parts: list[Part],
           cores: int | None = None) -> str:
    """The report's text (see the module docstring)."""
    lines = [f"slowest {min(slowest, len(tests))} tests (set-up, call and tear-down):"]
    lines += [f"{t.seconds:8.1f} s  {t.test}" for t in sorted(tests, key=lambda t: -t.seconds)[:slowest]]
    counts = {ended: sum(t.ended == ended for t in tests) for ended in ("passed", "failed", "skipped")}
    lines.append(f"tests: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    spent = [f"{p.name} {p.seconds / 60:.1f} min" for p in parts]
    total = sum(p.seconds for p in parts)
    head = f"time: set-up {setup_s / 60:.1f} min, then " if setup_s is not None else "time: "
    lines.append(f"{head}tests {total / 60:.1f} min ({'; '.join(spent)})")
    cpu = cpu_line(parts, cores)
    if cpu is not None:
        lines.append(cpu)
    for t in tests:
        if t.ended == "failed":
            lines += [f"failed: {t.test}", f"  {t.why}"]
    return "\n".join(lines)


def _part(text: str) -> Part:
    name, equals, figures = text.rpartition("=")
    seconds, colon, cpu_s = figures.partition(":")
    try:
        return Part(name, float(seconds) if equals else float("nan"), float(cpu_s) if colon else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a part is NAME=SECONDS or NAME=SECONDS:CPU_SECONDS, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slowest", type=int, default=25, help="how many of the slowest tests to list")
    parser.add_argument("--setup-s", type=float, help="seconds the machine's set-up took")
    parser.add_argument("--cores", type=int, help="the machine's cores (for how busy they were)")
    parser.add_argument("--part", type=_part, action="append", default=[],
                        help="NAME=SECONDS[:CPU_SECONDS] of one pytest run (the machine's busy CPU-seconds)")
    parser.add_argument("--group-seconds", metavar="FILE", help="write each worker group's seconds here (JSON)")
    parser.add_argument("reports", nargs="+", help="JUnit XML files")
    args = parser.parse_args(argv)
    tests = [t for path in args.reports for t in outcomes(path)]
    print(report(tests, args.slowest, args.setup_s, args.part, args.cores))
    if args.group_seconds:
        with open(args.group_seconds, "w") as out:
            json.dump(group_seconds(tests), out, indent=0)
            out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
