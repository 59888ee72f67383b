"""What Slurm says, read into PDL's terms: pure functions, no I/O.

:mod:`~pdl_spawner.slurm.cli` runs Slurm's own commands; this module builds their
argument lists and reads their JSON (``squeue --json``, ``sinfo --json``: Slurm 21.08
or later; both the 0.0.38 schema of 22.05 and the newer number and state forms) into
:class:`SlurmJob` and :class:`SlurmNode`. JSON, not the ``key=value`` text of
``scontrol``, because users choose job names and paths: in text, a name such as
``x JobId=9 UserId=root(0)`` would pose as other fields.
Slurm is the one source of truth for who holds which GPU: PDL keeps no table of its
own, it only reads these.

A PDL reservation is one batch job per user server, named :func:`job_name`, holding
one GPU per task (``--ntasks=N --gpus-per-task=1``: Slurm spreads the tasks over
nodes as it likes, and refuses at submission a request no node set could ever hold).
Its batch step only sleeps; the engines are job steps started into it by the user's
server (``srun --jobid``).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

from pdl_spawner.core.usage import GpuReading, WorkerUsage, gpu_reading

#: Prefix of the names of PDL's reservation jobs: ``pdl:<hub user>[:<server name>]``.
JOB_NAME_PREFIX = "pdl:"

#: Pending reasons that will not clear by waiting: the request breaks a limit of the
#: partition or the cluster, or asks for nodes that are not there (Slurm's own words).
NEVER_REASONS = (
    "PartitionNodeLimit", "PartitionTimeLimit", "PartitionDown", "PartitionInactive", "BadConstraints",
    "ReqNodeNotAvail", "InvalidQOS", "InvalidAccount", "QOSJobLimit", "AssocMaxJobsLimit",
    "JobHeldAdmin", "JobHeldUser",
)

#: Job states in which a job holds (or is about to hold) its GPUs.
HOLDING_STATES = ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED")
#: Job states of a job still in the queue.
WAITING_STATES = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING")

#: One GPU entry of a GRES or TRES text: its type (None: untyped) and count, e.g.
#: ``gpu:a100:2(S:0-1)``, ``gpu:2``, ``gres:gpu:a100:1``, ``gres/gpu:a100=2``.
_GPU_ENTRY = re.compile(r"\bgpu(?::([\w.-]+?))?[:=](\d+)(?![\w.-])")
_GPU_INDEXES = re.compile(r"\bgpu(?::[\w.-]+)?:\d+\(IDX:([\d,-]+)\)")


def gpu_types(text: str) -> dict[str, int]:
    """GPU type -> count of every GPU entry of a GRES or TRES text (``""``: untyped),
    e.g. ``"gpu:a100:2(S:0),gpu:t4:1"`` -> ``{"a100": 2, "t4": 1}``."""
    found: dict[str, int] = {}
    for kind, count in _GPU_ENTRY.findall(str(text or "")):
        found[kind] = found.get(kind, 0) + int(count)
    return found


def job_name(user: str, server: str = "") -> str:
    """The name of the reservation job of ``user``'s server (``server``: a named one)."""
    return f"{JOB_NAME_PREFIX}{user}:{server}" if server else f"{JOB_NAME_PREFIX}{user}"


#: The hub's default prefix of its users' Unix accounts (``PDLLocalSpawner.account_prefix``).
DEFAULT_ACCOUNT_PREFIX = "pdl-"


def pdl_owner(name: str, account: str, account_prefix: str = DEFAULT_ACCOUNT_PREFIX) -> tuple[str, str] | None:
    """(hub user, server name) of a job named ``name`` of the Unix ``account`` when it
    is one of PDL's reservations: named ``pdl:<user>[:<server>]`` and owned by that
    user's account (``account_prefix`` + user). None for any other job, also one a user
    named after someone else (a job's name is the submitter's to choose, its account is not)."""
    if not name.startswith(JOB_NAME_PREFIX):
        return None
    user, _, server = name[len(JOB_NAME_PREFIX):].partition(":")
    if not user or account != f"{account_prefix}{user}":
        return None
    return user, server


def pdl_job_owner(job: SlurmJob, account_prefix: str = DEFAULT_ACCOUNT_PREFIX) -> tuple[str, str] | None:
    """:func:`pdl_owner` of a job ``squeue`` listed."""
    return pdl_owner(job.name, job.user, account_prefix)


