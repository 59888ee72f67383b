"""``pdl-singleuser``: a user's server plus their ipyparallel cluster, as one process tree.

The PDL spawner runs ``pdl-singleuser <jupyterhub-singleuser args>`` with
``PDL_SLOTS`` (the reserved slots) in the environment. This process

1. runs ``jupyterhub-singleuser`` with ``PDL_CLUSTER_FILE`` exported, so every
   kernel's ``%%distributed`` finds the cluster;
2. starts the user's ipyparallel controller on 127.0.0.1, in ``$PDL_CLUSTER_DIR``
   (default ``~/.pdl/cluster``);
3. starts one engine per reserved slot, pinned to it, and restarts an engine that
   dies, so the reservation always has its engines; with ``PDL_ENGINE_IDLE_TIMEOUT``
   set, stops them after that many seconds without a task, giving the slots back,
   and starts them again on the slots the hub grants when a cell asks
   (:mod:`pdl_server.lease`);
4. on SIGINT/SIGTERM, or when the server exits, stops the server and the cluster.

Every engine and the controller get SIGKILL if this process dies, even by SIGKILL.
The whole tree runs with umask 077: the cluster's connection files, its keys and
the user's files are created readable by the user alone, with no window in between.

**Slurm**: with ``PDL_SLURM_JOB``, each engine of step 3 is a step of that job
(``srun --jobid``, on the node and GPU Slurm chose), the controller listens on
``PDL_CONTROLLER_IP`` for them, and after an idle release the engines come back in
the new job the hub's grant names.

**Controller only** (Docker Swarm): when ``PDL_CONTROLLER_SECRET`` names the notebook
secret written by ``PDLSwarmSpawner`` (a file under /run/secrets, see
:mod:`pdl.connection`), step 3 is skipped: the spawner runs the engines as services
on other nodes. The controller binds the ports from the secret with CurveZMQ on, and
the hub API token for the server is taken from the secret, not from the environment.
With ``PDL_ENGINE_IDLE_TIMEOUT``, idle engines are released the same way, except that
the hub stops them (it scales their services to 0, reading the lease through
``/pdl/api/lease``) and starts them again when it grants ``{"engines": n}``.
The process and its children can never gain privileges.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pdl.contract import ServerContract
from pdl_server import clusters
from pdl_server import lease as engine_lease

#: Seconds between checks that every slot's engine is alive.
SUPERVISE_PERIOD_S = 2.0


class IdleTracker:
    """When the cluster's engines last had a task: queued, running or newly completed."""

    def __init__(self, cluster):
        self.client = cluster.connect_client_sync()
        self.last_busy = time.monotonic()
        self._completed = None

    def idle_s(self) -> float:
        """Seconds since an engine last had a task (0 now if one has)."""
        status = self.client.queue_status()
        engines = {k: v for k, v in status.items() if isinstance(v, dict)}
        completed = sum(v.get("completed", 0) for v in engines.values())
        busy = any(v.get("queue") or v.get("tasks") for v in engines.values()) or status.get("unassigned")
        if busy or completed != self._completed:
            self.last_busy = time.monotonic()
        self._completed = completed
        return time.monotonic() - self.last_busy

    def reset(self) -> None:
        self.last_busy = time.monotonic()


