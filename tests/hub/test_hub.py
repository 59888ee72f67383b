"""End to end through a real JupyterHub and configurable-http-proxy.

Login through the form, spawn through the REST API, run the CINIC-10 notebook on
the spawned server's engines, and check reservations across stops, failures,
concurrent users and a hub restart.
"""

from __future__ import annotations

import concurrent.futures
import signal
import time

import pytest

from hub_harness import Kernel, engine_processes, hub_fixture
from notebook_run import check_notebook, small_run_env
from pdl.process import pid_alive
from waiting import wait_until

pytestmark = pytest.mark.hub

POOL = ["cpu:0", "cpu:1", "cpu:2", "cpu:3", "cpu:4", "cpu:5"]
USERS = ["admin", "alice", "bob", "carol", "dave", "erin"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    yield from hub_fixture(root, USERS, POOL, spawner_env=small_run_env(str(root / "no-cinic10-here")))


@pytest.fixture
def clean(hub):
    """Every test starts and ends with no servers and no reservations."""
    yield hub
    for user in USERS:
        hub.api("DELETE", f"/users/{user}/server")
    wait_until(lambda: not hub.running_servers(), 60, what="servers to stop")
    assert hub.reservations() == {}


def test_login_form_admits_listed_users_only(hub):
    home = hub.login("alice").get(f"{hub.url}/hub/home")
    assert home.url.endswith("/hub/home") and "alice" in home.text
    refused = hub.login("alice", password="wrong-password")
    assert "/hub/login" in refused.get(f"{hub.url}/hub/home").url
    stranger = hub.login("mallory", password=hub.password("alice"))
    assert "/hub/login" in stranger.get(f"{hub.url}/hub/home").url


def test_spawn_form_shows_free_slots_and_names_only_to_admins(clean):
    hub = clean
    assert hub.spawn("bob", 2).status_code in (201, 202)
    hub.wait_ready("bob")
    alice_page = hub.login("alice").get(f"{hub.url}/hub/spawn").text
    assert 'name="workers"' in alice_page
    assert "4 of 6 CPU workers free" in alice_page
    assert "2 held by other users" in alice_page and "bob" not in alice_page
    assert "You may hold 6 workers; you hold 0." in alice_page
    admin_page = hub.login("admin").get(f"{hub.url}/hub/spawn").text
    assert "bob (2)" in admin_page


def test_form_spawn_reserves_what_the_form_asked(clean):
    hub = clean
    s = hub.login("carol")
    bad = s.post(f"{hub.url}/hub/spawn", data={"_xsrf": s.cookies.get("_xsrf"), "workers": "99"})
    assert "workers must be a whole number from 1 to 6, got 99" in bad.text
    assert hub.reservations() == {}
    r = s.post(f"{hub.url}/hub/spawn", data={"_xsrf": s.cookies.get("_xsrf"), "workers": "2"},
               allow_redirects=False)
    assert r.status_code == 302
    hub.wait_ready("carol")
    assert sorted(o for o in hub.reservations().values()) == ["carol", "carol"]


def test_notebook_trains_on_three_engines_and_recovers_from_failures(clean):
    hub = clean
    assert hub.spawn("alice", 3).status_code in (201, 202)
    hub.wait_ready("alice")
    # her server answers before her engines run (the spawn returns once it listens)
    engines = wait_until(lambda: e if len(e := engine_processes(hub.root)) == 3 else None, 60, what="3 engines")
    assert sorted(e["PDL_SLOT"] for e in engines.values()) == ["cpu:0", "cpu:1", "cpu:2"]

    check_notebook(hub, "alice")

    # the hub's log, which holds the servers' too, as an admin reads it: no warning about
    # the workers each spawn named, no line per look at a lease (watched here only with
    # PDL_ENGINE_IDLE_TIMEOUT: tests/hub/test_hub_reclaim.py sees the looks)
    assert hub.log_noise() == []


def test_request_that_cannot_be_met_fails_fast_and_reserves_nothing(clean):
    hub = clean
    assert hub.spawn("alice", 5).status_code in (201, 202)
    hub.wait_ready("alice")
    # her server answers before all her engines run: count them once all five do
    def all_five():
        found = engine_processes(hub.root)
        return found if len(found) == 5 else None

    before = wait_until(all_five, 60, what="alice's five engines")
    started = time.monotonic()
    r = hub.spawn("bob", 2)
    assert time.monotonic() - started < 5
    assert r.status_code == 409
    assert "you asked for 2, 1 of 6 are free (5 held by other users)" in r.json()["message"]
    assert "bob" not in hub.reservations().values()
    assert engine_processes(hub.root).keys() == before.keys()
    assert not hub.server_ready("bob")
    # the same through the spawn form: the form again, with the one line
    s = hub.login("bob")
    page = s.post(f"{hub.url}/hub/spawn", data={"_xsrf": s.cookies.get("_xsrf"), "workers": "2"}).text
    assert "you asked for 2, 1 of 6 are free (5 held by other users)" in page and 'name="workers"' in page
    assert "bob" not in hub.reservations().values()
    # PDL answered both before JupyterHub began a spawn: no failed spawn for the admin to read
    assert "Error starting bob's server" not in hub.log_tail(1000)
    # and only after JupyterHub let the request in: carol asking for bob's server learns nothing
    r = hub.api("POST", "/users/bob/server", token=hub.user_token("carol"), json={"workers": 2})
    assert r.status_code in (403, 404) and "free" not in r.text, (r.status_code, r.text)


def wait_for_tree(hub, user: str, engines: int) -> dict[int, str]:
    """``user``'s lasting processes (no helpers) once their server, controller and
    ``engines`` engines all run."""
    def tree():
        procs = hub.lasting_processes_of(user)
        roles = list(procs.values())
        complete = all(roles.count(r) == 1 for r in ("pdl-singleuser", "server")) and "controller" in roles
        return procs if complete and roles.count("engine") == engines else None

    return wait_until(tree, 60, what=f"{user}'s server, controller and {engines} engines")


def stop_and_count(hub, user: str) -> None:
    """Stop ``user``'s server; once the hub says it stopped, no reservation is left,
    and none of their processes within a few seconds (engines die with their parent)."""
    procs = hub.processes_of(user)
    assert hub.api("DELETE", f"/users/{user}/server").status_code in (202, 204)
    wait_until(lambda: user not in hub.running_servers(), 60, what=f"{user}'s server to stop")
    assert user not in hub.reservations().values()
    # A process counts until it is gone or a zombie: one still exiting has no
    # readable environment any more (so processes_of no longer lists it) but runs.
    left = lambda: {**hub.processes_of(user), **{pid: role for pid, role in procs.items() if pid_alive(pid)}}  # noqa: E731
    try:
        wait_until(lambda: not left(), 10, what=f"{user}'s processes to exit")
    except TimeoutError:
        raise AssertionError(f"left running after the stop: {left()}") from None


def test_stop_releases_slots_and_processes(clean):
    hub = clean
    hub.spawn("dave", 2)
    hub.wait_ready("dave")
    procs = wait_for_tree(hub, "dave", engines=2)
    assert sorted(engine_processes(hub.root)) == sorted(p for p, role in procs.items() if role == "engine")
    stop_and_count(hub, "dave")
    assert not engine_processes(hub.root)


def test_many_users_at_once_never_share_a_slot(clean):
    hub = clean
    users = ["alice", "bob", "carol", "dave", "erin"]
    with concurrent.futures.ThreadPoolExecutor(len(users)) as pool:
        codes = dict(zip(users, pool.map(lambda u: hub.spawn(u, 2).status_code, users)))
    granted = [u for u, code in codes.items() if code in (201, 202)]
    refused = [u for u, code in codes.items() if code == 409]
    assert len(granted) == 3 and len(refused) == 2, codes
    for user in granted:
        hub.wait_ready(user)
    owners = hub.reservations()
    assert sorted(owners.values()) == sorted(granted * 2)
    engines = wait_until(lambda: e if len(e := engine_processes(hub.root)) == 6 else None, 60,
                         what="six engines")
    slots = [e["PDL_SLOT"] for e in engines.values()]
    assert sorted(slots) == sorted(POOL), "a slot is used by two engines"
    for e in engines.values():  # each engine runs in the home of the user holding its slot
        assert e["HOME"] == str(hub.home(owners[e["PDL_SLOT"]]))


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["restart", "crash"])
def test_hub_restart_keeps_servers_and_reservations(clean, how):
    hub = clean
    hub.spawn("erin", 4)
    hub.wait_ready("erin")
    erin = wait_for_tree(hub, "erin", engines=4)
    held = hub.reservations()
    hub.stop_hub(how)
    hub.start()
    hub.wait_ready("erin", timeout=30)
    assert hub.reservations() == held
    assert hub.lasting_processes_of("erin") == erin, "erin's server, controller or engines were restarted"
    r = hub.spawn("bob", 3)
    assert r.status_code == 409 and "2 of 6 are free" in r.json()["message"]
    # bob gets exactly the two free slots, never one of erin's
    assert hub.spawn("bob", 2).status_code in (201, 202)
    hub.wait_ready("bob")
    bob = wait_for_tree(hub, "bob", engines=2)
    free = sorted(set(POOL) - set(held))
    assert sorted(s for s, owner in hub.reservations().items() if owner == "bob") == free
    assert sorted(e["PDL_SLOT"] for pid, e in engine_processes(hub.root).items() if pid in bob) == free
    kernel = Kernel(hub, "erin")
    try:
        kernel.execute("%load_ext pdl_magics")
        out = kernel.execute("%%distributed -n 4\nprint('world', world_size)")
        assert out["error"] is None and "world 4" in out["stdout"], out
    finally:
        kernel.close()
    # the restarted hub stops erin's server completely, and bob's keeps running
    wait_until(lambda: "kernel" not in hub.processes_of("erin").values(), 30, what="erin's kernel to exit")
    stop_and_count(hub, "erin")
    assert hub.reservations() == dict.fromkeys(free, "bob")
    assert hub.lasting_processes_of("bob") == bob
