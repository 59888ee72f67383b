"""Engines forked from a warm parent (:mod:`pdl.runtime.warm_parent`) instead of each
importing torch and ipyparallel on its own.

A process that starts engines (the user's server, a kernel's local cluster) calls
:func:`warm_up` once per cluster, before it starts the cluster's controller, so the
parent imports while the controller starts; each cluster has its own parent, ended
with it (:func:`stop_warm_parent`). The cluster's engines are then launched by :class:`WarmEngineSetLauncher`
(:func:`pdl_server.clusters.new_cluster` names it): each of PDL's own engines is forked
by the warm parent, with exactly the environment, working folder and output file that
ipyparallel's own launcher gives a cold engine; ipyparallel then watches it, signals it
and stops it by its pid as it does a cold one. An engine starts cold, as before, where
it cannot be forked: before :func:`warm_up` (Slurm's steps, which ``srun`` starts), for
any other command, and once the warm parent is gone or refuses (its one-line reason in
the server's log, once).

The warm parent is this process's child, started from the launcher thread (it dies with
that thread's process, :mod:`pdl_server.launcher_thread`); it is reached only through a socket
pair, so no other process (another user's least of all) can ask it to fork anything.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import psutil
from ipyparallel.cluster.launcher import LocalEngineLauncher, LocalEngineSetLauncher

from pdl.engine_contract import ENGINE_COMMAND
from pdl_server.launcher_thread import on_launcher_thread

#: Seconds to wait for the warm parent's answer to one request: its imports (a few
#: seconds, more on a busy machine) come before its first answer.
ANSWER_TIMEOUT_S = 120


def log(line: str) -> None:
    print(f"pdl warm engines: {line}", file=sys.stderr, flush=True)


class WarmParent:
    """One warm parent process and this process's end of its socket. Thread-safe."""

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pdl.runtime.warm_parent", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self._sock = ours
        self._lock = threading.Lock()
        self._refused: str | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def fork(self, argv: list[str], env: dict[str, str], cwd: str, stdin: int, output: int) -> int | None:
        """The pid of the engine ``argv`` forked with ``env`` in ``cwd`` (descriptors
        ``stdin`` and ``output`` its own), or None: then it must start cold (the reason
        said once in this process's log)."""
        request = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
        with self._lock:
            if self._refused is not None:
                return None
            try:
                self._sock.settimeout(ANSWER_TIMEOUT_S)
                socket.send_fds(self._sock, [request], [stdin, output])
                answer = self._sock.recv(4096)
                reply = json.loads(answer) if answer else {"refused": "the warm parent has exited"}
            except (OSError, ValueError) as e:
                reply = {"refused": f"the warm parent did not answer: {e}"}
            if "pid" in reply:
                return int(reply["pid"])
            why = str(reply.get("refused", "no answer"))
            if tuple(argv[:len(ENGINE_COMMAND)]) == ENGINE_COMMAND:
                self._refused = why  # PDL's own engine refused: the parent is of no more use
            log(f"engine started cold: {why}")
            return None

    def close(self) -> None:
        """End the warm parent (its engines with it) and wait for it."""
        self._sock.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


#: The warm parent of each cluster of this process, by (profile folder, cluster id).
_parents: dict[tuple[str, str], WarmParent] = {}
_parents_lock = threading.Lock()


def _key(cluster) -> tuple[str, str]:
    return str(cluster.profile_dir), str(cluster.cluster_id)


def warm_up(cluster) -> WarmParent:
    """The warm parent of ``cluster``'s engines, started now if it is not running
    (non-blocking: it imports in the background; the first engine's fork waits for that)."""
    with _parents_lock:
        parent = _parents.get(_key(cluster))
        if parent is None or parent.process.poll() is not None:
            parent = _parents[_key(cluster)] = on_launcher_thread(WarmParent)
        return parent


def warm_parent(profile_dir: str, cluster_id: str) -> WarmParent | None:
    """The running warm parent of the cluster ``cluster_id`` in ``profile_dir``, or None
    (never warmed up, or gone)."""
    parent = _parents.get((str(profile_dir), str(cluster_id)))
    return parent if parent is not None and parent.process.poll() is None else None


def stop_warm_parent(cluster) -> None:
    """End the warm parent of ``cluster``, if it has one (the engines forked from it with
    it); other clusters' are left alone."""
    with _parents_lock:
        parent = _parents.pop(_key(cluster), None)
    if parent is not None:
        parent.close()


class WarmEngineLauncher(LocalEngineLauncher):
    """ipyparallel's local engine launcher, the process forked by the warm parent where
    it can be (see the module docstring), else started as ipyparallel starts it."""

    def start(self):
        parent = warm_parent(self.profile_dir, self.cluster_id)
        if parent is None or self.state != "before" or tuple(self.args[:len(ENGINE_COMMAND)]) != ENGINE_COMMAND:
            return super().start()
        env = os.environ.copy()
        env.update(self.get_env())
        with open(self.output_file, "ab") as output, open(os.devnull, "rb") as stdin:
            pid = parent.fork(list(self.args), env, self.work_dir, stdin.fileno(), output.fileno())
        if pid is None:
            return super().start()
        self.pid = pid
        try:
            self.process = psutil.Process(pid)
        except psutil.NoSuchProcess:  # it has already ended (and was reaped)
            self.notify_start(pid)
            self.notify_stop(dict(exit_code=None, pid=pid, identifier=self.identifier))
            return None
        self.notify_start(pid)
        self._start_waiting()
        return None


class WarmEngineSetLauncher(LocalEngineSetLauncher):
    """ipyparallel's local engine set, each engine launched by :class:`WarmEngineLauncher`."""

    launcher_class = WarmEngineLauncher
    #: its name among ipyparallel's engine launchers (pyproject.toml), as cluster files say it
    entrypoint_name = "pdl-warm"
