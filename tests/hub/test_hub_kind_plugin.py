"""A fourth cluster kind is one folder: the test kind (tests/harness/test_kind, registered
as ``procs`` under the entry-point group ``pdl.kinds`` only where that folder is on
``PYTHONPATH``) runs a user's whole story through a real hub, with no line of PDL
changed for it: login, spawn, a ``%%distributed`` cell on its own engine host's
engines, the admin view, stop. The hub, the user's server and its engines each find
the kind by its name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hub_harness import Kernel, admin_status, hub_fixture
from waiting import wait_until

pytestmark = pytest.mark.hub

TEST_KIND = Path(__file__).resolve().parents[1] / "harness" / "test_kind"
USERS = ["admin", "alice"]
POOL = ["cpu:0", "cpu:1"]

CELL = """%%distributed -n 2 --all-output
import os
print(f"rank {rank} of {world_size} engine of the test kind: {os.environ.get('PDL_TEST_KIND_ENGINE')}")
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    python_path = os.pathsep.join(p for p in (str(TEST_KIND), os.environ.get("PYTHONPATH", "")) if p)
    yield from hub_fixture(tmp_path_factory.mktemp("hub-procs"), USERS, POOL,
                           hub_env={"PDL_SPAWNER": "procs", "PDL_PROCS_SLOTS": ",".join(POOL),
                                    "PYTHONPATH": python_path})


def test_a_kind_that_lives_only_in_the_tests_runs_a_users_whole_story(hub):
    home = hub.login("alice").get(f"{hub.url}/hub/home")
    assert home.url.endswith("/hub/home") and "alice" in home.text
    assert hub.spawn("alice", 2).status_code in (201, 202)
    hub.wait_ready("alice")
    kernel = Kernel(hub, "alice")
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        out = kernel.execute_ok(CELL, timeout=180)["stdout"]
    finally:
        kernel.close()
    assert "rank 0 of 2 engine of the test kind: 1" in out and "rank 1 of 2 engine of the test kind: 1" in out, out
    status = admin_status(hub)
    assert sorted(r["slot"] for r in status["reservations"] if r["user"] == "alice") == POOL
    assert hub.api("DELETE", "/users/alice/server").status_code in (202, 204)
    wait_until(lambda: not hub.running_servers() and not hub.reservations(), 60, what="alice's server to stop")
