"""What tells a rank ended by its user's memory limit from one that only died
(:mod:`pdl.memory_limit`): the OOM killer's count in the account's memory cgroup, read
from a cgroup folder written for the test, in cgroup v1's files and in v2's (the one
seam: the hub's real cgroup is exercised in tests/hub/test_hub_neighbours.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdl import memory_limit

pytestmark = pytest.mark.unit

#: Each kind's files, as the kernel writes them: (limit file, limit text, the count's
#: file and text, the text of no limit).
FILES = {
    "v1": ("memory.limit_in_bytes", str(2 << 30), "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
           str(memory_limit.NO_LIMIT_BYTES)),
    "v2": ("memory.max", str(2 << 30), "memory.events", "low 0\nhigh 0\nmax 7\noom 3\noom_kill 3\noom_group_kill 0\n",
           "max"),
}


@pytest.fixture(params=sorted(FILES))
def cgroup(request, tmp_path, monkeypatch):
    kind = request.param
    limit_file, limit, events_file, events, _ = FILES[kind]
    monkeypatch.setattr(memory_limit, "memory_cgroup", lambda: (kind, tmp_path))
    (tmp_path / events_file).write_text(events)
    (tmp_path / limit_file).write_text(limit)
    return kind, tmp_path


def test_a_kill_since_the_cell_started_is_named_with_the_limit(cgroup):
    assert memory_limit.oom_kills() == 3
    assert memory_limit.ended_by_limit_line(2) == (
        "its engine was ended by your memory limit of 2 GiB (all your processes together, as the admin set it): "
        "use less memory a rank, or fewer ranks at once")
    assert memory_limit.ended_by_limit_line(3) is None  # none since: it died of something else


def test_no_limit_and_no_cgroup_say_nothing_false(cgroup, monkeypatch):
    kind, folder = cgroup
    (folder / FILES[kind][0]).write_text(FILES[kind][4])
    assert memory_limit.limit_bytes() is None
    assert "ended by your memory limit (all your processes" in memory_limit.ended_by_limit_line(0)
    monkeypatch.setattr(memory_limit, "memory_cgroup", lambda: None)
    assert memory_limit.oom_kills() is None and memory_limit.ended_by_limit_line(0) is None


def test_the_limits_folder_is_v1s_memory_cgroup_or_on_v2_the_one_above_the_leaf():
    hybrid = "12:pids:/pdl/pdl-ann\n4:memory:/pdl/pdl-ann\n1:name=systemd:/\n0::/pdl/pdl-ann\n"
    assert memory_limit.memory_folder(hybrid) == ("v1", Path("/sys/fs/cgroup/memory/pdl/pdl-ann"))
    assert memory_limit.memory_folder("0::/pdl/pdl-ann/cpu-1\n") == ("v2", Path("/sys/fs/cgroup/pdl/pdl-ann"))
    assert memory_limit.memory_folder("0::/pdl/pdl-ann/main\n") == ("v2", Path("/sys/fs/cgroup/pdl/pdl-ann"))
    # not below a folder of the hub's: none (the hub itself, a process outside PDL)
    assert memory_limit.memory_folder("0::/\n") is None and memory_limit.memory_folder("0::/init.scope\n") is None
    assert memory_limit.memory_folder("4:memory:/\n0::/\n") is None
