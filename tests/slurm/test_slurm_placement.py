"""A Slurm server inside its job (pdl_spawner/slurm/placement.py): the server step's
srun arguments, its node read from ``squeue --json`` / ``sinfo --json``, the check
that the nodes can reach the hub's API, and the step's guard
(pdl_spawner/slurm/step_guard.py), which ends the step with the server; no Slurm."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pdl_spawner.slurm.jobs import SlurmNode
from pdl_spawner.slurm.placement import ServerNode, batch_host, hub_api_problem, node_address, server_step_argv

pytestmark = pytest.mark.unit


def test_the_server_step_shares_the_jobs_cores_takes_no_gpu_and_runs_the_server_under_its_guard():
    assert server_step_argv(42, "n1", ["/py", "-m", "pdl_server.singleuser"], srun="/opt/slurm/bin/srun",
                            guard=("/py", "-m", "pdl_spawner.slurm.step_guard")) == [
        "/opt/slurm/bin/srun", "--jobid=42", "--nodes=1", "--ntasks=1", "--nodelist=n1", "--overlap", "--gres=none",
        "--export=ALL", "--input=none", "--disable-status", "--quiet", "--job-name=pdl-server",
        "/py", "-m", "pdl_spawner.slurm.step_guard", "/py", "-m", "pdl_server.singleuser",
    ]
    # no --cpus-per-task: the server's SLURM_CPUS_PER_TASK would reach its engines' sruns
    assert not any(a.startswith(("--cpus-per-task", "-c", "--gpus")) for a in server_step_argv(1, "n1", ["x"]))


def test_the_server_node_is_the_jobs_batch_host_at_its_node_address():
    squeue = json.dumps({"jobs": [{"job_id": 7, "batch_host": "n3"},
                                  {"job_id": {"set": True, "infinite": False, "number": 8}, "batch_host": "n2"}]})
    assert batch_host(squeue, 7) == "n3"
    assert batch_host(squeue, 8) == "n2"  # newer Slurm's number form
    with pytest.raises(ValueError, match="no batch host for job 9"):
        batch_host(squeue, 9)
    nodes = [SlurmNode("n2", "10.0.0.12", 1, "mixed"), SlurmNode("n3", "", 1, "idle")]
    assert node_address(nodes, "n2") == "10.0.0.12"
    assert node_address(nodes, "n3") == "n3"  # no NodeAddr: its name
    with pytest.raises(ValueError, match="does not list node n9"):
        node_address(nodes, "n9")


def test_the_server_node_survives_in_the_spawner_state_and_a_login_state_has_none():
    node = ServerNode("n1", "10.78.0.11")
    assert ServerNode.from_state(node.state()) == node
    assert ServerNode.from_state(None) is None and ServerNode.from_state({"name": "n1"}) is None


def test_a_hub_api_on_loopback_is_refused_in_one_line_naming_what_to_set():
    for url in ("http://127.0.0.1:8081/hub/api", "http://localhost:8081/hub/api", "http://[::1]:8081/hub/api"):
        problem = hub_api_problem(url)
        assert problem and "\n" not in problem and "hub_ip" in problem and "PDL_SLURM_SERVER=allocation" in problem
    assert hub_api_problem("http://10.78.0.1:8081/hub/api") is None
    assert hub_api_problem("http://login1:8081/hub/api") is None


@pytest.mark.integration
def test_the_step_guard_passes_stop_signals_on_and_stops_what_the_server_left(tmp_path):
    """A server killed with SIGKILL leaves its children orphaned: the guard stops them and
    exits with the server's status, so the step ends; SIGTERM reaches the server."""
    def guarded(script: str, lines: int) -> tuple[subprocess.Popen, list[int]]:
        """The guard running ``script``, once the script has written ``lines`` PIDs."""
        pids = tmp_path / f"pids-{lines}"
        guard = subprocess.Popen([sys.executable, "-m", "pdl_spawner.slurm.step_guard", "bash", "-c",
                                  script.format(pids=pids)])
        deadline = time.monotonic() + 10
        while len(pids.read_text().split() if pids.exists() else []) < lines and time.monotonic() < deadline:
            time.sleep(0.05)
        return guard, [int(pid) for pid in pids.read_text().split()]

    guard, (child, server) = guarded("sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; wait", 2)
    os.kill(server, signal.SIGKILL)
    assert guard.wait(timeout=15) == 128 + signal.SIGKILL
    assert not _alive(child), "the server's child outlived it"

    guard, _ = guarded("trap 'exit 3' TERM; echo $$ >> {pids}; sleep 300 & wait", 1)
    guard.terminate()
    assert guard.wait(timeout=15) == 3


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
