"""``PDLSwarmSpawner``: each user's server and GPU engines as Docker Swarm services.

A subclass of dockerspawner's ``SwarmSpawner`` that overrides its hooks; every Docker
call goes through dockerspawner's one seam, ``self.docker(method, ...)`` (docker-py's
low-level ``APIClient``, in a worker thread). Specs come from the pure builders in
:mod:`pdl_spawner.swarm_specs`, swarm bookkeeping from :mod:`pdl_spawner.swarm_state`,
connection info and keys from :mod:`pdl.connection`.

Contract:

- ``start()`` first checks ``user_options``: ``workers`` and ``queue`` are the only
  keys a user may set; any other (``image``, ``mounts``, ``env``, ...) fails with HTTP
  400 naming the valid options, before any Docker call. It then counts free GPUs (what
  the nodes offer minus what running or pending tasks of services scaled above 0
  reserve, and GPUs promised to spawns in progress in this hub). If the request can't
  be met, or others wait in the queue, it raises HTTP 409 at once, with one line saying
  how many are free of how many and who holds the rest (names only to admins), and
  creates nothing; with ``queue: true`` it waits in the hub's fair queue instead
  (:mod:`pdl_spawner.queueing`, in :attr:`PDLSwarmSpawner.state_db`). Otherwise it
  takes a free private network of the hub's pool (:mod:`pdl_spawner.swarm_networks`;
  HTTP 409 when all are taken), generates the cluster keys, picks the ports, and
  creates the notebook secret and service on that network; once the notebook task
  runs, it creates the engine secret (the controller's address on the network, ports
  and keys) and one engine service per GPU on the same network, and returns when every
  engine task runs. An engine task left pending for
  lack of GPUs (a race with another hub or service) for more than ``starved_timeout``
  seconds makes it remove everything and raise the same 409. Any failure removes
  everything it created: nothing is left pending.
- ``stop()`` removes every service and secret labelled with this server's
  ``pdl.owner`` and waits until their tasks stopped, so their GPUs are free.
- Storage (:class:`~pdl_spawner.swarm_specs.Storage`: ``home_storage``, ``data_storage``,
  ``cache_volume``) is mounted the same in the notebook and every engine, after which
  come the mounts of dockerspawner's ``volumes``. A storage setting that cannot work
  (``home_storage = "path"`` without a template, a refused host path) fails the spawn
  with HTTP 500 naming it, before any Docker call; a mount Docker cannot make (a
  missing host folder) fails it once the task is rejected.
- With ``engine_idle_timeout``, engines idle that long are scaled to 0 (their GPUs go
  back to the swarm, the reclaim is logged in ``state_db``) and back to 1 when a cell
  asks, if the GPUs are free and nobody waits in the queue
  (:meth:`PDLSwarmSpawner.tend_lease`; :mod:`pdl_server.lease`).
- ``poll()`` watches the notebook task (SwarmSpawner's); the state
  (:class:`~pdl_spawner.swarm_state.SwarmServer`: ports, node, keys, service and
  secret ids) survives hub restarts, and ``poll()`` works after ``load_state``.
"""

from __future__ import annotations

import asyncio
import secrets
import time

from docker.errors import APIError, NotFound
from dockerspawner import SwarmSpawner
from jupyterhub.utils import url_path_join
from tornado import web
from traitlets import Dict, Float, Instance, Integer, List, Tuple, Unicode, Union, default, validate

from pdl.connection import PORTS_NEEDED, ClusterKeys, engine_file, notebook_secret
from pdl_server.contract import ServerContract

from . import form, swarm_specs
from .db_thread import off_loop
from .idle_engines import IdleEngines, idle_reason
from .queueing import NotFreeYet, QueueingSpawner
from .reservations import SlotLedger
from .swarm_holdings import gpu_holdings
from .swarm_networks import NetworkPool, NoFreeNetwork
from .swarm_specs import LABEL_PREFIX, Owner
from .swarm_state import (
    ACTIVE_TASK_STATES, FAILED_TASK_STATES, GpuUsage, SwarmServer, excluded_hostnames, gpu_usage, network_address,
    node_address, pick_ports, select_nodes, service_replicas, starved_tasks, task_error, used_ports,
)

