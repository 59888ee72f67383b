"""Docker Swarm as a cluster kind (:class:`pdl_spawner.kinds.ClusterKind`, registered as
``swarm``): each server and its GPU engines as Swarm services.

Its variables name the manager's address as the nodes reach it (required), where the
proxy listens, the nodes and image PDL uses, and the users' storage; its hub settings
open sign-up (servers are containers, kept apart without root) and keep the queue and
the reclaim log in the hub's state folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pdl_spawner.kinds import ClusterKind
from pdl_spawner.settings import values
from pdl_spawner.settings.config_reading import effective
from pdl_spawner.settings.variables import Variable

SPAWNER = "pdl_spawner.swarm.spawner:PDLSwarmSpawner"
#: Docker's own default engine address.
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"


def data_storage(found: dict[str, Any]) -> dict | None:
    """``PDL_DATA_PATH`` or ``PDL_DATA_NFS`` as ``c.PDLSwarmSpawner.data_storage`` (None:
    neither); ValueError, one line, for both."""
    path, nfs = found["PDL_DATA_PATH"], found["PDL_DATA_NFS"]
    if path and nfs:
        raise ValueError("set PDL_DATA_PATH or PDL_DATA_NFS, not both")
    if path:
        return {"kind": "path", "source": path}
    if nfs:
        addr, _, export = nfs.partition(":")
        return {"kind": "nfs", "addr": addr, "export": export}
    return None


def configure(c, found: dict[str, Any], state_dir: Path) -> None:
    """The hub's addresses on the manager, the Docker engine, the state file, storage."""
    from pdl_spawner.swarm.hub_address import proxy_ip

    connect_ip = found["PDL_HUB_CONNECT_IP"]
    if not connect_ip:
        raise SystemExit("jupyterhub_config.py: PDL_SPAWNER=swarm needs PDL_HUB_CONNECT_IP, this node's address "
                         "as the other nodes reach it (e.g. -e PDL_HUB_CONNECT_IP=10.0.0.5)")
    try:  # every interface, unless this host's name does not resolve (then the manager's address)
        c.JupyterHub.ip = proxy_ip(found["PDL_HUB_IP"] or None, connect_ip)
        storage = data_storage(found)
    except ValueError as e:
        raise SystemExit(f"jupyterhub_config.py: {e}") from None
    # the hub's own API on the cluster's network only (the servers and engines call it
    # there), never on the lab's interface where the proxy may listen
    c.JupyterHub.hub_ip = connect_ip
    c.JupyterHub.hub_connect_ip = connect_ip  # this node's address
    c.PDLAuthenticator.enable_signup = True  # servers are containers: kept apart without root too
    c.PDLSwarmSpawner.client_kwargs = {"base_url": found["DOCKER_HOST"]}
    c.PDLSwarmSpawner.state_db = str(state_dir / "swarm.sqlite")  # the queue and the reclaim log
    if storage:
        c.PDLSwarmSpawner.data_storage = storage


def admin_settings(c) -> dict:
    """The state file, the manager's engine, the nodes and the GPUs' resource name, as the spawner has them."""
    sections = KIND.sections()
    return {"state_db": effective(c, sections, "state_db"),
            "docker_host": effective(c, sections, "client_kwargs", {}).get("base_url", DEFAULT_DOCKER_HOST),
            "nodes": list(effective(c, sections, "nodes", [])),
            "gpu_resource": effective(c, sections, "gpu_resource")}


KIND = ClusterKind(
    name="swarm", spawner=SPAWNER, engine_host="pdl_spawner.swarm.engine_host:SwarmServices",
    admin_source="pdl_spawner.swarm.admin_source",
    configure=configure, admin_settings=admin_settings,
    variables=(
        Variable("PDL_DEFAULT_GPUS", "The older name of `PDL_DEFAULT_WORKERS`.", values.whole_number,
                 trait="PDLSwarmSpawner.default_gpus", shown="none"),
        Variable("PDL_HUB_CONNECT_IP", "This node's address as the other nodes reach it.",
                 shown="required"),
        Variable("PDL_NODES", "The nodes whose GPUs PDL uses, e.g. `gpu1,gpu2,gpu3`.", values.names,
                 trait="PDLSwarmSpawner.nodes", shown="every node"),
        Variable("PDL_NOTEBOOK_IMAGE", "The image of the servers and engines.", trait="PDLSwarmSpawner.image"),
        Variable("PDL_HOME_STORAGE", "`volume` (a Docker volume per user and node) or `path` (\"Storage\").",
                 values.one_of("volume", "path"), trait="PDLSwarmSpawner.home_storage"),
        Variable("PDL_HOME_PATH", "With `path`: the users' folder on shared storage, e.g. "
                 "`/srv/pdl/home/{username}`.", trait="PDLSwarmSpawner.home_path_template"),
        Variable("PDL_DATA_PATH", "A folder on every node mounted read-only at `/data`."),
        Variable("PDL_DATA_NFS", "`addr:/export` mounted read-only at `/data` (not with `PDL_DATA_PATH`)."),
        Variable("DOCKER_HOST", "The manager's Docker engine.", default=DEFAULT_DOCKER_HOST),
    ),
)
