"""The hub's session limit on the embedded default, through a real JupyterHub: the spawn
form tells it, the panel and each cell count down and warn, the server releases the
engines at the end so the next cell says why and gets a new session, and a server that
keeps its workers past the end (the user forged its lease) has them taken back by the hub."""

from __future__ import annotations

import os
import time

import pytest

from fault_cells import SUM, magic
from hub_harness import Kernel, hub_fixture
from pdl.lease import Grant, LeaseFiles
from pdl_spawner.core.session_limit import ENFORCE_AFTER_S
from waiting import wait_until

# deadline: its limits (an idle or session limit in seconds) must hold while the test acts
pytestmark = [pytest.mark.hub, pytest.mark.deadline]

USERS = ["admin", "alice"]
POOL = ["cpu:0", "cpu:1"]
LIMIT_S = 40  # long enough to spawn and run a first cell on a busy machine
WHY = "the hub's session limit of 40 s"
SUM2 = magic(SUM, 2)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    # warned from the start: every cell of a 40 s session says how long is left
    yield from hub_fixture(tmp_path_factory.mktemp("hub-session"), USERS, POOL,
                           hub_env={"PDL_SESSION_LIMIT_S": str(LIMIT_S), "PDL_SESSION_WARN_S": str(LIMIT_S)})


def test_a_session_ends_with_a_release_the_next_cell_explains_and_a_forged_lease_changes_nothing(hub):
    form = hub.login("alice").get(f"{hub.url}/hub/spawn").text
    assert "Sessions last at most 40 s: your engines are then released, your notebook keeps its state" in form
    assert hub.spawn("alice", 2).status_code in (201, 202)
    hub.wait_ready("alice")
    kernel = Kernel(hub, "alice")
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        out = kernel.execute_ok(SUM2, timeout=120)
        assert "sum 2" in out["stdout"] and f"({WHY}): save your work, or extend it." in out["stderr"], out
        session = hub.server_api("alice", "/pdl/api/cluster")["session"]
        assert session["text"].startswith("Time left: ") and session["text"].endswith(f" ({WHY})"), session
        assert 0 < session["left_s"] <= LIMIT_S and session["warning"], session
        kernel.execute_ok("x = 41")  # kernel state, which must survive the end

        # the end: the server releases the engines; the hub frees the slots in its own words
        released = f"Engines released ({WHY} reached at "
        wait_until(lambda: (hub.server_api("alice", "/pdl/api/cluster")["message"] or "").startswith(released),
                   LIMIT_S + 30, what=f"the panel to say: {released}...")
        wait_until(lambda: not hub.reservations(), 30, what="alice's slots to be freed")
        hub.wait_for_log(f"Reclaimed cpu:0,cpu:1 from alice: {WHY} reached", 15)

        # the next cell says why in one line, and gets a new session
        asked_at = time.time()  # the new session starts after this
        out = kernel.execute_ok(SUM2, timeout=180)
        assert f"Your engines were stopped ({WHY} reached at " in out["stderr"] and "sum 2" in out["stdout"], out
        assert "died" not in out["stderr"], out
        assert kernel.execute_ok("print(x + 1)")["stdout"].strip() == "42"
        assert sorted(hub.reservations().values()) == ["alice", "alice"]

        # the attack: alice forges the grant her server holds, so that it never releases;
        # the hub takes the slots back itself shortly after the session's real end
        cluster = hub.home("alice") / ".pdl" / "cluster"
        owner = os.stat(cluster)
        forged = LeaseFiles(cluster)
        forged.keep_held(Grant(workers=2, slots=tuple(POOL), ends_at=time.time() + 86400))
        os.chown(cluster / "engines-held.json", owner.st_uid, owner.st_gid)
        wait_until(lambda: not hub.reservations(), LIMIT_S + ENFORCE_AFTER_S + 30,
                   what="the hub to take alice's slots back")
        assert time.time() >= asked_at + LIMIT_S  # not before her session's end
        hub.wait_for_log(f"Took back cpu:0,cpu:1 from alice: {WHY} reached", 15)
    finally:
        kernel.close()
        hub.api("DELETE", "/users/alice/server")
    wait_until(lambda: not hub.running_servers() and not hub.reservations(), 60, what="servers to stop")
