"""The hostile neighbour on the simulated Swarm: ben's containers against ann's server.

ann has a notebook and two engines (a torch process group across two nodes, with its
TCP store and gloo sockets, which have no authentication) and a kernel printing a
marker. ben has his own server. On each node where ann has a container, ben runs a
container the way the hub runs his (a service on his private network, uid 1000, no
capabilities, no new privileges), and from it tries every TCP port any of ann's
containers listens on, at every address they have (her private network, Docker's
gateway bridge), and her controller's ports at her node's address; where a port
answers, he subscribes to it for the marker. He also looks for her processes and
home (a file in it holds the marker too). Each attempt must fail, while his own
controller answers him. Nor does his password log him in as ann. Nor can he take more
of a node than the admin allows: his runaway fork loop stops at his process limit, and
his containers' memory and CPUs are bounded.

What else the local suite tries does not apply here: the hub, its secrets and the
ledger are not on the nodes; Swarm's own reservations decide the GPUs (an engine
service holds one); and the engine lease a user's server answers only says
"released" or "want": the hub brings back the engine services it made, never more.
"""

from __future__ import annotations

import json
import os

import pytest
from docker.types import EndpointSpec, RestartPolicy

from hub_harness import Kernel, origin_answers
from swarm_hub_harness import IMAGE, swarm_hub_fixture
from waiting import wait_until

pytestmark = pytest.mark.docker

#: ben's attack, run in his container: argv = marker, JSON list of [addr, port] targets
#: that must not answer, then his own [addr, port]. Prints one JSON line.
ATTACK = r"""
import errno, json, os, select, socket, sys, time, zmq
marker, targets, own = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
def answering(targets, timeout=3.0):
    # every connect at once: a dropped SYN costs the timeout once, not once per target
    pending = {}
    for addr, port in targets:
        s = socket.socket(); s.setblocking(False)
        if s.connect_ex((addr, port)) in (0, errno.EINPROGRESS):
            pending[s] = [addr, port]
        else:
            s.close()
    answered, deadline = [], time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        _, ready, _ = select.select([], list(pending), [], max(0.0, deadline - time.monotonic()))
        for s in ready:
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                answered.append(pending[s])
            del pending[s]; s.close()
    for s in pending:
        s.close()
    return answered
reached = answering(targets)
ctx = zmq.Context(); poller = zmq.Poller()
for addr, port in reached:
    s = ctx.socket(zmq.SUB); s.setsockopt(zmq.SUBSCRIBE, b""); s.setsockopt(zmq.LINGER, 0)
    s.connect(f"tcp://{addr}:{port}"); poller.register(s, zmq.POLLIN)
heard = []
deadline = time.monotonic() + (3 if reached else 0)
while time.monotonic() < deadline:
    for s, _ in poller.poll(200):
        heard.append(b"".join(s.recv_multipart()).decode(errors="replace"))
found_files = []
for top in ("/home", "/tmp", "/var", "/run", "/mnt", "/srv", "/data", "/opt", "/root"):
    for folder, _, files in os.walk(top):
        for f in files:
            path = os.path.join(folder, f)
            try:
                if os.path.getsize(path) < 256 * 1024 and marker.encode() in open(path, "rb").read():
                    found_files.append(path)
            except OSError:
                pass
others = []
for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
    try:
        others.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode())
    except OSError:
        pass
print(json.dumps({"reached": reached, "own": answering([own]) == [own], "processes": others,
                  "home": os.path.exists("/var/lib/docker/volumes"), "files": found_files,
                  "heard": [h[-300:] for h in heard if marker in h][:3]}))
"""

#: Run in one of ann's containers: its addresses and the TCP ports it listens on.
LISTENING = r"""
import json
addrs, lines = set(), open("/proc/net/fib_trie").read().splitlines()
for prev, line in zip(lines, lines[1:]):
    if line.strip() == "/32 host LOCAL" and not prev.split()[-1].startswith("127."):
        addrs.add(prev.split()[-1])
ports = set()
for line in open("/proc/net/tcp").read().splitlines()[1:]:
    fields = line.split()
    if fields[3] == "0A":  # LISTEN
        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
print(json.dumps({"addrs": sorted(addrs), "ports": sorted(ports)}))
"""

GROUP_CELL = """%%distributed -n 2
import torch, torch.distributed as dist
t = torch.ones(1); dist.all_reduce(t)
print("group of", dist.get_world_size(), "sum", int(t.item()))
"""


