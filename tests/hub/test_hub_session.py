"""The hub's session limit on the embedded default, through a real JupyterHub: the spawn
form tells it, the panel and each cell count down and warn, the server releases the
engines at the end, so that a cell running then says why in one line and the next cell
gets a new session, and a server that keeps its workers past the end (its user forged
its lease, and answered her own wish for more time) has them taken back by the hub, its
engines ended before anyone else has the slot. Two users at once, one session each: the
test waits for one session's end, not two."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import requests

from fault_cells import SUM, magic
from hub_harness import Kernel, engine_processes, hub_fixture
from pdl.lease import Extended, Grant, LeaseFiles, encode
from pdl_spawner.core.session_limit import ENFORCE_AFTER_S
from waiting import wait_until

# deadline: its limits (an idle or session limit in seconds) must hold while the test acts
pytestmark = [pytest.mark.hub, pytest.mark.deadline]

USERS = ["admin", "alice", "bob"]
POOL = ["cpu:0", "cpu:1"]
#: Long enough for a spawn, a first cell and the start of a second on CI's slowest
#: machine, beside the other deadline tests (48 s to the first cell's end seen there: a
#: 40 s session ended during it), in whole minutes as the form shows them.
LIMIT_S = 120
WHY = "the hub's session limit of 2 min"
SUM1 = magic(SUM, 1)
#: a cell that runs until the session's end stops its engine
PAST_THE_END = magic("import time\nprint('sleeping', flush=True)\ntime.sleep(10 * 60)", 1)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    # warned from the start: every cell of a session says how long is left
    yield from hub_fixture(tmp_path_factory.mktemp("hub-session"), USERS, POOL,
                           hub_env={"PDL_SESSION_LIMIT_S": str(LIMIT_S), "PDL_SESSION_WARN_S": str(LIMIT_S)})


def engines_of(hub, user: str) -> dict[int, dict[str, str]]:
    """``user``'s engine processes (:func:`engine_processes`, by their home)."""
    return {pid: e for pid, e in engine_processes(hub.root).items() if e["HOME"] == str(hub.home(user))}


