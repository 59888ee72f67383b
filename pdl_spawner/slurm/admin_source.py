"""The admin view's source for Slurm (:class:`~pdl_spawner.slurm.PDLSlurmSpawner`).

Slurm is the one source of who holds what, read through its own commands
(:mod:`pdl_spawner.slurm.cli`, parsed by :mod:`pdl_spawner.slurm.jobs`); the one file is
the hub's flags on GPUs held idle, which Slurm does not know. The holdings are the GPUs of every
job that holds some (``squeue --all --json``; PDL's jobs, named ``pdl:<hub
user>[:<server>]``, show the hub user, any other job its Unix account), each on the
node Slurm names for it, since the job's start time. The pool is every GPU of the
nodes of PDL's partition (``sinfo --json``; Slurm's default partition from ``scontrol
-o show partition`` when PDL names none), as ``"<node>/gpu:<index>"``; the queue is
Slurm's pending jobs that ask for GPUs, with Slurm's reason and the position in their
partition. There is no reclaims table: a reclaim cancels the job, and the hub's log
records it. When Slurm cannot be read (or its output cannot be understood) the page
says so in one line. Its settings (:func:`reader`) come from the hub's final config
(:func:`pdl_spawner.slurm.kind.admin_settings`): the accounts' prefix (a job is PDL's,
and shown as a hub user's, only when its name and its account agree), PDL's partition,
the flags' file, and where Slurm's commands and configuration are.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from functools import partial
from html import escape

from pdl_spawner.admin.frame import (
    PageParts, duration_text, gpu_idle_rows, gpu_idle_section, gpu_name, iso_utc, nodes_summary, table_html, typed,
)
from pdl_spawner.core.reservations import SlotLedger
from pdl_spawner.slurm.accounting import SlurmAccounting
from pdl_spawner.slurm.cli import SlurmCommands, SlurmError
from pdl_spawner.slurm.jobs import DEFAULT_ACCOUNT_PREFIX, SlurmJob, SlurmNode, in_partition, pdl_job_owner, queue_position

#: What the Slurm page says instead of a reclaims table.
SLURM_RECLAIMS_NOTE = ("PDL keeps no log of its own on Slurm: a reclaim (idle engines giving their GPUs back) "
                       "cancels the server's Slurm job, and the hub's log records each cancelled job.")


def slurm_job_owner(job: SlurmJob, account_prefix: str = DEFAULT_ACCOUNT_PREFIX) -> tuple[str, str, str]:
    """(owner, hub user, server name) of a job: for one of PDL's reservations
    (:func:`~pdl_spawner.slurm.jobs.pdl_job_owner`: its name and its account agree),
    owner ``"user"`` or ``"user/server"``; else the job's Unix account as owner and
    user, server ``""`` (also for a job named after another user)."""
    found = pdl_job_owner(job, account_prefix)
    if found is None:
        return job.user, job.user, ""
    user, server = found
    return (f"{user}/{server}" if server else user), user, server


def job_columns(job: SlurmJob, account_prefix: str) -> dict:
    """The columns every row of a job has: :func:`slurm_job_owner`'s, ``account``, ``job``,
    ``pdl``, ``partition`` and ``gpu_type`` (the GRES type it holds or asks for; "": untyped or any)."""
    owner, user, server = slurm_job_owner(job, account_prefix)
    return {"owner": owner, "user": user, "server": server, "account": job.user, "job": job.id,
            "pdl": pdl_job_owner(job, account_prefix) is not None, "partition": job.partition,
            "gpu_type": job.gpu_type}



def node_order(name: str) -> list:
    """Sort key of node names with their numbers in numeric order (``n2`` before ``n10``)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def slurm_reservation_rows(jobs: list[SlurmJob], now: float,
                           account_prefix: str = DEFAULT_ACCOUNT_PREFIX) -> list[dict]:
    """One row per GPU a job holds (running, completing or suspended; PDL's jobs and
    every other), by node then GPU: ``slot`` (``"gpu:<index>"`` on its node, ``"gpu:?"``
    where Slurm did not say), ``node`` (``""`` where Slurm did not say), ``state``, the
    columns of :func:`slurm_job_owner` plus ``account`` (the Unix account), ``job``
    (its id), ``pdl`` (a PDL reservation) and ``partition``; ``since`` (the job's start
    time, ISO UTC, ``""`` unknown) and ``held_s`` (whole seconds at ``now``, epoch
    seconds; None unknown)."""
    rows = []
    for job in jobs:
        if not (job.holding and job.gpus):
            continue
        since = job.start_time or None
        placed = [(node, f"gpu:{index}") for node, indexes in job.node_gpus.items() for index in indexes]
        placed += [("", "gpu:?")] * (job.gpus - len(placed))
        for node, slot in placed:
            rows.append({"slot": slot, "node": node, "state": job.state, **job_columns(job, account_prefix),
                         "since": iso_utc(since) if since is not None else "",
                         "held_s": max(0, int(now - since)) if since is not None else None})
    return sorted(rows, key=lambda r: (r["node"] == "", node_order(r["node"]), node_order(r["slot"]), r["job"]))


