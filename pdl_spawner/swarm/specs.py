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
daemons); no Docker socket, host root or host system folder mounted (a configured
path that names one is refused); secrets only as files under /run/secrets, mode
0400, owned by that user, never in a command line, environment or image (environment
variables that carry secrets are refused); an init process as PID 1 (stops take
milliseconds, so GPUs free at once). Swarm services cannot be privileged at all.
Each container is also bounded (:class:`Limits`): memory, CPUs and processes, from
JupyterHub's ``mem_limit`` and ``cpu_limit`` (the notebook), the engine settings (each
engine), and ``process_limit`` (both); an engine's CPUs are reserved as well, so Swarm
places it only where that many cores are not already promised.

Storage (:class:`Storage`), the same in the notebook and every engine: the user's
home (a named volume, or a host path that every node mounts from shared storage),
an optional read-only dataset at ``/data``, and a node-local cache volume per user
at ``/var/tmp`` for staged datasets (``CINIC10_CACHE``).

Networking (:func:`private_network`, :func:`network_keeper_service`): each server's
notebook and engines share one overlay network of the hub's pool, which no other
server's containers are on (the pool's networks are not attachable: only services
the hub creates join them). Controller, engines and process groups talk only there,
so no other user's container, on any node, can reach a group's TCP store or gloo
ports (which have no authentication). The only port on a node's own network is the
Jupyter server's, published in host mode: the hub reaches it at the node's address
(tokens guard it). The node kernel may have no IPVS, so services have no VIPs
(``dnsrr``).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from dataclasses import dataclass, field

from pdl.contract import ServerContract
from pdl.engine_contract import EngineContract

#: Prefix of every label PDL puts on services and secrets.
LABEL_PREFIX = "pdl."
#: The label of a node naming its GPUs' type, and of an engine service naming the type it asked for.
GPU_TYPE_LABEL = LABEL_PREFIX + "gpu-type"
#: Where Docker mounts secrets in a container.
SECRETS_DIR = "/run/secrets"
#: File names of the two secrets inside their containers.
NOTEBOOK_SECRET_FILE = "pdl-notebook.json"
ENGINE_SECRET_FILE = "pdl-engine.json"
#: Environment variables that carry secrets: never put in a spec.
SECRET_ENV = frozenset({"JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN", "IPP_CURVE_SECRETKEY", "IPP_CURVE_PUBLICKEY"})
#: Host paths never mounted into a user's container: the host's root and system
#: folders, and those holding the Docker daemon's socket (``/var/run``, ``/run``).
REFUSED_HOST_PATHS = frozenset({
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/opt", "/proc", "/root", "/run",
    "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/lib", "/var/run",
})
#: ... nor anything under these (sockets, devices, kernel files, Docker's own state).
REFUSED_HOST_TREES = ("/boot/", "/dev/", "/etc/", "/proc/", "/root/", "/run/", "/sys/", "/var/lib/docker/",
                      "/var/lib/containerd/", "/var/run/")
#: The notebook's ipyparallel files (connection files, keys): in the container, not in
#: the home, which other servers of the user may share and which outlives the server.
CLUSTER_DIR = "/tmp/pdl-cluster"
#: Name of the hub's private network ``index`` (:func:`private_network`).
PRIVATE_NETWORK = "pdl-private-{index}"
#: Name of the global service that keeps every private network on every node.
NETWORK_KEEPER = "pdl-network-keeper"
#: The hub's global service that reads the nodes' GPU use (:func:`gpu_reader_service`).
GPU_READER = "pdl-gpu-reader"
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


def check_host_path(path: str) -> str:
    """``path`` normalised; ValueError unless it is absolute and not the host's root, a
    system folder (:data:`REFUSED_HOST_PATHS`, :data:`REFUSED_HOST_TREES`) or a socket."""
    if not path.startswith("/"):
        raise ValueError(f"host paths must be absolute, got {path!r}")
    normal = "/" + posixpath.normpath(path).lstrip("/")  # normpath keeps a leading "//"
    if normal in REFUSED_HOST_PATHS or normal.startswith(REFUSED_HOST_TREES) or normal.endswith(".sock"):
        raise ValueError(f"refusing to mount {normal} into a user's container")
    return normal


