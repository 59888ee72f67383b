"""GPUs held idle on the simulated 3-node swarm: the hub's GPU reader (a global service
running a fake nvidia-smi, whose readings the test sets per node, in the nodes'
containers) gives the use and memory of the GPU Swarm assigned to alice's engine (on
/hub/metrics); after a time at
0 % her panel, her cells and the admin view flag it, and at the release time her engine
service is scaled to 0 (its GPU back to the swarm), the next cell says why and gets it
back."""

from __future__ import annotations

import pytest

from fault_cells import SUM, magic
from hub_harness import Kernel, admin_status, check_gpu_idle_flag, open_path_to, wait_gpu_idle_release
from swarm_hub_harness import swarm_hub_fixture
from waiting import wait_until

pytestmark = pytest.mark.docker

FLAG_S, RELEASE_S = 4, 16
SUM1 = magic(SUM, 1)


@pytest.fixture(scope="module")
def readings(swarm, tmp_path_factory):
    """The fake nvidia-smi, in a folder the reader's containers mount, with one file of
    readings per node (``<hostname>``: its GPU's UUID and use)."""
    folder = tmp_path_factory.mktemp("smi")
    smi = folder / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nwhile :; do cat "{folder}/$PDL_NODE"; sleep 1; done\n')
    smi.chmod(0o755)
    open_path_to(folder)
    set_use(swarm, folder, 50)
    return folder


def set_use(swarm, folder, percent: int) -> None:
    for i in swarm.node_ids():
        (folder / swarm.hostname(i)).write_text(f"{swarm.gpu(i)}, {percent}, 3000, 16000\n")  # memory in MiB
        (folder / swarm.hostname(i)).chmod(0o644)


@pytest.fixture(scope="module")
def hub(swarm, readings, tmp_path_factory):
    config = f"""
c.PDLSwarmSpawner.nvidia_smi = {str(readings / 'nvidia-smi')!r}
c.PDLSwarmSpawner.gpu_reader_mounts = [{{"Type": "bind", "Source": {str(readings)!r}, "Target": {str(readings)!r},
                                         "ReadOnly": True}}]
c.PDLSwarmSpawner.gpu_sample_s = 1
"""
    yield from swarm_hub_fixture(tmp_path_factory.mktemp("swarm-gpu-idle"), swarm, ["admin", "alice"],
                                 extra_config=config,
                                 hub_env={"PDL_GPU_IDLE_FLAG_S": str(FLAG_S), "PDL_GPU_IDLE_RELEASE_S": str(RELEASE_S)})


def engine_replicas(swarm, user: str) -> list[int]:
    return sorted(s.attrs["Spec"]["Mode"]["Replicated"]["Replicas"]
                  for s in swarm.manager.services.list(filters={"label": ["pdl.role=engine", f"pdl.user={user}"]}))


def test_a_gpu_held_idle_is_flagged_then_released_and_the_next_cell_says_why(hub, swarm, readings):
    assert hub.spawn("alice", 1).status_code in (201, 202)
    hub.wait_ready("alice", timeout=240)
    kernel = Kernel(hub, "alice")
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        assert "sum 1" in kernel.execute_ok(SUM1, timeout=120)["stdout"]
        assert hub.server_api("alice", "/pdl/api/cluster")["gpu_idle"] is None  # her GPU reads 50 %
        # what the reader printed for her GPU is on /hub/metrics for Prometheus: its use and memory
        wait_until(lambda: hub.metric("pdl_gpu_memory_used_bytes", user="alice", gpu="0") == 3000 * 1024 * 1024, 15,
                   what="alice's GPU's memory on /hub/metrics")
        assert hub.metric("pdl_gpu_memory_total_bytes", user="alice", gpu="0") == 16000 * 1024 * 1024
        assert hub.metric("pdl_gpu_utilization_ratio", user="alice", gpu="0") == 0.5

        set_use(swarm, readings, 0)
        check_gpu_idle_flag(hub, "alice", kernel, magic("x = 1", 1), flag_s=FLAG_S, timeout=FLAG_S + 30)
        wait_gpu_idle_release(hub, "alice", RELEASE_S + 20)
        wait_until(lambda: engine_replicas(swarm, "alice") == [0], 30, what="alice's engine service to scale to 0")
        hub.wait_for_log("from alice: GPUs held idle (0 % use) for ", 15)
        assert admin_status(hub)["gpu_idle"] == []

        set_use(swarm, readings, 50)
        out = kernel.execute_ok(SUM1, timeout=240)
        assert "Your engines were stopped (GPUs held idle (0 % use) since " in out["stderr"], out
        assert "sum 1" in out["stdout"] and engine_replicas(swarm, "alice") == [1], out
        assert hub.server_api("alice", "/pdl/api/cluster")["gpu_idle"] is None
    finally:
        kernel.close()
        hub.api("DELETE", "/users/alice/server")
