"""The fair queue on the simulated 3-node swarm, through a real JupyterHub in its swarm
mode: users who ask for busy GPUs wait in order and see their position, one who leaves
is skipped, a direct spawn does not jump the queue, the admin view lists who waits,
and the GPUs go first come first served when they free up."""

from __future__ import annotations

import time

import pytest

from hub_harness import Progress, queue_up
from swarm_hub_harness import admin_status, pdl_objects, swarm_hub_fixture
from waiting import wait_until

pytestmark = pytest.mark.docker

USERS = ["admin", "alice", "bob", "carol", "dave"]


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    yield from swarm_hub_fixture(tmp_path_factory.mktemp("swarm-queue"), swarm, USERS)


def engine_users(swarm) -> list[str]:
    """The user of each engine service, sorted."""
    return sorted(s.attrs["Spec"]["Labels"]["pdl.user"]
                  for s in swarm.manager.services.list(filters={"label": "pdl.role=engine"}))


def test_the_queue_serves_gpus_in_order_and_skips_who_left(hub, swarm):
    assert hub.spawn("alice", 3).status_code in (201, 202)
    hub.wait_ready("alice", timeout=240)

    queue_up(hub, "bob", 2)
    queue_up(hub, "carol", 1)
    queue_up(hub, "dave", 1)
    bob, carol, dave = (Progress(hub, u) for u in ("bob", "carol", "dave"))
    wait_until(lambda: bob.saw("number 1 in the queue") and dave.saw("number 3 in the queue"), 60,
               what="the queue positions on the spawn page")
    assert "Waiting for 2 GPUs: number 1 in the queue; 0 of 3 are free (3 held by other users)" in bob.messages[-1]

    # the hub answers while they wait, and a direct spawn does not jump the queue
    started = time.monotonic()
    r = hub.spawn("admin", 1)
    assert r.status_code == 409 and "3 users are waiting in the queue" in r.json()["message"], r.text
    assert time.monotonic() - started < 10
    assert [q["user"] for q in admin_status(hub)["queue"]] == ["bob", "carol", "dave"]
    admin_page = hub.login("admin").get(f"{hub.url}/hub/spawn").text
    assert "Queue: bob (2), carol (1), dave (1)." in admin_page
    assert "You may hold 3 workers; you hold 0." in admin_page

    # carol leaves (cancels her pending spawn): dave moves up, and she never gets a GPU
    assert hub.api("DELETE", "/users/carol/server").status_code in (202, 204)
    wait_until(lambda: dave.saw("number 2 in the queue"), 60, what="dave to move up")
    assert [q["user"] for q in admin_status(hub)["queue"]] == ["bob", "dave"]

    # alice stops: her three GPUs go to bob (2), then dave (1), in order
    assert hub.api("DELETE", "/users/alice/server").status_code in (202, 204)
    hub.wait_ready("bob", timeout=240)
    hub.wait_ready("dave", timeout=240)
    # the spawn pages say so too (their streams end a moment after the REST model does)
    wait_until(lambda: bob.ended and dave.ended, 30, what="bob's and dave's spawn pages to end")
    assert bob.ended.get("ready") and dave.ended.get("ready"), (bob.ended, dave.ended)
    assert engine_users(swarm) == ["bob", "bob", "dave"]
    assert not hub.user_model("carol").get("servers") and pdl_objects(swarm, "carol") == ([], [])
    status = admin_status(hub)
    assert status["queue"] == [] and sorted(r["user"] for r in status["reservations"]) == ["bob", "bob", "dave"]

    for user in ("bob", "dave"):
        hub.api("DELETE", f"/users/{user}/server")
    wait_until(lambda: pdl_objects(swarm) == ([], []), 120, what="the servers' services to go")
