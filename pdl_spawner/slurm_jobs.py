"""What Slurm says, read into PDL's terms: pure functions, no I/O.

:mod:`~pdl_spawner.slurm_cli` runs Slurm's own commands; this module builds their
argument lists and reads their one-line-per-record output (``scontrol -d -o show
job``, ``scontrol -o show node``) into :class:`SlurmJob` and :class:`SlurmNode`.
Slurm is the one source of truth for who holds which GPU: PDL keeps no table of its
own, it only reads these.

A PDL reservation is one batch job per user server, named :func:`job_name`, holding
one GPU per task (``--ntasks=N --gpus-per-task=1``: Slurm spreads the tasks over
nodes as it likes, and refuses at submission a request no node set could ever hold).
Its batch step only sleeps; the engines are job steps started into it by the user's
server (``srun --jobid``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .usage import WorkerUsage

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

_FIELD = re.compile(r"(?:^|\s)([A-Za-z_:/]+)=(\S*)")
_NODE_GRES = re.compile(r"\bNodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)")
_GPU_COUNT = re.compile(r"\bgpu(?::[\w.-]+)?:(\d+)")
_GPU_INDEXES = re.compile(r"\bgpu(?::[\w.-]+)?:\d+\(IDX:([\d,-]+)\)")


def job_name(user: str, server: str = "") -> str:
    """The name of the reservation job of ``user``'s server (``server``: a named one)."""
    return f"{JOB_NAME_PREFIX}{user}:{server}" if server else f"{JOB_NAME_PREFIX}{user}"


def sbatch_argv(name: str, gpus: int, *, partition: str = "", time_limit_min: int = 0, cpus_per_gpu: int = 1,
                extra: tuple[str, ...] = ()) -> list[str]:
    """``sbatch`` arguments for a reservation of ``gpus`` GPUs, one task each, under
    ``name``; the job's only step sleeps until it is cancelled or its time is up.
    ``time_limit_min``: minutes (0: the partition's default); ``cpus_per_gpu``: cores
    each engine gets; ``extra``: the admin's own
    sbatch options (e.g. ``--qos=lab``), never the user's."""
    argv = ["sbatch", "--parsable", f"--job-name={name}", f"--ntasks={gpus}", "--gpus-per-task=1",
            f"--cpus-per-task={cpus_per_gpu}", "--output=/dev/null", "--error=/dev/null", "--export=NONE",
            "--no-requeue"]
    if partition:
        argv.append(f"--partition={partition}")
    if time_limit_min:
        argv.append(f"--time={time_limit_min}")
    argv += list(extra)
    argv.append("--wrap=exec sleep infinity")
    return argv


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
    """One job as ``scontrol -d -o show job`` reports it."""

    id: int
    name: str
    user: str             #: the Unix account that owns it
    state: str            #: PENDING, RUNNING, COMPLETING, ...
    reason: str           #: why it waits ("None" when it does not)
    partition: str
    gpus: int             #: GPUs asked for (JOB_GRES, else the per-task request times tasks)
    priority: int = 0
    start_time: str = ""  #: when it started, or Slurm's estimate while pending ("" unknown)
    #: compressed node list -> GPU indexes on each of those nodes (running jobs)
    node_gpus: dict[str, list[int]] = field(default_factory=dict)

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


def _fields(line: str) -> dict[str, str]:
    return {k: v for k, v in _FIELD.findall(line)}


def _user(text: str) -> str:
    return text.split("(", 1)[0]


def parse_jobs(text: str) -> list[SlurmJob]:
    """Jobs from ``scontrol -d -o show job`` output (one job per line)."""
    jobs = []
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue
        f = _fields(line)
        gres = _GPU_COUNT.search(f.get("JOB_GRES", ""))
        per_task = _GPU_COUNT.search(f.get("TresPerTask", ""))
        tasks = int(f.get("NumTasks", "1") or 1) if f.get("NumTasks", "").isdigit() else 1
        if gres:
            gpus = int(gres.group(1))
        elif per_task:
            gpus = int(per_task.group(1)) * tasks
        else:
            total = _GPU_COUNT.search(f.get("TresPerJob", "") + " " + f.get("TresPerNode", ""))
            gpus = int(total.group(1)) if total else 0
        node_gpus = {}
        for nodes, node_gres in _NODE_GRES.findall(line):
            idx = _GPU_INDEXES.search(node_gres)
            node_gpus[nodes] = expand_indexes(idx.group(1)) if idx else []
        start = f.get("StartTime", "")
        jobs.append(SlurmJob(
            id=int(f["JobId"]), name=f.get("JobName", ""), user=_user(f.get("UserId", "")),
            state=f.get("JobState", ""), reason=f.get("Reason", "None"), partition=f.get("Partition", ""),
            gpus=gpus, priority=int(f["Priority"]) if f.get("Priority", "").isdigit() else 0,
            start_time="" if start in ("Unknown", "None", "N/A") else start, node_gpus=node_gpus,
        ))
    return jobs