def sbatch_argv(name: str, gpus: int, *, partition: str = "", time_limit_min: int = 0, cpus_per_gpu: int = 1,
                account: str = "", extra: tuple[str, ...] = (), gpu_type: str = "") -> list[str]:
    """``sbatch`` arguments for a reservation of ``gpus`` GPUs, one task each, under
    ``name``; the job's only step sleeps until it is cancelled or its time is up.
    ``time_limit_min``: minutes (0: the partition's default); ``cpus_per_gpu``: cores
    each engine gets; ``account``: the Slurm account charged ("": the user's default);
    ``extra``: the admin's own sbatch options (e.g. ``--qos=lab``), never the user's;
    ``gpu_type``: a GRES type each GPU must be (``--gpus-per-task=a100:1``; "": any)."""
    per_task = f"{gpu_type}:1" if gpu_type else "1"
    argv = ["sbatch", "--parsable", f"--job-name={name}", f"--ntasks={gpus}", f"--gpus-per-task={per_task}",
            f"--cpus-per-task={cpus_per_gpu}", "--output=/dev/null", "--error=/dev/null", "--export=NONE",
            "--no-requeue"]
    if partition:
        argv.append(f"--partition={partition}")
    if time_limit_min:
        argv.append(f"--time={time_limit_min}")
    if account:
        argv.append(f"--account={account}")
    argv += list(extra)
    argv.append("--wrap=exec sleep infinity")
    return argv


def gpu_use_argv(job: SlurmJob, nvidia_smi: str = "nvidia-smi") -> list[str]:
    """``srun`` arguments for a step into running ``job`` (beside its engines:
    ``--overlap``), one task on each of its nodes, each printing the use (percent) and
    memory (in use, in all: MiB) of the GPUs the job holds there, one line per GPU:
    ``nvidia-smi`` (the admin's path, run
    as the job's user without the user's environment) for the step's
    ``CUDA_VISIBLE_DEVICES``, which names the job's GPUs in ``nvidia-smi``'s numbering
    whether or not Slurm constrains devices."""
    nodes = sorted(job.node_gpus)
    return ["srun", f"--jobid={job.id}", "--overlap", f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}",
            "--ntasks-per-node=1", "--quiet", "--export=NONE", "/bin/sh", "-c",
            'exec "$0" --id="$CUDA_VISIBLE_DEVICES" --query-gpu=utilization.gpu,memory.used,memory.total '
            '--format=csv,noheader,nounits',
            nvidia_smi]


def parse_gpu_readings(output: str, job: SlurmJob) -> list[GpuReading] | None:
    """The readings :func:`gpu_use_argv`'s step printed, one per GPU of ``job`` (a line of
    use alone is a reading without memory); None when they are not one reading per GPU it
    holds (a node did not answer, a use of ``[N/A]``)."""
    readings = [gpu_reading([v.strip() for v in line.split(",")]) for line in output.splitlines() if line.strip()]
    wanted = sum(len(indexes) for indexes in job.node_gpus.values())
    if not readings or len(readings) != wanted or any(r is None for r in readings):
        return None
    return readings


def parse_job_id(sbatch_stdout: str) -> int:
    """The job id from ``sbatch --parsable`` output (``"123"`` or ``"123;cluster"``)."""
    text = sbatch_stdout.strip().splitlines()[-1] if sbatch_stdout.strip() else ""
    head = text.split(";")[0]
    if not head.isdigit():
        raise ValueError(f"sbatch printed no job id: {sbatch_stdout.strip()[:200]!r}")
    return int(head)


def expand_indexes(text: str) -> list[int]:
    """``"0,2-3"`` -> ``[0, 2, 3]`` (the GPU indexes of ``GRES=gpu:3(IDX:0,2-3)``)."""
    found = []
    for part in text.split(","):
        if "-" in part:
            low, high = part.split("-", 1)
            found += range(int(low), int(high) + 1)
        elif part:
            found.append(int(part))
    return found


