"""Engines on separate simulated nodes joined by links of a chosen speed: one network
namespace per node on a bridge (``sim_host.bridged_namespaces``), each node's outgoing
traffic shaped with ``tc`` (a token bucket of the chosen rate and a 100 ms queue), one
ipyparallel engine per node, each on a CPU of its own where there are enough (round
robin over this process's CPUs), and the controller in the root namespace on the
bridge. For the tests of
``%pdl scale``'s predictions; needs root and ``tc`` (iproute2).

The engines are started as the hub's are (a cluster file, ``PDL_WORKERS``); each says
its node's name and address through the engine contract (``PDL_ENGINE_HOST``,
``PDL_ENGINE_ADDR``) and keeps its collectives on the node's ``eth0``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys

from pdl.engine_contract import EngineContract
from pdl_server import clusters
from sim_host import Member, bridged_namespaces, remove_links, remove_namespaces, run

PREFIX = "pdlln"
BRIDGE = f"{PREFIX}-br"
HOST_IF, HOST_PEER = f"{PREFIX}-h", f"{PREFIX}-hp"
#: The nodes' subnet, 10.79.0.0/24: its own, as the simulated Swarm's (10.77) and Slurm's
#: (10.78, kept for the whole session) are; a second 10.78.0.1 in the root namespace sent
#: the engines' registrations to the Slurm bridge.
HOST_ADDR = "10.79.0.1"
#: The engines' niceness: ahead of whatever else runs on their cores (the session's
#: simulated clusters' daemons, the test itself), which would otherwise be measured too.
ENGINE_NICE = -10


def problem() -> str | None:
    """None when linked nodes can be made here, else why not (one line)."""
    if os.geteuid() != 0:
        return "linked nodes need root (network namespaces, tc)"
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            return f"linked nodes need {tool} (iproute2)"
    return None


def members(n: int) -> list[Member]:
    return [Member(netns=f"{PREFIX}-{k}", addr=f"10.79.0.{10 + k}/24", outer=f"{PREFIX}-{k}o", port=f"{PREFIX}-{k}p")
            for k in range(1, n + 1)]


def clean() -> None:
    """Remove what an earlier run left: its namespaces (and whatever runs in them), its veth."""
    remove_namespaces([m.netns for m in members(8)] + [BRIDGE])
    remove_links([HOST_IF])


def shape(nodes: list[Member], mbit: float) -> None:
    """Every node's outgoing traffic at most ``mbit`` Mbit/s (replacing an earlier rate)."""
    for m in nodes:
        run("ip", "netns", "exec", m.netns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
            "rate", f"{mbit}mbit", "burst", "64kb", "latency", "100ms")


@contextlib.contextmanager
def linked_engines(n: int, profile_dir: str):
    """Within: ``(cluster, nodes)``, a cluster whose controller listens on the bridge and
    one engine on each of ``n`` nodes (named ``node-1``...). Everything is removed after."""
    clean()
    nodes = members(n)
    cluster = None
    try:
        bridged_namespaces(BRIDGE, nodes, HOST_IF, HOST_PEER, f"{HOST_ADDR}/24")
        cluster = clusters.new_cluster(cluster_id=f"{PREFIX}-{os.getpid()}", profile_dir=profile_dir,
                                       controller_ip=HOST_ADDR)
        clusters.start_controller(cluster)
        for k, m in enumerate(nodes, start=1):
            addr = m.addr.split("/")[0]
            env = {**EngineContract(slot=f"cpu:{k - 1}", host=f"node-{k}", addr=addr).env(),
                   "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
            cpu = str(sorted(os.sched_getaffinity(0))[(k - 1) % len(os.sched_getaffinity(0))])
            clusters.start_engine(cluster, f"cpu:{k - 1}", environment=env,
                                  command=["ip", "netns", "exec", m.netns, "nice", "-n", str(ENGINE_NICE), "taskset", "-c", cpu,
                                           sys.executable, "-m", "pdl.runtime.boot", "engine"])
        yield cluster, nodes
    finally:
        if cluster is not None:
            cluster.stop_cluster_sync()
        clean()
