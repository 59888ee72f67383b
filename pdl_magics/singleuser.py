"""``pdl-singleuser``: a user's server plus their ipyparallel cluster, as one process tree.

The PDL spawner runs ``pdl-singleuser <jupyterhub-singleuser args>`` with
``PDL_SLOTS`` (the reserved slots) in the environment. This process

1. runs ``jupyterhub-singleuser`` with ``PDL_CLUSTER_FILE`` exported, so every
   kernel's ``%%distributed`` finds the cluster;
2. starts the user's ipyparallel controller on 127.0.0.1, in ``$PDL_CLUSTER_DIR``
   (default ``~/.pdl/cluster``);
3. starts one engine per reserved slot, pinned to it, and restarts an engine that
   dies, so the reservation always has its engines;
4. on SIGINT/SIGTERM, or when the server exits, stops the server and the cluster.

Every engine and the controller get SIGKILL if this process dies, even by SIGKILL.
The whole tree runs with umask 077: the cluster's connection files, its keys and
the user's files are created readable by the user alone, with no window in between.

**Controller only** (Docker Swarm): when ``PDL_CONTROLLER_SECRET`` names the notebook
secret written by ``PDLSwarmSpawner`` (a file under /run/secrets, see
:mod:`pdl.connection`), step 3 is skipped: the spawner runs the engines as services
on other nodes. The controller binds the ports from the secret with CurveZMQ on, and
the hub API token for the server is taken from the secret, not from the environment.
The process and its children can never gain privileges.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from pdl.slots import parse_slot_list

from . import clusters

#: Seconds between checks that every slot's engine is alive.
SUPERVISE_PERIOD_S = 2.0


def cluster_dir() -> Path:
    return Path(os.environ.get("PDL_CLUSTER_DIR") or Path.home() / ".pdl" / "cluster")


def supervise(cluster, slots: list[str], stop: threading.Event) -> None:
    """Restart the engine of any slot whose process has exited, until ``stop`` is set."""
    while not stop.wait(SUPERVISE_PERIOD_S):
        for slot in slots:
            engine_set = cluster.engines.get(clusters.slot_engine_set_id(slot))
            if engine_set is not None and clusters.engine_set_running(engine_set):
                continue
            if stop.is_set():  # shutting down: the cluster is being stopped, not crashing
                return
            print(f"pdl-singleuser: engine for {slot} exited; restarting it", file=sys.stderr, flush=True)
            try:
                clusters.restart_slot_engine(cluster, slot, len(slots))
            except Exception as e:  # keep supervising the other slots
                print(f"pdl-singleuser: could not restart {slot}: {e}", file=sys.stderr, flush=True)


def remote_engines_secret() -> dict | None:
    """The notebook secret in controller-only mode (``$PDL_CONTROLLER_SECRET``), else None."""
    path = os.environ.get("PDL_CONTROLLER_SECRET")
    if not path:
        return None
    from pdl.connection import read_secret
    from pdl.engine_boot import no_new_privileges

    no_new_privileges()
    return read_secret(path)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.umask(0o077)
    remote = remote_engines_secret()
    slots = [] if remote else parse_slot_list(os.environ.get("PDL_SLOTS", ""))
    profile_dir = cluster_dir() / "profile"
    cluster = clusters.new_cluster(cluster_id="pdl", profile_dir=str(profile_dir), shutdown_atexit=False)
    env = dict(os.environ, PDL_CLUSTER_FILE=cluster.cluster_file)
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
        clusters.start_slot_engines(cluster, slots, len(slots))
        watcher = threading.Thread(target=supervise, args=(cluster, slots, stop), daemon=True)
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
