"""What PDL reads from a Docker Swarm, and what it keeps: pure functions, no I/O.

Inputs are Engine API objects as docker-py's ``APIClient`` returns them
(``nodes()``, ``services()``, ``tasks()``). GPUs are counted as Swarm counts them:
a node offers the generic resources its daemon declares (``NamedResourceSpec``
entries count one each, ``DiscreteResourceSpec`` entries their value), and a task
holds what its spec reserves from the moment it is created until it stops, pending
or not. So a pending engine is counted as held, and its GPU is never offered twice.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from pdl.connection import ClusterKeys

from .swarm_specs import LABEL_PREFIX

#: Task states in which a task holds (or waits for) its resources.
ACTIVE_TASK_STATES = frozenset(
    {"new", "allocated", "pending", "assigned", "accepted", "preparing", "ready", "starting", "running"}
)
#: Task states after which a task will never run.
FAILED_TASK_STATES = frozenset({"failed", "rejected", "orphaned", "shutdown", "complete", "remove"})
#: Holder name for GPUs reserved by services that are not PDL's.
OTHER_SERVICES = "other services"
#: What Swarm says about a task no node has resources for.
INSUFFICIENT = "insufficient resources"


@dataclass(frozen=True)
class GpuUsage:
    """GPUs of the swarm: ``total`` offered, ``holders`` (user -> GPUs held), ``free``."""

    total: int
    holders: dict[str, int]

    @property
    def free(self) -> int:
        return max(0, self.total - sum(self.holders.values()))


def node_gpus(node: dict, resource: str) -> int:
    """GPUs (units of generic resource ``resource``) a ready, active node offers."""
    if node.get("Status", {}).get("State") != "ready" or node.get("Spec", {}).get("Availability") != "active":
        return 0
    resources = node.get("Description", {}).get("Resources", {}).get("GenericResources") or []
    return _count(resources, resource)


def _count(generic_resources: list[dict], resource: str) -> int:
    n = 0
    for r in generic_resources:
        if r.get("NamedResourceSpec", {}).get("Kind") == resource:
            n += 1
        elif r.get("DiscreteResourceSpec", {}).get("Kind") == resource:
            n += int(r["DiscreteResourceSpec"].get("Value", 0))
    return n


def select_nodes(nodes: list[dict], names: list[str]) -> list[dict]:
    """The nodes whose hostname is in ``names`` (every node when ``names`` is empty).

    Raises ValueError, in one line naming the swarm's nodes, for a name that is not one.
    """
    if not names:
        return nodes
    known = {n.get("Description", {}).get("Hostname", ""): n for n in nodes}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"node(s) {', '.join(unknown)} not in the swarm; its nodes are: "
                         f"{', '.join(sorted(known)) or 'none'}")
    return [known[name] for name in names]


def excluded_hostnames(nodes: list[dict], names: list[str]) -> list[str]:
    """Hostnames of the swarm's nodes that ``names`` leaves out (none when it is empty)."""
    if not names:
        return []
    return sorted({n.get("Description", {}).get("Hostname", "") for n in nodes} - set(names))


def task_gpus(task: dict, resource: str) -> int:
    """GPUs a task reserves while it is active (0 once it stopped or is meant to stop)."""
    if task.get("DesiredState") != "running" or task.get("Status", {}).get("State") not in ACTIVE_TASK_STATES:
        return 0
    reservations = task.get("Spec", {}).get("Resources", {}).get("Reservations", {})
    return _count(reservations.get("GenericResources") or [], resource)


def gpu_usage(
    nodes: list[dict], services: list[dict], tasks: list[dict], resource: str, *,
    promised: dict[str, tuple[str, int]] | None = None, exclude_owner: str | None = None,
) -> GpuUsage:
    """How many GPUs the swarm offers and who holds them.

    Holders are PDL users (the ``pdl.user`` label of the task's service) or
    :data:`OTHER_SERVICES`. A PDL engine service holds the GPUs its spec reserves for
    as long as it exists, also between a task that died and its replacement, so a
    restarting engine keeps its user's GPU. ``promised`` (owner -> (user, GPUs)) adds
    GPUs granted to spawns whose engine tasks do not exist yet. A service scaled to 0
    (engines released for idleness) holds nothing. ``exclude_owner``'s
    own services are not counted (a server replacing itself).
    """
    labels = {s["ID"]: s.get("Spec", {}).get("Labels") or {} for s in services}
    held: dict[str, int] = {}  # service id (a task's own key outside a service) -> GPUs its tasks hold
    for i, task in enumerate(tasks):
        key = task.get("ServiceID") or f"task-{i}"
        held[key] = held.get(key, 0) + task_gpus(task, resource)
    promised = promised or {}
    for svc in services:  # PDL's engine services: at least what the spec reserves, unless scaled to 0
        svc_labels = svc.get("Spec", {}).get("Labels") or {}
        if (svc_labels.get(LABEL_PREFIX + "user") and svc_labels.get(LABEL_PREFIX + "owner") not in promised
                and service_replicas(svc)):
            reservations = svc["Spec"].get("TaskTemplate", {}).get("Resources", {}).get("Reservations", {})
            held[svc["ID"]] = max(held.get(svc["ID"], 0), _count(reservations.get("GenericResources") or [], resource))
    holders: dict[str, int] = {}
    for key, n in held.items():
        if not n:
            continue
        svc = labels.get(key, {})
        if exclude_owner is not None and svc.get(LABEL_PREFIX + "owner") == exclude_owner:
            continue
        who = svc.get(LABEL_PREFIX + "user") or OTHER_SERVICES
        holders[who] = holders.get(who, 0) + n
    for owner, (user, n) in promised.items():
        if owner != exclude_owner:
            holders[user] = holders.get(user, 0) + n
    return GpuUsage(total=sum(node_gpus(n, resource) for n in nodes), holders=holders)


def service_replicas(service: dict) -> int:
    """Tasks a replicated service is meant to run (1 when the spec says nothing)."""
    return int(service.get("Spec", {}).get("Mode", {}).get("Replicated", {}).get("Replicas", 1))


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

    ``keys``: the cluster's credentials; ``port``: the Jupyter server's;
    ``controller_ports``: the controller's; ``node_addr``: the notebook's node;
    ``network``: the server's private network (:mod:`pdl_spawner.swarm_networks`);
    ``api_token``: the server's hub API token, with which the hub asks the server
    about its engine lease (it accepts its own token).
    """

    gpus: int = 0
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
            "gpus": self.gpus, "port": self.port, "controller_ports": list(self.controller_ports),
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
            gpus=int(state.get("gpus", 0)), port=int(state.get("port", 0)),
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
