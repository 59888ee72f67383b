"""The fair queue on the embedded default, through a real JupyterHub: users who ask
for busy workers wait in order, see their position, can leave, and are served first
come first served when workers free up; admins see who waits."""

from __future__ import annotations

import time

import pytest

from hub_harness import Progress, hub_fixture, queue_up
from waiting import wait_until

pytestmark = pytest.mark.hub

USERS = ["admin", "alice", "bob", "carol", "dave", "erin"]
POOL = ["cpu:0", "cpu:1"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from hub_fixture(tmp_path_factory.mktemp("hub-queue"), USERS, POOL)


def test_the_queue_serves_in_order_skips_who_left_and_never_blocks_the_hub(hub):
    assert hub.spawn("alice", 2).status_code in (201, 202)
    hub.wait_ready("alice")

    queue_up(hub, "bob")
    queue_up(hub, "carol")
    queue_up(hub, "dave")
    bob, carol, dave = (Progress(hub, u) for u in ("bob", "carol", "dave"))
    wait_until(lambda: bob.saw("number 1 in the queue") and dave.saw("number 3 in the queue"), 30,
               what="the queue positions on the spawn page")
    assert "Waiting for 1 workers: number 1 in the queue; 0 of 2 are free (2 held by other users)" in bob.messages[-1]

    # the hub answers while they wait; a direct spawn does not jump the queue
    started = time.monotonic()
    r = hub.spawn("erin", 1)
    assert r.status_code == 409 and "3 users are waiting in the queue" in r.json()["message"], r.text
    assert time.monotonic() - started < 5
    # admins see who waits, in order; users see how many
    assert "Queue: bob (1), carol (1), dave (1)." in hub.login("admin").get(f"{hub.url}/hub/spawn").text
    assert "3 users are waiting." in hub.login("erin").get(f"{hub.url}/hub/spawn").text

    # carol leaves (cancels her pending spawn): dave moves up
    assert hub.api("DELETE", "/users/carol/server").status_code in (202, 204)
    wait_until(lambda: dave.saw("number 2 in the queue"), 30, what="dave to move up")
    assert "carol" not in hub.reservations().values()

    # alice stops: her two slots go to bob, then dave, in order
    assert hub.api("DELETE", "/users/alice/server").status_code in (202, 204)
    hub.wait_ready("bob", timeout=120)
    hub.wait_ready("dave", timeout=120)
    assert sorted(hub.reservations().values()) == ["bob", "dave"]
    # the spawn pages say so too (their streams end a moment after the REST model does)
    wait_until(lambda: bob.ended and dave.ended, 30, what="bob's and dave's spawn pages to end")
    assert bob.ended.get("ready") and dave.ended.get("ready"), (bob.ended, dave.ended)
    assert not hub.user_model("carol").get("servers")

    for user in ("bob", "dave"):
        hub.api("DELETE", f"/users/{user}/server")
    wait_until(lambda: not hub.running_servers() and not hub.reservations(), 60, what="servers to stop")


def test_bad_queue_options_are_refused_in_one_line(hub):
    r = hub.api("POST", "/users/erin/server", json={"workers": 1, "queue": "yes"})
    assert r.status_code == 400 and "spawn option 'queue' must be true or false" in r.json()["message"], r.text
    assert "erin" not in hub.reservations().values()
