"""PDLSlurmSpawner with ``server_placement = "allocation"`` (``PDL_SLURM_SERVER=allocation``)
on the simulated Slurm cluster, through a real hub: the user's server is a step of
their own job on its batch host, the hub's proxy reaches it on that node, its engines
are steps of the same job, and stopping it leaves no job and no process."""

from __future__ import annotations

import os
import re
import signal
import socket
from pathlib import Path

import pytest

from hub_harness import Kernel, pids_matching, process_env
from slurm_hub_harness import slurm_engines, slurm_hub_fixture
from waiting import wait_until

pytestmark = pytest.mark.slurm

#: Each rank's node, its job and the all-reduced sum of ones.
RANKS_CELL = """%%distributed -n 2 --all-output
import os, torch, torch.distributed as dist
t = torch.ones(1); dist.all_reduce(t)
print(f"rank {rank} host {os.environ['PDL_ENGINE_HOST']} job {os.environ['SLURM_JOB_ID']} sum {int(t.item())}")
"""
RANK_LINE = re.compile(r"rank (\d) host (\S+) job (\d+) sum (\d+)")


@pytest.fixture(scope="module")
def hub(slurm, tmp_path_factory):
    # the hub notices a server that died within seconds (JupyterHub's default: 30 s)
    yield from slurm_hub_fixture(tmp_path_factory.mktemp("slurm-in-job"), slurm, ["admin", "ann"],
                                 hub_env={"PDL_SLURM_SERVER": "allocation"},
                                 extra_config="c.Spawner.poll_interval = 2")


def servers(hub, user: str) -> dict[int, dict[str, str]]:
    """``user``'s pdl-singleuser processes (not the srun that started one, nor the step's
    guard that runs it) -> the Slurm variables they started with."""
    home = str(hub.home(user))
    found = {}
    for pid in pids_matching(lambda cmd, cwd: "-m pdl_server.singleuser" in cmd and "step_guard" not in cmd
                             and cwd.startswith(home)):
        env = process_env(pid)
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        if env is not None and Path(argv0).name != "srun":
            found[pid] = {k: v for k, v in env.items() if k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURMD_NODENAME")}
    return found


def listening_in_its_namespace(pid: int) -> set[str]:
    """The IPv4 addresses ``pid`` listens on (TCP), read in its own network namespace
    (/proc/PID/net/tcp: psutil reads the caller's, where a node's sockets are not)."""
    sockets = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            sockets.add(target[len("socket:["):-1])
    found = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in sockets:  # LISTEN, one of its sockets
            found.add(socket.inet_ntoa(bytes.fromhex(fields[1].split(":")[0])[::-1]))
    return found


def test_the_server_is_a_step_of_its_job_on_a_node_and_runs_cells_across_the_jobs_gpus(hub, slurm):
    r = hub.spawn("ann", 2)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ann", timeout=120)
    [job] = hub.pdl_jobs("ann")
    assert job["user"] == hub.account("ann") and job["state"] == "RUNNING" and job["nodes"] == "2", job
    batch_host = slurm.run("squeue", "-h", "-j", job["id"], "-o", "%B", check=True).stdout.strip()

    # Slurm's view: the server is a step of ann's job on its batch host, and so is its process's
    steps = slurm.run("squeue", "-h", "-s", "-j", job["id"], "-o", "%i|%j|%N", check=True).stdout.split()
    assert f"{job['id']}.0|pdl-server|{batch_host}" in steps, steps
    [server_env] = servers(hub, "ann").values()
    assert server_env == {"SLURM_JOB_ID": job["id"], "SLURM_STEP_ID": "0", "SLURMD_NODENAME": batch_host}
    # the server and its controller listen on the node's address, where the proxy and the
    # engines reach them (the controller's processes also talk among themselves on loopback)
    node_addr, roles = slurm.addr(batch_host), hub.processes_of("ann")
    listening = {role: set().union(*(listening_in_its_namespace(p) for p, r in roles.items() if r == role))
                 for role in ("server", "controller")}
    assert listening["server"] == {node_addr} and listening["controller"] - {"127.0.0.1"} == {node_addr}, listening

    kernel = Kernel(hub, "ann")  # through the hub's proxy, to the node
    try:
        where = kernel.execute_ok("import os; print(os.environ['SLURMD_NODENAME'], os.environ['SLURM_JOB_ID'])")
        assert where["stdout"].split() == [batch_host, job["id"]]
        kernel.execute_ok("%load_ext pdl_magics")
        out = kernel.execute_ok(RANKS_CELL, timeout=180)
        ranks = {int(m[0]): m[1:] for m in RANK_LINE.findall(out["stdout"])}
        assert sorted(ranks) == [0, 1], out
        assert {(j, total) for _, j, total in ranks.values()} == {(job["id"], "2")}
        engine_nodes = sorted(env["SLURMD_NODENAME"] for env in slurm_engines(hub.root).values())
        assert sorted(host for host, *_ in ranks.values()) == engine_nodes and len(set(engine_nodes)) == 2
        kernel.detach()

        # the hub crashes and restarts: it finds the same server in the same job, and the kernel keeps going
        pids = set(servers(hub, "ann"))
        hub.stop_hub(signal.SIGKILL)
        hub.start()
        hub.wait_ready("ann", timeout=60)
        assert [(j["id"], j["state"]) for j in hub.pdl_jobs("ann")] == [(job["id"], "RUNNING")]
        assert set(servers(hub, "ann")) == pids
        kernel = Kernel(hub, "ann", kernel.id)
        assert "sum 2" in kernel.execute_ok(RANKS_CELL, timeout=120)["stdout"]
    finally:
        kernel.close()

    # stop: no job, no server, no engine left, in Slurm's view and the machine's
    r = hub.api("DELETE", "/users/ann/server")
    assert r.status_code in (202, 204), r.text
    wait_until(lambda: not hub.pdl_jobs() and not servers(hub, "ann") and not slurm_engines(hub.root)
               and not hub.processes_of("ann"), 60,
               what=lambda: f"ann's job and processes gone: {slurm.jobs()} {hub.processes_of('ann')}")


def test_a_server_that_dies_on_its_node_leaves_no_job(hub, slurm):
    """Guards the srun on the login node as the server's process: the step ends with the
    server, srun exits, the hub's poll finds the server gone and cancels its job."""
    r = hub.spawn("ann", 1)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ann", timeout=120)
    [job] = hub.pdl_jobs("ann")
    [server] = servers(hub, "ann")
    os.kill(server, signal.SIGKILL)
    wait_until(lambda: not hub.pdl_jobs() and not hub.processes_of("ann") and not hub.server_ready("ann"), 60,
               what=lambda: f"ann's job {job['id']} and processes gone: {slurm.jobs()} {hub.processes_of('ann')}")
