"""What tells a rank ended by its user's memory limit from one that only died
(:mod:`pdl.memory_limit`): the OOM killer's count in the account's memory cgroup, read
from a cgroup folder written for the test (the one seam: the hub's real cgroup is
exercised in tests/hub/test_hub_neighbours.py)."""

from __future__ import annotations

import pytest

from pdl import memory_limit

pytestmark = pytest.mark.unit


@pytest.fixture
def cgroup(tmp_path, monkeypatch):
    monkeypatch.setattr(memory_limit, "memory_cgroup", lambda: tmp_path)
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    (tmp_path / "memory.limit_in_bytes").write_text(str(2 << 30))
    return tmp_path


def test_a_kill_since_the_cell_started_is_named_with_the_limit(cgroup):
    assert memory_limit.oom_kills() == 3
    assert memory_limit.ended_by_limit_line(2) == (
        "its engine was ended by your memory limit of 2 GiB (all your processes together, as the admin set it): "
        "use less memory a rank, or fewer ranks at once")
    assert memory_limit.ended_by_limit_line(3) is None  # none since: it died of something else


def test_no_limit_and_no_cgroup_say_nothing_false(cgroup, monkeypatch):
    (cgroup / "memory.limit_in_bytes").write_text(str(memory_limit.NO_LIMIT_BYTES))
    assert memory_limit.limit_bytes() is None
    assert "ended by your memory limit (all your processes" in memory_limit.ended_by_limit_line(0)
    monkeypatch.setattr(memory_limit, "memory_cgroup", lambda: None)
    assert memory_limit.oom_kills() is None and memory_limit.ended_by_limit_line(0) is None
