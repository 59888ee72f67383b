"""The Slurm QOS that applies to a user's PDL jobs, and what it lets them hold (pure:
``sacctmgr``'s output in, a :class:`QosLimits` out). The spawn form and the user's
Cluster panel show it, so that Slurm's limits are seen before Slurm refuses a job.

Which QOS: the admin's ``--qos`` among the spawner's ``sbatch_args``, else the default
QOS of the user's association (in the spawner's Slurm account when it has one), else
Slurm's own default, ``normal``.
"""

from __future__ import annotations

from dataclasses import dataclass

#: ``sacctmgr list qos NAME format=...``: the fields read, in this order.
QOS_FIELDS = ("Name", "MaxTRESPU", "MaxTRES", "MaxWall", "MaxJobsPU")
#: ``sacctmgr list associations users=USER format=...``: the fields read, in this order.
ASSOCIATION_FIELDS = ("Account", "DefaultQOS")
#: Slurm's QOS where neither the admin nor the association names one.
DEFAULT_QOS = "normal"


@dataclass(frozen=True)
class QosLimits:
    """One QOS's limits on a user: GPUs at once over all their jobs, GPUs a job,
    a job's time (Slurm's words, ``D-HH:MM:SS``), jobs at once; None where it sets none."""

    name: str
    gpus_per_user: int | None = None
    gpus_per_job: int | None = None
    max_wall: str | None = None
    jobs_per_user: int | None = None

    @property
    def gpu_cap(self) -> int | None:
        """The most GPUs one PDL server can hold under this QOS (None: no cap)."""
        caps = [c for c in (self.gpus_per_user, self.gpus_per_job) if c is not None]
        return min(caps) if caps else None

    def note(self) -> str:
        """One line for the user: ``"Slurm QOS lab: at most 2 GPUs per user, jobs of at
        most 1-00:00:00."``"""
        parts = []
        if self.gpus_per_user is not None:
            parts.append(f"at most {self.gpus_per_user} GPUs per user")
        if self.gpus_per_job is not None:
            parts.append(f"at most {self.gpus_per_job} GPUs a job")
        if self.jobs_per_user is not None:
            parts.append(f"at most {self.jobs_per_user} jobs at once per user")
        if self.max_wall is not None:
            parts.append(f"jobs of at most {self.max_wall}")
        return f"Slurm QOS {self.name}: {', '.join(parts) if parts else 'no limits of its own'}."


def tres_gpus(tres: str) -> int | None:
    """The GPU count of a TRES list (``"cpu=8,gres/gpu=2"`` -> 2), None without one.
    Only the untyped ``gres/gpu``: a typed count (``gres/gpu:a100=1``) limits one kind."""
    for item in tres.split(","):
        name, _, value = item.partition("=")
        if name.strip() == "gres/gpu" and value.strip().isdigit():
            return int(value)
    return None


def parse_qos(name: str, output: str) -> QosLimits:
    """The QOS ``name`` from ``sacctmgr --noheader --parsable2 list qos NAME
    format=<QOS_FIELDS>``; ValueError (one line) when Slurm knows no such QOS."""
    for line in output.splitlines():
        values = line.split("|")
        if len(values) >= len(QOS_FIELDS) and values[0] == name:
            fields = dict(zip(QOS_FIELDS, values))
            jobs = fields["MaxJobsPU"].strip()
            return QosLimits(name=name, gpus_per_user=tres_gpus(fields["MaxTRESPU"]),
                             gpus_per_job=tres_gpus(fields["MaxTRES"]), max_wall=fields["MaxWall"].strip() or None,
                             jobs_per_user=int(jobs) if jobs.isdigit() else None)
    raise ValueError(f"Slurm has no QOS named {name!r}")


def qos_of(sbatch_args: list[str] | tuple[str, ...], associations: str, account: str = "") -> str:
    """The QOS a PDL job runs under: the admin's ``--qos`` (the last one wins, as with
    sbatch), else the default QOS of the association in ``account`` ("" : the user's
    first), from ``sacctmgr --noheader --parsable2 list associations users=USER
    format=<ASSOCIATION_FIELDS>``, else :data:`DEFAULT_QOS`."""
    chosen = None
    for k, arg in enumerate(sbatch_args):
        if arg.startswith("--qos="):
            chosen = arg.split("=", 1)[1]
        elif arg in ("--qos", "-q") and k + 1 < len(sbatch_args):
            chosen = sbatch_args[k + 1]
    if chosen:
        return chosen
    for line in associations.splitlines():
        values = line.split("|")
        if len(values) >= len(ASSOCIATION_FIELDS) and (not account or values[0] == account) and values[1].strip():
            return values[1].strip()
    return DEFAULT_QOS
