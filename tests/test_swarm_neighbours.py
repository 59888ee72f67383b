"""The hostile neighbour on the simulated Swarm: a container of ben's on the node of ann's notebook.

Every user's container on a node runs the same way (the notebook image, uid 1000, no
capabilities, no new privileges, the node's network: ``tests/test_swarm_hub.py`` checks
it as the tasks run). So ben's container here is one started that way on the node where
ann's notebook task runs, whichever it is, while ann's kernel prints a marker. From it,
ben looks for ann's processes and home, and subscribes to every TCP port listening on
the node; each attempt must fail. What does not hold on Swarm yet, and is not claimed
here: the torch store and gloo ports of a group are reachable from the node's network
(docs/admin.md, "What users can and cannot do to each other").
"""

from __future__ import annotations

import json
import os
import time

import pytest

from hub_harness import Kernel
from swarm_hub_harness import IMAGE, running_hub

pytestmark = pytest.mark.docker

#: ben's attack, run in his container; prints one JSON line.
ATTACK = r"""
import json, os, sys, time, zmq
marker = sys.argv[1]
others = []
for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
    try:
        others.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode())
    except OSError:
        pass
ports = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A":  # LISTEN
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
ctx = zmq.Context()
poller = zmq.Poller()
for port in sorted(ports):
    s = ctx.socket(zmq.SUB); s.setsockopt(zmq.SUBSCRIBE, b""); s.setsockopt(zmq.LINGER, 0)
    s.connect(f"tcp://127.0.0.1:{port}")
    poller.register(s, zmq.POLLIN)
heard = []
deadline = time.monotonic() + 4
while time.monotonic() < deadline:
    for s, _ in poller.poll(200):
        heard.append(b"".join(s.recv_multipart()).decode(errors="replace"))
print(json.dumps({"processes": others, "ports": sorted(ports), "home": os.path.exists("/var/lib/docker/volumes"),
                  "heard": [h[-300:] for h in heard if marker in h][:3]}))
"""


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    yield from running_hub(tmp_path_factory.mktemp("swarm-neighbours"), swarm, ["admin", "ann", "ben"])


def node_running(swarm, service: str) -> int:
    """The sim's node index where ``service``'s container runs."""
    for i in swarm.node_ids():
        if swarm.client(i).containers.list(filters={"label": f"com.docker.swarm.service.name={service}"}):
            return i
    raise AssertionError(f"no container of {service} on any node")


def notebook_port(swarm, service: str) -> int:
    """The port ``service``'s notebook server listens on (the first of its ``pdl.ports`` label)."""
    return int(swarm.manager.services.get(service).attrs["Spec"]["Labels"]["pdl.ports"].split(",")[0])


def test_bens_container_on_anns_node_cannot_see_her_processes_home_or_kernel(hub, swarm):
    """Guards the kernels' IPC transport (jupyter-config/jupyter_server_config.py) inside
    the notebook container, where every port is on the node's network: with TCP kernels,
    ben would hear ann's marker. The PID namespace and the per-user home volume keep
    her processes and files out of his container."""
    r = hub.spawn("ann", 1)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ann", timeout=240)
    node = node_running(swarm, "pdl-ann")
    ann = Kernel(hub, "ann")
    try:
        marker = f"ann-secret-{os.getpid()}"
        ann.send(f"import time\nfor _ in range(60):\n    print({marker!r}, flush=True); time.sleep(0.25)")
        time.sleep(1)  # the loop prints
        out = swarm.client(node).containers.run(
            IMAGE, ["python", "-c", ATTACK, marker], network_mode="host", user="1000", cap_drop=["ALL"],
            security_opt=["no-new-privileges"], remove=True, stdout=True, stderr=True,
        )
        found = json.loads(out.decode().strip().splitlines()[-1])
    finally:
        ann.close()
    assert notebook_port(swarm, "pdl-ann") in found["ports"], "ben's container must share the node's network"
    assert found["heard"] == [] and found["home"] is False
    assert not [cmd for cmd in found["processes"] if "singleuser" in cmd or "ipykernel" in cmd], found["processes"]