#: Seconds between checks while waiting for tasks.
POLL_S = 0.25
#: Seconds stop() waits for removed services' tasks to stop.
STOP_WAIT_S = 30.0
#: Upper bound on GPUs per server when ``max_gpus`` is 0 (the real bound is what is free).
GPU_REQUEST_CAP = 1024


class TaskFailed(web.HTTPError, RuntimeError):
    """A task of the server will never run (rejected: a missing image or home folder,
    failed, ...): HTTP 500 whose one line JupyterHub shows the user as it is, on the
    spawn page, in the progress events and in the REST API."""

    def __init__(self, message: str):
        super().__init__(500, message, reason=message)
        self.jupyterhub_message = message


class PDLSwarmSpawner(QueueingSpawner, IdleEngines, SwarmSpawner):
    """A user's notebook (with its ipyparallel controller) plus one engine service per GPU."""

    worker_unit = "GPUs"

    default_gpus = Integer(1, config=True, help="GPUs (engines) pre-filled in the spawn form.")

    max_gpus = Integer(
        0, config=True,
        help="Most GPUs one user may reserve; 0 means as many as the swarm has free.",
    )

    engine_image = Unicode(
        "", config=True,
        help="Image of the engine services. Empty means the notebook's image (`image`). "
        "It must provide `pdl-engine` (pip install pdl).",
    )

    gpu_resource = Unicode(
        "NVIDIA-GPU", config=True,
        help="""Swarm generic resource one engine reserves one unit of. Each node's daemon.json
        declares its GPUs under this name (`"node-generic-resources": ["NVIDIA-GPU=GPU-<uuid>"]`).""",
    )

    run_as = Unicode(
        "1000:1000", config=True,
        help="Numeric uid:gid the notebook and engine containers run as. Root is refused.",
    )

    @validate("run_as")
    def _validate_run_as(self, proposal):
        swarm_specs.uid_gid(proposal.value)
        return proposal.value

    container_home = Unicode(
        "/home/jovyan", config=True,
        help="HOME and working directory inside the containers; must be writable by `run_as`.",
    )

    port_range = Tuple(
        Integer(), Integer(), default_value=(20000, 32000), config=True,
        help="""Ports (inclusive) the hub picks from for each notebook's Jupyter server and
        ipyparallel controller. The Jupyter server's is published on its node's address,
        so these must be free on every node; below Linux's ephemeral range (32768+) by default.""",
    )

    private_networks = Integer(
        16, min=1, config=True,
        help="""Private overlay networks the hub keeps, one per running server (its notebook
        and engines talk only there). A spawn when all are taken fails with HTTP 409.
        Raising it adds networks to every node once; on Docker Engine before 23.0 that
        restarts the GPU tasks running at that moment.""",
    )

    nodes = List(
        Unicode(), config=True,
        help="Hostnames of the swarm nodes whose GPUs PDL hands out (engines run only there); "
        "empty: every node. A name that is not a node of the swarm fails each spawn with a one-line error.",
    )

    starved_timeout = Float(
        5.0, config=True,
        help="Seconds an engine task may wait for a GPU (another spawn took it first) "
        "before the spawn is abandoned with HTTP 409.",
    )

    home_storage = Unicode(
        "volume", config=True,
        help="""How each user's home (`container_home`, in the notebook and every engine) is kept.
        "volume": the Docker named volume `pdl-home-{username}` of `home_volume_driver`. With the
        default local driver and no options it is a folder on the node the task runs on: it
        survives server restarts on that node, but not a move to another node (and engines on
        other nodes see their own). With a shared driver or NFS options it follows the user.
        "path": a bind mount of `home_path_template`, a folder every node mounts from shared
        storage (NFS at the same path on every node); the admin creates it, owned by `run_as`.""",
    )

    home_volume_driver = Unicode(
        "local", config=True,
        help="Docker volume driver of the home volume (`home_storage = \"volume\"`), on every node.",
    )

    home_volume_driver_opts = Dict(
        value_trait=Unicode(), config=True,
        help="""Options of the home volume's driver; `{username}` is filled in. NFS with the local
        driver: {"type": "nfs", "o": "addr=10.0.0.5,rw,nfsvers=4", "device": ":/export/home/{username}"}.
        Docker keeps a volume's options from its first use on each node.""",
    )

    home_path_template = Unicode(
        "", config=True,
        help="""Host folder of each user's home when `home_storage = "path"`, e.g.
        `/srv/pdl/home/{username}` ({username}: the escaped user name). The same on every
        node (shared storage). A missing folder fails the spawn naming it.""",
    )

    data_storage = Union(
        [Dict()], default_value=None, allow_none=True, config=True,
        help="""The dataset, mounted read-only at /data in the notebook and every engine
        (`CINIC10_DIR=/data/cinic10` unless `environment` sets it). None: no dataset.
        {"kind": "path", "source": "/srv/pdl/data"}: that host folder on each node.
        {"kind": "nfs", "addr": "10.0.0.5", "export": "/export/data"} (optional "options",
        e.g. "nfsvers=4"): an NFS export, mounted by each node.""",
    )

    cache_volume = Unicode(
        "pdl-cache-{username}", config=True,
        help="""Node-local volume (driver local: one per node) at /var/tmp in the notebook and
        every engine, where datasets are staged once per node (`CINIC10_CACHE=/var/tmp/cinic10`
        unless `environment` sets it): a user's ranks on one node share it. One per user by
        default: every user's containers run as the same `run_as`, so in a volume shared by
        all ("pdl-cache") any user could alter what the others load. "": no cache volume.""",
    )

    @validate("home_storage")
    def _validate_home_storage(self, proposal):
        return swarm_specs.check_home_kind(proposal.value)

    @validate("home_path_template")
    def _validate_home_path_template(self, proposal):
        return swarm_specs.check_home_path_template(proposal.value)

    @validate("data_storage")
    def _validate_data_storage(self, proposal):
        return swarm_specs.check_data(proposal.value)

    @validate("cache_volume")
    def _validate_cache_volume(self, proposal):
        return swarm_specs.check_volume_template(proposal.value, "cache_volume")

    state_db = Unicode(
        "pdl-swarm.sqlite", config=True,
        help="SQLite file of the hub's queue and its log of reclaimed GPUs (relative to the hub's "
        "working directory). Every spawner of one hub must use the same file.",
    )

    swarm = Instance(SwarmServer, args=(), help="This server's swarm objects (spawner state).")

    @default("prefix")
    def _default_prefix(self):
        return "pdl"

    @default("cmd")
    def _default_cmd(self):
        return ["pdl-singleuser"]

    @default("options_form")
    def _default_options_form(self):
        return self._render_options_form

    # -- whose, and how many ----------------------------------------------------

    @property
    def owner(self) -> Owner:
        return Owner(self.user.name, self.name or "")

    @property
    def owner_key(self) -> str:
        return self.owner.key

    @property
    def queue_db(self) -> str:
        return self.state_db

    def ready_to_start(self) -> bool:
        return self.owner.key in PDLSwarmSpawner._promised or bool(self.object_id)

    async def describe_free(self) -> tuple[int, int, dict[str, int]]:
        usage = await self.gpu_usage()
        return usage.free, usage.total, usage.holders

    def _gpu_limit(self, total: int) -> int:
        return max(1, min(self.max_gpus or total, total))

    async def _render_options_form(self, spawner) -> str:
        usage = await self.gpu_usage()
        return form.render_form(
            waiting=await self.waiting(), kind="gpu", pool_size=usage.total, free=usage.free, holders=usage.holders,
            default=self.default_gpus, maximum=self._gpu_limit(usage.total), show_names=bool(self.user.admin),
        )

    def options_from_form(self, formdata):
        try:
            options = {"workers": form.parse_workers(formdata, maximum=self.max_gpus or GPU_REQUEST_CAP)}
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None
        if form.wants_queue(formdata):
            options["queue"] = True
        return options

    def requested_gpus(self) -> int:
        """``workers`` from the user options, or HTTPError(400) naming the valid option."""
        try:
            n = form.requested_workers(self.user_options, default=self.default_gpus,
                                       maximum=self.max_gpus or GPU_REQUEST_CAP)
        except ValueError as e:
            raise web.HTTPError(400, str(e), reason=str(e)) from None
        return n

    # -- GPUs ----------------------------------------------------------------------

    #: GPUs granted to spawns of this hub whose engine tasks don't exist yet:
    #: owner -> (user, GPUs). Shared by every spawner of the process.
    _promised: dict[str, tuple[str, int]] = {}
    _promise_lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
    #: The private networks' claims, shared by every spawner of the process.
    _networks = NetworkPool()

    async def gpu_usage(self) -> GpuUsage:
        """GPUs of the swarm and their holders, this server's own not counted."""
        nodes = await self.cluster_nodes()
        services = await self.docker("services", filters={"label": [f"{LABEL_PREFIX}role=engine"]})
        tasks = await self.docker("tasks", filters={"desired-state": ["running"]})
        if self.nodes:  # tasks placed on the other nodes hold none of these GPUs
            ids = {n["ID"] for n in nodes}
            tasks = [t for t in tasks if t.get("NodeID") in ids or not t.get("NodeID")]
        return gpu_usage(nodes, services, tasks, self.gpu_resource,
                         promised=PDLSwarmSpawner._promised, exclude_owner=self.owner.key)

    async def cluster_nodes(self) -> list[dict]:
        """The swarm's nodes that PDL uses (:attr:`nodes`), or HTTP 500 naming the bad names."""
        try:
            return select_nodes(await self.docker("nodes"), self.nodes)
        except ValueError as e:
            message = f"PDLSwarmSpawner.nodes: {e}"
            raise web.HTTPError(500, message, reason=message) from None

    def not_enough(self, wanted: int, usage: GpuUsage) -> web.HTTPError:
        message = form.not_enough_message(wanted, usage.free, usage.total, usage.holders,
                                          show_names=bool(self.user.admin), unit="GPUs")
        return web.HTTPError(409, message, reason=message)

    async def promise_gpus(self, n: int, *, spawning: bool = True) -> None:
        """Grant ``n`` GPUs to this spawn (``spawning``) or to engines a cell asks back,
        or raise HTTP 409 saying what is free (or that others wait in the queue ahead of it)."""
        loop = asyncio.get_running_loop()
        if PDLSwarmSpawner._promise_lock is None or PDLSwarmSpawner._promise_lock[0] is not loop:
            PDLSwarmSpawner._promise_lock = (loop, asyncio.Lock())
        async with PDLSwarmSpawner._promise_lock[1]:
            await self.refuse_while_others_wait(spawning=spawning)
            usage = await self.gpu_usage()
            if n > usage.free:
                raise self.not_enough(n, usage)
            PDLSwarmSpawner._promised[self.owner.key] = (self.user.name, n)

    def forget_promise(self) -> None:
        PDLSwarmSpawner._promised.pop(self.owner.key, None)

    async def wait_and_promise(self, n: int) -> None:
        """Wait in the queue (:meth:`QueueingSpawner.wait_in_queue`) until ``n`` GPUs are promised."""

        async def take() -> None:
            try:
                await self.promise_gpus(n)
            except web.HTTPError as e:
                if e.status_code != 409:
                    raise
                raise NotFreeYet() from None

        await self.wait_in_queue(n, take)

    # -- storage ---------------------------------------------------------------------

    @property
    def storage(self) -> swarm_specs.Storage:
        return swarm_specs.Storage(
            home=self.home_storage, home_volume_driver=self.home_volume_driver,
            home_volume_driver_opts=dict(self.home_volume_driver_opts), home_path_template=self.home_path_template,
            data=self.data_storage, cache_volume=self.cache_volume,
        )

    def storage_mounts(self) -> list[dict]:
        """This user's storage mounts, then those of ``volumes``; HTTP 500 naming a bad setting."""
        try:
            return swarm_specs.check_mounts([*self.storage.mounts(self.escaped_name, self.container_home),
                                             *self.mounts])
        except ValueError as e:
            message = f"PDLSwarmSpawner storage: {e}"
            raise web.HTTPError(500, message, reason=message) from None

    # -- env and secrets -------------------------------------------------------------

    def get_env(self):
        """JupyterHub's environment minus its secrets (they go in the notebook secret)."""
        env = super().get_env()
        for name in swarm_specs.SECRET_ENV:
            env.pop(name, None)
        env.update(ServerContract(idle_timeout_s=self.engine_idle_timeout).env())
        return env

    def user_environment(self) -> dict[str, str]:
        """``Spawner.environment`` (callables evaluated) over the storage's variables:
        what the engines get."""
        return {**self.storage.env(), **{k: str(v(self) if callable(v) else v) for k, v in self.environment.items()}}

    async def create_secret(self, kind: str, data: dict) -> tuple[str, str]:
        name = f"{self.object_name}-{kind}-{secrets.token_hex(4)}"
        spec = swarm_specs.secret(name=name, data=data, labels=self.owner.labels("secret", kind=kind))
        created = await self.docker("create_secret", **spec)
        self.swarm.secrets.append(created["ID"])
        return created["ID"], name

    # -- dockerspawner hooks -----------------------------------------------------------

    async def start(self):
        self.requested_gpus()  # refuse other options (image, mounts, ...) before any Docker call
        self.storage_mounts()  # and storage settings that cannot work
        try:
            url = await super().start()
            self.watch_lease()
            return url
        except BaseException:
            self.log.warning("Spawn of %s failed; removing its services and secrets", self.owner.key)
            try:
                await self.remove_object()
            except Exception:
                self.log.exception("Could not clean up after the failed spawn of %s", self.owner.key)
            self.object_id = ""
            raise
        finally:
            self.forget_promise()
            PDLSwarmSpawner._networks.release(self.owner.key)

    async def claim_network(self) -> str:
        """A private network of the pool for this server, or HTTP 409 when all are taken."""
        try:
            network, ready = await PDLSwarmSpawner._networks.claim(
                self.docker, self.owner.key, size=self.private_networks, image=self.image, user=self.run_as)
        except NoFreeNetwork as e:
            raise web.HTTPError(409, str(e), reason=str(e)) from None
        if not ready:
            self.log.warning("The network keeper (%s) does not run on every node yet; on Docker Engine "
                             "before 23.0, GPU tasks may restart", swarm_specs.NETWORK_KEEPER)
        return network

    async def create_object(self):
        """Check and promise the GPUs, take a private network, then create the notebook
        secret and service."""
        n = self.requested_gpus()
        mounts = self.storage_mounts()
        if self.wants_queue:
            await self.wait_and_promise(n)
        else:
            await self.promise_gpus(n)
        network = await self.claim_network()
        keys = self.swarm.keys or ClusterKeys.generate()
        notebooks = await self.docker("services", filters={"label": [f"{LABEL_PREFIX}role=notebook"]})
        ports = pick_ports(1 + PORTS_NEEDED, used_ports(notebooks), *self.port_range)
        self.swarm = SwarmServer(gpus=n, port=ports[0], controller_ports=ports[1:], keys=keys,
                                 api_token=self.api_token, network=network)
        self.port = ports[0]
        secret_id, secret_name = await self.create_secret(
            "notebook", notebook_secret(keys, self.swarm.controller_ports, self.api_token))
        spec = swarm_specs.notebook_service(
            name=self.object_name, image=self.image, owner=self.owner, command=await self.get_command(),
            env={**self.storage.env(), **self.get_env()}, secret_id=secret_id, secret_name=secret_name,
            user=self.run_as, home=self.container_home, ports=ports, gpus=n, network=network, mounts=mounts,
        )
        return await self.docker("create_service", **spec)

    async def get_command(self):
        return [*self.cmd, *self.get_args()]

    async def start_object(self):
        """Wait for the notebook task, then create the engines and wait for them."""
        task = (await self.wait_tasks([self.object_id], "notebook"))[0]
        self.swarm.node_addr = node_address(await self.docker("inspect_node", task["NodeID"]))
        keys, ports = self.swarm.keys, self.swarm.controller_ports
        controller = network_address(task, self.swarm.network)
        secret_id, secret_name = await self.create_secret("engine", engine_file(keys, ports, controller))
        avoid = excluded_hostnames(await self.docker("nodes"), self.nodes)
        mounts = self.storage_mounts()
        for index in range(self.swarm.gpus):
            spec = swarm_specs.engine_service(
                name=f"{self.object_name}-engine-{index}", image=self.engine_image or self.image,
                owner=self.owner, index=index, env=self.user_environment(), secret_id=secret_id,
                secret_name=secret_name, user=self.run_as, home=self.container_home,
                gpu_resource=self.gpu_resource, network=self.swarm.network, mounts=mounts, avoid_hosts=avoid,
            )
            self.swarm.engine_services.append((await self.docker("create_service", **spec))["ID"])
        await self.wait_tasks(self.swarm.engine_services, "engine", holds_gpus=True)

    async def wait_tasks(self, service_ids: list[str], what: str, *, current_only: bool = False,
                         holds_gpus: bool = False) -> list[dict]:
        """The running task of each service, once all run.

        Raises :class:`TaskFailed` (HTTP 500, a RuntimeError) when a task fails, and
        HTTP 409 when one waits for a GPU longer than ``starved_timeout``. ``what``
        names the services in messages. ``holds_gpus``: the services reserve GPUs, so
        the GPUs promised to this spawn are released once every service has its task
        (from then on Swarm counts them); a notebook's task holds none, so the promise
        outlives it. ``current_only``: look only at tasks meant to run (services scaled
        up again, whose earlier tasks were shut down).
        """
        starved_since = None
        filters = {"service": list(service_ids)}
        if current_only:
            filters["desired-state"] = ["running"]
        while True:
            tasks = await self.docker("tasks", filters=filters)
            current = {}
            for t in sorted(tasks, key=lambda t: t.get("Version", {}).get("Index", 0)):
                current[t["ServiceID"]] = t
            if holds_gpus and len(current) == len(service_ids):
                self.forget_promise()
            for t in current.values():
                if t["Status"]["State"] in FAILED_TASK_STATES:
                    raise TaskFailed(f"{what} task of {self.owner.key} did not start: {task_error(t)}")
            if starved_tasks(list(current.values())):
                starved_since = starved_since or time.monotonic()
                if time.monotonic() - starved_since > self.starved_timeout:
                    raise self.not_enough(self.swarm.gpus, await self.gpu_usage())
            else:
                starved_since = None
            if len(current) == len(service_ids) and all(
                t["Status"]["State"] == "running" for t in current.values()
            ):
                return [current[s] for s in service_ids]
            await asyncio.sleep(POLL_S)

    async def get_ip_and_port(self):
        return self.swarm.node_addr, self.swarm.port

    async def poll(self):
        status = await super().poll()
        if status is None and self.swarm.api_token:
            self.watch_lease()  # also after a hub restart
        return status

    async def stop(self, now=False):
        self.unwatch_lease()
        return await super().stop(now=now)

    # -- idle engines --------------------------------------------------------------

    @property
    def reclaim_log(self) -> SlotLedger:
        """Where reclaims are logged (the admin view lists them): :attr:`state_db`."""
        return SlotLedger(self.state_db)

    def lease_url(self) -> str | None:
        if self.server is None or not self.swarm.node_addr:
            return None
        return f"http://{self.swarm.node_addr}:{self.swarm.port}{url_path_join(self.server.base_url, 'pdl/api/lease')}"

    def lease_token(self) -> str | None:
        return self.swarm.api_token

    async def engine_services_now(self) -> list[dict]:
        return await self.docker("services", filters={"label": [f"{LABEL_PREFIX}owner={self.owner.key}",
                                                                  f"{LABEL_PREFIX}role=engine"]})

    async def scale_engines(self, services: list[dict], replicas: int) -> None:
        """Set every engine service of ``services`` to ``replicas`` tasks (0: its GPU is released)."""
        for svc in services:
            await self.docker("update_service", svc["ID"], svc["Version"]["Index"],
                              mode={"Replicated": {"Replicas": replicas}}, fetch_current_spec=True)

    async def tend_lease(self) -> None:
        """One look at the server's lease: scale engines released for idleness to 0 (their
        GPUs go back to the swarm; logged), then answer a request to have them again."""
        if self.server is None or not self.swarm.api_token:
            return
        lease = await self.lease()
        if not lease or not lease.get("released"):
            return
        services = await self.engine_services_now()
        running = [s for s in services if service_replicas(s)]
        if running:
            reason = idle_reason(self.engine_idle_timeout)
            tasks = await self.docker("tasks", filters={"service": [s["ID"] for s in running],
                                                         "desired-state": ["running"]})
            gpus = [f"{h.node}/{h.gpu}" for h in gpu_holdings(await self.docker("nodes"), running, tasks,
                                                               self.gpu_resource)] or [f"{len(running)} GPU(s)"]
            await self.scale_engines(running, 0)
            await off_loop(self.reclaim_log.log_reclaim, self.owner.key, gpus, reason)
            self.log.info("Reclaimed %s from %s: %s", ",".join(gpus), self.owner.key, reason)
        if not lease.get("want") or lease.get("grant"):
            return
        try:
            await self.bring_back_engines(services)
            answer = {"engines": len(services)}
            self.log.info("Granted %d GPU(s) to %s again", len(services), self.owner.key)
        except web.HTTPError as e:
            answer = {"refused": e.reason or e.log_message or str(e)}
        await self.lease(grant=answer)

    async def bring_back_engines(self, services: list[dict]) -> None:
        """Scale the engine services back to one task each once their GPUs are free, and
        wait until they run; HTTP 409 (one line, nothing left running) when they are not."""
        await self.promise_gpus(len(services), spawning=False)
        try:
            await self.scale_engines(await self.engine_services_now(), 1)
            wait = self.wait_tasks([s["ID"] for s in services], "engine", current_only=True, holds_gpus=True)
            try:
                await asyncio.wait_for(wait, timeout=self.start_timeout)
            except asyncio.TimeoutError:
                message = f"the engines did not start within {self.start_timeout} s"
                raise web.HTTPError(504, message, reason=message) from None
        except BaseException:
            try:
                await self.scale_engines(await self.engine_services_now(), 0)
            except (APIError, NotFound):
                self.log.warning("Could not scale the engines of %s back to 0", self.owner.key)
            raise
        finally:
            self.forget_promise()

    async def remove_object(self):
        """Remove every service and secret of this server; wait until its tasks stopped."""
        selector = self.owner.filter()
        services = [s["ID"] for s in await self.docker("services", filters=selector)]
        for service_id in services:
            try:
                await self.docker("remove_service", service_id)
            except NotFound:
                pass
        if services:
            await self.wait_stopped(services)
        for secret in await self.docker("secrets", filters=selector):
            await self.remove_secret(secret["ID"])
        if services:
            self.log.info("Removed %d service(s) of %s", len(services), self.owner.key)
        self.swarm.engine_services.clear()
        self.swarm.secrets.clear()

    async def wait_stopped(self, service_ids: list[str]) -> None:
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline:
            tasks = await self.docker("tasks")
            if not any(t.get("ServiceID") in service_ids and t["Status"]["State"] in ACTIVE_TASK_STATES
                       for t in tasks):
                return
            await asyncio.sleep(POLL_S)
        self.log.warning("Tasks of %s still stopping after %.0f s", self.owner.key, STOP_WAIT_S)

    async def remove_secret(self, secret_id: str) -> None:
        """Remove a secret, waiting while a removed service's task still uses it."""
        deadline = time.monotonic() + STOP_WAIT_S
        while True:
            try:
                await self.docker("remove_secret", secret_id)
                return
            except NotFound:
                return
            except APIError as e:
                if "in use" not in str(e) or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(POLL_S)

    # -- state -----------------------------------------------------------------

    def get_state(self):
        state = super().get_state()
        if self.object_id:
            state["pdl_swarm"] = self.swarm.to_state()
        return state

    def load_state(self, state):
        super().load_state(state)
        self.swarm = SwarmServer.from_state(state.get("pdl_swarm"))
        if self.swarm.port:
            self.port = self.swarm.port

    def clear_state(self):
        super().clear_state()
        self.swarm = SwarmServer()
