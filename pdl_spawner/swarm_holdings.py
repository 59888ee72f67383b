"""Who holds which GPU of a Docker Swarm, on which node, since when: pure functions, no I/O.

Inputs are Engine API objects as docker-py's low-level ``APIClient`` returns them:
``nodes()``, ``services(filters={"label": ["pdl.role=engine"]})`` and ``tasks()``.
A GPU is one unit of a Swarm generic resource (``resource``, e.g. ``"NVIDIA-GPU"``)
that a node's daemon declares as a ``NamedResourceSpec`` (``NVIDIA-GPU=GPU-<uuid>``
in ``node-generic-resources``); its id is the spec's value. Times are epoch seconds.

What counts:

- **A holding** (:func:`gpu_holdings`): a GPU assigned to an *active* task of a PDL
  engine service (label ``pdl.role=engine``): the task's ``DesiredState`` is
  ``running`` and its ``Status.State`` one of
  :data:`~pdl_spawner.swarm_state.ACTIVE_TASK_STATES`. Tasks that stopped or are
  being stopped, and services that are not PDL engines, hold nothing here.
- **A pending holding**: an active PDL engine task that reserves GPUs but has none
  assigned yet (Swarm has not placed it): one holding per GPU it reserves, with gpu
  :data:`PENDING` and node ``""`` (or the node's hostname once it has one). These are
  listed last and never match a GPU of the pool.
- **The pool** (:func:`gpu_pool`): the named GPUs of nodes that are ``ready`` and
  ``active`` (as :func:`~pdl_spawner.swarm_state.node_gpus` counts them). A node that
  is down, paused or drained offers nothing. ``DiscreteResourceSpec`` declarations
  (a count, no ids) cannot be listed GPU by GPU and are left out of the pool.
- **In use** (:func:`gpus_in_use`): GPUs assigned to an active task of *any* service,
  so that a GPU taken by a service that is not PDL's is not shown as free.

Docker names the GPUs Swarm assigned to a task ``GenericResources`` on the task
object (its API reference calls them ``AssignedGenericResources``); both are read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

from .swarm_specs import LABEL_PREFIX
from .swarm_state import ACTIVE_TASK_STATES, node_gpus, task_gpus

#: The gpu of a holding whose task Swarm has not placed yet.
PENDING = "(pending)"

_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))$"
)


@dataclass(frozen=True)
class GpuHolding:
    """One GPU held by a PDL engine task: the GPU's id (:data:`PENDING` before Swarm
    placed the task), the node's hostname, the ledger-style ``owner`` (``"user"`` or
    ``"user/server"``), the ``user``, and ``since`` (epoch seconds: when the task
    reached its current state, e.g. running)."""

    gpu: str
    node: str
    owner: str
    user: str
    since: float


@dataclass(frozen=True)
class SwarmSnapshot:
    """What the admin view shows of a swarm at one moment.

    ``nodes``: hostnames of the nodes whose GPUs PDL uses; ``unavailable``: those of
    them that offer nothing now (not ready, not active, or not in the swarm); ``pool``
    and ``in_use``: (hostname, GPU id) pairs (see :func:`gpu_pool`, :func:`gpus_in_use`);
    ``holdings``: :func:`gpu_holdings`.
    """

    nodes: list[str]
    unavailable: list[str] = field(default_factory=list)
    pool: list[tuple[str, str]] = field(default_factory=list)
    in_use: list[tuple[str, str]] = field(default_factory=list)
    holdings: list[GpuHolding] = field(default_factory=list)


def parse_timestamp(text: str | None) -> float | None:
    """An RFC 3339 time as Docker writes it (``"2026-11-23T18:40:01.123456789Z"``,
    fractions to the nanosecond, ``Z`` or ``+hh:mm``) in epoch seconds; None when
    missing, malformed, or Go's zero time (year 1)."""
    match = _RFC3339.match((text or "").strip())
    if not match:
        return None
    date, clock, fraction, zulu, sign, hours, minutes = match.groups()
    try:
        moment = datetime.strptime(f"{date}T{clock}", "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    if moment.year <= 1:
        return None
    seconds = moment.timestamp() + (float(f"0.{fraction}") if fraction else 0.0)
    if not zulu:
        offset = int(hours) * 3600 + int(minutes) * 60
        seconds -= offset if sign == "+" else -offset
    return seconds


def hostname(node: dict) -> str:
    """A node's hostname (``Description.Hostname``; ``""`` when it reports none)."""
    return node.get("Description", {}).get("Hostname") or ""


def assigned_gpus(task: dict, resource: str) -> list[str]:
    """The GPUs of kind ``resource`` Swarm assigned to ``task``, by id; a counted
    (``DiscreteResourceSpec``) assignment of n units, which has no id, as
    ``"<resource> (n)"``. Empty before the task is placed."""
    assigned = task.get("GenericResources") or task.get("AssignedGenericResources") or []
    gpus = []
    for r in assigned:
        named, discrete = r.get("NamedResourceSpec") or {}, r.get("DiscreteResourceSpec") or {}
        if named.get("Kind") == resource:
            gpus.append(str(named.get("Value", "")))
        elif discrete.get("Kind") == resource and int(discrete.get("Value", 0)):
            gpus.append(f"{resource} ({int(discrete['Value'])})")
    return gpus


def is_available(node: dict) -> bool:
    """Whether Swarm places tasks on ``node``: its status is ``ready`` and its availability ``active``."""
    return node.get("Status", {}).get("State") == "ready" and node.get("Spec", {}).get("Availability") == "active"


def is_active(task: dict) -> bool:
    """Whether ``task`` holds (or waits for) its resources: meant to run and in an active state."""
    return task.get("DesiredState") == "running" and task.get("Status", {}).get("State") in ACTIVE_TASK_STATES


def _natural(text: str) -> tuple:
    """A sort key that orders digit runs by value (``GPU-fake-2`` before ``GPU-fake-10``)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text) if part)


def _task_since(task: dict) -> float:
    """When ``task`` reached its current state (``Status.Timestamp``), else when it was
    last updated or created; 0.0 when it carries no time at all."""
    for text in (task.get("Status", {}).get("Timestamp"), task.get("UpdatedAt"), task.get("CreatedAt")):
        since = parse_timestamp(text)
        if since is not None:
            return since
    return 0.0


def gpu_holdings(nodes: list[dict], services: list[dict], tasks: list[dict], resource: str) -> list[GpuHolding]:
    """One :class:`GpuHolding` per GPU held by an active task of a PDL engine service
    (see the module docstring for what counts, pending tasks included), sorted by node,
    then GPU (digit runs by value); pending holdings last."""
    hosts = {n.get("ID"): hostname(n) for n in nodes}
    engines = {}
    for svc in services:
        labels = svc.get("Spec", {}).get("Labels") or {}
        if labels.get(LABEL_PREFIX + "role") == "engine":
            engines[svc.get("ID")] = labels
    holdings = []
    for task in tasks:
        labels = engines.get(task.get("ServiceID"))
        if labels is None or not is_active(task):
            continue
        owner = labels.get(LABEL_PREFIX + "owner") or labels.get(LABEL_PREFIX + "user") or ""
        user = labels.get(LABEL_PREFIX + "user") or owner.partition("/")[0]
        node_id = task.get("NodeID") or ""
        node = hosts.get(node_id) or node_id
        since = _task_since(task)
        gpus = assigned_gpus(task, resource) or [PENDING] * task_gpus(task, resource)
        holdings.extend(GpuHolding(gpu, node, owner, user, since) for gpu in gpus)
    return sorted(holdings, key=lambda h: (h.gpu == PENDING, _natural(h.node), _natural(h.gpu), h.owner, h.since))


def gpu_pool(nodes: list[dict], resource: str) -> list[tuple[str, str]]:
    """(hostname, GPU id) of every named GPU of kind ``resource`` that a ready, active
    node declares, sorted by hostname then GPU (digit runs by value)."""
    pool = []
    for node in nodes:
        if not node_gpus(node, resource):
            continue
        for r in node.get("Description", {}).get("Resources", {}).get("GenericResources") or []:
            named = r.get("NamedResourceSpec") or {}
            if named.get("Kind") == resource:
                pool.append((hostname(node), str(named.get("Value", ""))))
    return sorted(pool, key=lambda p: (_natural(p[0]), _natural(p[1])))


def gpus_in_use(nodes: list[dict], tasks: list[dict], resource: str) -> list[tuple[str, str]]:
    """(hostname, GPU id) of every GPU assigned to an active task of any service, sorted."""
    hosts = {n.get("ID"): hostname(n) for n in nodes}
    used = {
        (hosts.get(t.get("NodeID") or "") or t.get("NodeID") or "", gpu)
        for t in tasks if is_active(t) for gpu in assigned_gpus(t, resource)
    }
    return sorted(used, key=lambda p: (_natural(p[0]), _natural(p[1])))


def pdl_nodes(nodes: list[dict], names: list[str]) -> list[dict]:
    """The nodes whose hostname is in ``names`` (every node when ``names`` is empty).
    Names that are no node of the swarm are skipped (see :func:`swarm_snapshot`)."""
    if not names:
        return list(nodes)
    wanted = set(names)
    return [n for n in nodes if hostname(n) in wanted]


def swarm_snapshot(
    nodes: list[dict], services: list[dict], tasks: list[dict], resource: str, names: list[str],
) -> SwarmSnapshot:
    """A :class:`SwarmSnapshot` for the swarm's ``nodes``, PDL's engine ``services`` and
    the ``tasks``, where PDL uses the nodes named ``names`` (all when empty). Holdings
    and GPUs in use are read on every node; the pool only on PDL's. A name that is no
    node of the swarm is listed among the unavailable nodes."""
    chosen = pdl_nodes(nodes, names)
    known = {hostname(n) for n in chosen}
    listed = list(dict.fromkeys(names)) if names else sorted(known, key=_natural)
    unavailable = [name for name in listed if name not in known]
    unavailable += [hostname(n) for n in chosen if not is_available(n)]
    return SwarmSnapshot(
        nodes=listed,
        unavailable=sorted(set(unavailable), key=_natural),
        pool=gpu_pool(chosen, resource),
        in_use=gpus_in_use(nodes, tasks, resource),
        holdings=gpu_holdings(nodes, services, tasks, resource),
    )
