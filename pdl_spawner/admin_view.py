"""The admin view: who holds which slot or GPU, who waits in the queue, what was reclaimed.

A JupyterHub managed service, ``pdl-admin`` (registered in ``jupyterhub_config.py``),
run by the hub as ``python -m pdl_spawner.admin_view``. Under its prefix
(``$JUPYTERHUB_SERVICE_PREFIX``, ``/services/pdl-admin/``) it serves

- ``GET <prefix>``: an HTML page with three tables (reservations, queue, recent
  reclaims);
- ``GET <prefix>api/status``: the same as JSON, for scripts (``Authorization: token ...``
  with a hub API token); see :func:`status_model` (local), :func:`swarm_status_model`
  (Swarm) and :func:`slurm_status_model` (Slurm) for the fields.

Three sources of holdings, read on every request:

- **local** (the embedded default, ``PDLLocalSpawner``): the slot ledger, a SQLite
  file (:class:`~pdl_spawner.reservations.SlotLedger`); the node is this machine.
- **Swarm** (``PDLSwarmSpawner``, when ``PDL_DOCKER_HOST`` is set): the GPUs that
  PDL's engine tasks hold, read from the swarm's manager through the Docker Engine
  API (:mod:`pdl_spawner.swarm_gpus`), each on its node, since the time its task
  reached its state. The pool is the GPUs that PDL's nodes declare, as
  ``"<hostname>/<GPU id>"``. When Docker cannot be read the page says so and still
  shows the queue and the reclaims.
- **Slurm** (``PDLSlurmSpawner``, when ``PDL_SLURM=1``): Slurm is the one source, read
  through its own commands (:mod:`~pdl_spawner.slurm_cli`, parsed by
  :mod:`~pdl_spawner.slurm_jobs`); no file. The holdings are the GPUs of every job
  that holds some (``squeue --all --json``; PDL's jobs, named ``pdl:<hub
  user>[:<server>]``, show the hub user, any other job its Unix account), each on the
  node Slurm names for it, since the job's start time. The pool is every GPU of the
  nodes of PDL's partition (``sinfo --json``; Slurm's default partition from
  ``scontrol -o show partition`` when PDL names none), as ``"<node>/gpu:<index>"``;
  the queue is Slurm's pending jobs that ask for GPUs, with Slurm's reason and the
  position in their partition. There is no reclaims table: a reclaim cancels the
  job, and the hub's log records it. When Slurm cannot be read (or its output
  cannot be understood) the page says so in one line.

Locally and on Swarm the queue (:class:`~pdl_spawner.wait_queue.WaitQueue`) and the
recent reclaims (:meth:`~pdl_spawner.reservations.SlotLedger.reclaims`) come from the
SQLite file ``PDL_RESERVATIONS_DB``; on Swarm it holds no slot reservations, and the
slots of its reclaims are GPU descriptions (e.g. ``"pdl-node1/GPU-fake-1"``), shown as
they are.

Access is JupyterHub's: a request needs the scope
``access:services!service=pdl-admin``, which the admin role has (through
``access:services``) and ordinary users do not. Everyone else gets 403: the hub
refuses the OAuth login, or this service refuses the token.

Environment (set in the service definition):

- ``PDL_RESERVATIONS_DB``: the ledger file, the same as
  ``c.PDLLocalSpawner.reservations_db`` (required, on Swarm too; not read on Slurm);
  the queue and the reclaim log live in it too;
- ``PDL_POOL`` (local): the spawner's slots, comma-separated, when configured; otherwise
  the spawner's default pool (:func:`pdl.slots.default_pool`, with ``PDL_CPU_SLOTS``);
- ``PDL_DOCKER_HOST`` (Swarm): the Docker base URL of a swarm manager, e.g.
  ``unix:///var/run/docker.sock`` or ``tcp://10.77.0.2:2375``; set, it selects the
  Swarm source (docker-py must be installed: the ``swarm`` extra);
- ``PDL_GPU_RESOURCE`` (Swarm): the generic resource that counts as a GPU, the same
  as ``c.PDLSwarmSpawner.gpu_resource`` (default ``NVIDIA-GPU``);
- ``PDL_NODES`` (Swarm): the hostnames of the nodes whose GPUs PDL uses,
  comma-separated, as ``c.PDLSwarmSpawner.nodes`` (empty: every node); the GPUs of
  other nodes are not in the pool;
- ``PDL_SLURM`` (Slurm): ``1`` selects the Slurm source (before ``PDL_DOCKER_HOST``);
- ``PDL_ACCOUNT_PREFIX`` (Slurm): the prefix of the users' Unix accounts, as
  ``c.PDLLocalSpawner.account_prefix`` (default ``pdl-``): a job is PDL's, and shown as
  a hub user's, only when its name and its account agree;
- ``PDL_SLURM_PARTITION`` (Slurm): PDL's partition, as ``c.PDLSlurmSpawner.partition``
  (empty: Slurm's default partition);
- ``PATH`` and ``SLURM_CONF`` (Slurm): where ``squeue``, ``sinfo`` and ``scontrol``
  are, and the cluster's configuration when not the default;
- ``PDL_ADMIN_VIEW_PORT`` (read by ``jupyterhub_config.py``, not here): the port on
  127.0.0.1 in the service's URL, default 8002. The service listens where
  ``$JUPYTERHUB_SERVICE_URL`` says.

The rows and the page are pure functions (:func:`status_model`,
:func:`swarm_status_model`, :func:`slurm_status_model`, :func:`render_page`); the
readers (:func:`read_status`, :func:`read_swarm_status`, :func:`read_slurm_status`) do
the I/O, and the handlers run a reader in a thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from functools import partial
from html import escape
from pathlib import Path
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import web

from pdl.runtime.boot import die_with_parent
from pdl.slots import default_pool, slot_index

from .reservations import Holding, Reclaim, SlotLedger
from .slurm_cli import SlurmCommands, SlurmError
from .slurm_jobs import DEFAULT_ACCOUNT_PREFIX, SlurmJob, SlurmNode, in_partition, pdl_job_owner, queue_position
from .swarm_gpus import GpuHolding, SwarmSnapshot, swarm_snapshot
from .swarm_specs import LABEL_PREFIX
from .wait_queue import Waiter, WaitQueue

#: How many reclaims the view lists, newest first.
RECENT_RECLAIMS = 20
#: The generic resource that counts as a GPU on Swarm, unless ``PDL_GPU_RESOURCE`` says otherwise.
DEFAULT_GPU_RESOURCE = "NVIDIA-GPU"
#: Seconds one Docker API call of the Swarm source may take.
DOCKER_TIMEOUT_S = 10
#: What the Slurm page says instead of a reclaims table.
SLURM_RECLAIMS_NOTE = ("PDL keeps no log of its own on Slurm: a reclaim (idle engines giving their GPUs back) "
                       "cancels the server's Slurm job, and the hub's log records each cancelled job.")

# -- pure: rows and page ------------------------------------------------------------


def iso_utc(epoch_s: float) -> str:
    """``epoch_s`` (seconds since the epoch) as ISO 8601 in UTC, to the second:
    ``"2025-01-31T09:05:00Z"``."""
    return datetime.fromtimestamp(epoch_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def duration_text(seconds: float) -> str:
    """A duration in seconds, short: ``"42 s"``, ``"3 min 20 s"``, ``"2 h 5 min"``, ``"1 d 3 h"``."""
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {s} s"
    return f"{s} s"


def split_owner(owner: str) -> tuple[str, str]:
    """A ledger owner (``"user"`` or ``"user/server"``) as (user, server name; ``""`` for the default server)."""
    user, _, server = owner.partition("/")
    return user, server


def _reservation_row(slot: str, node: str, owner: str, user: str, since: float, now: float) -> dict:
    return {"slot": slot, "node": node, "owner": owner, "user": user, "server": split_owner(owner)[1],
            "since": iso_utc(since), "held_s": max(0, int(now - since))}


def reservation_rows(holdings: list[Holding], node: str, now: float) -> list[dict]:
    """One row per reserved slot, in slot order: ``slot``, ``node`` (the machine the
    slot is on), ``owner``/``user``/``server``, ``since`` (ISO UTC) and ``held_s``
    (whole seconds held at ``now``, epoch seconds)."""
    ordered = sorted(holdings, key=lambda h: (h.slot.partition(":")[0], slot_index(h.slot), h.slot))
    return [_reservation_row(h.slot, node, h.owner, split_owner(h.owner)[0], h.since, now) for h in ordered]


def gpu_reservation_rows(holdings: list[GpuHolding], now: float) -> list[dict]:
    """:func:`reservation_rows` for Swarm, in the holdings' order (node, then GPU): the
    GPU id as ``slot`` (``"(pending)"`` for a task not placed yet), its node's hostname
    as ``node``."""
    return [_reservation_row(h.gpu, h.node, h.owner, h.user or split_owner(h.owner)[0], h.since, now)
            for h in holdings]


def gpu_name(node: str, gpu: str) -> str:
    """A GPU of the swarm as the view names it: ``"<hostname>/<GPU id>"``."""
    return f"{node}/{gpu}"


def queue_rows(waiters: list[Waiter], now: float) -> list[dict]:
    """One row per waiting spawn, head first: ``position`` (1 = next served),
    ``owner``/``user``/``server``, ``workers`` wanted, ``since`` (ISO UTC) and
    ``waiting_s`` (whole seconds waited at ``now``, epoch seconds)."""
    return [
        {"position": i, "owner": w.owner, "user": w.user, "server": split_owner(w.owner)[1],
         "workers": w.wanted, "since": iso_utc(w.since), "waiting_s": max(0, int(now - w.since))}
        for i, w in enumerate(waiters, start=1)
    ]


def reclaim_rows(reclaims: list[Reclaim]) -> list[dict]:
    """One row per reclaim, as given (newest first): ``at`` (ISO UTC),
    ``owner``/``user``, the ``slots`` freed and the ``reason``."""
    return [
        {"at": iso_utc(r.at), "owner": r.owner, "user": split_owner(r.owner)[0],
         "slots": list(r.slots), "reason": r.reason}
        for r in reclaims
    ]


def status_model(
    holdings: list[Holding], waiters: list[Waiter], reclaims: list[Reclaim], *,
    node: str, pool: list[str] | None, now: float,
) -> dict:
    """Everything the view shows, JSON-ready: ``node`` (this machine's hostname),
    ``now`` (ISO UTC), ``pool`` and ``free`` (slot names; None when the pool is not
    known), and the rows of :func:`reservation_rows`, :func:`queue_rows` and
    :func:`reclaim_rows` as ``reservations``, ``queue`` and ``reclaims``.
    ``now`` is epoch seconds."""
    held = {h.slot for h in holdings}
    return {
        "node": node,
        "now": iso_utc(now),
        "pool": list(pool) if pool is not None else None,
        "free": [s for s in pool if s not in held] if pool is not None else None,
        "reservations": reservation_rows(holdings, node, now),
        "queue": queue_rows(waiters, now),
        "reclaims": reclaim_rows(reclaims),
    }


def swarm_status_model(
    snapshot: SwarmSnapshot, waiters: list[Waiter], reclaims: list[Reclaim], *, now: float, error: str | None = None,
) -> dict:
    """Everything the view shows on Swarm, JSON-ready: ``nodes`` (hostnames of PDL's
    nodes) and ``unavailable`` (those of them that offer no GPU now), ``now`` (ISO UTC),
    ``pool`` and ``free`` (GPUs as ``"<hostname>/<GPU id>"``: PDL's nodes' GPUs, and
    those no task holds), ``other_services`` (GPUs of the pool held by services that are
    not PDL engines), ``reservations`` (:func:`gpu_reservation_rows`), ``queue`` and
    ``reclaims`` as in :func:`status_model`, and ``error``: None, or why Docker could not
    be read (then ``pool`` and ``free`` are None and there are no reservations).
    ``now`` is epoch seconds."""
    held = {(h.node, h.gpu) for h in snapshot.holdings}
    in_use = set(snapshot.in_use) | held
    known = error is None
    return {
        "nodes": list(snapshot.nodes),
        "unavailable": list(snapshot.unavailable),
        "now": iso_utc(now),
        "pool": [gpu_name(*g) for g in snapshot.pool] if known else None,
        "free": [gpu_name(*g) for g in snapshot.pool if g not in in_use] if known else None,
        "other_services": [gpu_name(*g) for g in snapshot.pool if g in in_use and g not in held],
        "reservations": gpu_reservation_rows(snapshot.holdings, now),
        "queue": queue_rows(waiters, now),
        "reclaims": reclaim_rows(reclaims),
        "error": error,
    }


def slurm_job_owner(job: SlurmJob, account_prefix: str = DEFAULT_ACCOUNT_PREFIX) -> tuple[str, str, str]:
    """(owner, hub user, server name) of a job: for one of PDL's reservations
    (:func:`~pdl_spawner.slurm_jobs.pdl_job_owner`: its name and its account agree),
    owner ``"user"`` or ``"user/server"``; else the job's Unix account as owner and
    user, server ``""`` (also for a job named after another user)."""
    found = pdl_job_owner(job, account_prefix)
    if found is None:
        return job.user, job.user, ""
    user, server = found
    return (f"{user}/{server}" if server else user), user, server


def _job_columns(job: SlurmJob, account_prefix: str) -> dict:
    owner, user, server = slurm_job_owner(job, account_prefix)
    return {"owner": owner, "user": user, "server": server, "account": job.user, "job": job.id,
            "pdl": pdl_job_owner(job, account_prefix) is not None, "partition": job.partition}


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
            rows.append({"slot": slot, "node": node, "state": job.state, **_job_columns(job, account_prefix),
                         "since": iso_utc(since) if since is not None else "",
                         "held_s": max(0, int(now - since)) if since is not None else None})
    return sorted(rows, key=lambda r: (r["node"] == "", node_order(r["node"]), node_order(r["slot"]), r["job"]))


def slurm_queue_rows(jobs: list[SlurmJob], account_prefix: str = DEFAULT_ACCOUNT_PREFIX) -> list[dict]:
    """One row per pending job that asks for GPUs, by partition then Slurm's order:
    ``position`` in its partition (:func:`~pdl_spawner.slurm_jobs.queue_position`), the
    columns of :func:`slurm_reservation_rows` but the slot, node and times, ``gpus``
    asked for, Slurm's ``reason``, ``never_starts`` (a reason waiting will not clear) and
    ``expected_start`` (Slurm's estimate, ISO UTC; ``""`` when it gives none)."""
    rows = []
    for job in jobs:
        if not (job.waiting and job.gpus):
            continue
        rows.append({"position": queue_position(job, jobs), **_job_columns(job, account_prefix), "gpus": job.gpus,
                     "reason": job.reason, "never_starts": job.never_starts,
                     "expected_start": iso_utc(job.start_time) if job.start_time else ""})
    return sorted(rows, key=lambda r: (r["partition"], r["position"], r["job"]))


def slurm_status_model(
    jobs: list[SlurmJob], nodes: list[SlurmNode], now: float, *,
    partition: str = "", default_partition: str = "", error: str | None = None,
    account_prefix: str = DEFAULT_ACCOUNT_PREFIX,
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
    hub's users' account prefix, which tells PDL's jobs from others'."""
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
        "error": error,
    }


def _table(caption: str, headers: list[str], rows: list[list[str]], empty: str) -> str:
    """An HTML table; every header and cell is escaped here."""
    if not rows:
        return f'<h2>{escape(caption)}</h2>\n<p class="empty">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "\n".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<h2>{escape(caption)}</h2>\n<table>\n<tr>{head}</tr>\n{body}\n</table>"


def _summary(status: dict) -> tuple[str, str]:
    """The summary line's subject (the node, or on Swarm and Slurm PDL's nodes) and what it says of the pool."""
    if "nodes" not in status:
        if status["pool"] is None:
            return f"Node {status['node']}", f"{len(status['reservations'])} slot(s) reserved"
        return f"Node {status['node']}", f"{len(status['free'])} of {len(status['pool'])} slot(s) free"
    nodes = status["nodes"]
    subject = f"{'Node' if len(nodes) == 1 else 'Nodes'} {', '.join(nodes) or '(none)'}"
    if status.get("partition"):
        subject = f"Partition {status['partition']}, {subject[0].lower()}{subject[1:]}"
    if status["pool"] is None:
        return subject, "GPUs unknown"
    text = f"{len(status['free'])} of {len(status['pool'])} GPU(s) free"
    if status.get("other_services"):
        text += f", {len(status['other_services'])} held by other services"
    if status["unavailable"]:
        text += f"; not available: {', '.join(status['unavailable'])}"
    return subject, text


def _local_or_swarm_sections(status: dict) -> str:
    """The tables Reservations, Queue and Recent reclaims of a local or Swarm model."""
    swarm = "nodes" in status
    header, noun = ("GPU", "GPU") if swarm else ("Slot", "slot")
    reservations = _table(
        "Reservations", [header, "Node", "User/server", "Since (UTC)", "Held for"],
        [[r["slot"], r["node"], r["owner"], r["since"], duration_text(r["held_s"])] for r in status["reservations"]],
        "No GPU is held." if swarm else "No slot is reserved.",
    )
    queue = _table(
        "Queue", ["Position", "User/server", "Workers wanted", "Waiting since (UTC)", "Waiting for"],
        [[q["position"], q["owner"], q["workers"], q["since"], duration_text(q["waiting_s"])]
         for q in status["queue"]],
        "Nobody is waiting.",
    )
    reclaims = _table(
        "Recent reclaims", ["When (UTC)", "User/server", f"{header}s", "Reason"],
        [[r["at"], r["owner"], ", ".join(r["slots"]), r["reason"]] for r in status["reclaims"]],
        f"No {noun} was reclaimed.",
    )
    return f"{reservations}\n{queue}\n{reclaims}"


def _slurm_sections(status: dict) -> str:
    """The tables Reservations and Queue of a Slurm model, and where its reclaims are."""
    reservations = _table(
        "Reservations", ["GPU", "Node", "User/server", "Account", "Job", "State", "Since (UTC)", "Held for"],
        [[r["slot"], r["node"], r["owner"], r["account"], r["job"], r["state"], r["since"],
          "" if r["held_s"] is None else duration_text(r["held_s"])] for r in status["reservations"]],
        "No GPU is held.",
    )
    queue = _table(
        "Queue", ["Position", "Partition", "User/server", "Account", "Job", "GPUs", "Slurm's reason",
                  "Expected start (UTC)"],
        [[q["position"], q["partition"], q["owner"], q["account"], q["job"], q["gpus"],
          q["reason"] + (" (will not start)" if q["never_starts"] else ""), q["expected_start"] or "unknown"]
         for q in status["queue"]],
        "Nobody is waiting.",
    )
    return f'{reservations}\n{queue}\n<h2>Recent reclaims</h2>\n<p class="empty">{escape(SLURM_RECLAIMS_NOTE)}</p>'


def render_page(status: dict) -> str:
    """The admin page for a :func:`status_model`, :func:`swarm_status_model` or
    :func:`slurm_status_model` dict: a summary line (and on Swarm or Slurm why Docker
    or Slurm could not be read, if so), the tables Reservations and Queue, and Recent
    reclaims (on Slurm, where to find them); each table says so when empty. Every
    value is HTML-escaped."""
    slurm = status.get("source") == "slurm"
    subject, summary = _summary(status)
    error = ""
    if status.get("error"):
        error = f'\n<p class="error">{"Slurm" if slurm else "Docker"} could not be read: {escape(status["error"])}</p>'
    sections = _slurm_sections(status) if slurm else _local_or_swarm_sections(status)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>PDL admin view</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; margin-bottom: 1em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.8em; text-align: left; }}
th {{ background: #f3f3f3; }}
.empty {{ color: #666; }}
.error {{ color: #a00; }}
</style>
</head>
<body>
<h1>PDL admin view</h1>
<p class="summary">{escape(subject)}: {escape(summary)}. As of {escape(status["now"])}
(<a href="api/status">JSON</a>).</p>{error}
{sections}
</body>
</html>
"""


# -- I/O: the readers and the handlers ------------------------------------------------


def read_status(db_path: str | Path, *, node: str, pool: list[str] | None) -> dict:
    """:func:`status_model` for the ledger (and queue) file ``db_path``, now."""
    ledger = SlotLedger(db_path)
    return status_model(
        ledger.holdings(), WaitQueue(db_path).waiters(), ledger.reclaims(RECENT_RECLAIMS),
        node=node, pool=pool, now=time.time(),
    )


def read_swarm(docker_host: str) -> tuple[list[dict], list[dict], list[dict]]:
    """The swarm's nodes, PDL's engine services and the tasks meant to run, as the
    Engine API of the manager at ``docker_host`` (a Docker base URL) returns them.
    Each call may take up to :data:`DOCKER_TIMEOUT_S` seconds. Raises what docker-py
    raises (see :func:`read_swarm_status`)."""
    import docker

    client = docker.APIClient(base_url=docker_host, version="auto", timeout=DOCKER_TIMEOUT_S)
    try:
        return (
            client.nodes(),
            client.services(filters={"label": [f"{LABEL_PREFIX}role=engine"]}),
            client.tasks(filters={"desired-state": ["running"]}),
        )
    finally:
        client.close()


def _docker_errors() -> tuple[type[BaseException], ...]:
    """What reading the swarm raises when Docker is unreachable, refuses, or is no manager."""
    import docker.errors
    import requests

    return docker.errors.DockerException, requests.exceptions.RequestException, OSError


def read_swarm_status(db_path: str | Path, *, docker_host: str, resource: str, node_names: list[str]) -> dict:
    """:func:`swarm_status_model` now: the holdings and the pool from the swarm manager
    at ``docker_host`` (GPUs are units of generic resource ``resource``; PDL's nodes are
    ``node_names``, all when empty), the queue and the reclaims from ``db_path``. When
    Docker cannot be read the model carries the error (one line) instead."""
    waiters, reclaims = WaitQueue(db_path).waiters(), SlotLedger(db_path).reclaims(RECENT_RECLAIMS)
    try:
        snapshot, error = swarm_snapshot(*read_swarm(docker_host), resource, node_names), None
    except _docker_errors() as exc:
        error = " ".join(f"{docker_host}: {exc}".split())[:500]
        logging.getLogger("pdl.admin_view").warning("cannot read the swarm: %s", error)
        snapshot = SwarmSnapshot(nodes=list(node_names))
    return swarm_status_model(snapshot, waiters, reclaims, now=time.time(), error=error)


async def read_slurm(commands: SlurmCommands, partition: str) -> tuple[list[SlurmJob], list[SlurmNode], str]:
    """What the Slurm source reads, through Slurm's own commands (each within
    :data:`~pdl_spawner.slurm_cli.COMMAND_TIMEOUT_S` seconds): every job (``squeue
    --all --json``), every node (``sinfo --json``) and the default partition
    (``scontrol -o show partition``; not asked, ``""``, when ``partition`` names one).
    Raises :class:`~pdl_spawner.slurm_cli.SlurmError`, and what parsing output that is
    not Slurm's JSON raises (``ValueError``...)."""
    jobs, nodes = await commands.jobs(), await commands.nodes()
    default = "" if partition else await commands.default_partition()
    return jobs, nodes, default


def read_slurm_status(*, partition: str, slurm_env: Mapping[str, str],
                      account_prefix: str = DEFAULT_ACCOUNT_PREFIX) -> dict:
    """:func:`slurm_status_model` now, from Slurm's commands run with ``slurm_env``
    (``PATH``, ``SLURM_CONF``...); PDL's partition is ``partition`` ("": Slurm's
    default). No file is read: Slurm is the one source. When Slurm cannot be read, or
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
    return slurm_status_model(jobs, nodes, time.time(), partition=partition, default_partition=default,
                              error=error, account_prefix=account_prefix)


class _ViewHandler(HubOAuthenticated, web.RequestHandler):
    """Base of the view's handlers: hub-authenticated, runs the reader (blocking I/O)
    off the event loop."""

    def initialize(self, hub_auth: HubOAuth, reader: Callable[[], dict]):
        self.hub_auth = hub_auth
        self.reader = reader

    async def status(self) -> dict:
        return await asyncio.to_thread(self.reader)

    def set_default_headers(self):
        self.set_header("Cache-Control", "no-store")


class PageHandler(_ViewHandler):
    """``GET <prefix>``: the HTML page. Without a login the browser is sent through
    the hub's OAuth; a user without access gets 403."""

    @web.authenticated
    async def get(self):
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
        self.finish(render_page(await self.status()))


class StatusAPIHandler(_ViewHandler):
    """``GET <prefix>api/status``: the status model as JSON. 403 (never a login
    redirect) without a token or cookie that has access."""

    def get_login_url(self):
        raise web.HTTPError(403)

    @web.authenticated
    async def get(self):
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(await self.status()))

    def write_error(self, status_code, **kwargs):
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": self._reason}))


class _OAuthCallbackHandler(HubOAuthCallbackHandler):
    """``GET <prefix>oauth_callback``: finishes the hub's OAuth login (sets this service's cookie)."""

    def initialize(self, hub_auth: HubOAuth):
        self.hub_auth = hub_auth


def access_scope(service_name: str) -> str:
    """The scope a request needs: access to this service (the admin role has it)."""
    return f"access:services!service={service_name}"


def make_app(prefix: str, reader: Callable[[], dict], *, service_name: str) -> web.Application:
    """The tornado app, its routes under ``prefix`` (ending in ``/``); ``reader``
    returns the status model (blocking; see :func:`reader_from_env`). The hub
    connection (API URL, token, OAuth client) comes from the ``JUPYTERHUB_*``
    environment the hub gives its services."""
    hub_auth = HubOAuth(access_scopes={access_scope(service_name)}, cache_max_age=60)
    args = {"hub_auth": hub_auth, "reader": reader}
    return web.Application(
        [
            (prefix, PageHandler, args),
            (url_path_join(prefix, "api/status"), StatusAPIHandler, args),
            (url_path_join(prefix, "oauth_callback"), _OAuthCallbackHandler, {"hub_auth": hub_auth}),
            (prefix.rstrip("/"), web.RedirectHandler, {"url": prefix}),
        ],
        cookie_secret=os.urandom(32),
    )


def pool_from_env(env=os.environ) -> list[str]:
    """The spawner's pool: ``PDL_POOL`` (comma-separated) when the hub configured one,
    else the spawner's default (every GPU, else ``PDL_CPU_SLOTS`` CPU slots)."""
    if env.get("PDL_POOL"):
        return [s.strip() for s in env["PDL_POOL"].split(",") if s.strip()]
    return default_pool(int(env["PDL_CPU_SLOTS"]) if env.get("PDL_CPU_SLOTS") else None)


def nodes_from_env(env=os.environ) -> list[str]:
    """PDL's swarm nodes: the hostnames in ``PDL_NODES`` (comma-separated); empty means every node."""
    return [n.strip() for n in env.get("PDL_NODES", "").split(",") if n.strip()]


def slurm_env_from(env=os.environ) -> dict[str, str]:
    """The environment of Slurm's commands: ``PATH`` (default ``/usr/bin:/bin``), ``LANG``
    and, when set, ``SLURM_CONF``."""
    slurm_env = {"PATH": env.get("PATH") or "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if env.get("SLURM_CONF"):
        slurm_env["SLURM_CONF"] = env["SLURM_CONF"]
    return slurm_env


def reader_from_env(env=os.environ) -> Callable[[], dict]:
    """The status reader the environment asks for: the Slurm source when ``PDL_SLURM``
    is ``1`` (with ``PDL_SLURM_PARTITION``, ``PDL_ACCOUNT_PREFIX``, ``PATH`` and
    ``SLURM_CONF``; no file), else
    the Swarm source when ``PDL_DOCKER_HOST`` is set (with ``PDL_GPU_RESOURCE`` and
    ``PDL_NODES``), else the local slot ledger (with ``PDL_POOL``); these two read
    ``PDL_RESERVATIONS_DB``."""
    if env.get("PDL_SLURM") == "1":
        return partial(read_slurm_status, partition=env.get("PDL_SLURM_PARTITION", "").strip(),
                       slurm_env=slurm_env_from(env),
                       account_prefix=env.get("PDL_ACCOUNT_PREFIX", DEFAULT_ACCOUNT_PREFIX))
    db_path = env["PDL_RESERVATIONS_DB"]
    if env.get("PDL_DOCKER_HOST"):
        return partial(read_swarm_status, db_path, docker_host=env["PDL_DOCKER_HOST"],
                       resource=env.get("PDL_GPU_RESOURCE") or DEFAULT_GPU_RESOURCE, node_names=nodes_from_env(env))
    return partial(read_status, db_path, node=socket.gethostname(), pool=pool_from_env(env))


async def _serve() -> None:
    prefix = os.environ["JUPYTERHUB_SERVICE_PREFIX"]
    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    app = make_app(prefix, reader_from_env(), service_name=os.environ["JUPYTERHUB_SERVICE_NAME"])
    app.listen(url.port, url.hostname)
    logging.getLogger("pdl.admin_view").info("PDL admin view at %s%s", url.netloc, prefix)
    await asyncio.Event().wait()


def main() -> None:
    """Serve until the hub stops the service; never outlive the hub (even after ``kill -9``).
    Ctrl-C in the hub's terminal reaches this process too: it ends quietly, as the hub does."""
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s %(asctime)s %(name)s] %(message)s")
    try:
        asyncio.run(_serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
