"""``PDLSwarmSpawner``: each user's server and GPU engines as Docker Swarm services.

A subclass of dockerspawner's ``SwarmSpawner`` that overrides its hooks; every Docker
call goes through dockerspawner's one seam, ``self.docker(method, ...)`` (docker-py's
low-level ``APIClient``, in a worker thread). Specs come from the pure builders in
:mod:`pdl_spawner.swarm.specs`, the server's state and task facts from
:mod:`pdl_spawner.swarm.state`, who holds which GPU from :mod:`pdl_spawner.swarm.gpus`,
connection info and keys from :mod:`pdl.connection`. The worker count, its limits
(``default_workers``, ``max_workers``; a worker here is one GPU), the form and the
queue are :mod:`pdl_spawner.core.spawner`'s, as for every PDL spawner.

Contract:

- ``start()`` first checks ``user_options``: ``workers`` and ``queue`` are the only
  keys a user may set (and ``gpu_type`` where PDL's nodes are labelled with two GPU
  types or more, :class:`~pdl_spawner.core.gpu_types.GpuTypeChoice`: then the GPUs
  counted are that type's and the engines run on its nodes only); any other
  (``image``, ``mounts``, ``env``, ...) fails with HTTP 400 naming the valid options,
  before any Docker call but the one that reads the types. It then counts free GPUs (what
  the nodes offer minus what :func:`~pdl_spawner.swarm.gpus.gpu_usage` counts held,
  and GPUs promised to spawns in progress in this hub). If the request can't
  be met, or others wait in the queue, it raises HTTP 409 at once, with one line saying
  how many are free of how many and who holds the rest (names only to admins), and
  creates nothing; with ``queue: true`` it waits in the hub's fair queue instead
  (:mod:`pdl_spawner.core.queueing`, in :attr:`PDLSwarmSpawner.state_db`). Otherwise it
  takes a free private network of the hub's pool (:mod:`pdl_spawner.swarm.networks`;
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
- Storage (:class:`~pdl_spawner.swarm.specs.Storage`: ``home_storage``, ``data_storage``,
  ``cache_volume``) is mounted the same in the notebook and every engine, after which
  come the mounts of dockerspawner's ``volumes``. A storage setting that cannot work
  (``home_storage = "path"`` without a template, a refused host path) fails the spawn
  with HTTP 500 naming it, before any Docker call; a mount Docker cannot make (a
  missing host folder) fails it once the task is rejected.
- With ``engine_idle_timeout``, engines idle that long are scaled to 0 (their GPUs go
  back to the swarm, the reclaim is logged in ``state_db``) and back to 1 when a cell
  asks, if the GPUs are free and nobody waits in the queue
  (:mod:`pdl_spawner.swarm.idle`; :mod:`pdl.lease`).
- ``poll()`` watches the notebook task (SwarmSpawner's); the state
  (:class:`~pdl_spawner.swarm.state.SwarmServer`: ports, node, keys, service and
  secret ids) survives hub restarts, and ``poll()`` works after ``load_state``.
"""

from __future__ import annotations

import asyncio
import secrets
import time

from dockerspawner import SwarmSpawner
from tornado import web
from traitlets import Float, Instance, Integer, Unicode, default, observe, validate

from pdl.connection import PORTS_NEEDED, ClusterKeys, engine_file, notebook_secret
from pdl.contract import ServerContract

from pdl_spawner.hub import metrics
from pdl_spawner.swarm import specs as swarm_specs
from pdl_spawner.core.spawner import SpawnerCore
from pdl_spawner.swarm.gpu_use import SwarmGpuUse
from pdl_spawner.swarm.idle import SwarmIdleEngines
from pdl_spawner.swarm.limits import SwarmLimits
from pdl_spawner.swarm.networks import NetworkPool, NoFreeNetwork
from pdl_spawner.swarm.promises import SwarmGpuPromises
from pdl_spawner.swarm.specs import LABEL_PREFIX, Owner
from pdl_spawner.swarm.state import (
    FAILED_TASK_STATES, SwarmServer, network_address, node_address, pick_ports, starved_tasks, task_error, used_ports,
)
from pdl_spawner.swarm.storage import SwarmStorage
from pdl_spawner.swarm.teardown import POLL_S, SwarmTeardown
from pdl_spawner.swarm.kind import KIND
from pdl_spawner.swarm.workers import SwarmGpus


class TaskFailed(web.HTTPError, RuntimeError):
    """A task of the server will never run (rejected: a missing image or home folder,
    failed, ...): HTTP 500 whose one line JupyterHub shows the user as it is, on the
    spawn page, in the progress events and in the REST API."""

    def __init__(self, message: str):
        super().__init__(500, message, reason=message)
        self.jupyterhub_message = message


