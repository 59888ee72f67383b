"""The closing report of ``scripts/test`` (``scripts/test_report.py``), as CI's log shows
it: the counts, where the time went and, for parts given with the machine's CPU-seconds,
where the CPU went and how busy the cores were; a malformed part is refused in one line
naming the valid forms. Run as ``scripts/test`` runs it, on JUnit XML files written
here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # one short script on files written here

ROOT = Path(__file__).resolve().parent.parent
JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>"""


def junit(path: Path, *cases: str) -> str:
    path.write_text(JUNIT.format(cases="".join(cases)))
    return str(path)


def run_report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "test_report.py"), *args],
                          capture_output=True, text=True, timeout=60)


def test_the_report_says_each_parts_cpu_seconds_and_how_busy_the_cores_were(tmp_path):
    first = junit(tmp_path / "1.xml", '<testcase classname="tests.hub.test_a" name="test_one" time="60"/>')
    second = junit(tmp_path / "3.xml",
                   '<testcase classname="tests.swarm.test_b" name="test_two" time="100"/>',
                   '<testcase classname="tests.swarm.test_b" name="test_three" time="5">'
                   '<failure message="AssertionError: only 1 of 3"/></testcase>')
    done = run_report("--setup-s", "90", "--cores", "2", "--part", "one at a time=120:60",
                      "--part", "the rest, 3 side by side=480:864", first, second)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "tests: 2 passed, 1 failed, 0 skipped" in lines
    assert "time: set-up 1.5 min, then tests 10.0 min (one at a time 2.0 min; the rest, 3 side by side 8.0 min)" in lines
    # 924 CPU-s in 600 s on 2 cores: 77 % busy; 60 in 120: 25 %; 864 in 480: 90 %
    assert ("cpu: tests 924 CPU-s on 2 cores, 77 % busy (one at a time 60 CPU-s, 25 % busy; "
            "the rest, 3 side by side 864 CPU-s, 90 % busy)") in lines, done.stdout
    assert lines[-2:] == ["failed: tests/swarm/test_b.py::test_three", "  AssertionError: only 1 of 3"]


def test_parts_without_cpu_seconds_give_no_cpu_line(tmp_path):
    done = run_report("--part", "one at a time=60", junit(tmp_path / "1.xml"))
    assert done.returncode == 0, done.stderr
    assert "time: tests 1.0 min (one at a time 1.0 min)" in done.stdout
    assert "cpu:" not in done.stdout


def test_a_malformed_part_is_refused_naming_the_valid_forms(tmp_path):
    done = run_report("--part", "one at a time=two minutes", junit(tmp_path / "1.xml"))
    assert done.returncode == 2
    assert "a part is NAME=SECONDS or NAME=SECONDS:CPU_SECONDS, got 'one at a time=two minutes'" in done.stderr
