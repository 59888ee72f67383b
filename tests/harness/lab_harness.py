"""A real JupyterLab server and a real ipyparallel cluster for the Cluster panel's tests.

:class:`LabServer` runs ``jupyter lab`` on 127.0.0.1 with a random token, its
Jupyter dirs and ``$PDL_STATUS_DIR`` under a temporary directory; PDL's server
extension and the ``pdl-cluster`` labextension come from the installed package
(``pip install -e .``, which scripts/setup runs). :class:`SlotCluster` is a
controller plus one supervised engine per slot, as ``pdl-singleuser`` runs them
for a hub user. Everything is stopped by PID.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import requests

from hub_harness import free_port
from pdl.contract import ServerContract
from pdl.process import pid_alive
from pdl_server import clusters, singleuser
from pdl_spawner.local.engine_host import LocalSlots
from waiting import wait_until


class LabServer:
    """``jupyter lab`` with the PDL extensions, for one test module."""

    def __init__(self, root: Path, env: dict | None = None, extra_args: list[str] | None = None):
        self.root = Path(root)
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.status_dir = self.root / "status"
        self.log_path = self.root / "lab.log"
        self.env = env or {}
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None

    def environment(self) -> dict:
        """The environment of the server; a kernel stand-in should share PDL_STATUS_DIR."""
        jupyter = self.root / "jupyter"
        return dict(
            os.environ,
            JUPYTER_CONFIG_DIR=str(jupyter / "config"),
            JUPYTER_RUNTIME_DIR=str(jupyter / "runtime"),
            IPYTHONDIR=str(self.root / "ipython"),
            PDL_STATUS_DIR=str(self.status_dir),
            PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            **self.env,
        )

    def start(self) -> LabServer:
        (self.root / "notebooks").mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", "--ServerApp.allow_root=True",
             f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root / 'notebooks'}",
             f"--LabApp.workspaces_dir={self.root / 'workspaces'}", *self.extra_args],
            cwd=self.root, env=self.environment(), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(self._up, 60, what="JupyterLab to answer")
        return self

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            return requests.get(f"{self.url}/api/status", headers=self.headers, timeout=2).status_code == 200
        except (requests.ConnectionError, requests.Timeout):  # not answering yet: still starting
            return False

    @property
    def headers(self) -> dict:
        return {"Authorization": f"token {self.token}"}

    def api(self, method: str, path: str, token: bool = True, **kwargs) -> requests.Response:
        kwargs.setdefault("timeout", 30)
        headers = {**(self.headers if token else {}), **kwargs.pop("headers", {})}
        return requests.request(method, f"{self.url}{path}", headers=headers, **kwargs)

    def cluster(self) -> dict:
        r = self.api("GET", "/pdl/api/cluster")
        r.raise_for_status()
        return r.json()

    def wait_cluster(self, predicate, timeout: float = 60, what: str = "the panel's model") -> dict:
        """Poll GET /pdl/api/cluster until ``predicate(model)``; returns that model."""
        last = {}

        def check():
            last["model"] = self.cluster()
            return predicate(last["model"])

        try:
            wait_until(check, timeout, interval=0.5, what=what)
        except TimeoutError:
            raise TimeoutError(f"timed out waiting for {what}; last model: {last.get('model')}") from None
        return last["model"]

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


class SlotCluster:
    """A controller and one engine per slot, restarted when they die (as under the hub)."""

    def __init__(self, root: Path, slots: list[str]):
        self.slots = slots
        self.cluster = clusters.new_cluster(
            cluster_id=f"pdl-lab-{os.getpid()}", profile_dir=str(Path(root) / "profile"),
        )
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None

    @property
    def cluster_file(self) -> str:
        return self.cluster.cluster_file

    def start(self) -> SlotCluster:
        clusters.start_controller(self.cluster)
        host = LocalSlots(self.cluster, self.slots)
        host.start()
        client = self.cluster.connect_client_sync()
        try:
            client.wait_for_engines(len(self.slots), timeout=clusters.ENGINE_TIMEOUT_S, block=True)
        finally:
            client.close()
        self._supervisor = threading.Thread(
            target=singleuser.supervise, args=(host, self._stop), daemon=True,
        )
        self._supervisor.start()
        return self

    def engine_pids(self) -> set[int]:
        return {
            launcher.pid
            for engine_set in self.cluster.engines.values()
            for launcher in engine_set.launchers.values()
            if launcher.pid > 0
        }

    def hub_env(self) -> dict:
        """What ``pdl-singleuser`` exports to the user's server."""
        return ServerContract(kind="local", cluster_file=self.cluster_file, slots=tuple(self.slots),
                              workers=len(self.slots)).env()

    def stop(self) -> None:
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=10)
        self.cluster.stop_cluster_sync()


def run_kernel_standin(env: dict, code: str, cluster_file: str | None = None, n: int = 2,
                       local_slots: list[str] | None = None) -> subprocess.Popen:
    """A process that runs ``code`` on ``n`` ranks as a notebook kernel would
    (a DistributedSession), prints ``outcome: ok|interrupted|failed`` and exits."""
    script = f"""
import sys
from pdl_magics import DistributedSession
session = DistributedSession(cluster_file={cluster_file!r}, local_slots={local_slots!r})
try:
    session.run({code!r}, {n})
    print("outcome: ok", flush=True)
except KeyboardInterrupt:
    print("outcome: interrupted", flush=True)
except Exception as e:
    print(f"outcome: failed {{type(e).__name__}}: {{e}}", flush=True)
sys.stdin.read()  # stay alive (a kernel between cells) until stdin closes
session.close()
"""
    return subprocess.Popen([sys.executable, "-c", script], env=env, cwd=tempfile.gettempdir(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def wait_pids_gone(pids: set[int], timeout: float = 15) -> None:
    wait_until(lambda: not any(pid_alive(p) for p in pids), timeout, what=f"processes {pids} to exit")

