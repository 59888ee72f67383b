"""The lease's one owner (pdl_server/lease_owner.py) and its HTTP API
(pdl_server/lease_api.py), through which the hub, the supervisor and kernels reach it:
each change wakes whoever waits for one at once, a cell that starts while the engines
are being released waits for the release and sees it, and the supervisor may not
release engines a cell started on within the idle timeout. The API is served by a real
Jupyter server with the extension, reached with its token by the supervisor's and a
kernel's client (pdl_server/lease_client.py)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from pdl.lease import Grant, LeaseFiles, LeaseState, LeaseView, Refusal, Release, Want
from pdl_server import lease_api
from pdl_server.lease_client import LeaseClient
from pdl_server.lease_owner import LeaseOwner
from lease_server import lease_server


def run(coroutine):
    return asyncio.run(coroutine)


@pytest.mark.unit
def test_a_change_wakes_a_long_poll_at_once_and_none_lets_it_run_to_its_wait(tmp_path):
    owner = LeaseOwner(LeaseFiles(tmp_path))

    async def poll_then_release():
        seen = owner.view()
        waiting = asyncio.ensure_future(owner.wait_for_change(seen.version, seen.epoch, 20.0))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        started = time.monotonic()
        assert owner.begin_release()
        view = await waiting
        return view, time.monotonic() - started

    view, took = run(poll_then_release())
    assert took < 0.5 and view.state is LeaseState.RELEASING and view.version == 1

    async def quiet_poll():
        started = time.monotonic()
        view = await owner.wait_for_change(owner.version, owner.epoch, 0.3)
        return view, time.monotonic() - started

    view, took = run(quiet_poll())
    assert 0.25 < took < 2 and view.version == 1  # nothing changed: the lease as it is, after the wait


@pytest.mark.unit
def test_a_poll_that_knew_another_servers_lease_is_answered_at_once(tmp_path):
    owner = LeaseOwner(LeaseFiles(tmp_path))
    started = time.monotonic()
    view = run(owner.wait_for_change(99, "an-earlier-server", 20.0))
    assert time.monotonic() - started < 0.5 and view.epoch == owner.epoch and view.version == 0


@pytest.mark.unit
def test_the_lease_goes_through_its_states_from_release_to_grant(tmp_path):
    owner = LeaseOwner(LeaseFiles(tmp_path))
    assert owner.view().state is LeaseState.HELD
    assert owner.begin_release() and owner.view().state is LeaseState.RELEASING
    assert not owner.begin_release()  # one release at a time
    owner.end_release(Release("engines idle for 9 s", 2, ("cpu:0", "cpu:1")))
    assert owner.view().state is LeaseState.RELEASED and not owner.begin_release()
    owner.ask_again(Want(workers=2))
    assert owner.view().state is LeaseState.WISHED
    owner.answer_request(Refusal("not enough free"))
    assert owner.view().state is LeaseState.REFUSED
    owner.forget_request()
    assert owner.view().state is LeaseState.RELEASED
    owner.ask_again(Want(workers=2))
    grant = Grant(workers=2, slots=("cpu:2", "cpu:3"))
    owner.answer_request(grant)
    assert owner.view().state is LeaseState.GRANTED
    owner.take_up(grant)
    view = owner.view()
    assert view.state is LeaseState.HELD and view.held == grant and view.released is None and view.answer is None
    assert LeaseFiles(tmp_path).holding(_contract()).slots == ("cpu:2", "cpu:3")
    assert view.version == 8  # every change counted


def _contract():
    from pdl.contract import ServerContract

    return ServerContract(slots=("cpu:0", "cpu:1"), workers=2)


@pytest.mark.unit
def test_engines_a_cell_started_on_within_the_idle_timeout_are_not_released(tmp_path):
    owner = LeaseOwner(LeaseFiles(tmp_path))
    run(owner.cell_start())
    assert not owner.begin_release(idle_s=60) and owner.view().state is LeaseState.HELD
    assert owner.begin_release(idle_s=0.0)  # a release at the session's end, say, does not wait


@pytest.mark.unit
def test_a_cell_that_starts_while_the_engines_are_being_released_waits_and_sees_the_release(tmp_path):
    owner = LeaseOwner(LeaseFiles(tmp_path))
    release = Release("engines idle for 9 s", 1, ("cpu:0",))

    async def cell_during_release():
        assert owner.begin_release(idle_s=9)
        cell = asyncio.ensure_future(owner.cell_start())
        await asyncio.sleep(0.3)
        assert not cell.done()  # it waits for the release being made
        owner.end_release(release)
        return await cell

    view = run(cell_during_release())
    assert view.released == release and view.state is LeaseState.RELEASED


@pytest.mark.unit
def test_a_release_the_supervisor_did_not_make_leaves_the_engines_held(tmp_path):
    owner = LeaseOwner(LeaseFiles(tmp_path))
    assert owner.begin_release()
    owner.end_release(None)
    assert owner.view().state is LeaseState.HELD and owner.view().released is None


@pytest.mark.unit
def test_the_views_state_and_version_cross_the_wire(tmp_path):
    owner = LeaseOwner(LeaseFiles(tmp_path))
    owner.begin_release()
    owner.end_release(Release("why", 1, ("cpu:0",)))
    back = LeaseView.from_json(owner.view().to_json())
    assert back == owner.view() and back.to_json()["state"] == "released"


def _access_record(line: str, level: int = logging.INFO) -> logging.LogRecord:
    """A record as JupyterHub's single-user server logs a request (the line pre-formatted)."""
    return logging.getLogger("tornado.access").makeRecord("tornado.access", level, __file__, 1, line, (), None)


