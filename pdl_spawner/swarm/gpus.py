"""Who holds which GPU of a Docker Swarm: the one reader of GPUs, for the spawn form,
the queue, the spawner's free count and the admin view alike. Pure functions, no I/O.

Inputs are Engine API objects as docker-py's low-level ``APIClient`` returns them:
``nodes()``, ``services(filters={"label": ["pdl.role=engine"]})`` and ``tasks()``.
A GPU is one unit of a Swarm generic resource (``resource``, e.g. ``"NVIDIA-GPU"``).
A node declares its GPUs in ``node-generic-resources``: a ``NamedResourceSpec``
(``NVIDIA-GPU=GPU-<uuid>``) is one GPU, its id the spec's value; a
``DiscreteResourceSpec`` is a count, with no ids. Times are epoch seconds.

What is held, counted as Swarm counts it (one definition, :func:`gpu_holdings`):

- **A holding**: a GPU of an *active* task of a PDL engine service (label
  ``pdl.role=engine``, :func:`is_active`): a task placed on a node until it has
  stopped, even while it is being stopped (Swarm gives its GPU to another task only
  then: counted free earlier, a user waiting in the queue got a spawn whose engines
  Swarm could not place), and a task not placed yet while it is meant to run. Tasks
  that stopped hold nothing.
- **A pending holding** (gpu :data:`PENDING`): what an active PDL engine task reserves
  before Swarm assigned it a GPU; and what a PDL engine service scaled above 0
  reserves while it has no active task (between a task that died and its
  replacement), so a restarting engine keeps its user's GPU. A service scaled to 0
  (engines released for idleness) holds nothing. Pending holdings are listed last and
  never match a GPU of the pool.
- **Other services' GPUs**: what active tasks of services that are not PDL engines
  reserve; the free count (:func:`gpu_usage`) counts them held by
  :data:`OTHER_SERVICES`, and the admin view lists them as in use (:func:`gpus_in_use`).
- **The pool** (:func:`gpu_pool`, :func:`node_gpus`): the GPUs of nodes that are
  ``ready`` and ``active``; a node that is down, paused or drained offers nothing.

**GPU types**: a node's GPUs are of the type its label
:data:`~pdl_spawner.swarm.specs.GPU_TYPE_LABEL` names
(``docker node update --label-add pdl.gpu-type=a100 <node>``; no label: untyped). An
engine service of a spawn that chose a type carries the same label (and a placement
constraint on it). Counted for one type (``gpu_type``), the GPUs are those of that
type's nodes; held among them are the holdings on those nodes, the pending holdings of
that type's services and of untyped ones (which Swarm may place on any node), and the
promises of that type and untyped ones: a GPU is never granted twice, whichever type
a spawn asks for.

Docker names the GPUs Swarm assigned to a task ``GenericResources`` on the task
object (its API reference calls them ``AssignedGenericResources``); both are read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import NamedTuple

from pdl_spawner.swarm.specs import GPU_TYPE_LABEL, LABEL_PREFIX
from pdl_spawner.swarm.state import ACTIVE_TASK_STATES, PLACED_TASK_STATES, service_replicas
from pdl_spawner.core.usage import WorkerUsage

#: The gpu of a holding whose task Swarm has not placed yet.
PENDING = "(pending)"
#: Holder name for GPUs reserved by services that are not PDL's engines.
OTHER_SERVICES = "other services"

_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))$"
)


@dataclass(frozen=True)
class GpuHolding:
    """One GPU held by a PDL engine task: the GPU's id (:data:`PENDING` before Swarm
    placed the task), the node's hostname, the ledger-style ``owner`` (``"user"`` or
    ``"user/server"``), the ``user``, ``since`` (epoch seconds: when the task
    reached its current state, e.g. running) and ``gpu_type``: its node's type once
    placed, before that the type its service asked for ("": untyped, or any)."""

    gpu: str
    node: str
    owner: str
    user: str
    since: float
    gpu_type: str = ""

    def counts_for(self, gpu_type: str) -> bool:
        """Whether this holding takes a GPU of type ``gpu_type`` ("": any type): a
        pending holding of no type might, wherever Swarm places it."""
        return not gpu_type or self.gpu_type == gpu_type or (self.gpu == PENDING and not self.gpu_type)


class Promise(NamedTuple):
    """GPUs granted to a spawn whose engine tasks do not all exist yet."""

    user: str
    gpus: int
    gpu_type: str = ""  #: the type the spawn asked for ("": any)

    def counts_for(self, gpu_type: str) -> bool:
        """Whether the promise takes GPUs of type ``gpu_type`` ("": any type)."""
        return not gpu_type or self.gpu_type in ("", gpu_type)


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
    """Whether ``task`` holds (or waits for) its resources, as Swarm's scheduler counts
    them: a task placed on a node (:data:`~pdl_spawner.swarm.state.PLACED_TASK_STATES`)
    holds them there until it has stopped, even once it is meant to stop (its service
    scaled to 0 or removed: its container may take seconds to end); a task not placed
    yet waits for them only while it is meant to run."""
    state = task.get("Status", {}).get("State")
    return state in PLACED_TASK_STATES or (task.get("DesiredState") == "running" and state in ACTIVE_TASK_STATES)


def node_gpu_type(node: dict) -> str:
    """The type of ``node``'s GPUs: its label ``pdl.gpu-type`` ("" without one)."""
    return (node.get("Spec", {}).get("Labels") or {}).get(GPU_TYPE_LABEL, "")


