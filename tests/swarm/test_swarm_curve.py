"""Engines on other machines connect over CurveZMQ with hub-generated keys (no Docker).

A real controller is started the way ``pdl-singleuser`` starts it in controller-only
mode (connection files and keypair from the notebook secret), and real engines the way
each Swarm engine task runs them (``pdl-engine`` with its connection secret and the GPU
Swarm assigned). Everything is on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import ExitStack

import pytest

from pdl.connection import PORTS_NEEDED, ClusterKeys, engine_file, notebook_secret
from pdl_server import clusters
from pdl_server.world import call_engine

pytestmark = pytest.mark.integration

REGISTRATION_TIMEOUT_S = 5


def free_ports(n: int) -> list[int]:
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def write_secret(path, data: dict) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    return str(path)


def start_engine(tmp_path, name: str, connection: dict, gpu: str) -> subprocess.Popen:
    env = dict(os.environ, PDL_ENGINE_CONNECTION=write_secret(tmp_path / f"{name}.json", connection),
               PDL_ENGINE_HOST=name, PYTHONUNBUFFERED="1")
    env["DOCKER_RESOURCE_NVIDIA-GPU"] = gpu
    return subprocess.Popen(
        [sys.executable, "-m", "pdl_spawner.swarm.engine_boot", f"--IPEngine.timeout={REGISTRATION_TIMEOUT_S}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


@pytest.fixture
def curve_cluster(tmp_path, monkeypatch):
    """A controller-only cluster with fresh keys on 127.0.0.1: (cluster, keys, ports)."""
    keys = ClusterKeys.generate()
    ports = free_ports(PORTS_NEEDED)
    secret = notebook_secret(keys, ports, api_token="not-used-here", bind="tcp://127.0.0.1")
    monkeypatch.setenv("PDL_CONTROLLER_SECRET", write_secret(tmp_path / "notebook.json", secret))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    cluster = clusters.new_cluster(cluster_id="pdl", profile_dir=str(tmp_path / "profile"))
    clusters.start_controller(cluster, secret=secret)
    try:
        yield cluster, keys, ports
    finally:
        cluster.stop_cluster_sync()


def test_engine_with_the_keys_registers_and_engines_with_wrong_keys_cannot(curve_cluster, tmp_path):
    cluster, keys, ports = curve_cluster
    client = cluster.connect_client_sync()
    assert client.curve_serverkey == keys.curve_publickey.encode()
    other = ClusterKeys.generate()
    good = engine_file(keys, ports, "127.0.0.1")
    wrong_server_key = {**good, "curve_serverkey": other.curve_publickey}
    wrong_hmac_key = {**good, "key": other.session_key}
    no_curve = {**good, "curve_serverkey": None}
    engines = {
        "good": start_engine(tmp_path, "good", good, gpu="GPU-fake-1"),
        "wrong-server-key": start_engine(tmp_path, "wrong-server-key", wrong_server_key, gpu="GPU-fake-2"),
        "wrong-hmac-key": start_engine(tmp_path, "wrong-hmac-key", wrong_hmac_key, gpu="GPU-fake-3"),
        "no-curve": start_engine(tmp_path, "no-curve", no_curve, gpu="1"),
    }
    try:
        client.wait_for_engines(1, timeout=60, block=True)
        info = client[:].apply_sync(call_engine, "describe")
        assert len(info) == 1
        assert info[0]["host"] == "good" and info[0]["slot"] == "gpu:0"
        assert info[0]["cuda_visible"] == "GPU-fake-1"
        assert info[0]["addr"] == "127.0.0.1"
        # the others give up after their registration timeout, never registered
        for name in ("wrong-server-key", "wrong-hmac-key", "no-curve"):
            proc = engines[name]
            out, _ = proc.communicate(timeout=REGISTRATION_TIMEOUT_S + 30)
            assert proc.returncode != 0, f"{name} engine exited cleanly:\n{out}"
            assert "Registration timed out" in out, out
        time.sleep(0.5)
        assert len(client.ids) == 1, "an engine without the right keys registered"
        assert engines["good"].poll() is None
    finally:
        for proc in engines.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        client.close()


def test_client_without_the_controller_key_gets_no_answer(curve_cluster, tmp_path):
    cluster, keys, ports = curve_cluster
    info = json.loads((tmp_path / "profile" / "security" / "ipcontroller-pdl-client.json").read_text())
    assert info["curve_serverkey"] == keys.curve_publickey and info["key"] == keys.session_key
    bad = tmp_path / "bad-client.json"
    bad.write_text(json.dumps({**info, "curve_serverkey": ClusterKeys.generate().curve_publickey}))
    import ipyparallel as ipp

    with pytest.raises(TimeoutError):
        ipp.Client(str(bad), timeout=3)
