"""``pdl-singleuser``: a user's server plus their ipyparallel cluster, as one process tree.

The PDL spawner runs ``pdl-singleuser <jupyterhub-singleuser args>`` with the server
contract (:mod:`pdl.contract`) in the environment. This process

1. runs ``jupyterhub-singleuser`` (through :mod:`pdl_server.jupyter_process`) with ``PDL_CLUSTER_FILE`` exported, so every
   kernel's ``%%distributed`` finds the cluster;
2. starts the user's ipyparallel controller in ``$PDL_CLUSTER_DIR`` (default
   ``~/.pdl/cluster``), on 127.0.0.1 or ``PDL_CONTROLLER_IP``;
3. starts the engines through the engine host of its cluster kind
   (:mod:`pdl_server.engine_hosts`: slots of this machine, steps of a Slurm job, or
   none on Docker Swarm, where the hub runs them as services) and keeps them running;
   with ``PDL_ENGINE_IDLE_TIMEOUT`` set, releases them after that many seconds
   without a task, giving their workers back, and brings them back as the hub grants
   when a cell asks (:mod:`pdl.lease`); a Slurm job that ends under its engines is a
   release too;
4. on SIGINT/SIGTERM, or when the server exits, stops the server and the cluster.

Every engine and the controller get SIGKILL if this process dies, even by SIGKILL.
The whole tree runs with umask 077: the cluster's connection files, its keys and
the user's files are created readable by the user alone, with no window in between.

**Docker Swarm**: when ``PDL_CONTROLLER_SECRET`` names the notebook secret written by
``PDLSwarmSpawner`` (a file under /run/secrets, see :mod:`pdl.connection`), the
controller binds the ports from the secret with CurveZMQ on, and the hub API token
for the server is taken from the secret, not from the environment. The process and
its children can never gain privileges.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable

from pdl.contract import ServerContract
from pdl.lease import Grant, LeaseFiles
from pdl_server import clusters, warm_engines
from pdl_server.engine_hosts import EngineHost, host_for, log
from pdl_server.lease_client import LeaseClient, server_address
from pdl_server.session_clock import session_end

#: Seconds between two rounds of the supervisor: restarts, idle releases, the session's
#: end, the hub's GPU flag.
SUPERVISE_PERIOD_S = 2.0
#: Seconds between two looks at the engines' processes within a round: an engine that
#: dies starts the next round at once, so its replacement is not a round late.
DEATH_CHECK_S = 0.25


def wait_for_round(host: EngineHost, stop: threading.Event) -> bool:
    """Wait :data:`SUPERVISE_PERIOD_S`, or less: until an engine of ``host`` that was
    alive when the wait began dies. True once ``stop`` is set (then at once)."""
    dead_before = set(host.dead_slots())
    deadline = time.monotonic() + SUPERVISE_PERIOD_S
    while True:
        left = deadline - time.monotonic()
        if stop.wait(max(0.0, min(DEATH_CHECK_S, left))):
            return True
        if left <= DEATH_CHECK_S or not set(host.dead_slots()) <= dead_before:
            return False


class IdleTracker:
    """When the cluster's engines last had a task: queued, running or newly completed.

    The clock runs only while the engines can be used: while fewer than ``expected()``
    engines are registered (they are starting, after a spawn or a grant), while the set
    of engines changes (one was restarted), and until the user's Jupyter server first
    accepts a connection at ``server_address`` (host, port), they count as busy. On a
    busy machine a server can take longer to start than the idle timeout: its engines
    were released before its user could run a cell, and a cell that waited for engines
    starting again had them released under it."""

    def __init__(self, cluster, expected: Callable[[], int] | None = None,
                 server_address: tuple[str, int] | None = None):
        self.cluster, self.client = cluster, None  # connected on first use, by the thread that uses it
        self.expected = expected
        self.server_address = server_address
        self.last_busy = time.monotonic()
        self._completed = None
        self._engine_ids: set = set()
        self._failing: str | None = None  # why the last look failed, said once in the log

    def idle_s(self) -> float:
        """Seconds since an engine last had a task (0 now if one has, or if the
        controller cannot tell now: it is busy or restarting; the server's log says
        why, once until a look succeeds)."""
        try:
            if self.client is None:
                self.client = self.cluster.connect_client_sync()
            status = self.client.queue_status()
        except Exception as e:  # noqa: BLE001 - look again later
            why = f"{type(e).__name__}: {e}"
            if why != self._failing:
                log(f"idle watch: cannot read the engines' queues now ({why}); trying again")
            self._failing = why
            return 0.0
        if self._failing is not None:
            log("idle watch: reading the engines' queues again")
            self._failing = None
        engines = {k: v for k, v in status.items() if isinstance(v, dict)}
        completed = sum(v.get("completed", 0) for v in engines.values())
        busy = any(v.get("queue") or v.get("tasks") for v in engines.values()) or status.get("unassigned")
        starting = (self.expected is not None and len(engines) < self.expected()) or set(engines) != self._engine_ids
        if busy or starting or completed != self._completed or not self._server_listens():
            self.last_busy = time.monotonic()
        self._completed, self._engine_ids = completed, set(engines)
        return time.monotonic() - self.last_busy

    def _server_listens(self) -> bool:
        """Whether the user's server has accepted a connection (once it has, always)."""
        if self.server_address is None:
            return True
        try:
            socket.create_connection(self.server_address, timeout=1).close()
        except OSError:
            return False
        self.server_address = None
        return True

    def reset(self) -> None:
        self.last_busy = time.monotonic()