class PDLSwarmSpawner(SwarmGpuPromises, SwarmStorage, SwarmIdleEngines, SwarmGpuUse, SwarmTeardown,
                      SwarmLimits, SpawnerCore, SwarmSpawner):
    """A user's notebook (with its ipyparallel controller) plus one engine service per
    GPU: the worker rules of :class:`~pdl_spawner.core.spawner.SpawnerCore`, the GPUs its
    source of workers (:class:`~pdl_spawner.swarm.workers.SwarmGpus`), with the swarm's
    nodes and promises of :class:`~pdl_spawner.swarm.promises.SwarmGpuPromises`, storage by
    :class:`~pdl_spawner.swarm.storage.SwarmStorage`, idle engines by
    :class:`~pdl_spawner.swarm.idle.SwarmIdleEngines`, removal by
    :class:`~pdl_spawner.swarm.teardown.SwarmTeardown`, each container's limits by
    :class:`~pdl_spawner.swarm.limits.SwarmLimits`; here the services' life."""

    kind_name = KIND.name

    worker_source = SwarmGpus

    default_gpus = Integer(
        None, allow_none=True, config=True,
        help="Deprecated name of `default_workers` (a worker on Swarm is one GPU); it sets that.",
    )

    max_gpus = Integer(
        None, allow_none=True, config=True,
        help="Deprecated name of `max_workers` (a worker on Swarm is one GPU); it sets that.",
    )

    @observe("default_gpus", "max_gpus")
    def _set_the_workers_setting(self, change):
        if change.new is not None:
            new_name = change.name.replace("gpus", "workers")
            self.log.warning("PDLSwarmSpawner.%s is deprecated: set %s", change.name, new_name)
            setattr(self, new_name, change.new)

    engine_image = Unicode(
        "", config=True,
        help="Image of the engine services. Empty means the notebook's image (`image`). "
        "It must provide `pdl-engine` (pip install pdl).",
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

    private_networks = Integer(
        16, min=1, config=True,
        help="""Private overlay networks the hub keeps, one per running server (its notebook
        and engines talk only there). A spawn when all are taken fails with HTTP 409.
        Raising it adds networks to every node once; on Docker Engine before 23.0 that
        restarts the GPU tasks running at that moment.""",
    )

    starved_timeout = Float(
        5.0, config=True,
        help="Seconds an engine task may wait for a GPU (another spawn took it first) "
        "before the spawn is abandoned with HTTP 409.",
    )

    state_db = Unicode(
        "pdl-swarm.sqlite", config=True,
        help="SQLite file of the hub's queue and its log of reclaimed GPUs (relative to the hub's "
        "working directory). Every spawner of one hub must use the same file.",
    )

    swarm = Instance(SwarmServer, args=(), help="This server's swarm objects (spawner state).")

    @default("image")
    def _default_image(self):
        """PDL's notebook image (scripts/build-images), as a cluster's registry names it
        when pulled from there (``PDL_NOTEBOOK_IMAGE``)."""
        return "pdl-notebook:latest"

    @default("prefix")
    def _default_prefix(self):
        return "pdl"

    @default("cmd")
    def _default_cmd(self):
        return ["pdl-singleuser"]

    # -- whose, and how many ----------------------------------------------------

    @property
    def owner(self) -> Owner:
        return Owner(self.user.name, self.name or "")

    #: The private networks' claims, shared by every spawner of the process.
    _networks = NetworkPool()

    # -- env and secrets -------------------------------------------------------------

    def get_env(self):
        """JupyterHub's environment minus its secrets (they go in the notebook secret)."""
        env = super().get_env()
        for name in swarm_specs.SECRET_ENV:
            env.pop(name, None)
        env.update(ServerContract(**self.told_contract()).env())
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
        if isinstance(self.user_options, dict) and "gpu_type" in self.user_options:
            await self.workers.read_capacity()  # the GPU types it may name
        self.requested_workers()  # refuse other options (image, mounts, ...) before any Docker call
        _ = self.chosen_gpu_type  # and a GPU type PDL's nodes lack
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
        n = self.requested_workers()
        mounts = self.storage_mounts()
        await self.claim_workers()
        network = await self.claim_network()
        keys = self.swarm.keys or ClusterKeys.generate()
        notebooks = await self.docker("services", filters={"label": [f"{LABEL_PREFIX}role=notebook"]})
        ports = pick_ports(1 + PORTS_NEEDED, used_ports(notebooks), *self.port_range)
        self.swarm = SwarmServer(workers=n, port=ports[0], controller_ports=ports[1:], keys=keys,
                                 api_token=self.api_token, network=network)
        self.port = ports[0]
        secret_id, secret_name = await self.create_secret(
            "notebook", notebook_secret(keys, self.swarm.controller_ports, self.api_token))
        spec = swarm_specs.notebook_service(
            name=self.object_name, image=self.image, owner=self.owner, command=await self.get_command(),
            env={**self.storage.env(), **self.get_env()}, secret_id=secret_id, secret_name=secret_name,
            user=self.run_as, home=self.container_home, ports=ports, gpus=n, network=network, mounts=mounts,
            limits=self.notebook_limits(),
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
        avoid = await self.avoided_hostnames()
        mounts = self.storage_mounts()
        for index in range(self.swarm.workers):
            spec = swarm_specs.engine_service(
                name=f"{self.object_name}-engine-{index}", image=self.engine_image or self.image,
                owner=self.owner, index=index, env=self.user_environment(), secret_id=secret_id,
                secret_name=secret_name, user=self.run_as, home=self.container_home,
                gpu_resource=self.gpu_resource, network=self.swarm.network, mounts=mounts, avoid_hosts=avoid,
                gpu_type=self.chosen_gpu_type, limits=self.engine_limits(),
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
                    raise self.not_enough(self.swarm.workers, await self.workers.usage())
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
        if self.object_id:  # its workers count up to now (a refused spawn holds none)
            await metrics.count_until_now()
        if self.gpu_idle_flag_s:
            await self.workers.record_gpu_idle(None)
        return await super().stop(now=now)

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
