"""How far a Slurm job's time limit may be extended (pdl_spawner/slurm/time_limits.py):
Slurm's time strings, and the lowest cap, named in Slurm's words."""

from __future__ import annotations

import pytest

from pdl_spawner.slurm.time_limits import Cap, extended_limit, minutes

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text,expected", [("45", 45), ("03:04", 4), ("03:00", 3), ("02:03:00", 123),
                                           ("1-02:03:00", 1563), ("1-00:00:00", 1440), (" 1:00:00\n", 60),
                                           ("UNLIMITED", None), ("", None), ("Partition_Limit", None)])
def test_slurms_times_read_as_whole_minutes(text, expected):
    assert minutes(text) == expected


@pytest.mark.parametrize("bad", ["soon", "1:2:3:4", "x-01:00:00", "-5"])
def test_anything_else_is_refused_in_one_line(bad):
    with pytest.raises(ValueError, match="not a Slurm time"):
        minutes(bad)


def test_an_extension_stops_at_the_lowest_cap_and_is_refused_there():
    qos = Cap(120, "Slurm QOS lab allows jobs of at most 02:00:00 (MaxWall)")
    partition = Cap(1440, "partition gpu allows jobs of at most 1-00:00:00 (MaxTime)")
    assert extended_limit(30, 60, [qos, partition]) == (90, "")
    assert extended_limit(90, 60, [partition, qos]) == (120, "")
    assert extended_limit(120, 60, [qos, partition]) == (None, qos.why)
    assert extended_limit(30, 60, []) == (90, "")
