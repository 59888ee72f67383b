"""The admin view (pdl_spawner/admin/view.py, its frame and local source): the pure rows and page, then the
``pdl-admin`` service in a real JupyterHub, where admins see who holds which slot,
who waits and what was reclaimed, and nobody else gets in."""

from __future__ import annotations

import signal
import socket
import time
from datetime import datetime, timezone

import pytest
import requests

from hub_harness import Hub, hub_fixture, pids_matching
from pdl_spawner.admin.view import render_page
from pdl_spawner.admin.frame import duration_text
from pdl_spawner.local.admin_source import status_model
from pdl_spawner.core.reservations import Holding, Reclaim, SlotLedger
from pdl_spawner.core.wait_queue import Waiter
from waiting import wait_until

USERS = ["admin", "alice", "bob", "carol"]
POOL = ["cpu:0", "cpu:1"]
SCRIPT = "<script>alert(1)</script>"
T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


# -- pure ---------------------------------------------------------------------------


@pytest.mark.unit
def test_status_rows_in_slot_order_with_iso_times_and_seconds():
    holdings = [Holding("cpu:10", "bob/big", T0), Holding("cpu:2", "alice", T0 - 90)]
    status = status_model(holdings, [Waiter("carol", "carol", 2, T0 + 5)],
                          [Reclaim("dave", ["cpu:3"], T0, "engines idle for 600 s")],
                          node="box", pool=["cpu:2", "cpu:3", "cpu:10"], now=T0 + 65)
    assert status == {
        "source": "local", "node": "box", "now": "2023-11-14T22:14:25Z", "pool": ["cpu:2", "cpu:3", "cpu:10"], "free": ["cpu:3"],
        "reservations": [
            {"slot": "cpu:2", "node": "box", "owner": "alice", "user": "alice", "server": "",
             "since": "2023-11-14T22:11:50Z", "held_s": 155, "gpu_type": ""},
            {"slot": "cpu:10", "node": "box", "owner": "bob/big", "user": "bob", "server": "big",
             "since": "2023-11-14T22:13:20Z", "held_s": 65, "gpu_type": ""},
        ],
        "queue": [{"position": 1, "owner": "carol", "user": "carol", "server": "", "workers": 2, "gpu_type": "",
                   "since": "2023-11-14T22:13:25Z", "waiting_s": 60}],
        "reclaims": [{"at": "2023-11-14T22:13:20Z", "owner": "dave", "user": "dave", "slots": ["cpu:3"],
                      "reason": "engines idle for 600 s"}],
        "gpu_idle": [],
    }
    assert [duration_text(s) for s in (42, 200, 7500, 97200, -3)] == ["42 s", "3 min 20 s", "2 h 5 min", "1 d 3 h", "0 s"]


@pytest.mark.unit
def test_the_page_escapes_every_value_and_says_when_a_table_is_empty():
    page = render_page(status_model([Holding("cpu:0", f"x{SCRIPT}", T0)], [], [], node=f"n{SCRIPT}",
                                    pool=None, now=T0))
    assert "<script" not in page and page.count("&lt;script&gt;") == 3  # node twice, owner once
    assert "Nobody is waiting." in page and "No slot was reclaimed." in page and "1 slot(s) reserved" in page
    assert "No slot is reserved." in render_page(status_model([], [], [], node="n", pool=["gpu:0"], now=T0))


# -- through the hub ----------------------------------------------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from hub_fixture(tmp_path_factory.mktemp("hub-admin-view"), USERS, POOL)


def view_url(hub: Hub, path: str = "") -> str:
    return f"{hub.service_url('pdl-admin')}/{path}"


def api_status(hub: Hub, token: str) -> requests.Response:
    return requests.get(view_url(hub, "api/status"), headers={"Authorization": f"token {token}"}, timeout=30)