@dataclass(frozen=True)
class SlurmJob:
    """One job as ``squeue --json`` reports it."""

    id: int
    name: str
    user: str             #: the Unix account that owns it
    state: str            #: PENDING, RUNNING, COMPLETING, ...
    reason: str           #: why it waits ("None" when it does not)
    partition: str
    gpus: int             #: GPUs it holds (running) or asks for (pending)
    priority: int = 0
    start_time: float = 0.0  #: epoch s it started, or Slurm's estimate while pending (0: unknown)
    #: node -> GPU indexes it holds there (running jobs)
    node_gpus: dict[str, list[int]] = field(default_factory=dict)
    #: the GPU type it holds (running) or asks for (pending), as Slurm's GRES names it;
    #: "" for untyped GPUs, a request for any type, or more than one type
    gpu_type: str = ""

    @property
    def holding(self) -> bool:
        return self.state in HOLDING_STATES

    @property
    def waiting(self) -> bool:
        return self.state in WAITING_STATES

    @property
    def never_starts(self) -> bool:
        """True when it waits for something waiting will not bring (:data:`NEVER_REASONS`)."""
        return self.waiting and self.reason.split(",")[0] in NEVER_REASONS


def _number(value) -> float:
    """A JSON number of Slurm's REST schema: a plain number, or (newer versions)
    ``{"set": bool, "infinite": bool, "number": n}``; 0 when unset."""
    if isinstance(value, dict):
        return float(value.get("number", 0)) if value.get("set", True) and not value.get("infinite") else 0.0
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0


def _word(value) -> str:
    """A state of Slurm's REST schema: a string, or (newer versions) a list of them."""
    if isinstance(value, list):
        return str(value[0]) if value else ""
    return str(value or "")


def _requested_gpus(job: dict) -> tuple[int, str]:
    """GPUs a job asks for (per task times tasks, per node times nodes, or per job) and
    their type ("" : any, or several)."""
    for key, times in (("tres_per_task", _number(job.get("tasks")) or 1),
                       ("tres_per_node", _number(job.get("node_count")) or 1), ("tres_per_job", 1)):
        found = gpu_types(job.get(key))
        if found:
            return sum(found.values()) * int(times), _one_type(found)
    return 0, ""


def _one_type(types: dict[str, int]) -> str:
    """The one type of ``types`` (type -> count), or "" for untyped or several."""
    return next(iter(types)) if len(types) == 1 else ""


def _held_gpus(job: dict) -> dict[str, list[int]]:
    """Node -> GPU indexes a running job holds there: ``gres_detail`` lists one entry per
    allocated node, in the order of ``job_resources.allocated_nodes``."""
    resources = job.get("job_resources") or {}
    names = [n.get("nodename", "") for n in resources.get("allocated_nodes") or [] if isinstance(n, dict)]
    held = {}
    for name, detail in zip(names, job.get("gres_detail") or []):
        held[name] = [index for found in _GPU_INDEXES.findall(str(detail)) for index in expand_indexes(found)]
    return held


def _held_type(job: dict) -> str:
    """The one GPU type of a job's allocation (``gres_detail``), "" for untyped or several."""
    types: dict[str, int] = {}
    for detail in job.get("gres_detail") or []:
        for kind, count in gpu_types(detail).items():
            types[kind] = types.get(kind, 0) + count
    return _one_type(types)


def parse_jobs(text: str) -> list[SlurmJob]:
    """Jobs from ``squeue --json`` output. Every field is a JSON value of its own, so
    text a user chose (a job name, a path) cannot pose as another field."""
    jobs = []
    for job in json.loads(text).get("jobs", []):
        held = _held_gpus(job)
        held_count = sum(len(v) for v in held.values())
        requested, requested_type = _requested_gpus(job)
        jobs.append(SlurmJob(
            id=int(_number(job.get("job_id"))), name=str(job.get("name") or ""), user=str(job.get("user_name") or ""),
            state=_word(job.get("job_state")), reason=str(job.get("state_reason") or "None"),
            partition=str(job.get("partition") or ""), gpus=held_count or requested,
            priority=int(_number(job.get("priority"))), start_time=_number(job.get("start_time")), node_gpus=held,
            gpu_type=_held_type(job) if held_count else requested_type,
        ))
    return jobs


@dataclass(frozen=True)
class SlurmNode:
    """One node as ``sinfo --json`` reports it."""

    name: str
    addr: str
    gpus: int                 #: GPUs it declares (gres gpu:N, or gpu:<type>:N of each type)
    state: str                #: idle, mixed, allocated, down, drain, ... (lower case)
    partitions: tuple[str, ...] = ()
    #: its GPUs by type, as its gres names them ("" : untyped)
    gpu_types: dict[str, int] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        """False for a node Slurm will not give jobs to (down, drained, failing)."""
        return not any(word in self.state.upper() for word in ("DOWN", "DRAIN", "FAIL", "INVAL", "NOT_RESPONDING"))