def _host_path(mount: dict) -> str | None:
    """The host path a mount exposes: a bind's source, or the device of a ``local``
    volume with ``o=bind``; None for volumes that hold their own data (or NFS)."""
    if mount.get("Type", "bind") == "bind":
        return mount.get("Source") or ""
    options = ((mount.get("VolumeOptions") or {}).get("DriverConfig") or {}).get("Options") or {}
    if {"bind", "rbind"} & set(str(options.get("o", "")).split(",")):
        return str(options.get("device", ""))
    return None


def check_mounts(mounts: list[dict]) -> list[dict]:
    """The mounts as plain dicts; ValueError for a host path :func:`check_host_path`
    refuses (the Docker socket, ``/``, ...) or two mounts at one target."""
    plain = [dict(m) for m in mounts]
    targets = set()
    for m in plain:
        host = _host_path(m)
        if host is not None:
            check_host_path(host)
        target = posixpath.normpath(m.get("Target") or "")
        if target in targets:
            raise ValueError(f"two mounts at {target} in one container")
        targets.add(target)
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


@dataclass(frozen=True)
class Limits:
    """What one container may take: ``memory_bytes`` of memory, ``cpus`` cores (a CFS
    quota: Docker's ``NanoCPUs``), ``processes`` processes and threads (``Pids``); 0: no
    limit of that kind. ValueError (one line) below 0."""

    memory_bytes: int = 0
    cpus: float = 0.0
    processes: int = 0

    def __post_init__(self):
        for name in ("memory_bytes", "cpus", "processes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 (no limit) or more, got {getattr(self, name)}")

    def resources(self, *, reserve_cpus: bool = False) -> dict:
        """The task template's ``Resources``: the ``Limits`` that are set, and with
        ``reserve_cpus`` the CPUs as a ``Reservations`` too."""
        limits = {}
        if self.memory_bytes:
            limits["MemoryBytes"] = int(self.memory_bytes)
        if self.cpus:
            limits["NanoCPUs"] = round(self.cpus * _NS)
        if self.processes:
            limits["Pids"] = int(self.processes)
        resources = {"Limits": limits} if limits else {}
        if reserve_cpus and self.cpus:
            resources["Reservations"] = {"NanoCPUs": round(self.cpus * _NS)}
        return resources


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


def _service(name: str, labels: dict[str, str], task_template: dict, published: tuple[int, ...] = ()) -> dict:
    """A one-replica service; ``published``: ports on its node's own address (host mode)."""
    # no VIP: the swarm's nodes may have no IPVS
    endpoint = {"Mode": "dnsrr"}
    if published:
        endpoint["Ports"] = [{"Protocol": "tcp", "TargetPort": p, "PublishedPort": p, "PublishMode": "host"}
                             for p in published]
    return {
        "name": name,
        "labels": dict(labels),
        "task_template": task_template,
        "mode": {"Replicated": {"Replicas": 1}},
        "endpoint_spec": endpoint,
    }


def notebook_service(
    *, name: str, image: str, owner: Owner, command: list[str], env: dict[str, str], secret_id: str,
    secret_name: str, user: str, home: str, ports: list[int], gpus: int, network: str, mounts: list[dict] = (),
    limits: Limits = Limits(),
) -> dict:
    """The user's notebook service: ``pdl-singleuser`` with the controller only, bounded
    by ``limits``.

    ``ports``: the Jupyter server's port, published on its node, then the controller's,
    on ``network`` only (all recorded in the ``pdl.ports`` label so later spawns avoid
    them). ``gpus``: engines it will get. ``network``: the server's private network
    (recorded in the ``pdl.network`` label: it is taken while the service exists).
    """
    labels = owner.labels("notebook", ports=",".join(map(str, ports)), gpus=str(gpus), network=network)
    contract = ServerContract(cluster_dir=CLUSTER_DIR, workers=gpus,
                              controller_secret=posixpath.join(SECRETS_DIR, NOTEBOOK_SECRET_FILE))
    env = {**env, "HOME": home, **contract.env()}
    ref = secret_ref(secret_id=secret_id, secret_name=secret_name, filename=NOTEBOOK_SECRET_FILE, user=user)
    container = container_spec(image=image, command=command, env=env, labels=labels, user=user,
                               workdir=home, secrets=[ref], mounts=mounts)
    task = {
        "ContainerSpec": container,
        "Networks": [{"Target": network}],
        "RestartPolicy": NOTEBOOK_RESTART,
    }
    if limits.resources():
        task["Resources"] = limits.resources()
    return _service(name, labels, task, published=(ports[0],))