def supervise(cluster, slots: list[str], stop: threading.Event, idle_timeout_s: float = 0.0,
              lease: Path | None = None, remote_engines: int = 0, slurm_job: int = 0) -> None:
    """Restart the engine of any slot whose process has exited, until ``stop`` is set.

    With ``idle_timeout_s`` and a ``lease`` directory: stop every engine once none has
    had a task for that long and record the release, then, once the hub grants slots
    again, start one engine on each (see :mod:`pdl_server.lease`). With
    ``remote_engines`` (the hub runs that many engines elsewhere, on Docker Swarm),
    record the release only, and forget it once the hub grants ``{"engines": n}``: the
    hub stops and starts those engines. With ``slurm_job``, each engine is a step of
    that job, and the hub's grant names the new job the engines come back in; when the
    job ends under the engines (its time limit, scancel), they are not restarted: with
    the lease, that is recorded as a release (the next cell asks for a new job), else
    supervision ends with one line saying so.
    """
    def release(reason: str, what_next: str) -> None:
        """Stop the engines of every slot and record the release (``reason``, one line)."""
        for slot in slots:
            esid = clusters.slot_engine_set_id(slot)
            if esid in cluster.engines:
                cluster.stop_engines_sync(esid)
        engine_lease.write(lease, engine_lease.RELEASED, {"reason": reason, "slots": slots})
        print(f"pdl-singleuser: {reason}; {what_next}", file=sys.stderr, flush=True)

    tracker = IdleTracker(cluster) if idle_timeout_s and lease is not None else None
    released = tracker is not None and engine_lease.read(lease, engine_lease.RELEASED) is not None
    while not stop.wait(SUPERVISE_PERIOD_S):
        if released:
            grant = engine_lease.read(lease, engine_lease.GRANT)
            if grant and grant.get("engines"):
                engine_lease.remove(lease, engine_lease.RELEASED, engine_lease.WANT, engine_lease.GRANT)
                print(f"pdl-singleuser: the hub started {grant['engines']} engine(s) again", file=sys.stderr,
                      flush=True)
                if tracker is not None:
                    tracker.reset()
                released = False
            elif grant and grant.get("slots"):
                slots = list(grant["slots"])
                if slurm_job:
                    slurm_job = int(grant["slurm_job"])
                for slot in slots:
                    clusters.restart_slot_engine(cluster, slot, len(slots), slurm_job=slurm_job)
                engine_lease.write(lease, engine_lease.SLOTS, {"slots": slots})
                engine_lease.remove(lease, engine_lease.RELEASED, engine_lease.WANT, engine_lease.GRANT)
                print(f"pdl-singleuser: engines back on {','.join(slots)}", file=sys.stderr, flush=True)
                if tracker is not None:
                    tracker.reset()
                released = False
            continue
        if tracker is not None:
            try:
                idle = tracker.idle_s()
            except Exception:  # noqa: BLE001 - the controller is busy or restarting: look again later
                idle = 0.0
            if idle >= idle_timeout_s and remote_engines:
                reason = f"engines idle for {idle_timeout_s:g} s"
                engine_lease.write(lease, engine_lease.RELEASED, {"reason": reason, "engines": remote_engines})
                print(f"pdl-singleuser: {reason}; the hub stops them and frees their GPUs", file=sys.stderr,
                      flush=True)
                released = True
                continue
            if idle >= idle_timeout_s:
                release(f"engines idle for {idle_timeout_s:g} s", f"stopped them and gave back {','.join(slots)}")
                released = True
                continue
        job_ended = False
        for slot in slots:
            engine_set = cluster.engines.get(clusters.slot_engine_set_id(slot))
            if engine_set is not None and clusters.engine_set_running(engine_set):
                continue
            if stop.is_set():  # shutting down: the cluster is being stopped, not crashing
                return
            if slurm_job and not clusters.slurm_job_running(slurm_job):
                job_ended = True
                break
            print(f"pdl-singleuser: engine for {slot} exited; restarting it", file=sys.stderr, flush=True)
            try:
                clusters.restart_slot_engine(cluster, slot, len(slots), slurm_job=slurm_job)
            except Exception as e:  # keep supervising the other slots
                print(f"pdl-singleuser: could not restart {slot}: {e}", file=sys.stderr, flush=True)
        if job_ended:  # its time limit, or scancel: no step can start in it any more
            if lease is None:
                print(f"pdl-singleuser: Slurm job {slurm_job} ended; stop and start the server for GPUs again",
                      file=sys.stderr, flush=True)
                return
            release(f"Slurm job {slurm_job} ended", "the next %%distributed cell asks for GPUs again")
            released = True


def remote_engines_secret(contract: ServerContract) -> dict | None:
    """The notebook secret in controller-only mode (``$PDL_CONTROLLER_SECRET``), else None."""
    path = contract.controller_secret
    if not path:
        return None
    from pdl.connection import read_secret
    from pdl.runtime.boot import no_new_privileges

    no_new_privileges()
    return read_secret(path)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.umask(0o077)
    contract = ServerContract.from_env()
    remote = remote_engines_secret(contract)
    slots = [] if remote else list(contract.slots)
    cluster_dir = contract.cluster_path
    profile_dir = cluster_dir / "profile"
    profile_dir.mkdir(parents=True, exist_ok=True)
    # a new server starts its engines on the slots of this spawn: forget an earlier release
    engine_lease.remove(cluster_dir, engine_lease.RELEASED, engine_lease.WANT, engine_lease.GRANT,
                        engine_lease.SLOTS)
    cluster = clusters.new_cluster(cluster_id="pdl", profile_dir=str(profile_dir), shutdown_atexit=False,
                                   controller_ip=contract.controller_ip or "127.0.0.1")
    env = dict(os.environ, **ServerContract(cluster_dir=str(cluster_dir), cluster_file=cluster.cluster_file).env())
    if remote:
        env["JUPYTERHUB_API_TOKEN"] = env["JPY_API_TOKEN"] = remote["api_token"]

    stop = threading.Event()
    server = None

    def on_signal(signum, frame):
        stop.set()
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        # The server first, so the user's spawn finishes without waiting for engines;
        # %%distributed waits for them on first use.
        server = subprocess.Popen([sys.executable, "-m", "jupyterhub.singleuser", *argv], env=env)
        clusters.start_controller(cluster, remote_engines=remote)
        clusters.start_slot_engines(cluster, slots, len(slots), slurm_job=contract.slurm_job)
        remote_engines = contract.engines if remote else 0
        watcher = threading.Thread(target=supervise, args=(cluster, slots, stop, contract.idle_timeout_s,
                                                           cluster_dir, remote_engines, contract.slurm_job),
                                   daemon=True)
        watcher.start()
        if not stop.is_set():
            while server.poll() is None:
                try:
                    server.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    pass
        return server.returncode if server is not None else 0
    finally:
        stop.set()
        if server is not None and server.poll() is None:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
        cluster.stop_cluster_sync()


if __name__ == "__main__":
    sys.exit(main())
