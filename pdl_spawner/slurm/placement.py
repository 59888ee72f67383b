"""Where a Slurm user's server runs: on the login node, or inside its own job.

``PDLSlurmSpawner.server_placement`` chooses (docs/admin.md, "Where the server runs"):

- ``"login"`` (the default): the server runs on the hub's machine, the login node, as
  the user's account; only its engines are steps of the job. Idle engines give the
  whole job back, and the notebook stays.
- ``"allocation"``: the server runs as one more step of the user's job, on the job's
  batch host (:func:`server_step_argv`): Slurm counts and limits everything the user
  runs. The ``srun`` that starts that step runs on the login node, as the user's
  account, where the hub's local process handling watches and signals it (srun
  forwards SIGINT and SIGTERM to the server), and it ends when the server does
  (:mod:`pdl_spawner.slurm.step_guard`). The server listens on its node's address
  (:class:`ServerNode`), where the hub's proxy reaches it; it reaches the hub's API at
  an address the nodes reach (:func:`hub_api_problem`); its ipyparallel controller
  listens on the node's address too, and its engines are steps of the same job. The
  job hosts the server, so idle engines keep it: the GPUs go back to Slurm when the
  server stops (or the idle culler stops it), not before.

The port: the hub picks each server's port from ``port_range``, unique among this
hub's servers, but checks that it is free on the login node only. On a node, a port
taken by something that is not a PDL server of this hub (another job's program) makes
that spawn fail; spawning again picks another port.

Pure builders and readers, plus :func:`find_server_node`, which asks Slurm through
:class:`~pdl_spawner.slurm.cli.SlurmCommands`.
"""

from __future__ import annotations

import ipaddress
import json
import sys
from dataclasses import dataclass
from urllib.parse import urlparse

from pdl_spawner.slurm.cli import SlurmCommands, SlurmError
from pdl_spawner.slurm.jobs import SlurmNode

#: The values of ``PDLSlurmSpawner.server_placement``.
LOGIN, ALLOCATION = "login", "allocation"
PLACEMENTS = (LOGIN, ALLOCATION)
#: The Slurm step name of a server that runs inside its job.
SERVER_STEP_NAME = "pdl-server"
#: The step's task, which runs the server and ends the step with it (:mod:`pdl_spawner.slurm.step_guard`).
STEP_GUARD = (sys.executable, "-m", "pdl_spawner.slurm.step_guard")


@dataclass(frozen=True)
class ServerNode:
    """The node a server runs on inside its job: Slurm's name for it, and its address
    (``NodeAddr``) as the hub reaches it, where the server and its controller listen."""

    name: str
    addr: str

    def state(self) -> dict[str, str]:
        """For the spawner state."""
        return {"name": self.name, "addr": self.addr}

    @classmethod
    def from_state(cls, value) -> ServerNode | None:
        """From :meth:`state` (None for anything else: a state saved by the login mode)."""
        if isinstance(value, dict) and value.get("name") and value.get("addr"):
            return cls(str(value["name"]), str(value["addr"]))
        return None


def server_step_argv(job_id: int, node: str, cmd: list[str], *, srun: str = "srun",
                     guard: tuple[str, ...] = STEP_GUARD) -> list[str]:
    """``srun`` arguments that run ``cmd`` (the server) as one step of job ``job_id`` on
    ``node``: one task, sharing the job's CPUs with its engine steps (``--overlap``),
    with no GPU of the job (``--gres=none``), the environment of the srun (the hub's
    server environment; ``--export=ALL``), no stdin; a SIGINT goes to the server at
    once (``--disable-status``), as SIGTERM does. The task is ``guard`` running ``cmd``:
    the step ends when the server does, whatever it leaves. No ``--cpus-per-task``: it
    would be exported to the server as ``SLURM_CPUS_PER_TASK`` and reach the engines' sruns."""
    return [srun, f"--jobid={job_id}", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap",
            "--gres=none", "--export=ALL", "--input=none", "--disable-status", "--quiet",
            f"--job-name={SERVER_STEP_NAME}", *guard, *cmd]


def batch_host(squeue_json: str, job_id: int) -> str:
    """The batch host of job ``job_id`` in ``squeue --json`` output (the node its batch
    step runs on: the first of its allocation); ValueError when it is not there."""
    for job in json.loads(squeue_json).get("jobs", []):
        number = job.get("job_id")
        if isinstance(number, dict):  # newer Slurm: {"set": true, "number": n}
            number = number.get("number")
        if str(number) == str(job_id) and job.get("batch_host"):
            return str(job["batch_host"])
    raise ValueError(f"Slurm names no batch host for job {job_id}")


def node_address(nodes: list[SlurmNode], name: str) -> str:
    """The address of node ``name`` (its ``NodeAddr``, else its name); ValueError when
    Slurm does not list it."""
    for node in nodes:
        if node.name == name:
            return node.addr or node.name
    raise ValueError(f"Slurm does not list node {name}")


async def find_server_node(slurm: SlurmCommands, job_id: int) -> ServerNode:
    """The node of job ``job_id`` the server runs on: its batch host, with its address.
    :class:`~pdl_spawner.slurm.cli.SlurmError` when Slurm cannot say."""
    try:
        name = batch_host(await slurm.run(["squeue", "--json", f"--jobs={job_id}"]), job_id)
        return ServerNode(name, node_address(await slurm.nodes(), name))
    except ValueError as e:
        raise SlurmError("squeue", str(e)) from None


def hub_api_problem(api_url: str) -> str | None:
    """Why a server on a compute node could not reach the hub's API at ``api_url`` (a
    loopback address: the hub listens on its own machine only), in one line; None when
    it can, as far as the URL tells."""
    host = urlparse(api_url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        return None
    return (f"PDLSlurmSpawner.server_placement is 'allocation', but the hub's API is at {api_url}, which the "
            f"compute nodes cannot reach: set c.JupyterHub.hub_ip (and hub_connect_ip) to the login node's "
            f"address as the nodes reach it (PDL_SLURM_SERVER=allocation does, with PDL_CONTROLLER_IP)")
