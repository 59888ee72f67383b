"""Finding or starting the ipyparallel cluster a notebook runs its cells on.

Three cases, same engines:

- **Hub** — the user's server was started by PDL's spawner. ``pdl-singleuser``
  started a controller and one engine per reserved slot, and exported
  ``PDL_CLUSTER_FILE`` (and ``PDL_SLOTS``) to the server and its kernels.
- **Hub on Docker Swarm** — ``pdl-singleuser`` started only the controller, with
  CurveZMQ and the ports and keys the spawner chose (:func:`start_controller` with
  ``remote_engines``); the spawner runs the engines as services and sets
  ``PDL_ENGINES`` to how many.
- **Hub on Slurm** — as the first case, but each engine is a step of the user's
  Slurm job (``PDL_SLURM_JOB``), started with ``srun --jobid`` (:func:`srun_engine_cmd`)
  on the node and GPU Slurm chose, and the controller listens on ``PDL_CONTROLLER_IP``,
  where the compute nodes reach it (CurveZMQ on).
- **Local** — plain JupyterLab or IPython. A cluster is started on first use,
  one engine per slot of this machine's pool, and stopped when the kernel exits.

Every engine and controller runs through :mod:`pdl.runtime.boot`, so it is pinned
to its slot and dies with the process that started it. They are all started from one
thread that lives as long as the process (:func:`on_launcher_thread`): Linux's
parent-death signal follows the *thread* that forked a child, so engines started
from a thread that ends (a worker thread, a kernel subshell) would die with it.
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
from pathlib import Path

import ipyparallel as ipp

from pdl.contract import ServerContract
from pdl.slots import engine_env

#: Seconds to wait for a controller's connection files and for engines to register.
ENGINE_TIMEOUT_S = 60

_BOOT = [sys.executable, "-m", "pdl.runtime.boot"]
#: The thread every engine and controller is started from; idle between starts, it
#: ends only with the process.
_LAUNCHER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdl-launcher")


def on_launcher_thread(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` run on the launcher thread (blocking; its result or its
    exception), so that processes it starts live as long as this process."""
    if threading.current_thread().name.startswith("pdl-launcher"):
        return fn(*args, **kwargs)
    return _LAUNCHER.submit(fn, *args, **kwargs).result()


def new_cluster(*, cluster_id: str, profile_dir: str | None = None, shutdown_atexit=True,
                controller_ip: str = "127.0.0.1"):
    """An ipyparallel Cluster whose processes run through pdl.runtime.boot, its
    controller listening on ``controller_ip`` (engines on other nodes: their route here)."""
    kwargs = {"profile_dir": profile_dir} if profile_dir else {}
    cluster = ipp.Cluster(
        cluster_id=cluster_id,
        n=0,
        controller_ip=controller_ip,
        shutdown_atexit=shutdown_atexit,
        engine_timeout=ENGINE_TIMEOUT_S,
        log_level=30,
        **kwargs,
    )
    # ipyparallel writes a profile into profile_dir; make sure its parent exists.
    Path(cluster.profile_dir).mkdir(parents=True, exist_ok=True)
    return cluster


def start_controller(cluster, *, remote_engines: dict | None = None) -> None:
    """Start the cluster's controller (blocking; safe inside a running event loop).

    ``remote_engines`` is the notebook secret of :mod:`pdl.connection` when engines
    run on other machines: the controller then reuses the connection files written
    from it (ports, HMAC key, CurveZMQ on) and reads its keypair from the file named
    by ``$PDL_CONTROLLER_SECRET``.
    """
    # notice a dead engine within ~3 s instead of ipyparallel's default ~30 s; CurveZMQ
    # always: traffic is encrypted, and only holders of this controller's public key
    # (in connection files readable by the user alone) can connect
    args = ["--HeartMonitor.period=1000", "--HeartMonitor.max_heartmonitor_misses=3",
            "--IPController.enable_curve=True"]
    if remote_engines is not None:
        from pdl.connection import CONTROLLER_ARGS, install_controller_files

        install_controller_files(remote_engines, Path(cluster.profile_dir) / "security", cluster.cluster_id)
        args += [arg for arg in CONTROLLER_ARGS if arg not in args]  # traitlets refuses an option twice
    on_launcher_thread(cluster.start_controller_sync, controller_cmd=[*_BOOT, "controller"], controller_args=args)