def engine_service(
    *, name: str, image: str, owner: Owner, index: int, env: dict[str, str], secret_id: str,
    secret_name: str, user: str, home: str, gpu_resource: str, network: str, mounts: list[dict] = (),
    avoid_hosts: list[str] = (), gpu_type: str = "", limits: Limits = Limits(),
) -> dict:
    """Engine ``index`` of the user's server: ``pdl-engine`` on one GPU of any node
    except those named in ``avoid_hosts`` (and, with a ``gpu_type``, only on nodes whose
    label ``pdl.gpu-type`` names it; the service carries that label too), on the
    server's private ``network``, bounded by ``limits`` (its CPUs reserved)."""
    labels = owner.labels("engine", index=str(index), **({"gpu-type": gpu_type} if gpu_type else {}))
    env = {
        **env,
        "HOME": home,
        **EngineContract(connection=posixpath.join(SECRETS_DIR, ENGINE_SECRET_FILE), gpu_resource=gpu_resource,
                         host="{{.Node.Hostname}}").env(),
    }
    ref = secret_ref(secret_id=secret_id, secret_name=secret_name, filename=ENGINE_SECRET_FILE, user=user)
    container = container_spec(image=image, command=["pdl-engine"], env=env, labels=labels, user=user,
                               workdir=home, secrets=[ref], mounts=mounts)
    task = {
        "ContainerSpec": container,
        "Networks": [{"Target": network}],
        "Resources": _with_gpu(limits.resources(reserve_cpus=True), gpu_resource),
        "Placement": {"Preferences": [{"Spread": {"SpreadDescriptor": "node.id"}}]},
        "RestartPolicy": ENGINE_RESTART,
    }
    constraints = [f"node.hostname!={host}" for host in avoid_hosts]
    if gpu_type:
        constraints.append(f"node.labels.{GPU_TYPE_LABEL}=={gpu_type}")
    if constraints:
        task["Placement"]["Constraints"] = constraints
    return _service(name, labels, task)


def _with_gpu(resources: dict, gpu_resource: str) -> dict:
    """``resources`` with one unit of ``gpu_resource`` reserved too."""
    reservations = {**resources.get("Reservations", {}),
                    "GenericResources": [{"DiscreteResourceSpec": {"Kind": gpu_resource, "Value": 1}}]}
    return {**resources, "Reservations": reservations}


# -- private networks -----------------------------------------------------------

def private_network(index: int) -> dict:
    """``create_network`` kwargs of the hub's private network ``index``: an overlay that
    only services join (not attachable: ``docker run --network`` cannot)."""
    return {
        "name": PRIVATE_NETWORK.format(index=index),
        "driver": "overlay",
        "attachable": False,
        "check_duplicate": True,
        "labels": {LABEL_PREFIX + "role": "network", LABEL_PREFIX + "index": str(index)},
    }


def network_keeper_service(*, image: str, networks: list[str], user: str) -> dict:
    """``create_service`` kwargs of the keeper: one idle container on every node, on
    every private network, so each node joins each network once, before any GPU task.

    Why: Swarm records a node's first task on an overlay network by updating the node,
    and Docker Engine before 23.0 then rejects every GPU task running there ("assigned
    node no longer meets constraints", moby/moby#44378): without the keeper, one
    user's spawn would restart another user's engines.
    """
    labels = {LABEL_PREFIX + "role": "network-keeper"}
    container = container_spec(image=image, command=["sleep", "infinity"], env={}, labels=labels, user=user,
                               workdir="/", secrets=[])
    container["ReadOnly"] = True
    task = {
        "ContainerSpec": container,
        "Networks": [{"Target": n} for n in networks],
        "Resources": {"Limits": {"MemoryBytes": 32 * 1024 * 1024}},
        "RestartPolicy": {"Condition": "any", "Delay": 1 * _NS},
    }
    return {"name": NETWORK_KEEPER, "labels": labels, "task_template": task, "mode": {"Global": {}},
            "endpoint_spec": {"Mode": "dnsrr"}}


