"""Idle reclaim on the embedded default, through a real JupyterHub: idle engines give
their slots to a waiting user while the notebook server stays; the next cell says no
workers are free, and once some are, it brings engines back and runs."""

from __future__ import annotations

import pytest

from fault_cells import SUM, magic
from hub_harness import Kernel, engine_processes, hub_fixture
from pdl_spawner.core.reservations import SlotLedger
from waiting import wait_until

# deadline: its limits (an idle or session limit in seconds) must hold while the test acts
pytestmark = [pytest.mark.hub, pytest.mark.deadline]

USERS = ["admin", "alice", "bob"]
POOL = ["cpu:0", "cpu:1"]
IDLE_S = 10  # long enough for the test's steps between two idle periods on a busy machine
SUM2 = magic(SUM, 2)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from hub_fixture(tmp_path_factory.mktemp("hub-reclaim"), USERS, POOL,
                           hub_env={"PDL_ENGINE_IDLE_TIMEOUT": str(IDLE_S)})


def test_idle_engines_release_their_slots_to_a_waiting_user_and_come_back(hub):
    hub.spawn("alice", 2)
    hub.wait_ready("alice")
    kernel = Kernel(hub, "alice")
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        assert "sum 2" in kernel.execute_ok(SUM2, timeout=120)["stdout"]
        kernel.execute_ok("x = 41")  # kernel state, which must survive the reclaim

        # bob waits in the queue; alice's engines go idle and their slots go to him
        assert hub.api("POST", "/users/bob/server", json={"workers": 2, "queue": True}).status_code == 202
        hub.wait_ready("bob", timeout=120)
        assert sorted(hub.reservations().values()) == ["bob", "bob"]
        engines = wait_until(lambda: e if len(e := engine_processes(hub.root)) == 2 else None, 30,
                             what="bob's two engines")
        assert all(env["HOME"] == str(hub.home("bob")) for env in engines.values()), engines
        assert hub.server_ready("alice"), "alice's notebook server must stay"
        newest = SlotLedger(hub.state_dir / "reservations.sqlite").reclaims()[0]  # newest first
        assert (newest.owner, newest.slots, newest.reason) == ("alice", POOL, f"engines idle for {IDLE_S} s")
        hub.wait_for_log(f"Reclaimed cpu:0,cpu:1 from alice: engines idle for {IDLE_S} s", 15)
        token = hub.user_token("alice")
        panel = hub.server_api("alice", "/pdl/api/cluster", token)  # what her Cluster panel shows
        assert panel["message"] == (f"Engines released (engines idle for {IDLE_S} s): "
                                    "the next %%distributed cell asks for them again."), panel
        assert panel["slots"] == [] and panel["engines"] == [], panel

        # alice's next cell says clearly that no workers are free, and runs nothing
        out = kernel.execute(SUM2, timeout=120)  # IPython shows a UsageError as one line on stderr
        assert f"Your engines were stopped (engines idle for {IDLE_S} s)" in out["stderr"], out
        assert (f"UsageError: your engines were stopped (engines idle for {IDLE_S} s) and cannot come back now: "
                "Not enough free workers: you asked for 2, 0 of 2 are free") in out["stderr"], out
        assert "sum" not in out["stdout"]
        # ...and the engines' stop showed nothing else: no log of theirs reached her notebook
        assert "Traceback" not in kernel.stray_output and "IPEngine" not in kernel.stray_output, kernel.stray_output

        # bob stops: alice's next cell brings engines back and runs, with her kernel's state
        hub.api("DELETE", "/users/bob/server")
        wait_until(lambda: "bob" not in hub.reservations().values(), 60, what="bob's slots to free")
        out = kernel.execute_ok(SUM2, timeout=180)
        assert "sum 2" in out["stdout"] and "asking for 2 again" in out["stderr"]
        hub.wait_for_log("Granted cpu:0,cpu:1 to alice again", 15)
        assert hub.log_noise() == []  # the hub looked at the lease every second: debug lines only
        assert kernel.execute_ok("print(x + 1)")["stdout"].strip() == "42"
        panel = hub.server_api("alice", "/pdl/api/cluster", token)
        assert panel["message"] is None and panel["slots"] == POOL, panel
    finally:
        kernel.close()
        hub.api("DELETE", "/users/alice/server")
        hub.api("DELETE", "/users/bob/server")
    wait_until(lambda: not hub.running_servers() and not hub.reservations(), 60, what="servers to stop")


@pytest.fixture
def culling_hub(tmp_path):
    """A hub of its own whose idle culler stops servers idle for 10 s."""
    yield from hub_fixture(tmp_path, USERS, POOL, hub_env={"PDL_CULL_IDLE_S": "10"})


def test_a_whole_idle_server_is_culled_and_its_slots_freed(culling_hub):
    """jupyterhub-idle-culler runs as a hub service (PDL_CULL_IDLE_S)."""
    hub = culling_hub
    hub.spawn("alice", 2)
    hub.wait_ready("alice")
    assert sorted(hub.reservations().values()) == ["alice", "alice"]
    wait_until(lambda: not hub.running_servers(), 90, what="the idle culler to stop alice's server")
    wait_until(lambda: not hub.reservations() and not engine_processes(hub.root), 30,
               what="alice's slots and engines to go")
    assert hub.home("alice").is_dir(), "the user's files stay"
    assert "Culling server alice (inactive for" in hub.log_tail(2000)