#: The admin's limits on each container (pdl_spawner/swarm/limits.py).
PROCESS_LIMIT = 300
LIMITS = f"""
c.Spawner.mem_limit = "1G"
c.Spawner.cpu_limit = 1.0
c.Spawner.process_limit = {PROCESS_LIMIT}
c.PDLSwarmSpawner.engine_mem_limit = "3G"
c.PDLSwarmSpawner.engine_cpu_limit = 0.75
"""
#: What a container's own cgroups say of its limits (cgroup v1, as Docker mounts them in
#: the container; v2: one folder): one JSON line.
OWN_LIMITS = r"""
import json, os
def read(*names):
    for name in names:
        if os.path.exists(name):
            return open(name).read().split()
v1 = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
memory = read(v1, "/sys/fs/cgroup/memory.max")[0]
quota = read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu.max")
period = read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")[0] if os.path.exists(v1) else quota[1]
pids = read("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max")[0]
print(json.dumps({"memory": int(memory), "cores": int(quota[0]) / int(period), "pids": int(pids)}))
"""
#: ben's runaway loop: fork until refused (or 5,000), then end the children; one line.
FORK_LOOP = """
import os, time
children, stopped = [], None
try:
    while len(children) < 5000:
        pid = os.fork()
        if pid == 0:
            time.sleep(120)
            os._exit(0)
        children.append(pid)
except BlockingIOError as e:
    stopped = e.errno
finally:
    for pid in children:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
print("forked", len(children), "stopped by errno", stopped)
"""


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    yield from swarm_hub_fixture(tmp_path_factory.mktemp("swarm-neighbours"), swarm, ["admin", "ann", "ben"],
                                 extra_config=LIMITS)


def containers_of(swarm, user: str) -> list[tuple[int, object]]:
    """(node index, container) of each running container of ``user``'s services."""
    names = {s.name for s in swarm.manager.services.list(filters={"label": f"pdl.user={user}"})}
    return [(i, c) for i in swarm.node_ids() for c in swarm.containers(i)
            if c.labels.get("com.docker.swarm.service.name") in names]


def listening(container) -> dict:
    out = container.exec_run(["python", "-c", LISTENING], user="1000")
    assert out.exit_code == 0, out.output.decode()
    return json.loads(out.output.decode().strip().splitlines()[-1])


def labels_of(swarm, service: str) -> dict:
    return swarm.manager.services.get(service).attrs["Spec"]["Labels"]


def run_as_ben(swarm, network: str, node: int, argv: list[str]) -> dict:
    """``argv`` in a container started as the hub starts ben's, on ``node``; its JSON line."""
    name = f"ben-probe-{node}-{os.getpid()}"
    service = swarm.manager.services.create(
        IMAGE, argv, name=name, networks=[network], constraints=[f"node.hostname=={swarm.hostname(node)}"],
        user="1000:1000", cap_drop=["ALL"], init=True, restart_policy=RestartPolicy("none"),
        endpoint_spec=EndpointSpec(mode="dnsrr"), labels={"pdl.test": "probe"},
    )
    try:
        wait_until(lambda: any(t["Status"]["State"] in ("complete", "failed", "rejected") for t in service.tasks()),
                   90, what=f"{name} to finish")
        task = service.tasks()[0]
        assert task["Status"]["State"] == "complete", task["Status"]
        found = swarm.containers(node, all=True, label=f"com.docker.swarm.service.name={name}")
        return json.loads(found[0].logs().decode().strip().splitlines()[-1])
    finally:
        service.remove()


def test_ben_cannot_log_in_as_ann_with_his_own_password(hub):
    """Guards the per-user credential (pdl_spawner/accounts/authenticator.py) in the hub's Swarm mode."""
    session = hub.login("ann", password=hub.password("ben"))
    assert "jupyterhub-hub-login" not in session.cookies
    assert hub.login("ann").cookies.get("jupyterhub-hub-login")  # her own password does