def gpu_reader_service(*, image: str, nvidia_smi: str, every_s: int, user: str, mounts: list[dict] = ()) -> dict:
    """``create_service`` kwargs of the GPU reader (:mod:`pdl_spawner.swarm.gpu_use`): on
    every node, ``nvidia-smi`` prints each GPU's UUID, use (percent) and memory (in use,
    in all: MiB) every ``every_s`` seconds, for the hub to read through the manager's logs. The hub's own service, in
    the admin's ``image``: every GPU visible (``NVIDIA_VISIBLE_DEVICES=all``, the NVIDIA
    runtime's own variable), none reserved, no network, read-only, logs capped."""
    labels = {LABEL_PREFIX + "role": "gpu-reader"}
    container = container_spec(
        image=image, command=[nvidia_smi, "--query-gpu=uuid,utilization.gpu,memory.used,memory.total",
                              "--format=csv,noheader,nounits",
                              "-l", str(every_s)],
        env={"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility",
             "PDL_NODE": "{{.Node.Hostname}}"},
        labels=labels, user=user, workdir="/", secrets=[], mounts=mounts)
    container["ReadOnly"] = True
    task = {
        "ContainerSpec": container,
        "Resources": {"Limits": {"MemoryBytes": 64 * 1024 * 1024}},
        "RestartPolicy": {"Condition": "any", "Delay": 5 * _NS},
        "LogDriver": {"Name": "json-file", "Options": {"max-size": "1m", "max-file": "2"}},
    }
    return {"name": GPU_READER, "labels": labels, "task_template": task, "mode": {"Global": {}},
            "endpoint_spec": {"Mode": "dnsrr"}}


# -- storage ------------------------------------------------------------------------

#: How a user's home can be provided (``PDLSwarmSpawner.home_storage``).
HOME_KINDS = ("volume", "path")
#: The home's named volume; ``{username}`` is the escaped hub user name.
HOME_VOLUME = "pdl-home-{username}"
#: Where the read-only dataset is mounted, and CINIC-10 in it.
DATA_DIR = "/data"
CINIC10_DIR = "/data/cinic10"
#: Where the node-local cache volume is mounted, and CINIC-10's staged copy in it.
#: /var/tmp because a new volume takes the owner and mode of the image's folder at its
#: mount point: /var/tmp (sticky, world-writable) is writable by any ``run_as``; a
#: folder the image lacks, such as /cache, would be root's.
CACHE_DIR = "/var/tmp"
CINIC10_CACHE = "/var/tmp/cinic10"
#: Docker's rule for volume names.
_VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_DATA_HELP = ("data_storage must be None, {'kind': 'path', 'source': '/srv/pdl/data'} or "
              "{'kind': 'nfs', 'addr': '10.0.0.5', 'export': '/export/data'} (optional 'options': 'nfsvers=4')")


def check_home_kind(kind: str) -> str:
    if kind not in HOME_KINDS:
        raise ValueError(f"home_storage must be {' or '.join(map(repr, HOME_KINDS))}, got {kind!r}")
    return kind


def check_home_path_template(template: str) -> str:
    """An absolute host path containing ``{username}``; "" (unset) passes."""
    if template and "{username}" not in template:
        raise ValueError(f"home_path_template must contain {{username}} (one home per user), got {template!r}")
    if template:
        check_host_path(template.replace("{username}", "user"))
    return template


def check_volume_template(template: str, setting: str) -> str:
    """A Docker volume name once ``{username}`` is filled in; "" passes."""
    if template and not _VOLUME_NAME.fullmatch(template.replace("{username}", "user")):
        raise ValueError(f"{setting} must be a Docker volume name ([A-Za-z0-9_.-], "
                         f"optionally with {{username}}), got {template!r}")
    return template


def check_data(data) -> dict | None:
    """``data_storage`` normalised: None, ``{"kind": "path", "source"}`` or
    ``{"kind": "nfs", "addr", "export", "options"}``; ValueError saying what is valid."""
    if data is None:
        return None
    keys = {"path": ({"kind", "source"}, set()), "nfs": ({"kind", "addr", "export"}, {"options"})}
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in keys:
        raise ValueError(f"{_DATA_HELP}; got {data!r}")
    required, optional = keys[kind]
    if not required <= set(data) <= required | optional or not all(
            isinstance(v, str) and v for v in data.values()):
        raise ValueError(f"{_DATA_HELP}; got {data!r}")
    if kind == "path":
        return {"kind": "path", "source": check_host_path(data["source"])}
    if not data["export"].startswith("/") or "," in data["addr"]:
        raise ValueError(f"{_DATA_HELP}; got {data!r}")
    return {"kind": "nfs", "addr": data["addr"], "export": posixpath.normpath(data["export"]),
            "options": data.get("options", "")}


