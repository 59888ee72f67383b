"""The GPU type at spawn on the embedded default, through a real JupyterHub: a machine
with two kinds of GPU (stand-in device nodes; a fake nvidia-smi names gpu:0 and gpu:1
"NVIDIA A100", gpu:2 and gpu:3 "Tesla T4"). The spawn form, seen in a real browser,
offers each type with its free count; a spawn takes the slots of the type it chose,
the free count and the refusal count that type, a type the machine lacks is refused in
one line, and the server's panel names its GPUs' type."""

from __future__ import annotations

import os

import pytest

from browser_harness import chromium_page
from hub_harness import Hub, gpu_types_in_browser, running, stand_in_gpus
from waiting import wait_until

pytestmark = [pytest.mark.hub, pytest.mark.browser,
              pytest.mark.skipif(os.geteuid() != 0, reason="stand-in GPU device nodes need root (mknod)")]

POOL = ["gpu:0", "gpu:1", "gpu:2", "gpu:3"]
NAMES = "0, NVIDIA A100\n1, NVIDIA A100\n2, Tesla T4\n3, Tesla T4\n"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    config = stand_in_gpus(tmp_path_factory.mktemp("gpus"), len(POOL), NAMES)
    # the stand-in GPUs are no GPUs to torch: the preflight would stop every cell
    hub = Hub(tmp_path_factory.mktemp("gpu-types-hub"), ["admin", "alice", "bob"], POOL,
              spawner_env={"PDL_PREFLIGHT_SKIP": "gpu"}, extra_config=config)
    with running(hub):
        yield hub


@pytest.fixture
def page(tmp_path):
    with chromium_page(tmp_path) as page:
        yield page


def test_each_gpu_type_is_offered_with_its_free_count_and_reserved_as_chosen(hub, page):
    assert gpu_types_in_browser(hub, page, "alice") == ["Any type (4 of 4 free)", "NVIDIA A100 (2 of 2 free)",
                                                "Tesla T4 (2 of 2 free)"]
    r = hub.api("POST", "/users/admin/server", json={"workers": 1, "gpu_type": "H100"})
    assert r.status_code == 400, r.text
    assert "gpu_type must be one of 'NVIDIA A100', 'Tesla T4', or '' for any, got 'H100'" in r.json()["message"]
    try:
        assert hub.api("POST", "/users/alice/server", json={"workers": 2, "gpu_type": "Tesla T4"}).status_code \
            in (201, 202)
        hub.wait_ready("alice")
        assert hub.reservations() == {"gpu:2": "alice", "gpu:3": "alice"}
        assert hub.server_api("alice", "/pdl/api/cluster")["gpu_type"] == "Tesla T4"

        page.context.clear_cookies()
        assert gpu_types_in_browser(hub, page, "bob") == ["Any type (2 of 4 free)", "NVIDIA A100 (2 of 2 free)",
                                                  "Tesla T4 (0 of 2 free)"]
        r = hub.api("POST", "/users/bob/server", json={"workers": 1, "gpu_type": "Tesla T4"})
        assert r.status_code == 409, r.text
        assert r.json()["message"].startswith(
            "Not enough free Tesla T4 workers: you asked for 1, 0 of 2 are free"), r.text
        wait_until(lambda: not hub.server_ready("bob") and "bob" not in hub.reservations().values(), 30,
                   what="bob's refused spawn to leave nothing")
        assert hub.api("POST", "/users/bob/server", json={"workers": 2, "gpu_type": "NVIDIA A100"}).status_code \
            in (201, 202)
        hub.wait_ready("bob")
        assert hub.reservations() == {"gpu:0": "bob", "gpu:1": "bob", "gpu:2": "alice", "gpu:3": "alice"}
    finally:
        hub.api("DELETE", "/users/alice/server")
        hub.api("DELETE", "/users/bob/server")
    wait_until(lambda: not hub.reservations(), 60, what="every slot to be freed")
