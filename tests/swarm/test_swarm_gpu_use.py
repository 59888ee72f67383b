"""The Swarm GPU reader's output read into each held GPU's use
(pdl_spawner/swarm/gpu_use.py); no Docker."""

from __future__ import annotations

import pytest

from pdl_spawner.swarm.gpu_use import held_use, parse_readings
from pdl_spawner.swarm.gpus import PENDING

pytestmark = pytest.mark.unit


def test_the_last_reading_of_each_gpu_wins_and_other_lines_are_left_out():
    text = ("GPU-a, 40\nGPU-b, 0\nGPU-a, 3\n"  # node 1, two samples of GPU-a
            "GPU-c, [N/A]\nNVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
            ", 5\nGPU-d,7\n")
    assert parse_readings(text) == {"GPU-a": 3.0, "GPU-b": 0.0, "GPU-d": 7.0}


def test_a_server_has_a_reading_only_when_every_gpu_it_holds_has_one():
    readings = {"GPU-a": 0.0, "GPU-b": 12.0}
    assert held_use(["GPU-b", "GPU-a"], readings) == [12.0, 0.0]
    assert held_use(["GPU-a", "GPU-c"], readings) is None    # no reading of GPU-c (a node without the reader)
    assert held_use(["GPU-a", PENDING], readings) is None    # an engine not placed yet
    assert held_use([], readings) is None