@dataclass(frozen=True)
class SlurmNode:
    """One node as ``scontrol -o show node`` reports it."""

    name: str
    addr: str
    gpus: int                 #: GPUs it declares (Gres=gpu:N)
    state: str                #: IDLE, MIXED, ALLOCATED, DOWN*, DRAIN, ...
    partitions: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        """False for a node Slurm will not give jobs to (down, drained, failing)."""
        return not any(word in self.state for word in ("DOWN", "DRAIN", "FAIL", "INVAL", "NOT_RESPONDING"))


def parse_nodes(text: str) -> list[SlurmNode]:
    """Nodes from ``scontrol -o show node`` output (one node per line)."""
    nodes = []
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue
        f = _fields(line)
        gres = _GPU_COUNT.search(f.get("Gres", ""))
        nodes.append(SlurmNode(name=f["NodeName"], addr=f.get("NodeAddr", ""), gpus=int(gres.group(1)) if gres else 0,
                               state=f.get("State", ""), partitions=tuple(p for p in f.get("Partitions", "").split(",")
                                                                          if p)))
    return nodes


def in_partition(partition: str, nodes: list[SlurmNode], default: str = "") -> list[SlurmNode]:
    """The nodes of ``partition`` ("" : ``default``, else every node)."""
    name = partition or default
    return [n for n in nodes if not name or name in n.partitions]


def gpu_usage(nodes: list[SlurmNode], jobs: list[SlurmJob], *, partition: str = "", default_partition: str = "",
              exclude_job: int | None = None, users: dict[str, str] | None = None) -> WorkerUsage:
    """The GPUs of the partition's usable nodes and who holds them, from Slurm's view:
    every holding job there counts, PDL's or not. ``exclude_job``: the asking server's
    own; ``users``: Unix account -> the name to show (hub user), others shown as is."""
    names = partition or default_partition
    total = sum(n.gpus for n in in_partition(partition, nodes, default_partition) if n.usable)
    holders: dict[str, int] = {}
    for job in jobs:
        if job.holding and job.gpus and job.id != exclude_job and (not names or job.partition == names):
            who = (users or {}).get(job.user, job.user)
            holders[who] = holders.get(who, 0) + job.gpus
    return WorkerUsage(total=total, holders=holders)


def queue_position(job: SlurmJob, jobs: list[SlurmJob]) -> int:
    """1 + the pending jobs of the same partition Slurm would consider first (higher
    priority, then earlier id)."""
    ahead = [j for j in jobs if j.waiting and j.partition == job.partition and j.id != job.id
             and (j.priority, -j.id) > (job.priority, -job.id)]
    return 1 + len(ahead)


def pending_message(job: SlurmJob, jobs: list[SlurmJob]) -> str:
    """One line for a spawn waiting in Slurm's queue: Slurm's reason, the position,
    and the estimated start when Slurm gives one."""
    start = f"; Slurm expects it to start at {job.start_time}" if job.start_time else ""
    return (f"Waiting in Slurm's queue for {job.gpus} GPU(s): job {job.id}, number "
            f"{queue_position(job, jobs)} in partition {job.partition}, reason {job.reason}{start}. "
            f"Cancel to leave the queue.")


def default_partition(scontrol_partitions: str) -> str:
    """The partition marked ``Default=YES`` in ``scontrol -o show partition`` output ("" if none)."""
    for line in scontrol_partitions.splitlines():
        f = _fields(line)
        if f.get("Default") == "YES":
            return f.get("PartitionName", "")
    return ""