def test_bens_containers_reach_nothing_of_anns_server_on_any_of_her_nodes(hub, swarm):
    """Guards the private networks (pdl_spawner/swarm/specs.py: ``"Networks": [{"Target":
    network}]`` in notebook_service and engine_service; ``_service`` publishes only the
    Jupyter port): with the node's own network, ben's container on her node reaches
    her TCP store, gloo and controller ports. Also the kernels' IPC transport
    (jupyter-config/jupyter_server_config.py: no kernel port to reach), the PID
    namespace, the per-user home volume, and the servers' own web origins."""
    for user, gpus in (("ann", 2), ("ben", 1)):
        r = hub.spawn(user, gpus)
        assert r.status_code in (201, 202), r.text
    for user in ("ann", "ben"):
        hub.wait_ready(user, timeout=240)
    # each server is an origin of its own here too (jupyterhub_config.py: subdomain_host)
    assert origin_answers(hub, "ann") == {"own": 200, "hub": 302}
    ann_net, ben_net = labels_of(swarm, "pdl-ann")["pdl.network"], labels_of(swarm, "pdl-ben")["pdl.network"]
    assert ann_net != ben_net

    ann = Kernel(hub, "ann")
    try:
        ann.execute_ok("%load_ext pdl_magics")
        out = ann.execute_ok(GROUP_CELL, timeout=300)
        assert "group of 2 sum 2" in out["stdout"], out
        marker = f"ann-secret-{os.getpid()}"
        ann.execute_ok(f"import os\nopen(os.path.expanduser('~/notes.txt'), 'w').write({marker!r})")
        ann.send(f"import time\nfor _ in range(120):\n    print({marker!r}, flush=True); time.sleep(0.25)")

        jupyter_port, *controller_ports = map(int, labels_of(swarm, "pdl-ann")["pdl.ports"].split(","))
        targets, nodes, store_ports = [], set(), []
        for node, container in containers_of(swarm, "ann"):
            seen = listening(container)
            nodes.add(node)
            ports = [p for p in seen["ports"] if p != jupyter_port]
            targets += [[addr, port] for addr in seen["addrs"] for port in ports]
            if container.labels["com.docker.swarm.service.name"].startswith("pdl-ann-engine"):
                store_ports += ports
            else:
                targets += [[swarm.node_addr(node), port] for port in controller_ports]
        assert store_ports, "ann's engines listen on nothing: her process group is not there to attack"
        assert len(nodes) >= 2

        ben_task = swarm.manager.services.get("pdl-ben").tasks(filters={"desired-state": "running"})[0]
        ben_addr = next(a["Addresses"][0].split("/")[0] for a in ben_task["NetworksAttachments"]
                        if a["Network"]["Spec"]["Name"] == ben_net)
        ben_controller = [ben_addr, int(labels_of(swarm, "pdl-ben")["pdl.ports"].split(",")[1])]
        found = {node: run_as_ben(swarm, ben_net, node, ["python", "-c", ATTACK, marker, json.dumps(targets),
                                                         json.dumps(ben_controller)])
                 for node in sorted(nodes)}
    finally:
        ann.close()
    for node, seen in found.items():
        assert seen["own"], f"on {swarm.hostname(node)} ben's probe cannot reach his own controller: {seen}"
        assert seen["reached"] == [] and seen["heard"] == [], (swarm.hostname(node), seen)
        assert seen["home"] is False and seen["files"] == [], seen
        assert not [cmd for cmd in seen["processes"] if "singleuser" in cmd or "pdl-engine" in cmd], seen


def test_bens_containers_keep_the_admins_limits_and_his_runaway_loop_stops_at_his(hub, swarm):
    """Guards the containers' limits (pdl_spawner/swarm/limits.py, specs.Limits): without
    them ben's notebook and engines may take all of a node's memory, cores and process
    table. His kernel's fork loop is refused at his process limit; the cgroups of his
    notebook and of his engine say the admin's limits."""
    for user in ("ann", "ben"):
        if not hub.server_ready(user):
            r = hub.spawn(user, 1)
            assert r.status_code in (201, 202), r.text
    for user in ("ann", "ben"):
        hub.wait_ready(user, timeout=240)
    ben = Kernel(hub, "ben")
    try:
        out = ben.execute_ok(FORK_LOOP, timeout=120)
        forked = int(out["stdout"].split()[1])
        assert "stopped by errno 11" in out["stdout"] and forked < PROCESS_LIMIT, out
        notebook = json.loads(ben.execute_ok(OWN_LIMITS)["stdout"])
        assert notebook == {"memory": 2**30, "cores": 1.0, "pids": PROCESS_LIMIT}, notebook
        ben.execute_ok("%load_ext pdl_magics")
        out = ben.execute_ok("%%distributed -n 1\n" + OWN_LIMITS, timeout=180)
        engine = json.loads(out["stdout"].strip().splitlines()[-1])
        assert engine == {"memory": 3 * 2**30, "cores": 0.75, "pids": PROCESS_LIMIT}, engine
    finally:
        ben.close()


def test_a_full_pool_of_private_networks_refuses_a_spawn_in_one_line(hub, swarm):
    """Guards NetworkPool.claim (pdl_spawner/swarm/networks.py): with every network of
    the pool taken, another server would have to share one. ben's server goes, so a
    GPU is free; the pool shrinks to ann's network alone."""
    assert hub.api("DELETE", "/users/ben/server").status_code in (202, 204)
    wait_until(lambda: not containers_of(swarm, "ben"), 60, what="ben's containers to go")
    hub.stop_hub()
    hub.extra_config += "\nc.PDLSwarmSpawner.private_networks = 1\n"
    hub.start()
    hub.wait_ready("ann", timeout=60)
    assert labels_of(swarm, "pdl-ann")["pdl.network"] == "pdl-private-0"
    r = hub.spawn("admin", 1)
    assert r.status_code == 409, r.text
    assert r.json()["message"] == ("No private network is free for your server (0 of 1 are free); try again when a "
        "server stops, or ask the admin to raise PDLSwarmSpawner.private_networks"), r.text
    assert not swarm.manager.services.list(filters={"label": "pdl.user=admin"})
