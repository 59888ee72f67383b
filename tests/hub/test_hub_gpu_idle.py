"""GPUs held idle on the embedded default, through a real JupyterHub: the hub reads the
use of alice's GPUs with nvidia-smi (a fake one, whose readings the test sets, over
stand-in GPU device nodes), flags them in her panel (seen in a real browser), her cells
and the admin view after a time at 0 %, and at the release time her server releases the
engines, as the panel says, so the next cell says why and asks for them again."""

from __future__ import annotations

import os

import pytest

from browser_harness import chromium_page
from fault_cells import SUM, magic
from hub_harness import (
    GPU_IDLE_FLAG, Hub, Kernel, admin_status, check_gpu_idle_flag, running, stand_in_gpu_config, stand_in_gpus,
    wait_gpu_idle_release,
)
from waiting import wait_until

pytestmark = [pytest.mark.hub, pytest.mark.browser, pytest.mark.deadline,  # deadline: flag and release
              pytest.mark.skipif(os.geteuid() != 0, reason="stand-in GPU device nodes need root (mknod)")]

POOL = ["gpu:0", "gpu:1"]
FLAG_S, RELEASE_S = 4, 20
SUM2 = magic(SUM, 2)
PANEL = "#pdl-cluster-panel"


@pytest.fixture(scope="module")
def gpus(tmp_path_factory):
    """Stand-in GPU nodes (no driver behind them), and the fake nvidia-smi's readings."""
    folder = tmp_path_factory.mktemp("gpus")
    stand_in_gpus(folder, len(POOL), "0, 50\n1, 50\n", memory="0, 2048, 16384\n1, 4096, 16384\n")
    return folder


@pytest.fixture(scope="module")
def hub(tmp_path_factory, gpus):
    config = stand_in_gpu_config(gpus) + "c.PDLLocalSpawner.gpu_sample_s = 1\n"
    # the stand-in GPUs are no GPUs to torch: the preflight would stop every cell
    hub = Hub(tmp_path_factory.mktemp("gpu-idle-hub"), ["admin", "alice"], POOL,
              spawner_env={"PDL_PREFLIGHT_SKIP": "gpu"}, extra_config=config,
              hub_env={"PDL_GPU_IDLE_FLAG_S": str(FLAG_S), "PDL_GPU_IDLE_RELEASE_S": str(RELEASE_S)})
    with running(hub):
        yield hub


@pytest.fixture
def page(tmp_path):
    with chromium_page(tmp_path, height=900) as page:
        yield page


def open_panel(hub: Hub, page, user: str) -> None:
    """Log ``user`` in through the hub's form, to their running server's JupyterLab, and
    open the Cluster panel."""
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", hub.password(user))
    page.click("#login_submit")
    page.wait_for_url(f"**/user/{user}/lab**", timeout=90_000)
    page.click(".lm-TabBar-tab[data-id='pdl-cluster-panel']", timeout=60_000)
    page.wait_for_selector(f"{PANEL} .pdl-slots", timeout=30_000)


def test_gpus_held_idle_are_flagged_then_released_and_the_next_cell_says_why(hub, gpus, page):
    assert hub.spawn("alice", 2).status_code in (201, 202)
    hub.wait_ready("alice")
    kernel = Kernel(hub, "alice")
    try:
        open_panel(hub, page, "alice")
        kernel.execute_ok("%load_ext pdl_magics")
        assert "sum 2" in kernel.execute_ok(SUM2, timeout=120)["stdout"]
        assert hub.server_api("alice", "/pdl/api/cluster")["gpu_idle"] is None  # the GPUs read 50 %
        # what the hub read is on /hub/metrics for Prometheus: each GPU's use and memory
        mib = 1024 * 1024
        wait_until(lambda: hub.metric("pdl_gpu_memory_used_bytes", user="alice", gpu="1") == 4096 * mib, 15,
                   what="alice's second GPU's memory on /hub/metrics")
        assert hub.metric("pdl_gpu_memory_total_bytes", user="alice", gpu="0") == 16384 * mib
        assert hub.metric("pdl_gpu_utilization_ratio", user="alice", gpu="0") == 0.5

        (gpus / "readings").write_text("0, 0\n1, 0\n")  # nothing runs on them any more
        check_gpu_idle_flag(hub, "alice", kernel, magic("x = 1", 2), flag_s=FLAG_S, timeout=FLAG_S + 15)
        seen = page.wait_for_selector(f"{PANEL} .pdl-gpu-idle", timeout=15_000).inner_text()
        assert seen.startswith(GPU_IDLE_FLAG) and " unless used." in seen, seen

        wait_gpu_idle_release(hub, "alice", RELEASE_S + 15)
        wait_until(lambda: not hub.reservations(), 15, what="alice's GPUs to be freed")
        page.wait_for_function(  # the panel says why, and the flag is gone with the GPUs
            "() => { const p = document.querySelector('#pdl-cluster-panel');"
            " return p.querySelector('.pdl-notice').innerText.startsWith("
            "'Engines released (GPUs held idle (0 % use) since ') && !p.querySelector('.pdl-gpu-idle'); }",
            timeout=15_000, polling=250)
        hub.wait_for_log("from alice: GPUs held idle (0 % use) for ", 15)
        assert hub.metric("pdl_gpu_memory_used_bytes", user="alice", gpu="0") is None  # held no longer
        assert admin_status(hub)["gpu_idle"] == []

        (gpus / "readings").write_text("0, 50\n1, 50\n")  # in use again once they are back
        out = kernel.execute_ok(SUM2, timeout=180)
        assert "Your engines were stopped (GPUs held idle (0 % use) since " in out["stderr"], out
        assert "sum 2" in out["stdout"] and sorted(hub.reservations().values()) == ["alice", "alice"]
        assert hub.server_api("alice", "/pdl/api/cluster")["gpu_idle"] is None
    finally:
        kernel.close()
        hub.api("DELETE", "/users/alice/server")
    wait_until(lambda: not hub.running_servers() and not hub.reservations(), 60, what="servers to stop")
