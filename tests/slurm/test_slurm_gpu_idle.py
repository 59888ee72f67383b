"""GPUs held idle on Slurm: the hub reads the use of the GPUs of ann's job on its nodes
(a step it starts in her job, running a fake nvidia-smi whose readings the test sets per
node) into its metrics, flags them in her panel, her cells and the admin view after a time at 0 %, and at
the release time her server releases the engines, the job is cancelled (Slurm has the
GPUs back), and the next cell says why and gets a new job."""

from __future__ import annotations

import pytest

from fault_cells import SUM, magic
from hub_harness import admin_status, check_gpu_idle_flag, open_path_to, wait_gpu_idle_release
from slurm_hub_harness import slurm_hub_fixture, spawn_and_sum
from waiting import wait_until

pytestmark = pytest.mark.slurm

NODES = ("n1", "n2", "n3")
FLAG_S, RELEASE_S = 4, 16


@pytest.fixture(scope="module")
def readings(tmp_path_factory):
    """The fake nvidia-smi (one reading per node, the file ``<node>`` beside it) and its folder."""
    folder = tmp_path_factory.mktemp("smi")
    for node in NODES:
        (folder / node).write_text("50, 3000, 16000\n")  # use (%), memory in use and in all (MiB)
        (folder / node).chmod(0o644)
    smi = folder / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec cat "{folder}/$(hostname)"\n')
    smi.chmod(0o755)
    open_path_to(folder)
    return folder


@pytest.fixture(scope="module")
def hub(slurm, readings, tmp_path_factory):
    config = f"c.PDLSlurmSpawner.nvidia_smi = {str(readings / 'nvidia-smi')!r}\nc.PDLSlurmSpawner.gpu_sample_s = 1\n"
    yield from slurm_hub_fixture(tmp_path_factory.mktemp("slurm-gpu-idle"), slurm, ["admin", "ann"],
                                 extra_config=config,
                                 hub_env={"PDL_GPU_IDLE_FLAG_S": str(FLAG_S), "PDL_GPU_IDLE_RELEASE_S": str(RELEASE_S)})


def set_use(readings, percent: int) -> None:
    for node in NODES:
        (readings / node).write_text(f"{percent}, 3000, 16000\n")


def test_a_jobs_gpus_held_idle_are_flagged_then_released_and_the_next_cell_says_why(hub, slurm, readings):
    first, kernel = spawn_and_sum(hub, "ann", 2)
    try:
        assert hub.server_api("ann", "/pdl/api/cluster")["gpu_idle"] is None  # her GPUs read 50 %
        assert admin_status(hub)["gpu_idle"] == []
        # what the hub read in her job is on /hub/metrics for Prometheus: each GPU's use and memory
        wait_until(lambda: hub.metric("pdl_gpu_memory_used_bytes", user="ann", gpu="1") == 3000 * 1024 * 1024, 15,
                   what="ann's second GPU's memory on /hub/metrics")
        assert hub.metric("pdl_gpu_memory_total_bytes", user="ann", gpu="0") == 16000 * 1024 * 1024
        assert hub.metric("pdl_gpu_utilization_ratio", user="ann", gpu="0") == 0.5

        set_use(readings, 0)
        check_gpu_idle_flag(hub, "ann", kernel, magic("x = 1", 2), flag_s=FLAG_S, timeout=FLAG_S + 20)
        wait_gpu_idle_release(hub, "ann", RELEASE_S + 20)
        wait_until(lambda: not hub.pdl_jobs("ann"), 30, what=lambda: f"ann's job to be cancelled: {slurm.jobs()}")
        assert admin_status(hub)["gpu_idle"] == []

        set_use(readings, 50)
        out = kernel.execute_ok(magic(SUM, 2), timeout=180)
        assert "Your engines were stopped (GPUs held idle (0 % use) since " in out["stderr"], out
        assert "sum 2" in out["stdout"], out
        [second] = hub.pdl_jobs("ann")
        assert second["id"] != first["id"]
        assert hub.server_api("ann", "/pdl/api/cluster")["gpu_idle"] is None
    finally:
        kernel.close()
        hub.api("DELETE", "/users/ann/server")
    hub.wait_no_pdl_jobs()
