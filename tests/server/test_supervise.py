"""The user's server keeps its engines (pdl_server/singleuser.py ``supervise`` over an
engine host of pdl_server/engine_hosts.py): real ipyparallel engines on CPU slots,
released when idle, brought back where the hub's grant says, restarted when killed.
The lease's owner is a real Jupyter server's (tests/harness/lease_server.py); no hub:
the test sends the kernel's want and the hub's grant over the lease's API, as they would."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from pdl.contract import ServerContract
from pdl.lease import FILES, Grant, Release, Want, encode
from pdl_server import clusters, engine_hosts, singleuser
from pdl_server.singleuser import IdleTracker, supervise
from pdl_spawner.local.engine_host import LocalSlots
from lease_server import lease_server
from waiting import wait_until


@pytest.mark.unit
def test_the_engine_host_is_the_one_the_contracts_kind_names():
    host = engine_hosts.host_for(ServerContract(kind="local", slots=("cpu:0", "cpu:1"), workers=2), cluster=None)
    assert type(host) is LocalSlots and host.workers == 2 and host.slots == ["cpu:0", "cpu:1"]
    with pytest.raises(ValueError, match=r"^PDL_KIND must be one of local, slurm, swarm, got '': this server was not "
                                         r"started by PDL's hub$"):
        engine_hosts.host_for(ServerContract(slots=("cpu:0",), workers=1), cluster=None)


def running(cluster, slot: str) -> bool:
    return clusters.engine_set_running(cluster.engines.get(clusters.slot_engine_set_id(slot)))


def engine_pid(cluster, slot: str) -> int:
    [launcher] = cluster.engines[clusters.slot_engine_set_id(slot)].launchers.values()
    return launcher.pid


@pytest.fixture
def cluster(tmp_path):
    """A controller of this test's own (no engine yet), stopped with whatever it runs."""
    cluster = clusters.new_cluster(cluster_id=f"pdl-sup-{os.getpid()}", profile_dir=str(tmp_path / "profile"))
    clusters.start_controller(cluster)
    yield cluster
    cluster.stop_cluster_sync()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The lease's owner, in a Jupyter server of this module's."""
    with lease_server(tmp_path_factory.mktemp("supervised-lease")) as server:
        yield server


@pytest.fixture
def lease(served):
    """The lease, forgotten before each test (a new server starts with none)."""
    served.files.clear()
    return served


@pytest.fixture
def supervised(cluster):
    """Start ``supervise(host, stop, *more)`` on a thread; stopped (and waited for) after the test."""
    stop, threads = threading.Event(), []

    def start(host, *more):
        host.start()
        threads.append(threading.Thread(target=supervise, args=(host, stop, *more), daemon=True))
        threads[-1].start()

    yield start
    stop.set()
    for thread in threads:
        thread.join(timeout=30)


@pytest.mark.integration
def test_idle_engines_are_released_then_brought_back_on_the_slots_the_hub_granted(cluster, supervised, lease):
    files = lease.files
    supervised(LocalSlots(cluster, ["cpu:0", "cpu:1"]), IdleTracker(cluster), 1.0, lease.client, files)

    released = wait_until(files.released, 60, what="the idle engines' release")
    assert released == Release(reason="engines idle for 1 s", workers=2, slots=("cpu:0", "cpu:1"))
    assert not running(cluster, "cpu:0") and not running(cluster, "cpu:1")

    lease.client.ask_again(Want(workers=2))  # the kernel asks; the hub answers with other slots
    grant = Grant(workers=2, slots=("cpu:1", "cpu:2"))
    lease.hub_answers(encode(grant))
    # still idle, the engines that came back are released again: on the granted slots
    again = wait_until(lambda: files.released() != released and files.released(), 60,
                       what="the engines to come back on the granted slots and idle out again")
    assert again == Release(reason="engines idle for 1 s", workers=2, slots=("cpu:1", "cpu:2"))
    assert files.held() == grant and files.want() is None and files.answer() is None
    assert files.holding(ServerContract(slots=("cpu:0", "cpu:1"), workers=2)).slots == ("cpu:1", "cpu:2")


@pytest.mark.integration
def test_a_cell_that_starts_as_the_engines_go_idle_keeps_them(cluster, supervised, lease):
    """The kernel's side of the race, as pdl_magics' Engines does it at a cell's start:
    the cell tells the lease's owner, which then refuses the server's idle release until
    the cell has been idle for the timeout."""
    import time

    files = lease.files
    supervised(LocalSlots(cluster, ["cpu:0"]), IdleTracker(cluster), 2.0, lease.client, files)
    for _ in range(5):  # a cell starts each second for longer than the engines' idle timeout
        assert lease.client.cell_start().released is None
        noted = time.time()
        time.sleep(1)
    assert files.released() is None and running(cluster, "cpu:0"), "the cell's engines were released under it"
    wait_until(files.released, 60, what="the release once the cell has been idle for the timeout")
    assert (files.directory / FILES[Release]).stat().st_mtime >= noted + 2.0  # written no earlier


@pytest.mark.integration
def test_engines_are_not_idle_before_they_can_be_used(cluster, supervised, lease):
    """The idle clock starts once every engine the host expects has registered and the
    user's server accepts connections (the run of 52796e0: on a busy machine the server
    took 21 s to start, and its engines idled out at 10 s, before any cell could run)."""
    import socket
    import time

    expected, server = [2], socket.socket()
    server.bind(("127.0.0.1", 0))  # the server's port, not listening yet
    files = lease.files
    supervised(LocalSlots(cluster, ["cpu:0"]),
               IdleTracker(cluster, lambda: expected[0], server.getsockname()), 1.0, lease.client, files)
    wait_until(lambda: running(cluster, "cpu:0"), 60, what="the engine")
    time.sleep(4)
    assert files.released() is None, "released while the host still expected an engine"
    expected[0] = 1
    time.sleep(4)
    assert files.released() is None, "released before the server listened"
    server.listen()
    try:
        assert wait_until(files.released, 30, what="the release once usable and idle").workers == 1
    finally:
        server.close()


@pytest.mark.unit
@pytest.mark.parametrize(("url", "address"), [
    ("http://127.0.0.1:23495/user/alice/", ("127.0.0.1", 23495)),
    ("http://0.0.0.0:8888/user/alice/", ("127.0.0.1", 8888)),
    ("http://10.0.0.7:8888/", ("10.0.0.7", 8888)),
    ("", None), ("http://127.0.0.1/user/alice/", None), ("http://127.0.0.1:99999/", None),
])
def test_the_servers_address_comes_from_the_hubs_url_for_it(url, address):
    from pdl_server.lease_client import server_address

    assert server_address({"JUPYTERHUB_SERVICE_URL": url}) == address


@pytest.mark.integration
def test_a_killed_engine_is_restarted_on_its_slot(cluster, supervised):
    supervised(LocalSlots(cluster, ["cpu:0"]))
    killed = engine_pid(cluster, "cpu:0")
    os.kill(killed, signal.SIGKILL)
    wait_until(lambda: running(cluster, "cpu:0") and engine_pid(cluster, "cpu:0") != killed, 60,
               what="the killed engine to be restarted on its slot")


@pytest.mark.integration
def test_a_killed_engines_replacement_starts_at_once_not_at_the_supervisors_next_round(
        cluster, supervised, monkeypatch):
    monkeypatch.setattr(singleuser, "SUPERVISE_PERIOD_S", 120.0)  # a round later would be minutes
    looked = threading.Event()

    class Slots(LocalSlots):
        def dead_slots(self):  # LocalSlots's own, telling the test when the supervisor first looked
            dead = super().dead_slots()
            looked.set()
            return dead

    supervised(Slots(cluster, ["cpu:0", "cpu:1"]))
    assert looked.wait(30), "the supervisor never looked at its engines"
    killed = engine_pid(cluster, "cpu:1")
    os.kill(killed, signal.SIGKILL)
    wait_until(lambda: running(cluster, "cpu:1") and engine_pid(cluster, "cpu:1") != killed, 30,
               what="the killed engine's replacement, within the supervisor's round")
    assert running(cluster, "cpu:0")


@pytest.mark.integration
def test_gpus_the_hub_flags_as_held_idle_are_released_at_the_flags_time(cluster, supervised, lease):
    import time

    from pdl.lease import GpuIdle

    files = lease.files
    flag = GpuIdle(since=time.time() - 900, release_at=time.time() + 3)
    lease.hub_answers(encode(flag), part="gpu-idle")
    supervised(LocalSlots(cluster, ["cpu:0"]), IdleTracker(cluster), 3600.0, lease.client, files)
    released = wait_until(files.released, 30, what="the release at the flag's time")
    assert released == Release(reason=flag.reason(), workers=1, slots=("cpu:0",))
    assert time.time() >= flag.release_at and not running(cluster, "cpu:0")
    lease.hub_answers(encode(Grant(workers=1, slots=("cpu:0",))))  # the hub's grant: the flag was on the GPUs given back
    wait_until(lambda: files.released() is None and running(cluster, "cpu:0"), 60, what="the engines to come back")
    assert files.gpu_idle() is None