def parse_nodes(text: str) -> list[SlurmNode]:
    """Nodes from ``sinfo --json`` output (each once)."""
    nodes, seen = [], set()
    for node in json.loads(text).get("nodes", []):
        name = str(node.get("name") or "")
        if not name or name in seen:
            continue
        seen.add(name)
        types = gpu_types(node.get("gres"))
        state = node.get("state")
        words = [str(w) for w in state] if isinstance(state, list) else [str(state or "")]
        words += [str(f) for f in node.get("state_flags") or []]
        nodes.append(SlurmNode(name=name, addr=str(node.get("address") or ""), gpus=sum(types.values()),
                               state="+".join(w for w in words if w),
                               partitions=tuple(str(p) for p in node.get("partitions") or []), gpu_types=types))
    return nodes


def in_partition(partition: str, nodes: list[SlurmNode], default: str = "") -> list[SlurmNode]:
    """The nodes of ``partition`` ("" : ``default``, else every node)."""
    name = partition or default
    return [n for n in nodes if not name or name in n.partitions]


def gpu_usage(nodes: list[SlurmNode], jobs: list[SlurmJob], *, partition: str = "", default_partition: str = "",
              exclude_job: int | None = None, users: dict[str, str] | None = None,
              gpu_type: str = "") -> WorkerUsage:
    """The GPUs of the partition's usable nodes and who holds them, from Slurm's view:
    every holding job there counts, PDL's or not. ``exclude_job``: the asking server's
    own; ``users``: Unix account -> the name to show (hub user), others shown as is;
    ``gpu_type``: only the GPUs of that type and the jobs that hold it ("": all)."""
    names = partition or default_partition
    usable = [n for n in in_partition(partition, nodes, default_partition) if n.usable]
    total = sum(n.gpu_types.get(gpu_type, 0) if gpu_type else n.gpus for n in usable)
    holders: dict[str, int] = {}
    for job in jobs:
        if gpu_type and job.gpu_type != gpu_type:
            continue
        if job.holding and job.gpus and job.id != exclude_job and (not names or job.partition == names):
            who = (users or {}).get(job.user, job.user)
            holders[who] = holders.get(who, 0) + job.gpus
    return WorkerUsage(total=total, holders=holders)


def partition_gpu_types(nodes: list[SlurmNode], *, partition: str = "", default_partition: str = "") -> list[str]:
    """The GPU types of the partition's usable nodes, sorted; [] where its GPUs are untyped."""
    return sorted({kind for n in in_partition(partition, nodes, default_partition) if n.usable
                   for kind in n.gpu_types if kind})


def queue_position(job: SlurmJob, jobs: list[SlurmJob]) -> int:
    """1 + the pending jobs of the same partition Slurm would consider first (higher
    priority, then earlier id)."""
    ahead = [j for j in jobs if j.waiting and j.partition == job.partition and j.id != job.id
             and (j.priority, -j.id) > (job.priority, -job.id)]
    return 1 + len(ahead)


def pending_message(job: SlurmJob, jobs: list[SlurmJob]) -> str:
    """One line for a spawn waiting in Slurm's queue: Slurm's reason, the position,
    and the estimated start when Slurm gives one."""
    start = (f"; Slurm expects it to start at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(job.start_time))}"
             if job.start_time else "")
    gpus = f"{job.gpus} {job.gpu_type} GPU(s)" if job.gpu_type else f"{job.gpus} GPU(s)"
    return (f"Waiting in Slurm's queue for {gpus}: job {job.id}, number "
            f"{queue_position(job, jobs)} in partition {job.partition}, reason {job.reason}{start}. "
            f"Cancel to leave the queue.")


def default_partition(scontrol_partitions: str) -> str:
    """The partition marked ``Default=YES`` in ``scontrol -o show partition`` output ("" if
    none). Its words are the admin's (partition names hold no spaces)."""
    for line in scontrol_partitions.splitlines():
        words = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if words.get("Default") == "YES":
            return words.get("PartitionName", "")
    return ""
