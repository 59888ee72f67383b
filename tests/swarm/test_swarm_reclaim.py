"""Idle reclaim on the simulated 3-node swarm, through a real JupyterHub in its swarm
mode: a user's idle engines are scaled to 0 and their GPUs go to a user waiting in the
queue, while the notebook server (and the kernel's state) stays; the next cell says no
GPUs are free, and once they are, it brings the engines back and runs. The admin view
shows who holds which GPU on which node, and the reclaim."""

from __future__ import annotations

import pytest

from fault_cells import SUM, magic
from hub_harness import Kernel, Progress, queue_up
from swarm_hub_harness import admin_status, pdl_objects, swarm_hub_fixture
from waiting import wait_until

pytestmark = pytest.mark.docker

USERS = ["admin", "alice", "bob"]
#: Seconds without a task before engines are released: long enough for the test's
#: steps between bob's server being ready and his own engines going idle.
IDLE_S = 40
SUM3 = magic(SUM, 3)


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    yield from swarm_hub_fixture(tmp_path_factory.mktemp("swarm-reclaim"), swarm, USERS,
                           hub_env={"PDL_ENGINE_IDLE_TIMEOUT": str(IDLE_S)})


def replicas(swarm, user: str) -> list[int]:
    """Tasks each of ``user``'s engine services is meant to run."""
    return sorted(s.attrs["Spec"]["Mode"]["Replicated"]["Replicas"]
                  for s in swarm.manager.services.list(filters={"label": ["pdl.role=engine", f"pdl.user={user}"]}))


def test_idle_engines_release_their_gpus_to_a_waiting_user_and_come_back(hub, swarm):
    hub.spawn("alice", 3)
    hub.wait_ready("alice", timeout=240)
    kernel = Kernel(hub, "alice")
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        assert "sum 3" in kernel.execute_ok(SUM3, timeout=240)["stdout"]
        kernel.execute_ok("x = 41")  # kernel state, which must survive the reclaim
        held = admin_status(hub)["reservations"]
        assert sorted((r["user"], r["node"], r["slot"]) for r in held) == [
            ("alice", swarm.hostname(i), swarm.gpu(i)) for i in swarm.node_ids()], held

        # bob waits in the queue; alice's engines go idle and their GPUs go to him
        queue_up(hub, "bob", 2)
        bob = Progress(hub, "bob")
        wait_until(lambda: bob.saw("number 1 in the queue"), 60, what="bob to wait in the queue")
        hub.wait_ready("bob", timeout=IDLE_S + 240)
        assert replicas(swarm, "alice") == [0, 0, 0] and replicas(swarm, "bob") == [1, 1]
        assert hub.server_ready("alice"), "alice's notebook server must stay"
        hub.wait_for_log(f"from alice: engines idle for {IDLE_S} s", 15)
        panel = hub.server_api("alice", "/pdl/api/cluster")  # what her Cluster panel shows
        assert panel["message"] == (f"Engines released (engines idle for {IDLE_S} s): "
                                    "the next %%distributed cell asks for them again."), panel
        assert panel["slots"] == [] and panel["engines"] == [], panel
        reclaim = admin_status(hub)["reclaims"][0]  # newest first
        assert (reclaim["user"], reclaim["reason"]) == ("alice", f"engines idle for {IDLE_S} s"), reclaim
        assert sorted(reclaim["slots"]) == [f"{swarm.hostname(i)}/{swarm.gpu(i)}" for i in swarm.node_ids()]

        # alice's next cell says clearly that no GPUs are free, and runs nothing
        out = kernel.execute(SUM3, timeout=240)  # IPython shows a UsageError as one line on stderr
        assert f"Your engines were stopped (engines idle for {IDLE_S} s) and their GPUs given back" in out["stderr"]
        assert (f"UsageError: your engines were stopped (engines idle for {IDLE_S} s) and cannot come back now: "
                "Not enough free GPUs: you asked for 3, 1 of 3 are free") in out["stderr"], out
        assert "sum" not in out["stdout"] and replicas(swarm, "alice") == [0, 0, 0]

        # bob stops: alice's next cell brings her engines back and runs, with her kernel's state
        hub.api("DELETE", "/users/bob/server")
        wait_until(lambda: pdl_objects(swarm, "bob") == ([], []), 120, what="bob's services to go")
        out = kernel.execute_ok(SUM3, timeout=300)
        assert "sum 3" in out["stdout"] and "asking for 3 again" in out["stderr"], out
        hub.wait_for_log("Granted 3 GPU(s) to alice again", 15)
        assert replicas(swarm, "alice") == [1, 1, 1]
        assert kernel.execute_ok("print(x + 1)")["stdout"].strip() == "42"
    finally:
        kernel.close()
        hub.api("DELETE", "/users/alice/server")
        hub.api("DELETE", "/users/bob/server")
    wait_until(lambda: pdl_objects(swarm) == ([], []), 120, what="the servers' services to go")
