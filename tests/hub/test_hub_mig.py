"""MIG devices on the embedded default, through a real JupyterHub: a machine whose
GPU 0, an A100, is split by MIG into two 3g.20gb devices and whose GPU 1, a T4, is
whole (a fake nvidia-smi and driver files, stand-in device nodes: tests/harness/
mig_machine.py). The spawn form, in a real browser, offers the MIG devices as their
own type with their free count; a spawn of that type reserves MIG slots, its engine
sees only its MIG device (CUDA_VISIBLE_DEVICES is the device's UUID), and the device
cgroup lets it open its GPU's node and its own instances' capability nodes, never
those of the neighbour's MIG device on the same GPU nor the other GPU."""

from __future__ import annotations

import os
import re

import pytest

from browser_harness import chromium_page
from fault_cells import magic
from hub_harness import Hub, Kernel, gpu_types_in_browser, open_path_to, running
from mig_machine import MIG_TYPE, MIG_UUIDS, stand_in_mig_machine
from waiting import wait_until

pytestmark = [pytest.mark.hub, pytest.mark.browser,
              pytest.mark.skipif(os.geteuid() != 0, reason="stand-in GPU device nodes need root (mknod)")]

POOL = ["gpu:1", "mig:0", "mig:1"]
#: Rank 0 prints its CUDA_VISIBLE_DEVICES and, for each node, "ok" or the errno that
#: opening it gave: ENXIO, no driver behind the node (the cgroup let the open through);
#: EPERM, the device cgroup stopped it.
OPENS = """
import errno, os
def opened(path):
    try:
        os.close(os.open(path, os.O_RDONLY))
    except OSError as e:
        return errno.errorcode[e.errno]
    return "ok"
print("visible", os.environ["CUDA_VISIBLE_DEVICES"], *[opened(p) for p in {nodes!r}])
"""


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    return tmp_path_factory.mktemp("mig-machine")


@pytest.fixture(scope="module")
def hub(tmp_path_factory, machine):
    config = stand_in_mig_machine(machine)
    open_path_to(machine)  # the users' servers run its nvidia-smi and open its nodes
    # the stand-in GPUs are no GPUs to torch: the preflight would stop every cell
    hub = Hub(tmp_path_factory.mktemp("mig-hub"), ["admin", "alice", "bob"], POOL,
              spawner_env={"PDL_PREFLIGHT_SKIP": "gpu"}, extra_config=config)
    with running(hub):
        yield hub


def opens(hub: Hub, user: str, nodes: list[str]) -> list[str]:
    """What ``user``'s engine sees: [CUDA_VISIBLE_DEVICES, then each node's open]."""
    kernel = Kernel(hub, user)
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        out = kernel.execute_ok(magic(OPENS.format(nodes=nodes), 1), timeout=120)
    finally:
        kernel.close()
    return re.search(r"visible (.*)", out["stdout"]).group(1).split()


def test_mig_devices_are_a_type_of_their_own_and_each_user_opens_only_their_own(hub, machine, tmp_path):
    nodes = [str(machine / "nvidia0"), str(machine / "nvidia1")] + [
        str(machine / "caps" / f"nvidia-cap{m}") for m in (12, 13, 21, 22)]
    with chromium_page(tmp_path) as page:
        assert gpu_types_in_browser(hub, page, "alice") == ["Any type (3 of 3 free)", f"{MIG_TYPE} (2 of 2 free)",
                                                    "Tesla T4 (1 of 1 free)"]
    try:
        for user in ("alice", "bob"):
            r = hub.api("POST", f"/users/{user}/server", json={"workers": 1, "gpu_type": MIG_TYPE})
            assert r.status_code in (201, 202), r.text
            hub.wait_ready(user)
        assert hub.reservations() == {"mig:0": "alice", "mig:1": "bob"}
        assert hub.server_api("alice", "/pdl/api/cluster")["gpu_type"] == MIG_TYPE

        # GPU 0's node for both; each their own instances' capability nodes; GPU 1 for neither
        assert opens(hub, "alice", nodes) == [MIG_UUIDS[0], "ENXIO", "EPERM", "ENXIO", "ENXIO", "EPERM", "EPERM"]
        assert opens(hub, "bob", nodes) == [MIG_UUIDS[1], "ENXIO", "EPERM", "EPERM", "EPERM", "ENXIO", "ENXIO"]

        r = hub.api("POST", "/users/admin/server", json={"workers": 1, "gpu_type": MIG_TYPE})
        assert r.status_code == 409, r.text
        assert r.json()["message"].startswith(f"Not enough free {MIG_TYPE} workers: you asked for 1, 0 of 2 are free")
    finally:
        hub.api("DELETE", "/users/alice/server")
        hub.api("DELETE", "/users/bob/server")
    wait_until(lambda: not hub.reservations(), 60, what="every slot to be freed")
