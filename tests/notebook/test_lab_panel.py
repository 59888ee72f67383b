"""The Cluster panel's server API (pdl_lab) on a real JupyterLab, with real engines.

The module's cluster is two CPU-slot engines run and supervised as ``pdl-singleuser``
runs them for a hub user; the server gets ``PDL_CLUSTER_FILE``/``PDL_SLOTS`` as a
hub user's server does. A "kernel" is a separate process running a
DistributedSession, as a notebook kernel does.
"""

from __future__ import annotations

import signal
import socket
import time

import ipyparallel as ipp
import pytest

from lab_harness import LabServer, SlotCluster, run_kernel_standin, wait_pids_gone

pytestmark = pytest.mark.integration

SLOTS = ["cpu:0", "cpu:1"]
LOOP = """
import time, pdl
for i in range(1, 401):
    pdl.log(step=i, total=400, loss=4.0 / i, img_per_s=100.0 + rank)
    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("panel-cluster")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IPYTHONDIR", str(root / "ipython"))
        mp.delenv("PDL_CLUSTER_FILE", raising=False)
        c = SlotCluster(root, SLOTS).start()
        try:
            yield c
        finally:
            c.stop()


@pytest.fixture(scope="module")
def lab(cluster, tmp_path_factory):
    server = LabServer(tmp_path_factory.mktemp("panel-lab"), env=cluster.hub_env()).start()
    yield server
    server.stop()


def idle_engines(n):
    return lambda m: [e["state"] for e in m["engines"]] == ["idle"] * n and all(
        e["pid"] and e["cpu_percent"] is not None for e in m["engines"])


def test_every_endpoint_refuses_requests_without_a_valid_token(lab, cluster):
    pids = cluster.engine_pids()
    for method, path in [("GET", "/pdl/api/cluster"), ("POST", "/pdl/api/stop"), ("POST", "/pdl/api/restart")]:
        anonymous = lab.api(method, path, token=False)
        assert anonymous.status_code in (401, 403), (method, path, anonymous.status_code)
        forged = lab.api(method, path, token=False, headers={"Authorization": "token not-the-token"})
        assert forged.status_code in (401, 403), (method, path, forged.status_code)
    assert cluster.engine_pids() == pids  # nothing was stopped or restarted
    ok = lab.api("GET", "/pdl/api/cluster")
    assert ok.status_code == 200 and ok.headers["Content-Type"].startswith("application/json")


def test_the_model_lists_each_engine_idle_with_its_slot_node_pid_and_load(lab, cluster):
    model = lab.wait_cluster(idle_engines(2), what="2 idle engines with their load")
    host = socket.gethostname()
    assert model["mode"] == "hub" and model["connected"] and model["message"] is None
    assert model["slots"] == SLOTS and model["nodes"] == [host]
    assert [e["slot"] for e in model["engines"]] == SLOTS
    assert {e["pid"] for e in model["engines"]} == cluster.engine_pids()
    for e in model["engines"]:
        assert e["host"] == host and e["local"] is True
        assert isinstance(e["id"], int) and e["rank"] is None
        assert 0 <= e["cpu_percent"] and e["rss_bytes"] > 20 * 2**20  # an engine imports numpy at least
        assert e["gpus"] == [] and e["cuda_visible"] == ""  # CPU slots see no GPU
    assert model["cell"] is None  # no kernel has run a cell yet


def test_a_running_cell_shows_live_progress_per_rank_and_stop_interrupts_every_rank(lab, cluster):
    kernel = run_kernel_standin(lab.environment(), LOOP, cluster_file=cluster.cluster_file)
    try:
        def progressing(m):
            cell = m["cell"]
            return cell and cell["running"] and all((r["step"] or 0) >= 5 for r in cell["ranks"])

        first = lab.wait_cluster(progressing, 90, what="both ranks' progress")
        assert first["cell"]["kernel_pid"] == kernel.pid
        assert [e["state"] for e in first["engines"]] == ["busy", "busy"]
        assert sorted(e["rank"] for e in first["engines"]) == [0, 1]
        ranks = first["cell"]["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1] and all(r["total"] == 400 for r in ranks)
        assert ranks[1]["values"]["img_per_s"] == 101.0
        steps = [r["step"] for r in ranks]
        later = lab.wait_cluster(
            lambda m: m["cell"] and all(r["step"] > s + 5 for r, s in zip(m["cell"]["ranks"], steps)), 20,
            what="the steps to advance",
        )
        assert later["cell"]["running"]

        reply = lab.api("POST", "/pdl/api/stop")
        assert reply.status_code == 200, reply.text
        assert reply.json()["kernel_pid"] == kernel.pid
        out, _ = kernel.communicate(input="", timeout=60)
        assert "outcome: interrupted" in out, out
        stopped = lab.wait_cluster(lambda m: [e["state"] for e in m["engines"]] == ["idle", "idle"], 30,
                                   what="the engines to be idle")
        assert all(r["step"] < 400 for r in later["cell"]["ranks"])
        assert stopped["cell"] is None  # the kernel closed its session: no live status left
    finally:
        if kernel.poll() is None:
            kernel.kill()


def test_stop_without_a_kernel_signals_the_busy_engines(lab, cluster):
    client = ipp.Cluster.from_file(cluster.cluster_file).connect_client_sync()
    try:
        ar = client[:].apply_async(time.sleep, 120)
        lab.wait_cluster(lambda m: [e["state"] for e in m["engines"]] == ["busy", "busy"], 30,
                         what="both engines busy")
        reply = lab.api("POST", "/pdl/api/stop").json()
        assert reply["kernel_pid"] is None and sorted(reply["signalled_engines"]) == sorted(client.ids)
        with pytest.raises(ipp.error.CompositeError) as raised:
            ar.get(timeout=20)
        assert "KeyboardInterrupt" in str(raised.value)
        lab.wait_cluster(lambda m: [e["state"] for e in m["engines"]] == ["idle", "idle"], 30,
                         what="the engines to be idle again")
    finally:
        client.close()


def test_a_panel_that_connects_while_the_engines_run_shows_each_engine_once(cluster, monkeypatch):
    """A server restarted during a long cell: its engines cannot describe their slot
    until they are free, yet each shows once (busy), not beside a "starting" slot."""
    from pdl_lab.monitor import ClusterMonitor

    monkeypatch.delenv("PDL_CLUSTER_DIR", raising=False)
    client = ipp.Cluster.from_file(cluster.cluster_file).connect_client_sync()
    monitor = ClusterMonitor(hub_cluster_file=cluster.cluster_file, hub_slots=SLOTS)
    try:
        ar = client[:].apply_async(time.sleep, 120)
        deadline = time.monotonic() + 30
        while not all(q["queue"] for eid, q in client.queue_status().items() if isinstance(eid, int)):
            assert time.monotonic() < deadline, "the engines never took the task"
            time.sleep(0.1)
        for _ in range(3):  # a few refreshes, as the panel polls
            model = monitor.snapshot_sync()
            assert [e["state"] for e in model["engines"]] == ["busy", "busy"], model["engines"]
            assert sorted(e["id"] for e in model["engines"]) == sorted(client.ids)
        client.send_signal(signal.SIGINT, block=True)
        with pytest.raises(ipp.error.CompositeError):
            ar.get(timeout=20)
    finally:
        monitor.close()
        client.close()


def test_restart_kills_the_engines_and_the_supervisor_starts_fresh_ones(lab, cluster):
    before = lab.wait_cluster(idle_engines(2), what="2 idle engines")
    old_pids = {e["pid"] for e in before["engines"]}
    old_ids = {e["id"] for e in before["engines"]}
    reply = lab.api("POST", "/pdl/api/restart").json()
    assert sorted(reply["killed"]) == sorted(old_ids) and reply["restarted_by"] == "pdl-singleuser"
    wait_pids_gone(old_pids)
    seen_dead = lab.wait_cluster(lambda m: any(e["state"] == "dead" for e in m["engines"]), 10,
                                 what="the killed engines shown dead")
    assert {e["slot"] for e in seen_dead["engines"] if e["state"] == "dead"} <= set(SLOTS)
    after = lab.wait_cluster(
        lambda m: idle_engines(2)(m) and not {e["pid"] for e in m["engines"]} & old_pids, 90,
        what="2 fresh idle engines",
    )
    assert [e["slot"] for e in after["engines"]] == SLOTS
    assert not {e["id"] for e in after["engines"]} & old_ids


def test_outside_a_hub_the_panel_follows_the_kernels_local_cluster(tmp_path):
    server = LabServer(tmp_path / "lab").start()  # no PDL_CLUSTER_FILE: plain JupyterLab
    kernel = None
    try:
        empty = server.cluster()
        assert empty["mode"] == "none" and empty["engines"] == [] and "%%distributed" in empty["message"]
        env = server.environment()
        env.pop("PDL_CLUSTER_FILE", None)
        env.pop("PDL_SLOTS", None)
        kernel = run_kernel_standin(env, "import pdl\npdl.log(step=3, total=3, loss=0.5)", local_slots=SLOTS)
        model = server.wait_cluster(
            lambda m: m["mode"] == "local" and m["cell"] and not m["cell"]["running"] and idle_engines(2)(m),
            120, what="the kernel's local cluster, idle after its cell",
        )
        assert model["slots"] == SLOTS and model["cell"]["kernel_pid"] == kernel.pid
        assert [(r["rank"], r["step"], r["total"]) for r in model["cell"]["ranks"]] == [(0, 3, 3), (1, 3, 3)]
        pids = {e["pid"] for e in model["engines"]}
        kernel.communicate(input="", timeout=60)  # the kernel exits: its cluster stops
        wait_pids_gone(pids)
        gone = server.wait_cluster(lambda m: m["mode"] == "none", 20, what="the panel to drop the cluster")
        assert gone["engines"] == []
    finally:
        if kernel is not None and kernel.poll() is None:
            kernel.send_signal(signal.SIGKILL)
        server.stop()


def test_jupyterlab_loads_the_prebuilt_panel(lab):
    page = lab.api("GET", "/lab")
    assert page.status_code == 200 and '"name": "pdl-cluster"' in page.text.replace('\\"', '"')
    settings = lab.api("GET", "/lab/api/settings/pdl-cluster:plugin").json()
    assert settings["schema"]["properties"]["refreshInterval"]["default"] == 1000
