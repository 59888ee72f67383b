"""Slurm as a cluster kind (:class:`pdl_spawner.kinds.ClusterKind`, registered as
``slurm``): each server's GPUs one job of the user's own account, its engines the
job's steps; this machine is a login node.

Its variables name this machine's address as the compute nodes reach it (required),
the partition, the account PDL adds users to and where servers run; the hub must run
as root (it submits each user's job as their own Unix account). The session is the
job's time limit, so the hub's session variables do not apply.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pdl_spawner.kinds import ClusterKind
from pdl_spawner.settings import values
from pdl_spawner.settings.config_reading import effective
from pdl_spawner.settings.variables import Variable

SPAWNER = "pdl_spawner.slurm.spawner:PDLSlurmSpawner"
_JOB_IS_THE_SESSION = "on Slurm a job's time limit is its session's (c.PDLSlurmSpawner.time_limit)"


def configure(c, found: dict[str, Any], state_dir: Path) -> None:
    """Root required; the flags' file; the hub's API where the nodes reach it when
    servers run in their jobs."""
    if os.geteuid() != 0:
        raise SystemExit("jupyterhub_config.py: PDL_SPAWNER=slurm needs the hub to run as root (it submits each "
                         "user's job as their own Unix account)")
    c.PDLSlurmSpawner.flags_db = str(state_dir / "slurm-flags.sqlite")  # flags on GPUs held idle, for the admin view
    if found["PDL_SLURM_SERVER"] == "allocation":  # the servers on the compute nodes reach the hub's API here
        c.JupyterHub.hub_ip = found["PDL_CONTROLLER_IP"]
        c.JupyterHub.hub_connect_ip = found["PDL_CONTROLLER_IP"]


def problem(c) -> str | None:
    """The controller's address is required (``PDL_CONTROLLER_IP``, or ``c.PDLSlurmSpawner.controller_ip``)."""
    if effective(c, KIND.sections(), "controller_ip"):
        return None
    return ("jupyterhub_config.py: PDL_SPAWNER=slurm needs PDL_CONTROLLER_IP, this machine's address "
            "as the compute nodes reach it (e.g. PDL_CONTROLLER_IP=10.0.0.5)")


def admin_settings(c) -> dict:
    """PDL's partition, the accounts' prefix and the flags' file as the spawner has them;
    Slurm's commands as the hub finds them."""
    sections = KIND.sections()
    return {"partition": effective(c, sections, "partition", ""),
            "account_prefix": effective(c, sections, "account_prefix", "pdl-"),
            "flags_db": effective(c, sections, "flags_db"),
            "slurm_conf": os.environ.get("SLURM_CONF", ""), "path": os.environ.get("PATH", "")}


KIND = ClusterKind(
    name="slurm", spawner=SPAWNER, engine_host="pdl_spawner.slurm.engine_host:SlurmSteps",
    admin_source="pdl_spawner.slurm.admin_source",
    configure=configure, admin_settings=admin_settings,
    variables=(
        Variable("PDL_CONTROLLER_IP", "This machine's address as the compute nodes reach it.",
                 trait="PDLSlurmSpawner.controller_ip", shown="required"),
        Variable("PDL_SLURM_PARTITION", "The partition of the users' jobs.", trait="PDLSlurmSpawner.partition",
                 shown="Slurm's default partition"),
        Variable("PDL_SLURM_ACCOUNT", "The account PDL adds each user to.", trait="PDLSlurmSpawner.slurm_account",
                 shown="none (the users' own associations)"),
        Variable("PDL_SLURM_SERVER", "Where each server runs, `login` or `allocation` (\"Where the server runs\").",
                 values.one_of("login", "allocation"), trait="PDLSlurmSpawner.server_placement"),
    ),
    declines={"PDL_SESSION_LIMIT_S": _JOB_IS_THE_SESSION, "PDL_SESSION_MAX_S": _JOB_IS_THE_SESSION},
    problem=problem,
)