def declared_gpus(node: dict, resource: str) -> int:
    """GPUs ``node`` declares, whether or not it offers them now."""
    return _count(node.get("Description", {}).get("Resources", {}).get("GenericResources") or [], resource)


def gpu_types(nodes: list[dict], resource: str) -> list[str]:
    """The types of the GPUs ``nodes`` declare (a drained or down node's too, so that the
    choice stays while it is back), sorted; untyped GPUs name none."""
    return sorted({node_gpu_type(n) for n in nodes if declared_gpus(n, resource)} - {""})


def node_gpus(node: dict, resource: str) -> int:
    """GPUs (units of generic resource ``resource``) a ready, active node offers."""
    return declared_gpus(node, resource) if is_available(node) else 0


def task_gpus(task: dict, resource: str) -> int:
    """GPUs a task reserves while it is active (:func:`is_active`; 0 once it stopped)."""
    if not is_active(task):
        return 0
    return _count(task.get("Spec", {}).get("Resources", {}).get("Reservations", {}).get("GenericResources") or [],
                  resource)


def reserved_gpus(service: dict, resource: str) -> int:
    """GPUs each task of ``service`` reserves (its task template's reservations)."""
    template = service.get("Spec", {}).get("TaskTemplate", {})
    return _count(template.get("Resources", {}).get("Reservations", {}).get("GenericResources") or [], resource)


def _count(generic_resources: list[dict], resource: str) -> int:
    n = 0
    for r in generic_resources:
        if (r.get("NamedResourceSpec") or {}).get("Kind") == resource:
            n += 1
        elif (r.get("DiscreteResourceSpec") or {}).get("Kind") == resource:
            n += int(r["DiscreteResourceSpec"].get("Value", 0))
    return n


def _labels(service: dict) -> dict:
    return service.get("Spec", {}).get("Labels") or {}


def _owner(service: dict) -> tuple[str, str]:
    """(owner, user) of a PDL service, from its labels."""
    labels = _labels(service)
    owner = labels.get(LABEL_PREFIX + "owner") or labels.get(LABEL_PREFIX + "user") or ""
    return owner, labels.get(LABEL_PREFIX + "user") or owner.partition("/")[0]


