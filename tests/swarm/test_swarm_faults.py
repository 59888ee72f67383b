"""Faults and load on the simulated 3-node swarm, through a real JupyterHub.

- An engine's container is killed in the middle of a cell: the cell fails within
  30 s naming the rank and its node, Swarm restarts the engine while its GPU stays
  the user's, and the next cell runs on all three.
- The hub is killed (-9) while two users run: after its restart both servers are
  the same services and containers, no GPU is handed out twice, a user cannot reach
  the other's controller (its ports are not on the node's network), and stopping a server leaves no service, secret or container.
- Twenty users spawn at once: three get a GPU each, the others the one-line
  "not enough free GPUs" message; no GPU is given twice; the hub's memory stays bounded.
"""

from __future__ import annotations

import concurrent.futures
import re
import signal
import statistics
import time

import pytest

from fault_cells import ALL_REDUCE_LOOP, SUM, magic
from hub_harness import Kernel
from swarm_hub_harness import pdl_objects, swarm_hub_fixture
from waiting import wait_until

pytestmark = pytest.mark.docker

LOAD_USERS = [f"user{i:02d}" for i in range(1, 21)]
USERS = ["admin", "alice", "bob", *LOAD_USERS]
ANSI = re.compile(r"\x1b\[[0-9;]*m")

WHERE = "%%distributed -n 3 --all-output\nimport os\nprint(f\"rank {rank} host {os.environ['PDL_ENGINE_HOST']}\")"
LOOP = magic(ALL_REDUCE_LOOP, 3)


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    yield from swarm_hub_fixture(tmp_path_factory.mktemp("swarm-faults"), swarm, USERS)


@pytest.fixture
def users(hub, swarm):
    """Stops every server the test started, and checks nothing of them is left."""
    yield hub
    for user in USERS:
        hub.api("DELETE", f"/users/{user}/server")
    wait_until(lambda: not hub.running_servers(), 90, what="servers to stop")
    wait_until(lambda: pdl_objects(swarm) == ([], []) and not containers(swarm), 90,
               what="every PDL service, secret and container to go")


def containers(swarm, user: str | None = None) -> dict[str, str]:
    """The containers of users' servers (of ``user``) on every node, running or not:
    id -> name (not the hub's network keeper, which stays)."""
    name = f"pdl-{user}" if user else "pdl-"
    found = {}
    for i in swarm.node_ids():
        for c in swarm.containers(i, all=True, name=name, label="pdl.owner"):
            if c.labels.get("com.docker.swarm.service.name", "").startswith(name):
                found[c.id] = c.name
    return found


def engine_container(swarm, service: str):
    """(node index, running container) of an engine service's task."""
    for i in swarm.node_ids():
        found = swarm.containers(i, label=f"com.docker.swarm.service.name={service}")
        if found:
            return i, found[0]
    raise AssertionError(f"no running container of {service}")


def spawn_ready(hub, user: str, gpus: int) -> None:
    r = hub.spawn(user, gpus)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(user, timeout=240)


def test_an_engine_container_killed_mid_cell_fails_the_cell_and_the_gpu_stays_the_users(users, swarm):
    hub = users
    spawn_ready(hub, "alice", 3)
    kernel = Kernel(hub, "alice")
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        where = kernel.execute_ok(WHERE, timeout=300)["stdout"]
        rank_of = {host: int(rank) for rank, host in re.findall(r"rank (\d) host (\S+)", where)}
        node, victim = engine_container(swarm, "pdl-alice-engine-1")
        host = swarm.hostname(node)
        killed_at = []

        def kill_when_running(elapsed, text):
            if "loop running" in text and not killed_at:
                victim.kill()  # SIGKILL, as the OOM killer or a crash would
                killed_at.append(elapsed)

        out = kernel.execute(LOOP, timeout=120, on_output=kill_when_running)
        assert killed_at, out
        assert out["seconds"] - killed_at[0] < 30, f"failed {out['seconds'] - killed_at[0]:.0f} s after the kill"
        assert out["error"] is not None and out["error"]["ename"] == "RankFailed", out
        shown = ANSI.sub("", "\n".join(out["error"]["traceback"]))
        assert f"Rank {rank_of[host]} on host {host} died" in shown, shown

        # while Swarm brings the engine back, its GPU stays alice's
        r = hub.spawn("bob", 1)
        assert r.status_code == 409 and "0 of 3 are free" in r.json()["message"], r.text
        assert pdl_objects(swarm, "bob") == ([], [])
        wait_until(lambda: engine_container(swarm, "pdl-alice-engine-1")[1].id != victim.id, 60,
                   what="Swarm to restart the engine")
        out = kernel.execute_ok(magic(SUM, 3), timeout=300)
        assert "sum 3" in out["stdout"], out
    finally:
        kernel.close()