def slurm_queue_rows(jobs: list[SlurmJob], account_prefix: str = DEFAULT_ACCOUNT_PREFIX) -> list[dict]:
    """One row per pending job that asks for GPUs, by partition then Slurm's order:
    ``position`` in its partition (:func:`~pdl_spawner.slurm.jobs.queue_position`), the
    columns of :func:`slurm_reservation_rows` but the slot, node and times, ``gpus``
    asked for, Slurm's ``reason``, ``never_starts`` (a reason waiting will not clear) and
    ``expected_start`` (Slurm's estimate, ISO UTC; ``""`` when it gives none)."""
    rows = []
    for job in jobs:
        if not (job.waiting and job.gpus):
            continue
        rows.append({"position": queue_position(job, jobs), **job_columns(job, account_prefix), "gpus": job.gpus,
                     "reason": job.reason, "never_starts": job.never_starts,
                     "expected_start": iso_utc(job.start_time) if job.start_time else ""})
    return sorted(rows, key=lambda r: (r["partition"], r["position"], r["job"]))


def slurm_status_model(
    jobs: list[SlurmJob], nodes: list[SlurmNode], now: float, *,
    partition: str = "", default_partition: str = "", error: str | None = None,
    account_prefix: str = DEFAULT_ACCOUNT_PREFIX, gpu_idle: dict[str, float] | None = None,
) -> dict:
    """Everything the view shows on Slurm, JSON-ready: ``source`` (``"slurm"``),
    ``partition`` (PDL's: ``partition``, else ``default_partition``; ``""``: every
    node), ``nodes`` (its nodes' names) and ``unavailable`` (those Slurm gives no jobs
    now: down, drained...), ``now`` (ISO UTC), ``pool`` (every GPU of its nodes, as
    ``"<node>/gpu:<index>"``) and ``free`` (those on available nodes no job holds),
    ``reservations`` (:func:`slurm_reservation_rows`), ``queue``
    (:func:`slurm_queue_rows`) and ``error``: None, or why Slurm could not be read
    (then ``pool`` and ``free`` are None). No ``reclaims``: Slurm keeps no PDL log
    (:data:`SLURM_RECLAIMS_NOTE`). ``now`` is epoch seconds; ``account_prefix``: the
    hub's users' account prefix, which tells PDL's jobs from others'. ``gpu_idle``: the
    hub's flags on GPUs held idle (owner -> since, epoch s), shown as ``gpu_idle`` rows
    (:func:`~pdl_spawner.admin.frame.gpu_idle_rows`) for a PDL job of that owner that
    holds GPUs and started before the flag's time (an older job's flag is not its)."""
    mine = sorted(in_partition(partition, nodes, default_partition), key=lambda n: node_order(n.name))
    reservations = slurm_reservation_rows(jobs, now, account_prefix)
    held = {gpu_name(r["node"], r["slot"]) for r in reservations}
    pool = [gpu_name(n.name, f"gpu:{i}") for n in mine for i in range(n.gpus)]
    usable = {gpu_name(n.name, f"gpu:{i}") for n in mine if n.usable for i in range(n.gpus)}
    known = error is None
    return {
        "source": "slurm",
        "partition": partition or default_partition,
        "nodes": [n.name for n in mine],
        "unavailable": [n.name for n in mine if not n.usable],
        "now": iso_utc(now),
        "pool": pool if known else None,
        "free": [g for g in pool if g in usable and g not in held] if known else None,
        "reservations": reservations,
        "queue": slurm_queue_rows(jobs, account_prefix),
        "gpu_idle": gpu_idle_rows(standing_flags(jobs, gpu_idle or {}, account_prefix), now),
        "error": error,
    }


def standing_flags(jobs: list[SlurmJob], flags: dict[str, float], account_prefix: str) -> dict[str, float]:
    """The flags (owner -> since) of owners whose PDL job holds GPUs and started before it."""
    started = {job_columns(j, account_prefix)["owner"]: j.start_time for j in jobs
               if j.holding and pdl_job_owner(j, account_prefix) is not None}
    return {owner: since for owner, since in flags.items() if owner in started and started[owner] <= since}


