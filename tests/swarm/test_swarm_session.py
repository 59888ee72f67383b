"""The hub's session limit on the simulated 3-node swarm, through a real JupyterHub in
its swarm mode: the spawn form tells it, the panel and each cell warn, and at the end
the engine services are scaled to 0 (their GPUs back to the swarm) while the notebook
server and the kernel's state stay; the next cell says why and gets a new session.
(The hub taking back what a server keeps past the end is the same scaling to 0,
triggered by the spawner core: tests/hub/test_session_limit.py, and on the embedded
default with a forged lease: tests/hub/test_hub_session.py.)"""

from __future__ import annotations

import pytest

from fault_cells import SUM, magic
from hub_harness import Kernel
from swarm_hub_harness import swarm_hub_fixture
from waiting import wait_until

pytestmark = pytest.mark.docker

USERS = ["admin", "alice"]
LIMIT_S = 60  # long enough for a spawn's engines to start and a first cell to run
WHY = "the hub's session limit of 1 min"
SUM1 = magic(SUM, 1)


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    yield from swarm_hub_fixture(tmp_path_factory.mktemp("swarm-session"), swarm, USERS,
                                 hub_env={"PDL_SESSION_LIMIT_S": str(LIMIT_S), "PDL_SESSION_WARN_S": str(LIMIT_S)})


def engine_replicas(swarm, user: str) -> list[int]:
    return sorted(s.attrs["Spec"]["Mode"]["Replicated"]["Replicas"]
                  for s in swarm.manager.services.list(filters={"label": ["pdl.role=engine", f"pdl.user={user}"]}))


def test_a_session_ends_in_a_release_of_the_gpus_and_the_next_cell_starts_a_new_one(hub, swarm):
    form = hub.login("alice").get(f"{hub.url}/hub/spawn").text
    assert "Sessions last at most 1 min: your engines are then released" in form
    assert hub.spawn("alice", 1).status_code in (201, 202)
    hub.wait_ready("alice", timeout=240)
    kernel = Kernel(hub, "alice")
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        out = kernel.execute_ok(SUM1, timeout=120)
        assert "sum 1" in out["stdout"] and f"({WHY}): save your work, or extend it." in out["stderr"], out
        assert hub.server_api("alice", "/pdl/api/cluster")["session"]["text"].endswith(f" ({WHY})")
        kernel.execute_ok("x = 41")

        released = f"Engines released ({WHY} reached at "
        wait_until(lambda: (hub.server_api("alice", "/pdl/api/cluster")["message"] or "").startswith(released),
                   LIMIT_S + 30, what=f"the panel to say: {released}...")
        wait_until(lambda: engine_replicas(swarm, "alice") == [0], 30, what="alice's engine service to scale to 0")
        hub.wait_for_log(f"from alice: {WHY} reached", 15)
        assert hub.server_ready("alice"), "alice's notebook server must stay"

        out = kernel.execute_ok(SUM1, timeout=240)
        assert f"Your engines were stopped ({WHY} reached at " in out["stderr"] and "sum 1" in out["stdout"], out
        assert kernel.execute_ok("print(x + 1)")["stdout"].strip() == "42"
        assert engine_replicas(swarm, "alice") == [1]
    finally:
        kernel.close()
        hub.api("DELETE", "/users/alice/server")
    wait_until(lambda: not hub.running_servers(), 120, what="alice's server to stop")