def test_after_a_hub_crash_servers_stay_no_gpu_is_given_twice_and_stop_leaves_nothing(users, swarm):
    hub = users
    spawn_ready(hub, "alice", 2)
    spawn_ready(hub, "bob", 1)
    services = {s.id: s.attrs["Version"]["Index"] for s in swarm.manager.services.list()}
    running = containers(swarm)
    secrets = pdl_objects(swarm)[1]

    hub.stop_hub(signal.SIGKILL)
    hub.start()
    hub.wait_ready("alice", timeout=60)
    hub.wait_ready("bob", timeout=60)
    assert {s.id: s.attrs["Version"]["Index"] for s in swarm.manager.services.list()} == services
    assert containers(swarm) == running and pdl_objects(swarm)[1] == secrets
    r = hub.spawn("admin", 1)
    assert r.status_code == 409 and "0 of 3 are free (alice (2), bob (1))" in r.json()["message"], r.text

    # bob's controller is not on his node's network (only on his private one): alice,
    # with her own keys, cannot even connect to it there
    bob_task = swarm.manager.services.get("pdl-bob").tasks(filters={"desired-state": "running"})[0]
    bob_addr = swarm.node_addr([i for i in swarm.node_ids()
                                if swarm.hostnames_by_node_id()[bob_task["NodeID"]] == swarm.hostname(i)][0])
    bob_ports = swarm.manager.services.get("pdl-bob").attrs["Spec"]["Labels"]["pdl.ports"]
    kernel = Kernel(hub, "alice")
    try:
        out = kernel.execute_ok(PROBE % {"addr": bob_addr, "ports": bob_ports}, timeout=120)
    finally:
        kernel.close()
    assert "own controller: 2 engines" in out["stdout"], out
    assert "bob's port open: False" in out["stdout"], out
    assert "bob's controller: no answer" in out["stdout"], out

    assert hub.api("DELETE", "/users/alice/server").status_code in (202, 204)
    wait_until(lambda: pdl_objects(swarm, "alice") == ([], []) and not containers(swarm, "alice"), 90,
               what="alice's services, secrets and containers to go")
    assert containers(swarm, "bob") == {k: v for k, v in running.items() if v.startswith("pdl-bob")}
    spawn_ready(hub, "admin", 2)
    gpus = [gpu_of(engine_container(swarm, s.name)[1])
            for s in swarm.manager.services.list(filters={"label": "pdl.role=engine"})]
    assert sorted(gpus) == sorted(swarm.gpu(i) for i in swarm.node_ids()), "a GPU is used twice"


# Run in alice's kernel: her own client connects to her controller; the same client
# with her keys, pointed at bob's controller (whose registration port is open), gets
# no answer: the CurveZMQ handshake needs bob's keys.
PROBE = """
import glob, json, os, socket
import ipyparallel as ipp
from pdl.connection import _port_map
cluster = ipp.Cluster.from_file(os.environ["PDL_CLUSTER_FILE"])
own = json.load(open(glob.glob(os.path.join(cluster.profile_dir, "security", "ipcontroller*-client.json"))[0]))
c = ipp.Client(dict(own), timeout=20)
c.wait_for_engines(2, timeout=60)
print(f"own controller: {len(c.ids)} engines")
c.close()
_, ports = _port_map([int(p) for p in "%(ports)s".split(",")][1:])  # the first is Jupyter's
try:
    socket.create_connection(("%(addr)s", ports["registration"]), 5).close()
    print("bob's port open: True")
except OSError as e:
    print(f"bob's port open: False ({type(e).__name__})")
other = {**own, **ports, "location": "%(addr)s", "interface": "tcp://%(addr)s"}
try:
    ipp.Client(other, timeout=5)
    print("bob's controller: answered")
except Exception as e:
    print(f"bob's controller: no answer ({type(e).__name__})")
"""


def gpu_of(container) -> str:
    """The GPU Swarm assigned to an engine's container (its ``DOCKER_RESOURCE_*`` variable)."""
    found = [e.partition("=")[2] for e in container.attrs["Config"]["Env"] if e.startswith("DOCKER_RESOURCE_")]
    assert len(found) == 1, container.attrs["Config"]["Env"]
    return found[0]


def test_twenty_users_at_once_get_a_gpu_or_the_one_line_message(users, swarm):
    hub = users
    rss_before = hub.rss_kib()

    def spawn(user):
        started = time.monotonic()
        r = hub.spawn(user, 1)
        if r.status_code in (201, 202):
            ok, message = hub.wait_spawned(user, timeout=300)
            return user, ("ready" if ok else message), time.monotonic() - started
        return user, r.json().get("message", r.text), time.monotonic() - started

    with concurrent.futures.ThreadPoolExecutor(len(LOAD_USERS)) as pool:
        results = list(pool.map(spawn, LOAD_USERS))
    granted = [u for u, what, _ in results if what == "ready"]
    refused = {u: what for u, what, _ in results if what != "ready"}
    assert len(granted) == 3, results
    for user, message in refused.items():
        # refused at once (409), or, when the GPUs went to others while the spawn started, by the spawn
        assert "Not enough free GPUs: you asked for 1, 0 of 3 are free" in message and "\n" not in message, \
            (user, message)
    gpus = [gpu_of(engine_container(swarm, s.name)[1])
            for s in swarm.manager.services.list(filters={"label": "pdl.role=engine"})]
    assert sorted(gpus) == sorted(swarm.gpu(i) for i in swarm.node_ids()), "a GPU is used twice"
    owners = sorted(s.attrs["Spec"]["Labels"]["pdl.user"]
                    for s in swarm.manager.services.list(filters={"label": "pdl.role=engine"}))
    assert owners == sorted(granted)

    latencies = sorted(seconds for *_, seconds in results)
    p95 = latencies[max(0, round(0.95 * len(latencies)) - 1)]
    rss_after = hub.rss_kib()
    print(f"swarm, {len(LOAD_USERS)} users at once: spawn latency p50 {statistics.median(latencies):.2f} s, "
          f"p95 {p95:.2f} s, max {latencies[-1]:.2f} s; granted: "
          f"{statistics.median(s for u, _, s in results if u in granted):.2f} s median; "
          f"hub RSS {rss_before // 1024} -> {rss_after // 1024} MiB")
    assert rss_after - rss_before < 150 * 1024, f"hub RSS grew by {(rss_after - rss_before) // 1024} MiB"