def _volume(name: str, target: str, role: str, *, driver: str = "local", options: dict | None = None,
            labels: dict[str, str] | None = None, read_only: bool = False) -> dict:
    """A named-volume mount; Docker creates the volume on the task's node at first use."""
    config = {"Name": driver, **({"Options": dict(options)} if options else {})}
    mount = {"Type": "volume", "Source": name, "Target": target}
    if read_only:
        mount["ReadOnly"] = True
    mount["VolumeOptions"] = {"Labels": {LABEL_PREFIX + "volume": role, **(labels or {})}, "DriverConfig": config}
    return mount


@dataclass(frozen=True)
class Storage:
    """Where a user's files live, as mounts: the same in the notebook and every engine.

    - ``home``: ``"volume"``: the named volume :data:`HOME_VOLUME` of ``home_volume_driver``
      with ``home_volume_driver_opts`` (``{username}`` filled in). With the ``local``
      driver and no options that is a folder on the task's node: it survives restarts
      on that node only. ``"path"``: a bind of ``home_path_template``, which every node
      mounts from shared storage at the same path; Docker refuses a task whose source
      folder is missing, so the admin creates it, owned by ``run_as``.
    - ``data``: :func:`check_data`; mounted read-only at :data:`DATA_DIR`.
    - ``cache_volume``: the node-local cache volume's name (``{username}`` filled in),
      at :data:`CACHE_DIR`; "" for none.
    """

    home: str = "volume"
    home_volume_driver: str = "local"
    home_volume_driver_opts: dict = field(default_factory=dict)
    home_path_template: str = ""
    data: dict | None = None
    cache_volume: str = "pdl-cache-{username}"

    def home_mount(self, username: str, target: str) -> dict:
        if check_home_kind(self.home) == "path":
            if not self.home_path_template:
                raise ValueError("home_storage is 'path' but home_path_template is empty")
            source = check_home_path_template(self.home_path_template).replace("{username}", username)
            return {"Type": "bind", "Source": check_host_path(source), "Target": target}
        options = {k: str(v).replace("{username}", username) for k, v in self.home_volume_driver_opts.items()}
        return _volume(HOME_VOLUME.format(username=username), target, "home", driver=self.home_volume_driver,
                       options=options, labels={LABEL_PREFIX + "user": username})

    def data_mount(self) -> dict | None:
        data = check_data(self.data)
        if data is None:
            return None
        if data["kind"] == "path":
            return {"Type": "bind", "Source": data["source"], "Target": DATA_DIR, "ReadOnly": True}
        # named after its options: Docker keeps a volume's options from its first use on a node
        digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
        o = ",".join(filter(None, [f"addr={data['addr']}", "ro", data["options"]]))
        options = {"type": "nfs", "o": o, "device": f":{data['export']}"}
        return _volume(f"pdl-data-{digest}", DATA_DIR, "data", options=options, read_only=True)

    def cache_mount(self, username: str) -> dict | None:
        if not check_volume_template(self.cache_volume, "cache_volume"):
            return None
        return _volume(self.cache_volume.replace("{username}", username), CACHE_DIR, "cache",
                       labels={LABEL_PREFIX + "user": username})

    def mounts(self, username: str, home: str) -> list[dict]:
        """The mounts for ``username`` (escaped: a Docker name part) with HOME at ``home``."""
        mounts = [self.home_mount(username, home), self.data_mount(), self.cache_mount(username)]
        return check_mounts([m for m in mounts if m is not None])

    def env(self) -> dict[str, str]:
        """``CINIC10_DIR`` and ``CINIC10_CACHE`` where the dataset and the cache are mounted."""
        env = {}
        if self.data is not None:
            env["CINIC10_DIR"] = CINIC10_DIR
        if self.cache_volume:
            env["CINIC10_CACHE"] = CINIC10_CACHE
        return env
