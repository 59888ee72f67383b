"""The Swarm GPU reader's output read into each held GPU's use and memory
(pdl_spawner/swarm/gpu_use.py); no Docker."""

from __future__ import annotations

import pytest

from pdl_spawner.core.usage import GpuReading
from pdl_spawner.swarm.gpu_use import held_readings, parse_readings
from pdl_spawner.swarm.gpus import PENDING

pytestmark = pytest.mark.unit

MIB = 1024 * 1024


def test_the_last_reading_of_each_gpu_wins_and_other_lines_are_left_out():
    text = ("GPU-a, 40, 100, 800\nGPU-b, 0, 0, 800\nGPU-a, 3, 200, 800\n"  # node 1, two samples of GPU-a
            "GPU-c, [N/A], 1, 2\nNVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
            ", 5\nGPU-d,7\nGPU-e, 9, [N/A], [N/A]\n")
    assert parse_readings(text) == {"GPU-a": GpuReading(3.0, 200 * MIB, 800 * MIB),
                                    "GPU-b": GpuReading(0.0, 0.0, 800 * MIB),
                                    "GPU-d": GpuReading(7.0), "GPU-e": GpuReading(9.0)}  # use only: no memory


def test_a_server_has_a_reading_only_when_every_gpu_it_holds_has_one():
    readings = {"GPU-a": GpuReading(0.0), "GPU-b": GpuReading(12.0)}
    assert held_readings(["GPU-b", "GPU-a"], readings) == [GpuReading(12.0), GpuReading(0.0)]
    assert held_readings(["GPU-a", "GPU-c"], readings) is None    # no reading of GPU-c (a node without the reader)
    assert held_readings(["GPU-a", PENDING], readings) is None    # an engine not placed yet
    assert held_readings([], readings) is None