def _natural(text: str) -> tuple:
    """A sort key that orders digit runs by value (``GPU-fake-2`` before ``GPU-fake-10``)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text) if part)


def _task_since(task: dict) -> float:
    """When ``task`` reached its current state (``Status.Timestamp``), else when it (or a
    service) was last updated or created; 0.0 when it carries no time at all."""
    for text in (task.get("Status", {}).get("Timestamp"), task.get("UpdatedAt"), task.get("CreatedAt")):
        since = parse_timestamp(text)
        if since is not None:
            return since
    return 0.0


def gpu_holdings(nodes: list[dict], services: list[dict], tasks: list[dict], resource: str, *,
                 starting: frozenset[str] | set[str] = frozenset()) -> list[GpuHolding]:
    """One :class:`GpuHolding` per GPU held by a PDL engine service (see the module
    docstring for what counts), sorted by node, then GPU (digit runs by value);
    pending holdings last. ``starting``: owners whose spawn is in progress; their
    services hold only what their tasks do (the spawn's promise counts the rest)."""
    hosts = {n.get("ID"): hostname(n) for n in nodes}
    types = {n.get("ID"): node_gpu_type(n) for n in nodes}
    engines = {svc.get("ID"): svc for svc in services if _labels(svc).get(LABEL_PREFIX + "role") == "engine"}
    holdings = []
    by_service: dict[str, int] = {}
    for task in tasks:
        svc = engines.get(task.get("ServiceID"))
        if svc is None or not is_active(task):
            continue
        owner, user = _owner(svc)
        node_id = task.get("NodeID") or ""
        assigned = assigned_gpus(task, resource)
        kind = types.get(node_id, "") if assigned else _labels(svc).get(GPU_TYPE_LABEL, "")
        gpus = assigned or [PENDING] * task_gpus(task, resource)
        holdings.extend(GpuHolding(gpu, hosts.get(node_id) or node_id, owner, user, _task_since(task), kind)
                        for gpu in gpus)
        by_service[svc["ID"]] = by_service.get(svc["ID"], 0) + len(gpus)
    for sid, svc in engines.items():
        owner, user = _owner(svc)
        if owner in starting or not service_replicas(svc):
            continue
        missing = reserved_gpus(svc, resource) * service_replicas(svc) - by_service.get(sid, 0)
        kind = _labels(svc).get(GPU_TYPE_LABEL, "")
        holdings.extend(GpuHolding(PENDING, "", owner, user, _task_since(svc), kind) for _ in range(missing))
    return sorted(holdings, key=lambda h: (h.gpu == PENDING, _natural(h.node), _natural(h.gpu), h.owner, h.since))


def gpu_usage(
    nodes: list[dict], services: list[dict], tasks: list[dict], resource: str, *,
    promised: dict[str, Promise] | None = None, exclude_owner: str | None = None, gpu_type: str = "",
) -> WorkerUsage:
    """How many GPUs the swarm offers and who holds them: each PDL user their
    :func:`gpu_holdings`, :data:`OTHER_SERVICES` what other services' active tasks
    reserve, and ``promised`` (owner -> :class:`Promise`) what was granted to spawns whose
    engine tasks do not all exist yet. ``exclude_owner``'s own GPUs are not counted (a
    server replacing itself). ``gpu_type``: count that type's GPUs only (see the
    module docstring; "": every GPU)."""
    promised = promised or {}
    typed_nodes = [n for n in nodes if not gpu_type or node_gpu_type(n) == gpu_type]
    node_ids = {n.get("ID") for n in typed_nodes}
    holders: dict[str, int] = {}
    for h in gpu_holdings(nodes, services, tasks, resource, starting=set(promised)):
        if h.owner != exclude_owner and h.counts_for(gpu_type):
            holders[h.user] = holders.get(h.user, 0) + 1
    engines = {svc.get("ID") for svc in services if _labels(svc).get(LABEL_PREFIX + "role") == "engine"}
    others = sum(task_gpus(t, resource) for t in tasks if t.get("ServiceID") not in engines
                 and (not gpu_type or t.get("NodeID") in node_ids or not t.get("NodeID")))
    if others:
        holders[OTHER_SERVICES] = holders.get(OTHER_SERVICES, 0) + others
    for owner, promise in promised.items():
        if owner != exclude_owner and promise.counts_for(gpu_type):
            holders[promise.user] = holders.get(promise.user, 0) + promise.gpus
    return WorkerUsage(total=sum(node_gpus(n, resource) for n in typed_nodes), holders=holders)


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


def select_nodes(nodes: list[dict], names: list[str]) -> list[dict]:
    """The nodes whose hostname is in ``names`` (every node when ``names`` is empty).

    Raises ValueError, in one line naming the swarm's nodes, for a name that is not one
    (the spawner's check; the admin view lists such names as unavailable: :func:`pdl_nodes`).
    """
    if not names:
        return nodes
    known = {hostname(n): n for n in nodes}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"node(s) {', '.join(unknown)} not in the swarm; its nodes are: "
                         f"{', '.join(sorted(known)) or 'none'}")
    return [known[name] for name in names]


def excluded_hostnames(nodes: list[dict], names: list[str]) -> list[str]:
    """Hostnames of the swarm's nodes that ``names`` leaves out (none when it is empty)."""
    if not names:
        return []
    return sorted({hostname(n) for n in nodes} - set(names))


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