def sections(status: dict) -> str:
    """The tables Reservations and Queue of a Slurm model, and where its reclaims are."""
    reservations = table_html(
        "Reservations", ["GPU", "Node", "User/server", "Account", "Job", "State", "Since (UTC)", "Held for"],
        [[typed(r["slot"], r["gpu_type"]), r["node"], r["owner"], r["account"], r["job"], r["state"], r["since"],
          "" if r["held_s"] is None else duration_text(r["held_s"])] for r in status["reservations"]],
        "No GPU is held.",
    )
    queue = table_html(
        "Queue", ["Position", "Partition", "User/server", "Account", "Job", "GPUs", "Slurm's reason",
                  "Expected start (UTC)"],
        [[q["position"], q["partition"], q["owner"], q["account"], q["job"], typed(q["gpus"], q["gpu_type"]),
          q["reason"] + (" (will not start)" if q["never_starts"] else ""), q["expected_start"] or "unknown"]
         for q in status["queue"]],
        "Nobody is waiting.",
    )
    return (f'{reservations}\n{queue}\n<h2>Recent reclaims</h2>\n<p class="empty">{escape(SLURM_RECLAIMS_NOTE)}</p>'
            f"\n{gpu_idle_section(status)}")


#: The Slurm source's part of the page.
PAGE = PageParts(summary=nodes_summary, sections=sections, unreadable="Slurm")


async def read_slurm(commands: SlurmCommands, partition: str) -> tuple[list[SlurmJob], list[SlurmNode], str]:
    """What the Slurm source reads, through Slurm's own commands (each within
    :data:`~pdl_spawner.slurm.cli.COMMAND_TIMEOUT_S` seconds): every job (``squeue
    --all --json``), every node (``sinfo --json``) and the default partition
    (``scontrol -o show partition``; not asked, ``""``, when ``partition`` names one).
    Raises :class:`~pdl_spawner.slurm.cli.SlurmError`, and what parsing output that is
    not Slurm's JSON raises (``ValueError``...)."""
    jobs, nodes = await commands.jobs(), await commands.nodes()
    default = "" if partition else await commands.default_partition()
    return jobs, nodes, default


def read_slurm_status(*, partition: str, slurm_env: Mapping[str, str],
                      account_prefix: str = DEFAULT_ACCOUNT_PREFIX, flags_db: str = "") -> dict:
    """:func:`slurm_status_model` now, from Slurm's commands run with ``slurm_env``
    (``PATH``, ``SLURM_CONF``...); PDL's partition is ``partition`` ("": Slurm's
    default). Slurm is the one source of who holds what; the one file, ``flags_db``
    ("": none), holds the hub's flags on GPUs held idle. When Slurm cannot be read, or
    its output is not the JSON expected, the model carries the error (one line)
    instead. Blocking: run it off the event loop."""
    try:
        jobs, nodes, default = asyncio.run(read_slurm(SlurmCommands(dict(slurm_env)), partition))
        error = None
    except SlurmError as exc:
        error = " ".join(str(exc).split())[:500]
    except (ValueError, TypeError, AttributeError) as exc:  # not the JSON parse_jobs / parse_nodes expect
        error = " ".join(f"Slurm's output could not be understood: {type(exc).__name__}: {exc}".split())[:500]
    if error is not None:
        logging.getLogger("pdl.admin_view").warning("cannot read Slurm: %s", error)
        jobs, nodes, default = [], [], ""
    flags = SlotLedger(flags_db).gpu_idle_flags() if flags_db and os.path.exists(flags_db) else {}
    return slurm_status_model(jobs, nodes, time.time(), partition=partition, default_partition=default,
                              error=error, account_prefix=account_prefix, gpu_idle=flags)


def reader(settings: dict) -> Callable[[], dict]:
    """The Slurm reader, from :func:`pdl_spawner.slurm.kind.admin_settings`: Slurm's
    commands on ``path`` with ``slurm_conf`` (empty: Slurm's default place) on PDL's
    ``partition`` ("": Slurm's default), its users' accounts named with
    ``account_prefix``, the flags on GPUs held idle in ``flags_db`` ("": none)."""
    return partial(read_slurm_status, partition=(settings.get("partition") or "").strip(),
                   slurm_env=slurm_env(settings), account_prefix=settings.get("account_prefix", DEFAULT_ACCOUNT_PREFIX),
                   flags_db=settings.get("flags_db") or "")


def slurm_env(settings: dict) -> dict[str, str]:
    """The environment of Slurm's commands: ``path`` and ``slurm_conf`` of the settings."""
    env = {"PATH": settings.get("path") or "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if settings.get("slurm_conf"):
        env["SLURM_CONF"] = settings["slurm_conf"]
    return env


def usage_source(settings: dict) -> SlurmAccounting:
    """Where the usage report comes from on Slurm: Slurm's own accounting of PDL's jobs
    (:class:`~pdl_spawner.slurm.accounting.SlurmAccounting`), not the hub's book."""
    return SlurmAccounting(slurm_env(settings), settings.get("account_prefix", DEFAULT_ACCOUNT_PREFIX))
