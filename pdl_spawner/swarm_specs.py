"""Docker Swarm specs for one user's PDL server: pure functions, no I/O.

Each builder returns the keyword arguments of docker-py's low-level ``APIClient``
call (``create_service(**spec)``, ``create_secret(**spec)``), with Engine API field
names in plain dicts, so that tests compare them whole.

One user's server is

- a **notebook service** running ``pdl-singleuser`` in controller-only mode: the
  Jupyter server and the user's ipyparallel controller, no engines;
- one **engine service** per reserved GPU running ``pdl-engine``; each reserves one
  unit of a Swarm generic resource (``NVIDIA-GPU`` by default), which Swarm names
  to the task in ``DOCKER_RESOURCE_<resource>``;
- two **Docker secrets**: the notebook's (hub API token, controller keys and ports)
  and the engines' (controller address, ports, public key, HMAC key).

Every container gets the same secure defaults, refused or fixed here rather than
left to configuration: a non-root user; all capabilities dropped and none added
back (nothing PDL runs needs one); ``NoNewPrivileges`` (honoured by Engine API
1.44+; ``pdl-singleuser`` and ``pdl-engine`` also set it on themselves, for older
daemons); no Docker socket mounted; secrets only as files under /run/secrets, mode
0400, owned by that user, never in a command line, environment or image (environment
variables that carry secrets are refused); an init process as PID 1 (stops take
milliseconds, so GPUs free at once). Swarm services cannot be privileged at all.

Networking is the node's own (``host``): the node kernel may have no IPVS, so there
are no service VIPs. Containers bind the ports the hub chose; the hub and the
engines reach the notebook at its node's address.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass

#: Prefix of every label PDL puts on services and secrets.
LABEL_PREFIX = "pdl."
#: Where Docker mounts secrets in a container.
SECRETS_DIR = "/run/secrets"
#: File names of the two secrets inside their containers.
NOTEBOOK_SECRET_FILE = "pdl-notebook.json"
ENGINE_SECRET_FILE = "pdl-engine.json"
#: Environment variables that carry secrets: never put in a spec.
SECRET_ENV = frozenset({"JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN", "IPP_CURVE_SECRETKEY", "IPP_CURVE_PUBLICKEY"})
#: Host paths whose mount would hand out the Docker daemon.
DOCKER_SOCKETS = frozenset({"/var/run/docker.sock", "/run/docker.sock", "/var/run", "/run", "/"})
#: Seconds, in the nanoseconds the Engine API wants.
_NS = 1_000_000_000
STOP_GRACE_NS = 5 * _NS
#: The notebook is never restarted by Swarm: a dead server is the hub's to notice.
NOTEBOOK_RESTART = {"Condition": "none", "MaxAttempts": 0}
#: An engine that crashes comes back, a few times, on whichever node has a free GPU.
ENGINE_RESTART = {"Condition": "on-failure", "Delay": 1 * _NS, "MaxAttempts": 3, "Window": 60 * _NS}


@dataclass(frozen=True)
class Owner:
    """Whose server: a hub user and the server's name ("" for the default server)."""

    user: str
    server: str = ""

    @property
    def key(self) -> str:
        """``"alice"`` or ``"alice/gpu"``: the value of the ``pdl.owner`` label."""
        return f"{self.user}/{self.server}" if self.server else self.user

    def labels(self, role: str, **extra: str) -> dict[str, str]:
        """Labels of one of this server's services or secrets (``role``: notebook, engine, secret)."""
        labels = {"owner": self.key, "user": self.user, "server": self.server, "role": role, **extra}
        return {LABEL_PREFIX + k: str(v) for k, v in labels.items()}

    def filter(self) -> dict[str, list[str]]:
        """Docker API filter selecting everything of this server."""
        return {"label": [f"{LABEL_PREFIX}owner={self.key}"]}


def uid_gid(user: str) -> tuple[str, str]:
    """Split ``"1000:1000"`` (numeric ids); ValueError for root or a name."""
    uid, _, gid = user.partition(":")
    gid = gid or uid
    if not (uid.isdigit() and gid.isdigit()):
        raise ValueError(f"containers run as a numeric uid:gid, got {user!r}")
    if int(uid) == 0 or int(gid) == 0:
        raise ValueError(f"containers must not run as root, got {user!r}")
    return uid, gid


def check_mounts(mounts: list[dict]) -> list[dict]:
    """The mounts as plain dicts; ValueError for any that would expose the Docker socket."""
    plain = [dict(m) for m in mounts]
    for m in plain:
        source = posixpath.normpath(m.get("Source") or "/-")
        if source in DOCKER_SOCKETS or source.endswith("/docker.sock"):
            raise ValueError(f"refusing to mount {source} into a user's container")
    return plain


def check_env(env: dict[str, str]) -> list[str]:
    """``KEY=value`` lines, sorted; ValueError for variables that carry secrets."""
    leaked = sorted(SECRET_ENV & set(env))
    if leaked:
        raise ValueError(f"secrets go in Docker secrets, not the environment: {', '.join(leaked)}")
    return [f"{k}={v}" for k, v in sorted(env.items())]