def srun_engine_cmd(slurm_job: int) -> list[str]:
    """The command of an engine that is one step of Slurm job ``slurm_job``: one task on
    one node with one GPU of the job, as Slurm chooses (``--exact``: only its own share,
    so the steps run side by side); the step ends when the engine does, or at srun's
    first SIGINT (ipyparallel's stop), not its second."""
    return ["srun", f"--jobid={slurm_job}", "--ntasks=1", "--nodes=1", "--gpus=1", "--exact", "--quiet",
            "--quit-on-interrupt", "--kill-on-bad-exit=1", "--job-name=pdl-engine", sys.executable, "-m", "pdl.runtime.slurm_boot"]


def slurm_job_running(slurm_job: int) -> bool:
    """False once Slurm says job ``slurm_job`` has ended (its time limit, scancel) or is
    not running; True while it runs, and when Slurm cannot be asked (never end on doubt)."""
    import subprocess

    try:
        done = subprocess.run(["squeue", "-h", "-j", str(slurm_job), "-o", "%T"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return True
    if done.returncode != 0:
        return "Invalid job id" not in done.stderr
    return done.stdout.strip() in ("RUNNING", "CONFIGURING", "SUSPENDED")


def start_slot_engines(cluster, slots: list[str], pool_size: int, slurm_job: int = 0) -> None:
    """Start one engine per slot (blocking): a process pinned to it (its own pinning
    environment), or, with ``slurm_job``, a step of that job on a GPU Slurm binds (the
    slot then names the engine's worker of the reservation, not a GPU index)."""
    for slot in slots:
        on_launcher_thread(
            cluster.start_engines_sync,
            n=1,
            engine_set_id=slot_engine_set_id(slot),
            environment={"PDL_SLOT": slot} if slurm_job else engine_env(slot, pool_size),
            engine_cmd=srun_engine_cmd(slurm_job) if slurm_job else [*_BOOT, "engine"],
        )


def engine_set_running(engine_set) -> bool:
    """True while an engine process of ``engine_set`` is alive.

    Checked by pid: ipyparallel's own ``engine_set.running`` learns of an exit only
    when the event loop that started the engine runs again, which with the ``_sync``
    API (pdl-singleuser, a kernel between cells) may be never.
    """
    from pdl_server.status_file import pid_alive

    return any(launcher.pid > 0 and pid_alive(launcher.pid) for launcher in engine_set.launchers.values())


def slot_engine_set_id(slot: str) -> str:
    return f"slot-{slot.replace(':', '-')}"


def restart_slot_engine(cluster, slot: str, pool_size: int, slurm_job: int = 0) -> None:
    """Replace the (dead or killed) engine of ``slot`` with a fresh one (``slurm_job``:
    as a step of that job)."""
    esid = slot_engine_set_id(slot)
    if esid in cluster.engines:
        cluster.stop_engines_sync(esid)
    start_slot_engines(cluster, [slot], pool_size, slurm_job=slurm_job)


def hub_cluster_file() -> str | None:
    """The cluster file exported by ``pdl-singleuser``, if this kernel runs under the hub."""
    return ServerContract.from_env().cluster_file or None


def hub_slots() -> list[str]:
    """The slots the hub reserved for this user: ``PDL_SLOTS``, or those its engines
    came back on after an idle release (:func:`pdl_server.lease.current_slots`)."""
    from pdl_server import lease

    return lease.current_slots(lease.lease_dir(), list(ServerContract.from_env().slots))


def hub_engine_count() -> int:
    """How many engines the hub started for this user: ``$PDL_ENGINES`` (Swarm),
    else one per reserved slot; 0 when unknown."""
    return ServerContract.from_env().engines or len(hub_slots())