def on_a_slot(pid: int) -> bool:
    """Whether process ``pid`` is in a slot's CPU cgroup (pdl_spawner/host/cpu_limits.py)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except FileNotFoundError:
        return False
    return any("/slots/" in line.split(":", 2)[2] for line in lines if "cpu" in line.split(":", 2)[1].split(","))


def slot_of(hub, user: str) -> str:
    [slot] = [slot for slot, owner in hub.reservations().items() if owner == user]
    return slot


def forge_a_lease_that_never_ends(hub, user: str) -> None:
    """The attack: ``user`` answers her own server's wish for more time with a forged
    extension (her server takes it: it is hers), and forges the grant it holds, so that
    it never releases."""
    cluster = hub.home(user) / ".pdl" / "cluster"
    forged = LeaseFiles(cluster)
    session_end = hub.server_api(user, "/pdl/api/cluster")["session"]["ends_at"]
    r = requests.post(f"{hub.user_url(user)}/pdl/api/lease/extension", timeout=30,
                      json=encode(Extended(ends_at=time.time() + 86400, of=session_end)),
                      headers={"Authorization": f"token {hub.user_token(user)}"})
    assert r.status_code == 200, r.text
    assert hub.server_api(user, "/pdl/api/cluster")["session"]["left_s"] > LIMIT_S  # her server believes it
    owner = os.stat(cluster)
    forged.keep_held(Grant(workers=1, slots=(slot_of(hub, user),), ends_at=time.time() + 86400))
    os.chown(cluster / "engines-held.json", owner.st_uid, owner.st_gid)


def test_a_session_ends_with_a_release_the_next_cell_explains_and_a_forged_lease_changes_nothing(hub):
    form = hub.login("alice").get(f"{hub.url}/hub/spawn").text
    assert "Sessions last at most 2 min: your engines are then released, your notebook keeps its state" in form
    asked_at = time.time()  # bob's session starts after this
    for user in ("alice", "bob"):
        assert hub.spawn(user, 1).status_code in (201, 202)
    for user in ("alice", "bob"):
        hub.wait_ready(user)
    bobs_slot = slot_of(hub, "bob")
    # his server answers before his engine runs (the spawn returns once it listens)
    bobs_engines = wait_until(lambda: [pid for pid, role in hub.processes_of("bob").items() if role == "engine"],
                              60, what="bob's engine")
    assert len(bobs_engines) == 1, hub.processes_of("bob")
    forge_a_lease_that_never_ends(hub, "bob")

    kernel = Kernel(hub, "alice")
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        out = kernel.execute_ok(SUM1, timeout=120)
        assert "sum 1" in out["stdout"] and f"({WHY}): save your work, or extend it." in out["stderr"], out
        session = hub.server_api("alice", "/pdl/api/cluster")["session"]
        assert session["text"].startswith("Time left: ") and session["text"].endswith(f" ({WHY})"), session
        assert 0 < session["left_s"] <= LIMIT_S and session["warning"], session
        kernel.execute_ok("x = 41")  # kernel state, which must survive the end

        # the end: the server releases the engines; the cell running then says so in one
        # line (not that rank 0 died), and the hub frees the slot in its own words
        alices_slot = slot_of(hub, "alice")
        out = kernel.execute(PAST_THE_END, timeout=LIMIT_S + 60)
        assert "sleeping" in out["stdout"] and out["error"] is not None, out
        assert out["error"]["ename"] == "EnginesReleased", out
        assert out["error"]["evalue"].startswith(f"Your engines were stopped during this cell ({WHY} reached at "), out
        assert "died" not in out["stderr"] + "".join(out["error"]["traceback"]), out
        released = f"Engines released ({WHY} reached at "
        assert (hub.server_api("alice", "/pdl/api/cluster")["message"] or "").startswith(released)
        wait_until(lambda: alices_slot not in hub.reservations(), 30, what="alice's slot to be freed")
        hub.wait_for_log(f"Reclaimed {alices_slot} from alice: {WHY} reached", 15)

        # the next cell says why in one line, and gets a new session
        out = kernel.execute_ok(SUM1, timeout=180)
        assert f"Your engines were stopped ({WHY} reached at " in out["stderr"] and "sum 1" in out["stdout"], out
        assert "died" not in out["stderr"], out
        assert kernel.execute_ok("print(x + 1)")["stdout"].strip() == "42"
        assert "alice" in hub.reservations().values()
    finally:
        kernel.close()

    # bob's forged lease changes nothing: the hub takes his slot back itself shortly after
    # his session's real end, and his engine ends before the slot is free: none runs on
    # cores granted to another
    wait_until(lambda: bobs_slot not in hub.reservations(), LIMIT_S + ENFORCE_AFTER_S + 30,
               what="the hub to take bob's slot back")
    assert time.time() >= asked_at + LIMIT_S  # not before his session's end
    assert not [pid for pid in bobs_engines if Path(f"/proc/{pid}").exists()], hub.processes_of("bob")
    hub.wait_for_log(f"Took back {bobs_slot} from bob: {WHY} reached", 15)

    # the slot goes to the admin: his engine is the only process on it (bob's server,
    # which believes its forgery, may start an engine again: it joins no slot)
    assert hub.spawn("admin", 1).status_code in (201, 202)
    hub.wait_ready("admin")
    admins = wait_until(lambda: e if len(e := engines_of(hub, "admin")) == 1 else None, 60, what="admin's engine")
    assert [e["PDL_SLOT"] for e in admins.values()] == [bobs_slot], admins
    assert all(on_a_slot(pid) for pid in admins)
    assert not [pid for pid in engines_of(hub, "bob") if on_a_slot(pid)]
    for user in ("alice", "bob", "admin"):
        hub.api("DELETE", f"/users/{user}/server")
    wait_until(lambda: not hub.running_servers() and not hub.reservations(), 60, what="servers to stop")
