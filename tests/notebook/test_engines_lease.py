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