def secret(*, name: str, data: dict, labels: dict[str, str]) -> dict:
    """``create_secret`` kwargs for a JSON secret."""
    return {"name": name, "data": json.dumps(data, sort_keys=True).encode(), "labels": labels}


def secret_ref(*, secret_id: str, secret_name: str, filename: str, user: str) -> dict:
    """A secret file ``/run/secrets/<filename>``, readable only by ``user``."""
    uid, gid = uid_gid(user)
    return {
        "SecretID": secret_id,
        "SecretName": secret_name,
        "File": {"Name": filename, "UID": uid, "GID": gid, "Mode": 0o400},
    }


def container_spec(
    *, image: str, command: list[str], env: dict[str, str], labels: dict[str, str], user: str,
    workdir: str, secrets: list[dict], mounts: list[dict] = (),
) -> dict:
    """A ContainerSpec with PDL's secure defaults (see module doc)."""
    uid_gid(user)
    spec = {
        "Image": image,
        "Command": list(command),
        "Env": check_env(env),
        "Labels": dict(labels),
        "User": user,
        "Dir": workdir,
        "Init": True,
        "CapabilityDrop": ["ALL"],
        "Privileges": {"NoNewPrivileges": True},
        "Secrets": list(secrets),
        "StopGracePeriod": STOP_GRACE_NS,
    }
    plain_mounts = check_mounts(list(mounts))
    if plain_mounts:
        spec["Mounts"] = plain_mounts
    return spec


def _service(name: str, labels: dict[str, str], task_template: dict) -> dict:
    return {
        "name": name,
        "labels": dict(labels),
        "task_template": task_template,
        "mode": {"Replicated": {"Replicas": 1}},
        # no VIP: the swarm's nodes may have no IPVS
        "endpoint_spec": {"Mode": "dnsrr"},
    }


def notebook_service(
    *, name: str, image: str, owner: Owner, command: list[str], env: dict[str, str], secret_id: str,
    secret_name: str, user: str, home: str, ports: list[int], gpus: int, mounts: list[dict] = (),
) -> dict:
    """The user's notebook service: ``pdl-singleuser`` with the controller only.

    ``ports``: the Jupyter server's port, then the controller's (recorded in the
    ``pdl.ports`` label so later spawns avoid them). ``gpus``: engines it will get.
    """
    labels = owner.labels("notebook", ports=",".join(map(str, ports)), gpus=str(gpus))
    env = {
        **env,
        "HOME": home,
        "PDL_CONTROLLER_SECRET": posixpath.join(SECRETS_DIR, NOTEBOOK_SECRET_FILE),
        "PDL_ENGINES": str(gpus),
    }
    ref = secret_ref(secret_id=secret_id, secret_name=secret_name, filename=NOTEBOOK_SECRET_FILE, user=user)
    container = container_spec(image=image, command=command, env=env, labels=labels, user=user,
                               workdir=home, secrets=[ref], mounts=mounts)
    task = {
        "ContainerSpec": container,
        "Networks": [{"Target": "host"}],
        "RestartPolicy": NOTEBOOK_RESTART,
    }
    return _service(name, labels, task)


def engine_service(
    *, name: str, image: str, owner: Owner, index: int, env: dict[str, str], secret_id: str,
    secret_name: str, user: str, home: str, gpu_resource: str, mounts: list[dict] = (),
    avoid_hosts: list[str] = (),
) -> dict:
    """Engine ``index`` of the user's server: ``pdl-engine`` on one GPU of any node
    except those named in ``avoid_hosts``."""
    labels = owner.labels("engine", index=str(index))
    env = {
        **env,
        "HOME": home,
        "PDL_ENGINE_CONNECTION": posixpath.join(SECRETS_DIR, ENGINE_SECRET_FILE),
        "PDL_GPU_RESOURCE": gpu_resource,
        "PDL_ENGINE_HOST": "{{.Node.Hostname}}",
    }
    ref = secret_ref(secret_id=secret_id, secret_name=secret_name, filename=ENGINE_SECRET_FILE, user=user)
    container = container_spec(image=image, command=["pdl-engine"], env=env, labels=labels, user=user,
                               workdir=home, secrets=[ref], mounts=mounts)
    task = {
        "ContainerSpec": container,
        "Networks": [{"Target": "host"}],
        "Resources": {"Reservations": {"GenericResources": [
            {"DiscreteResourceSpec": {"Kind": gpu_resource, "Value": 1}},
        ]}},
        "Placement": {"Preferences": [{"Spread": {"SpreadDescriptor": "node.id"}}]},
        "RestartPolicy": ENGINE_RESTART,
    }
    if avoid_hosts:
        task["Placement"]["Constraints"] = [f"node.hostname!={host}" for host in avoid_hosts]
    return _service(name, labels, task)
