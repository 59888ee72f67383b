"""Finding or starting the ipyparallel cluster a notebook runs its cells on.

Two cases, same engines:

- **Hub** — the user's server was started by PDL's spawner. ``pdl-singleuser``
  started a controller and the engines of the hub's reservation (one engine host per
  cluster kind: :mod:`pdl_server.engine_hosts`, the kind's host), and exported ``PDL_CLUSTER_FILE``
  (with ``PDL_WORKERS`` and, on one machine or in a Slurm job, ``PDL_SLOTS``) to the
  server and its kernels. On Docker Swarm the controller uses the ports and keys the
  spawner chose (:func:`start_controller` with the notebook secret); on Slurm it
  listens on ``PDL_CONTROLLER_IP``, where the compute nodes reach it (CurveZMQ on).
- **Local** — plain JupyterLab or IPython. A cluster is started on first use,
  one engine per slot of this machine's pool, and stopped when the kernel exits.

Every engine and controller runs through :mod:`pdl.runtime.boot`, so it is pinned
to its slot and dies with the process that started it. Where the process that starts
them warmed up first (:func:`pdl_server.warm_engines.warm_up`), engines on this machine
are forked from a warm parent that has imported torch and ipyparallel once
(:mod:`pdl_server.warm_engines`). They are all started from one
thread that lives as long as the process (:func:`pdl_server.launcher_thread.on_launcher_thread`): Linux's
parent-death signal follows the *thread* that forked a child, so engines started
from a thread that ends (a worker thread, a kernel subshell) would die with it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import ipyparallel as ipp

from pdl.contract import ServerContract
from pdl.engine_contract import ENGINE_COMMAND, ENGINE_TIMEOUT_S
from pdl.lease import Holding, LeaseFiles
from pdl.slots import engine_env
from pdl_server.launcher_thread import on_launcher_thread
from pdl_server.warm_engines import WarmEngineSetLauncher


def new_cluster(*, cluster_id: str, profile_dir: str | None = None, shutdown_atexit=True,
                controller_ip: str = "127.0.0.1", log_level: int = logging.WARNING):
    """An ipyparallel Cluster whose processes run through pdl.runtime.boot, its
    controller listening on ``controller_ip`` (engines on other nodes: their route here),
    logging from ``log_level`` up (:mod:`logging`'s levels)."""
    kwargs = {"profile_dir": profile_dir} if profile_dir else {}
    cluster = ipp.Cluster(
        cluster_id=cluster_id,
        n=0,
        controller_ip=controller_ip,
        shutdown_atexit=shutdown_atexit,
        engine_timeout=ENGINE_TIMEOUT_S,
        engine_launcher_class=WarmEngineSetLauncher,
        log_level=log_level,
        **kwargs,
    )
    # ipyparallel writes a profile into profile_dir; make sure its parent exists.
    Path(cluster.profile_dir).mkdir(parents=True, exist_ok=True)
    return cluster


def start_controller(cluster, *, secret: dict | None = None, ports: tuple[int, ...] = ()) -> None:
    """Start the cluster's controller (blocking; safe inside a running event loop).

    ``ports``: the ports it binds, the hub's (:data:`pdl.connection.CONTROLLER_PORTS` of
    them, which only this server's processes may bind); () : ipyparallel picks free ones,
    each found free and then bound later by another process of the controller, so another
    user's controller can take one in between.

    ``secret`` is the notebook secret of :mod:`pdl.connection` when engines run on
    other machines (Docker Swarm): the controller then reuses the connection files written
    from it (ports, HMAC key, CurveZMQ on) and reads its keypair from the file named
    by ``$PDL_CONTROLLER_SECRET``.
    """
    # notice a dead engine within ~3 s instead of ipyparallel's default ~30 s; CurveZMQ
    # always: traffic is encrypted, and only holders of this controller's public key
    # (in connection files readable by the user alone) can connect
    args = ["--HeartMonitor.period=1000", "--HeartMonitor.max_heartmonitor_misses=3",
            "--IPController.enable_curve=True"]
    if ports:
        args.append(f"--IPController.ports={','.join(map(str, ports))}")
    if secret is not None:
        from pdl.connection import CONTROLLER_ARGS, install_controller_files

        install_controller_files(secret, Path(cluster.profile_dir) / "security", cluster.cluster_id)
        args += [arg for arg in CONTROLLER_ARGS if arg not in args]  # traitlets refuses an option twice
    on_launcher_thread(cluster.start_controller_sync, controller_cmd=[*ENGINE_COMMAND[:-1], "controller"],
                       controller_args=args)


def start_engine(cluster, slot: str, *, environment: dict[str, str], command: list[str] | None = None) -> None:
    """Start the engine of ``slot`` (blocking) as its own engine set, with ``environment``
    and ``command`` (default: an engine through :mod:`pdl.runtime.boot`)."""
    on_launcher_thread(cluster.start_engines_sync, n=1, engine_set_id=slot_engine_set_id(slot),
                       environment=environment, engine_cmd=command or list(ENGINE_COMMAND))


def start_slot_engines(cluster, slots: list[str], pool: list[str]) -> None:
    """Start one engine per slot (blocking), each pinned to its slot (its own pinning
    environment: its share of the cores, split over the hub's whole pool as the server
    contract tells it, else over ``pool``; a MIG slot's device as the hub's nvidia-smi,
    the contract's, lists it; the slot's cgroups, where the contract names them)."""
    contract = ServerContract.from_env()
    for slot in slots:
        start_engine(cluster, slot, environment=engine_env(slot, contract.pool or pool,
                                                           nvidia_smi=contract.nvidia_smi or None,
                                                           slot_cgroups=contract.slot_cgroups))


def engine_set_running(engine_set) -> bool:
    """True while an engine process of ``engine_set`` (None: no such set) is alive.

    Checked by pid: ipyparallel's own ``engine_set.running`` learns of an exit only
    when the event loop that started the engine runs again, which with the ``_sync``
    API (pdl-singleuser, a kernel between cells) may be never.
    """
    from pdl_server.status_file import pid_alive

    if engine_set is None:
        return False
    return any(launcher.pid > 0 and pid_alive(launcher.pid) for launcher in engine_set.launchers.values())


def slot_engine_set_id(slot: str) -> str:
    return f"slot-{slot.replace(':', '-')}"


def stop_slot_engine(cluster, slot: str) -> None:
    """Stop the engine of ``slot`` if the cluster has one (blocking)."""
    esid = slot_engine_set_id(slot)
    if esid in cluster.engines:
        cluster.stop_engines_sync(esid)


def restart_slot_engine(cluster, slot: str, pool: list[str]) -> None:
    """Replace the (dead or killed) engine of ``slot`` with a fresh one, pinned to it
    (:func:`start_slot_engines`)."""
    stop_slot_engine(cluster, slot)
    start_slot_engines(cluster, [slot], pool)


def hub_cluster_file() -> str | None:
    """The cluster file exported by ``pdl-singleuser``, if this kernel runs under the hub."""
    return ServerContract.from_env().cluster_file or None


def hub_holding() -> Holding | None:
    """What the hub gave this user's server (:meth:`pdl.lease.LeaseFiles.holding`: the
    grant its engines came back on, else the spawn's workers, and the release while they
    are stopped); None outside a hub server."""
    lease = LeaseFiles.of_this_server()
    return lease.holding(ServerContract.from_env()) if lease is not None else None


def hub_slots() -> list[str]:
    """The slots the hub reserved for this user: ``PDL_SLOTS``, or those its engines
    came back on after an idle release (:func:`hub_holding`)."""
    holding = hub_holding()
    return list(holding.slots) if holding is not None else list(ServerContract.from_env().slots)


def hub_workers() -> int:
    """How many workers the hub reserved for this user's server: those of the grant its
    engines came back on, else ``PDL_WORKERS`` of the spawn; 0 when unknown."""
    holding = hub_holding()
    return holding.workers if holding is not None else ServerContract.from_env().workers
