"""A real Jupyter server with PDL's extensions over a cluster folder of a test's own:
the owner of that folder's engine lease (pdl_server/lease_owner.py), reached over its
HTTP API as the hub, the supervisor and kernels reach it, without a hub."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pdl.lease import LeaseFiles
from pdl_server.lease_client import LeaseClient
from waiting import wait_until


@dataclass(frozen=True)
class LeaseServer:
    """The running server: its lease's client (the supervisor's and a kernel's), the
    files its owner writes, and the environment a kernel under it has."""

    client: LeaseClient
    files: LeaseFiles
    #: ``PDL_CLUSTER_DIR``, ``JUPYTERHUB_SERVICE_URL`` and ``JUPYTERHUB_API_TOKEN``
    env: dict[str, str]

    def hub_answers(self, body: dict, part: str = "") -> dict | None:
        """Post what the hub would (its answer to a request, ``part``: ``extension`` or
        ``gpu-idle``), with the server's token, as the hub does."""
        return self.client._call("POST", f"/{part}" if part else "", body)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def lease_server(folder: Path) -> Iterator[LeaseServer]:
    """Start the server (as this test's user: the test's own process tree) with its
    cluster folder ``folder / "cluster"``; stopped on leaving."""
    token, port = secrets.token_hex(16), _free_port()
    cluster = folder / "cluster"
    cluster.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PDL_", "JUPYTERHUB_"))}
    env.update(PDL_CLUSTER_DIR=str(cluster), JUPYTER_RUNTIME_DIR=str(folder / "runtime"), HOME=str(folder))
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0", f"--ServerApp.root_dir={folder}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = LeaseClient(f"http://127.0.0.1:{port}/pdl/api/lease", token)
    try:
        wait_until(lambda: server.poll() is not None or client.view() is not None, timeout=60,
                   what="the Jupyter server's lease API")
        assert server.poll() is None, f"the Jupyter server ended ({server.returncode})"
        yield LeaseServer(client, LeaseFiles(cluster), {
            "PDL_CLUSTER_DIR": str(cluster), "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}/",
            "JUPYTERHUB_API_TOKEN": token})
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
