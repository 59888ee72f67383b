"""Faults in a user's server on the embedded default, through a real JupyterHub:
an engine killed in the middle of a cell, and a cell whose ranks hang."""

from __future__ import annotations

import os
import re
import signal
import socket

import pytest

from fault_cells import ALL_REDUCE_LOOP, SUM, magic
from hub_harness import Kernel, engine_processes, hub_fixture
from waiting import wait_until

pytestmark = pytest.mark.hub

USERS = ["admin", "alice"]
POOL = ["cpu:0", "cpu:1", "cpu:2"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")

LOOP = magic(ALL_REDUCE_LOOP, 3)
SUM3 = magic(SUM, 3)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from hub_fixture(tmp_path_factory.mktemp("hub-faults"), USERS, POOL)


def test_an_engine_killed_mid_cell_fails_the_cell_and_its_slot_gets_a_new_engine(hub):
    hub.spawn("alice", 3)
    hub.wait_ready("alice")
    held = hub.reservations()
    assert sorted(held) == POOL
    engines = wait_until(lambda: e if len(e := engine_processes(hub.root)) == 3 else None, 60, what="3 engines")
    victim = next(pid for pid, env in engines.items() if env["PDL_SLOT"] == "cpu:1")  # rank 1
    kernel = Kernel(hub, "alice")
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        killed_at = []

        def kill_when_running(elapsed, text):
            if "loop running" in text and not killed_at:
                os.kill(victim, signal.SIGKILL)
                killed_at.append(elapsed)

        out = kernel.execute(LOOP, timeout=120, on_output=kill_when_running)
        assert killed_at, out
        assert out["seconds"] - killed_at[0] < 30
        assert out["error"] is not None and out["error"]["ename"] == "RankFailed", out
        shown = ANSI.sub("", "\n".join(out["error"]["traceback"]))
        assert f"Rank 1 on host {socket.gethostname()} died" in shown, shown

        # the reservation is untouched and pdl-singleuser starts a new engine on the slot
        assert hub.reservations() == held
        fresh = wait_until(lambda: e if len(e := engine_processes(hub.root)) == 3 and victim not in e else None,
                           60, what="a new engine for cpu:1")
        assert sorted(env["PDL_SLOT"] for env in fresh.values()) == POOL
        assert "sum 3" in kernel.execute_ok(SUM3, timeout=120)["stdout"]

        # a hang: the watchdog shows where each rank is; the stop button ends it
        out = kernel.execute(
            "%%distributed -n 3 --hang-timeout 2\nimport time, torch.distributed as dist\n"
            "if rank == 0:\n    dist.barrier()\nelse:\n    time.sleep(600)\n",
            timeout=120,
            on_output=lambda _, text: "Still waiting" in text and kernel.interrupt(),
        )
        assert out["error"] is not None and out["error"]["ename"] == "KeyboardInterrupt", out
        assert "No rank has made progress" in out["stderr"] and "time.sleep(600)" in out["stderr"], out
        assert "sum 3" in kernel.execute_ok(SUM3, timeout=120)["stdout"]
        assert engine_processes(hub.root).keys() == fresh.keys(), "an engine was restarted"
    finally:
        kernel.close()
        hub.api("DELETE", "/users/alice/server")
    # the hub frees the slots once her server's stop is done, a moment after the engines end
    wait_until(lambda: not hub.running_servers(), 60, what="alice's server to stop")
    assert not engine_processes(hub.root)
    assert hub.reservations() == {}
