"""The hub stays responsive while the ledger is locked, and a crash leaks no reservation.

A real JupyterHub. One test holds the slot ledger's SQLite write lock from another
connection (as a second hub process, an admin's script or a slow disk would) while a
spawn needs the ledger: every other request must still be answered within 0.2 s. The
other kills the hub with SIGKILL between a spawn's reservation and JupyterHub saving
the spawner's state, and restarts it: the reservation must be freed.
"""

from __future__ import annotations

import signal
import socket
import sqlite3
import threading
import time

import pytest
import requests

from hub_harness import hub_fixture, runs_as_root
from waiting import wait_until

pytestmark = pytest.mark.hub

POOL = ["cpu:0", "cpu:1", "cpu:2"]
#: The longest any request may take while the ledger's write lock is held elsewhere.
RESPONSIVE_S = 0.2
LOCK_HELD_S = 3.0


@pytest.fixture
def hub(tmp_path):
    """A hub each test starts itself (after changing its config)."""
    yield from hub_fixture(tmp_path, ["ann"], POOL, start=False)


def timed_get(session: requests.Session, url: str, **kwargs) -> tuple[float, int]:
    start = time.monotonic()
    r = session.get(url, timeout=30, allow_redirects=False, **kwargs)
    return time.monotonic() - start, r.status_code


@pytest.mark.timing
def test_the_hub_answers_within_0_2_s_while_the_ledger_is_locked_elsewhere(hub):
    """Guards ``pdl_spawner.hub.db_thread.off_loop`` around every ledger and queue call of the
    spawner (``reserve``, the spawn form): run on the event loop, the spawn below would
    freeze every page for as long as the lock is held."""
    hub.start()
    page = hub.login("ann")
    ledger = sqlite3.connect(hub.state_dir / "reservations.sqlite", isolation_level=None, timeout=30)
    ledger.execute("PRAGMA journal_mode=WAL")
    ledger.execute("CREATE TABLE IF NOT EXISTS slots (slot TEXT PRIMARY KEY, owner TEXT NOT NULL, since REAL NOT NULL)")
    ledger.execute("BEGIN IMMEDIATE")  # the write lock, until ROLLBACK
    locked_at = time.monotonic()
    spawn = threading.Thread(target=lambda: hub.spawn("ann", 1), daemon=True)
    spawn.start()
    times = []
    try:
        time.sleep(0.3)  # the spawn is now waiting for the lock
        while time.monotonic() - locked_at < LOCK_HELD_S:
            times.append(("hub API", *timed_get(requests.Session(), f"{hub.url}/hub/api/")))
            times.append(("home page", *timed_get(page, f"{hub.url}/hub/home")))
            times.append(("users", *timed_get(requests.Session(), f"{hub.url}/hub/api/users",
                                              headers={"Authorization": f"token {hub.token}"})))
        assert not hub.server_ready("ann")  # the spawn did wait for the ledger
    finally:
        ledger.execute("ROLLBACK")
        ledger.close()
    slow = [(what, round(s, 3), code) for what, s, code in times if s > RESPONSIVE_S or code >= 500]
    assert len(times) > 10 and slow == []
    spawn.join(60)
    hub.wait_ready("ann")
    assert hub.reservations() == {"cpu:0": "ann"}


@pytest.mark.skipif(not runs_as_root(), reason="the fault is injected where the hub prepares the user's account")
def test_a_reservation_made_just_before_a_hub_crash_is_freed_on_restart(hub, tmp_path):
    """Guards ``PDLLocalSpawner.clear_state`` releasing by owner (not by the slots of a
    state that JupyterHub never saved): the hub is killed while the spawn holds its
    slots and prepares the account, before any state is saved."""
    stall = tmp_path / "stall-after-reserve"
    stall.touch()
    hub.extra_config = f"""
import os, time
from pdl_spawner.local.spawner import PDLLocalSpawner

class StallAfterReserve(PDLLocalSpawner):
    def prepare_account(self):  # the fault: a spawn that stalls once it holds its slots
        while os.path.exists({str(stall)!r}):
            time.sleep(0.1)
        super().prepare_account()

c.JupyterHub.spawner_class = StallAfterReserve
"""
    hub.start()
    threading.Thread(target=lambda: hub.spawn("ann", 2), daemon=True).start()
    wait_until(lambda: hub.reservations() == {"cpu:0": "ann", "cpu:1": "ann"}, 30, what="the reservation")
    hub.stop_hub(signal.SIGKILL)
    stall.unlink()
    hub.start()
    wait_until(lambda: hub.reservations() == {}, 30, what="the restarted hub to free the slots")
    r = hub.spawn("ann", 3)  # the whole pool: nothing is held by the lost spawn
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ann")
    assert hub.reservations() == {slot: "ann" for slot in POOL}



def announce_a_huge_body(port: int, path: str, token: str, length: int = 20_000_000) -> str:
    """Send a POST's headers announcing ``length`` bytes of body, and none of it; the
    status line the server answers with within 5 s ("" if none: it waits for the body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall((f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: token {token}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode())
        try:
            return conn.recv(4096).decode(errors="replace").split("\r\n", 1)[0]
        except TimeoutError:
            return ""


def test_huge_request_bodies_are_refused_unread_and_small_ones_still_answered(hub):
    """The attack (issue 27, 6): 20 MB bodies posted to the hub's API were read and
    parsed whole (three stalled it 3.3 s). Now a body over PDL_MAX_REQUEST_BYTES
    (default 1 MiB) is refused on its headers, before any of it is sent, at the hub's own
    port (which local users can reach) and through the proxy (which buffers what the
    browser sends, the hub hangs up); smaller ones get the usual one-line refusal."""
    hub.start()
    token = hub.user_token("ann")
    path = "/hub/api/users/ann/server"
    assert announce_a_huge_body(hub.internal_port, path, token) == "HTTP/1.1 400 Bad Request"
    through_proxy = requests.post(f"{hub.url}{path}", data=b"9" * 20_000_000, timeout=30,
                                  headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    assert through_proxy.status_code in (400, 503), through_proxy.status_code  # the proxy's 503: the hub hung up
    assert announce_a_huge_body(hub.internal_port, path, token, length=1024 * 1024 + 1) == "HTTP/1.1 400 Bad Request"
    small = requests.post(f"{hub.url}{path}", json={"workers": "x" * 2000}, timeout=30,
                          headers={"Authorization": f"token {token}"})
    assert small.status_code == 400 and len(small.text) < 500, small.text  # under the cap: read and refused