@pytest.fixture
def access_log():
    """tornado.access as a server has it, restored after the test."""
    logger = logging.getLogger("tornado.access")
    saved = (logger.level, list(logger.filters))
    yield logger
    logger.setLevel(saved[0])
    logger.filters[:] = saved[1]


@pytest.mark.unit
def test_the_hubs_lease_polls_are_debug_lines_and_every_other_request_is_kept(access_log):
    lease = "/user/ann/pdl/api/lease"
    polls = lease_api.quiet_lease_polls(lease)
    assert lease_api.quiet_lease_polls(lease) is polls  # installing twice adds one filter
    assert sum(isinstance(f, lease_api.LeasePollsAtDebug) for f in access_log.filters) == 1

    access_log.setLevel(logging.INFO)
    poll = _access_record(f"200 GET {lease} (ann@127.0.0.1) 1.52ms")
    assert not access_log.filter(poll)  # no line per look at the lease
    kept = ["200 GET /user/ann/pdl/api/cluster (ann@127.0.0.1) 3.10ms",
            f"200 POST {lease} (ann@127.0.0.1) 2.00ms",  # the hub's answer
            f"403 GET {lease} (@127.0.0.1) 0.90ms",  # a failed look stays visible
            "200 GET /user/bob/pdl/api/lease (bob@127.0.0.1) 1.00ms",  # another server's path
            f"200 GET {lease}x (ann@127.0.0.1) 1.00ms"]
    for line in kept:
        record = _access_record(line)
        assert access_log.filter(record) and record.levelno == logging.INFO, line

    access_log.setLevel(logging.DEBUG)  # --debug: the polls are shown, as debug lines
    poll = _access_record(f"200 GET {lease}?after=1&wait=30 (ann@127.0.0.1) 30002.52ms")
    assert access_log.filter(poll) and (poll.levelno, poll.levelname) == (logging.DEBUG, "DEBUG")


@pytest.fixture(scope="module")
def served_lease(tmp_path_factory):
    """A real Jupyter server with PDL's extensions over a cluster folder of its own, and
    the client the supervisor and a kernel would have (its URL and token)."""
    with lease_server(tmp_path_factory.mktemp("lease-server")) as served:
        yield served.client, served.files


@pytest.mark.integration
def test_over_http_a_cell_waiting_for_a_grant_learns_of_it_as_the_hub_answers(served_lease):
    client, files = served_lease
    assert client.begin_release(idle_s=None)
    assert client.end_release(Release("engines idle for 9 s", 1, ("cpu:0",)))
    view = client.ask_again(Want(workers=1))
    assert view.state is LeaseState.WISHED and files.want() == Want(workers=1)  # the owner wrote it

    heard = {}

    def kernel_waits():
        started = time.monotonic()
        heard["view"] = client.view(after=view, wait_s=20)
        heard["after_s"] = time.monotonic() - started

    waiter = threading.Thread(target=kernel_waits)
    waiter.start()
    time.sleep(0.5)
    hub = LeaseClient(client.url, client.token)
    assert hub._call("POST", "", {"workers": 1, "slots": ["cpu:1"], "job": 0, "ends_at": 0}) == {"ok": True}
    waiter.join(timeout=20)
    assert heard["view"].state is LeaseState.GRANTED and 0.4 < heard["after_s"] < 3
    assert client.take_up(heard["view"].answer)
    assert client.view().state is LeaseState.HELD and files.held() == Grant(workers=1, slots=("cpu:1",))


@pytest.mark.integration
def test_over_http_the_lease_refuses_a_body_of_another_shape_in_one_line_and_a_stranger(served_lease):
    import urllib.error
    import urllib.request

    client, _ = served_lease
    request = urllib.request.Request(client.url, method="POST", data=b'{"workers": "all"}',
                                     headers={"Authorization": f"token {client.token}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    stranger = LeaseClient(client.url, "not-the-token")
    assert stranger.view() is None and not stranger.begin_release() and client.view().state is LeaseState.HELD