def parse_iso(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


@pytest.mark.hub
def test_admins_see_holders_queue_and_reclaims_and_nobody_else_gets_in(hub):
    started = time.time()
    # a reclaim, with a reason a user could have influenced: carol held the free slot
    ledger = SlotLedger(hub.state_dir / "reservations.sqlite")
    assert ledger.reserve("carol", 1, POOL) == ["cpu:0"]
    assert ledger.reclaim("carol", f"engines idle for 600 s {SCRIPT}") == ["cpu:0"]
    # alice holds both slots, bob waits for one
    assert hub.spawn("alice", 2).status_code in (201, 202)
    hub.wait_ready("alice")
    r = hub.api("POST", "/users/bob/server", json={"workers": 1, "queue": True})
    assert r.status_code == 202, r.text

    admin_token = hub.user_token("admin")
    status = wait_until(lambda: (s := api_status(hub, admin_token).json())["queue"] and s, 30,
                        what="bob in the admin view's queue")
    node = socket.gethostname()
    assert status["node"] == node and status["pool"] == POOL and status["free"] == []
    assert [(r["slot"], r["node"], r["owner"]) for r in status["reservations"]] == \
        [("cpu:0", node, "alice"), ("cpu:1", node, "alice")]
    for row in status["reservations"]:
        assert started - 1 <= parse_iso(row["since"]) <= time.time() and row["held_s"] >= 0
    assert [(q["position"], q["user"], q["workers"]) for q in status["queue"]] == [(1, "bob", 1)]
    assert [(c["owner"], c["slots"], c["reason"]) for c in status["reclaims"]] == \
        [("carol", ["cpu:0"], f"engines idle for 600 s {SCRIPT}")]

    # the admin's browser session: the hub's OAuth (no confirmation page), then the page
    t = time.monotonic()
    page = hub.login("admin").get(view_url(hub), timeout=30)
    page_s = time.monotonic() - t
    assert page.status_code == 200 and page.url == view_url(hub), (page.status_code, page.url)
    html = page.text
    for row in status["reservations"]:
        assert f"<td>{row['slot']}</td><td>{node}</td><td>alice</td><td>{row['since']}</td>" in html
    assert f"<td>1</td><td>bob</td><td>1</td><td>{status['queue'][0]['since']}</td>" in html
    assert "<td>carol</td><td>cpu:0</td><td>engines idle for 600 s &lt;script&gt;alert(1)&lt;/script&gt;</td>" in html
    assert "<script" not in html
    print(f"admin page through OAuth in {page_s:.2f} s")

    # not admins: a user's browser session and token, the tests' own service token, no token
    refused = hub.login("carol").get(view_url(hub), timeout=30)
    assert refused.status_code == 403, (refused.status_code, refused.url)
    assert "alice" not in refused.text
    assert api_status(hub, hub.user_token("carol")).status_code == 403
    assert hub.login("carol").get(view_url(hub, "api/status"), timeout=30).status_code == 403
    assert api_status(hub, hub.token).status_code == 403  # admin:users etc., but not access:services
    assert requests.get(view_url(hub, "api/status"), timeout=30).status_code == 403

    for user in ("bob", "alice"):
        assert hub.api("DELETE", f"/users/{user}/server").status_code in (202, 204)
    wait_until(lambda: not hub.running_servers() and not hub.reservations(), 60, what="servers to stop")
    assert api_status(hub, admin_token).json()["queue"] == []


@pytest.mark.hub
def test_the_view_dies_with_its_hub_and_comes_back_with_it(hub):
    """A view left behind by a killed hub would hold its port, and a restarted hub exits
    when its managed service cannot start."""
    def views():
        return pids_matching(lambda cmd, cwd: "pdl_spawner.admin.view" in cmd and cwd.startswith(str(hub.root)))

    assert len(views()) == 1
    hub.stop_hub(signal.SIGKILL)
    wait_until(lambda: not views(), 10, what="the admin view to exit with its hub")
    hub.start()
    assert len(views()) == 1
    assert api_status(hub, hub.user_token("admin")).json()["reservations"] == []



@pytest.mark.unit
def test_typed_gpus_and_waiters_show_their_type():
    holdings = [Holding("gpu:1", "alice", T0)]
    status = status_model(holdings, [Waiter("carol", "carol", 2, T0 + 5, "Tesla T4")], [], node="box",
                          pool=["gpu:0", "gpu:1"], now=T0 + 65, slot_types={"gpu:0": "Tesla T4", "gpu:1": "NVIDIA A100"})
    assert status["reservations"][0]["gpu_type"] == "NVIDIA A100" and status["queue"][0]["gpu_type"] == "Tesla T4"
    page = render_page(status)
    assert "<td>gpu:1 (NVIDIA A100)</td>" in page and "<td>2 (Tesla T4)</td>" in page