def supervise(host: EngineHost, stop: threading.Event, tracker: IdleTracker | None = None,
              idle_timeout_s: float = 0.0, lease: LeaseClient | None = None,
              files: LeaseFiles | None = None) -> None:
    """Keep ``host``'s engines running until ``stop`` is set: an engine that dies is
    restarted within :data:`DEATH_CHECK_S` of its death; the rest is looked at every
    :data:`SUPERVISE_PERIOD_S`.

    With a ``lease`` (the client of the lease's owner, in the user's Jupyter server) and
    its ``files`` (read only: the session's end, the hub's GPU flag): once no engine has
    had a task for ``idle_timeout_s`` seconds (with a ``tracker``) and the owner agrees
    that no cell started within that time, release them (the host stops them, or the
    hub does) and record the :class:`~pdl.lease.Release` with the owner; then wait on
    the lease (a long poll that a change ends at once) until the hub grants them again,
    and bring them back as the grant says. Engines lost for good (a Slurm job that
    ended) are a release too, and so is the session's end
    (:mod:`pdl_server.session_clock`: released a few seconds before its job's time
    limit, so that no cell starts on engines about to be killed); without a lease,
    supervision then ends with one line saying so.
    """
    def release(reason: str, idle_s: float | None = None) -> bool:
        """Stop the engines for ``reason`` once the owner agrees (an idle release:
        unless a cell started within ``idle_s``), and record the release with it."""
        if not lease.begin_release(idle_s):
            return False
        made = None
        try:
            made = host.release(reason)
        finally:
            lease.end_release(made)
        return True

    released, seen = False, None
    while not stop.is_set():
        if released:
            seen = lease.view(after=seen, wait_s=SUPERVISE_PERIOD_S) or seen
            if seen is None:  # the server does not answer now
                stop.wait(SUPERVISE_PERIOD_S)
            elif isinstance(seen.answer, Grant) and not stop.is_set():
                host.take_up(seen.answer)
                while not lease.take_up(seen.answer) and not stop.wait(SUPERVISE_PERIOD_S):
                    pass  # the server does not answer now: it learns of it before anything else
                if tracker is not None:
                    tracker.reset()
                released = False
            continue
        if wait_for_round(host, stop):
            return
        if tracker is not None and lease is not None and tracker.idle_s() >= idle_timeout_s \
                and release(f"engines idle for {idle_timeout_s:g} s", idle_timeout_s):
            released = True
            continue
        end = session_end(lease=files) if files is not None else None
        if end is not None and end.ending():
            end = session_end(lease=files, fresh=True)  # an extension may have moved it since the last read
        if end is not None and end.ending() and lease is not None and release(end.ended_reason()):
            released = True
            continue
        flag = files.gpu_idle() if files is not None else None
        if flag is not None and flag.release_at and time.time() >= flag.release_at and lease is not None \
                and release(flag.reason()):
            released = True
            continue
        lost = host.tend(stop)
        if lost and lease is None:
            log(f"{lost}; stop and start the server for GPUs again")
            return
        if lost and release(lost):
            released = True


def notebook_secret(contract: ServerContract) -> dict | None:
    """The notebook secret on Docker Swarm (``$PDL_CONTROLLER_SECRET``), else None."""
    path = contract.controller_secret
    if not path:
        return None
    from pdl.connection import read_secret
    from pdl.process import no_new_privileges

    no_new_privileges()
    return read_secret(path)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.umask(0o077)
    contract = ServerContract.from_env()
    secret = notebook_secret(contract)
    cluster_dir = contract.cluster_path
    profile_dir = cluster_dir / "profile"
    profile_dir.mkdir(parents=True, exist_ok=True)
    lease = LeaseFiles(cluster_dir)
    lease.clear()  # a new server starts its engines on the workers of this spawn: forget an earlier release
    cluster = clusters.new_cluster(cluster_id="pdl", profile_dir=str(profile_dir), shutdown_atexit=False,
                                   controller_ip=contract.controller_ip or "127.0.0.1")
    host = host_for(contract, cluster)
    env = dict(os.environ, **ServerContract(cluster_dir=str(cluster_dir), cluster_file=cluster.cluster_file,
                                            workers=host.workers).env())
    if secret:
        env["JUPYTERHUB_API_TOKEN"] = env["JPY_API_TOKEN"] = secret["api_token"]

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
        server = subprocess.Popen([sys.executable, "-m", "pdl_server.jupyter_process", "jupyterhub.singleuser", *argv],
                                  env=env)
        host.warm_up()
        clusters.start_controller(cluster, secret=secret, ports=contract.controller_ports)
        host.start()
        idle = contract.idle_timeout_s
        tracker = IdleTracker(cluster, lambda: host.workers, server_address(os.environ)) if idle else None
        client = LeaseClient.of_this_server(token=secret["api_token"] if secret else None)
        watcher = threading.Thread(target=supervise, args=(host, stop, tracker, idle, client, lease), daemon=True)
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
        warm_engines.stop_warm_parent(cluster)


if __name__ == "__main__":
    sys.exit(main())
