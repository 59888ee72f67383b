"""A distributed cell's start as the engine lease sees it (pdl_magics/engines.py): the
cell tells the lease's owner (pdl_server/lease_owner.py, in a real Jupyter server) that
it starts, and reads the release. The server's idle release (pdl_server/singleuser.py,
tests/server/test_supervise.py) is begun with the same owner: it comes before the cell,
which waits for it and then asks for its workers again, or the owner refuses it until
the cell has been idle for the timeout. No hub: the test plays the supervisor's and the
hub's parts over the lease's API."""

from __future__ import annotations

import threading
import time

import pytest

from pdl.lease import Refusal, Release, Want, encode
from pdl_magics.engines import Engines
from pdl_magics.errors import DistributedUsageError
from lease_server import lease_server
from waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with lease_server(tmp_path_factory.mktemp("kernel-lease")) as server:
        yield server


@pytest.fixture
def lease(served, monkeypatch):
    """The lease of a hub server, as a kernel under it sees it (its environment), back to
    engines held after the test."""
    for name, value in served.env.items():
        monkeypatch.setenv(name, value)
    for name in ("PDL_SESSION_LIMIT_S", "PDL_SESSION_ENDS_AT"):
        monkeypatch.delenv(name, raising=False)
    yield served
    served.client.forget_request()
    served.files.end_release()


def test_a_cell_notes_its_start_in_the_lease(lease):
    before = time.time()
    Engines(cluster_file="hub-cluster.json")._bring_back()  # engines not released: nothing to ask for
    assert before <= lease.files.cell_started_at() <= time.time()
    assert lease.files.want() is None
    assert not lease.client.begin_release(idle_s=60)  # the owner keeps engines a cell just started on


def test_a_cell_that_starts_while_the_server_releases_sees_the_release_and_asks_again(lease):
    outcome: list[BaseException | None] = []

    def cell():
        try:
            Engines(cluster_file="hub-cluster.json")._bring_back()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            outcome.append(e)

    started_before = lease.files.cell_started_at()
    assert lease.client.begin_release(idle_s=0)  # the supervisor, stopping the engines
    started = threading.Thread(target=cell, daemon=True)
    started.start()
    time.sleep(0.5)
    assert lease.files.cell_started_at() == started_before, "the cell went on while the engines were being released"
    assert lease.client.end_release(Release(reason="engines idle for 10 s", workers=2, slots=("cpu:0", "cpu:1")))
    assert wait_until(lease.files.want, 10, what="the cell's request") == Want(workers=2)
    lease.hub_answers(encode(Refusal("Not enough free workers: you asked for 2, 0 of 2 are free")))
    started.join(10)
    [error] = outcome
    assert isinstance(error, DistributedUsageError)
    assert str(error) == ("your engines were stopped (engines idle for 10 s) and cannot come back now: "
                          "Not enough free workers: you asked for 2, 0 of 2 are free")
    assert lease.files.want() is None and lease.files.answer() is None  # the cell forgot its request


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

    def supervisor():  # a moment after it stopped them
        lease.client.begin_release()
        lease.client.end_release(release)

    recorder = threading.Timer(1.0, supervisor)
    recorder.start()
    try:
        started = time.monotonic()
        assert engines.released_at_session_end() == release
        assert time.monotonic() - started < 2.5  # told as the release is made, not at a look's next tick
    finally:
        recorder.cancel()
