"""What the Swarm spawner keeps of a server, and reads of its own tasks: pure functions, no I/O.

Inputs are Engine API objects as docker-py's ``APIClient`` returns them (``nodes()``,
``services()``, ``tasks()``): task states, a task's error, ports, node and network
addresses, and :class:`SwarmServer`, the spawner's state. Who holds which GPU is
:mod:`pdl_spawner.swarm.gpus`'s alone.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from pdl.connection import ClusterKeys

from pdl_spawner.swarm.specs import LABEL_PREFIX

#: Task states in which a task holds (or waits for) its resources.
ACTIVE_TASK_STATES = frozenset(
    {"new", "allocated", "pending", "assigned", "accepted", "preparing", "ready", "starting", "running"}
)
#: Task states of a task placed on a node, which holds its resources there until it stops.
PLACED_TASK_STATES = frozenset({"assigned", "accepted", "preparing", "ready", "starting", "running"})
#: Task states after which a task will never run.
FAILED_TASK_STATES = frozenset({"failed", "rejected", "orphaned", "shutdown", "complete", "remove"})
#: What Swarm says about a task no node has resources for.
INSUFFICIENT = "insufficient resources"


def service_replicas(service: dict) -> int:
    """Tasks a replicated service is meant to run (1 when the spec says nothing)."""
    mode = (service.get("Spec") or {}).get("Mode") or {}
    return int((mode.get("Replicated") or {}).get("Replicas", 1))


def starved_tasks(tasks: list[dict]) -> list[dict]:
    """Tasks waiting for resources no node has free ("insufficient resources")."""
    return [
        t for t in tasks
        if t.get("Status", {}).get("State") == "pending" and INSUFFICIENT in (t.get("Status", {}).get("Err") or "")
    ]


def task_error(task: dict) -> str:
    """One line about a task that will never run: its state and Swarm's error."""
    status = task.get("Status", {})
    err = status.get("Err") or status.get("Message") or ""
    return f"{status.get('State', 'unknown')}: {err}".strip(": ")


def used_ports(services: list[dict]) -> set[int]:
    """Ports PDL notebook services bind (their ``pdl.ports`` labels)."""
    used = set()
    for s in services:
        text = (s.get("Spec", {}).get("Labels") or {}).get(LABEL_PREFIX + "ports", "")
        used.update(int(p) for p in text.split(",") if p.strip().isdigit())
    return used


def pick_ports(n: int, used: set[int], low: int, high: int, rng: random.Random | None = None) -> list[int]:
    """``n`` distinct ports from ``[low, high]`` avoiding ``used`` (random, so that two
    hubs rarely collide). Below Linux's ephemeral range (32768+) by default, so
    outgoing connections on the node do not take them."""
    candidates = high - low + 1 - len({p for p in used if low <= p <= high})
    if candidates < n:
        raise ValueError(f"only {candidates} ports left in {low}-{high}, need {n}")
    rng = rng or random.SystemRandom()
    picked: list[int] = []
    while len(picked) < n:
        p = rng.randint(low, high)
        if p not in used and p not in picked:
            picked.append(p)
    return picked


@dataclass
class SwarmServer:
    """What the spawner keeps about a running server (its JupyterHub state).

    ``workers``: its GPUs (one engine each); ``keys``: the cluster's credentials;
    ``port``: the Jupyter server's; ``controller_ports``: the controller's;
    ``node_addr``: the notebook's node;
    ``network``: the server's private network (:mod:`pdl_spawner.swarm.networks`);
    ``api_token``: the server's hub API token, with which the hub asks the server
    about its engine lease (it accepts its own token).
    """

    workers: int = 0
    port: int = 0
    controller_ports: list[int] = field(default_factory=list)
    node_addr: str = ""
    keys: ClusterKeys | None = None
    engine_services: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    api_token: str = ""
    network: str = ""

    def to_state(self) -> dict:
        state = {
            "workers": self.workers, "port": self.port, "controller_ports": list(self.controller_ports),
            "node_addr": self.node_addr, "engine_services": list(self.engine_services),
            "secrets": list(self.secrets), "api_token": self.api_token, "network": self.network,
        }
        if self.keys is not None:
            state["keys"] = self.keys.to_dict()
        return state

    @classmethod
    def from_state(cls, state: dict | None) -> SwarmServer:
        state = state or {}
        keys = state.get("keys")
        return cls(
            workers=int(state.get("workers", state.get("gpus", 0))),  # "gpus": state saved by 0.1.0
            port=int(state.get("port", 0)),
            controller_ports=[int(p) for p in state.get("controller_ports", [])],
            node_addr=state.get("node_addr", ""), keys=ClusterKeys(**keys) if keys else None,
            engine_services=list(state.get("engine_services", [])), secrets=list(state.get("secrets", [])),
            api_token=state.get("api_token", ""), network=state.get("network", ""),
        )


def node_address(node: dict) -> str:
    """The address other nodes reach ``node`` at (a manager may report 0.0.0.0 in
    ``Status.Addr``; its ``ManagerStatus.Addr`` then has it)."""
    addr = node.get("Status", {}).get("Addr") or ""
    if addr in ("", "0.0.0.0"):
        addr = (node.get("ManagerStatus", {}).get("Addr") or "").rpartition(":")[0] or addr
    if not addr or addr == "0.0.0.0":
        raise ValueError(f"node {node.get('ID', '?')} reports no address")
    return addr


def network_address(task: dict, network: str) -> str:
    """``task``'s address on the network named ``network`` (from its
    ``NetworksAttachments``); ValueError when the task is not on it."""
    for attachment in task.get("NetworksAttachments") or []:
        spec = attachment.get("Network", {}).get("Spec", {})
        if spec.get("Name") == network and attachment.get("Addresses"):
            return attachment["Addresses"][0].split("/", 1)[0]
    raise ValueError(f"task {task.get('ID', '?')} has no address on network {network}")
