"""A distributed cell's start as the engine lease sees it (pdl_magics/engines.py): the
cell notes its start under the lease's lock, then reads the release. The server's idle
release (pdl_server/singleuser.py, tests/server/test_supervise.py) is decided under the
same lock: it comes before the cell, which then asks for its workers again, or it waits
until the cell has been idle for the timeout. No hub: the test plays the server's part
in the lease's files."""

from __future__ import annotations

import threading
import time

import pytest

from pdl.lease import LeaseFiles, Refusal, Release, Want
from pdl_magics.engines import Engines
from pdl_magics.errors import DistributedUsageError
from waiting import wait_until

pytestmark = pytest.mark.unit


@pytest.fixture
def lease(tmp_path, monkeypatch):
    """The lease of a hub server whose cluster folder is ``tmp_path``."""
    monkeypatch.setenv("PDL_CLUSTER_DIR", str(tmp_path))
    return LeaseFiles(tmp_path)


def test_a_cell_notes_its_start_in_the_lease(lease):
    before = time.time()
    Engines(cluster_file="hub-cluster.json")._bring_back()  # engines not released: nothing to ask for
    assert before <= lease.cell_started_at() <= time.time()
    assert lease.want() is None


def test_a_cell_that_starts_while_the_server_releases_sees_the_release_and_asks_again(lease):
    outcome: list[BaseException | None] = []

    def cell():
        try:
            Engines(cluster_file="hub-cluster.json")._bring_back()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            outcome.append(e)

    with lease.decision_lock():  # the server, deciding on an idle release
        started = threading.Thread(target=cell, daemon=True)
        started.start()
        time.sleep(0.5)
        assert lease.cell_started_at() == 0.0, "the cell went on while the server held the lock"
        lease.write(Release(reason="engines idle for 10 s", workers=2, slots=("cpu:0", "cpu:1")))
    assert wait_until(lease.want, 10, what="the cell's request") == Want(workers=2)
    lease.write(Refusal("Not enough free workers: you asked for 2, 0 of 2 are free"))  # the hub's answer
    started.join(10)
    [error] = outcome
    assert isinstance(error, DistributedUsageError)
    assert str(error) == ("your engines were stopped (engines idle for 10 s) and cannot come back now: "
                          "Not enough free workers: you asked for 2, 0 of 2 are free")


def test_a_cell_whose_engines_die_at_the_sessions_end_learns_the_servers_release(lease, monkeypatch):
    """The server stops the engines at the session's end, then records the release: a cell
    whose engine died then waits for that record (and says why in one line), while an
    engine that dies mid-session is blamed at once (tests/hub/test_hub_session.py runs a
    cell past a real end)."""
    monkeypatch.setenv("PDL_SESSION_LIMIT_S", "40")
    monkeypatch.setenv("PDL_SESSION_ENDS_AT", str(time.time() + 3600))
    engines = Engines(cluster_file="hub-cluster.json")
    started = time.monotonic()
    assert engines.released_at_session_end() is None and time.monotonic() - started < 1  # mid-session: at once

    monkeypatch.setenv("PDL_SESSION_ENDS_AT", str(time.time() + 2))  # in its last seconds
    release = Release(reason="the hub's session limit of 40 s reached at 10:00 UTC", workers=2, slots=("cpu:0",))
    recorder = threading.Timer(1.0, lease.write, [release])  # the server, a moment after it stopped them
    recorder.start()
    try:
        assert engines.released_at_session_end() == release
    finally:
        recorder.cancel()
