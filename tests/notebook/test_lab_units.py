"""The Cluster panel's pure parts: the status file, the load readings, the panel's
lines on limits and the session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from pdl_lab import resources
from pdl_lab.monitor import ClusterMonitor
from pdl_server import status_file

pytestmark = pytest.mark.unit


@pytest.fixture
def status_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PDL_STATUS_DIR", str(tmp_path / "status"))
    monkeypatch.setattr(status_file, "_last_write", 0.0)
    return tmp_path / "status"


WORLD = [{"rank": 0, "engine_id": 4, "host": "h", "addr": "1.2.3.4", "slot": "cpu:0"},
         {"rank": 1, "engine_id": 5, "host": "h", "addr": "1.2.3.4", "slot": "cpu:1"}]


def snap(step, total=100):
    history = [[s, {"loss": 1.0 / s}] for s in range(1, step + 1)]
    return {"step": step, "total": total, "values": {"loss": 1.0 / step}, "history": history, "time": 1.0,
            "count": step}


def test_a_status_round_trips_with_each_ranks_latest_snapshot_and_a_thinned_history(status_dir):
    path = status_file.write_status("/c.json", WORLD, running=True, metrics={0: snap(500), 1: snap(7)},
                                    cell=3, slots=["cpu:0", "cpu:1"], force=True)
    assert path == status_dir / f"{os.getpid()}.json"
    status = status_file.read_status()
    assert status["pid"] == os.getpid() and status["running"] and status["cell"] == 3
    assert status["world"] == WORLD and status["slots"] == ["cpu:0", "cpu:1"] and status["hub"] is False
    history = status["metrics"]["0"]["history"]
    assert len(history) <= status_file.HISTORY_POINTS + 1 and history[-1] == [500, {"loss": 1.0 / 500}]
    assert status["metrics"]["1"]["history"] == snap(7)["history"]
    assert status_file.read_status("/c.json")["cell"] == 3
    assert status_file.read_status("/other-cluster.json") is None
    status_file.remove_status()
    assert status_file.read_status() is None


def test_writes_are_throttled_unless_forced(status_dir):
    assert status_file.write_status("/c.json", WORLD, running=True, force=True)
    assert status_file.write_status("/c.json", WORLD, running=True, metrics={0: snap(2)}) is None
    assert status_file.read_status()["metrics"] == {}
    assert status_file.write_status("/c.json", WORLD, running=False, metrics={0: snap(2)}, force=True)
    assert status_file.read_status()["metrics"]["0"]["step"] == 2


def test_the_newest_live_status_wins_and_files_of_dead_kernels_are_removed(status_dir):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    status_dir.mkdir(parents=True)
    (status_dir / f"{dead_pid}.json").write_text(json.dumps({"pid": dead_pid, "updated": 9e12, "cluster_file": "/d"}))
    (status_dir / "garbage.json").write_text("{not json")
    status_file.write_status("/c.json", WORLD, running=False, force=True)
    assert status_file.read_status()["cluster_file"] == "/c.json"
    assert not (status_dir / f"{dead_pid}.json").exists()


def test_an_unwritable_status_dir_never_breaks_a_cell(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("PDL_STATUS_DIR", str(blocker / "status"))
    assert status_file.write_status("/c.json", WORLD, running=True, force=True) is None


FAKE_SMI = """#!/bin/sh
echo "0, GPU-aaaa, NVIDIA H100, 87, 40960, 81559"
echo "1, GPU-bbbb, NVIDIA H100, [N/A], 10, 81559"
"""


def test_gpu_readings_come_from_nvidia_smi_and_map_by_cuda_visible_devices(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    gpus = resources.gpu_stats(str(smi))
    assert [g["index"] for g in gpus] == ["0", "1"]
    assert gpus[0]["util_percent"] == 87.0 and gpus[0]["mem_used_bytes"] == 40960 * 2**20
    assert gpus[1]["util_percent"] is None  # [N/A]
    assert resources.gpus_of("1", gpus) == [gpus[1]]
    assert resources.gpus_of("GPU-aaaa", gpus) == [gpus[0]]
    assert resources.gpus_of("", gpus) == [] and resources.gpus_of(None, gpus) == []
    assert resources.gpu_stats(str(tmp_path / "missing")) == []


def test_process_load_covers_the_process_and_its_children():
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        sampler = resources.ProcessSampler()
        first = sampler.sample(os.getpid())
        assert first["cpu_percent"] is None and first["rss_bytes"] > 10 * 2**20
        time.sleep(1.0)
        second = sampler.sample(os.getpid())
        assert second["cpu_percent"] > 5  # the busy child counts (on a loaded machine, far less than 100)
        assert sampler.sample(999_999_999) is None
    finally:
        child.kill()
        child.wait()


def test_the_cell_model_pairs_each_rank_with_its_latest_progress():
    status = {"cell": 2, "running": True, "pid": 42, "started": 1.0, "updated": 2.0, "world": WORLD,
              "metrics": {"1": snap(3, 10)}}
    cell = ClusterMonitor._cell(status)
    assert cell["running"] and cell["kernel_pid"] == 42 and cell["number"] == 2
    r0, r1 = cell["ranks"]
    assert (r0["rank"], r0["engine_id"], r0["step"], r0["values"]) == (0, 4, None, {})
    assert (r1["rank"], r1["step"], r1["total"], r1["values"]) == (1, 3, 10, {"loss": 1.0 / 3})
    assert ClusterMonitor._cell(None) is None


def test_the_panels_limits_line_says_what_the_hub_allows_and_what_is_held(monkeypatch):
    monkeypatch.setenv("PDL_WORKERS", "2")
    monkeypatch.setenv("PDL_CLUSTER_DIR", "/nonexistent/pdl-cluster")
    monitor = ClusterMonitor(hub_cluster_file="", hub_slots=[])
    monkeypatch.delenv("PDL_WORKERS_LIMIT", raising=False)
    assert monitor.limits_line(True) is None  # a hub that told nothing: no line
    monkeypatch.setenv("PDL_WORKERS_LIMIT", "4")
    assert monitor.limits_line(True) == "You may hold 4 workers; you hold 2."
    assert monitor.limits_line(False) == "You may hold 4 workers; you hold 0."  # released for idleness
    monkeypatch.setenv("PDL_LIMITS_NOTE", "Slurm QOS lab: at most 4 GPUs per user.")
    assert monitor.limits_line(True) == "You may hold 4 workers; you hold 2. Slurm QOS lab: at most 4 GPUs per user."


def test_the_panels_session_offers_extend_where_the_hub_allows_it_and_says_where_the_wish_stands(
        tmp_path, monkeypatch):
    from pdl.lease import Extended, LeaseFiles, Refusal

    ends_at = time.time() + 3600
    monkeypatch.setenv("PDL_CLUSTER_DIR", str(tmp_path))
    monkeypatch.setenv("PDL_SESSION_LIMIT_S", "3600")
    monkeypatch.setenv("PDL_SESSION_ENDS_AT", f"{ends_at:.3f}")
    monitor = ClusterMonitor(hub_cluster_file=str(tmp_path / "cluster.json"), hub_slots=["cpu:0"])
    session = monitor.session()
    assert session["text"].startswith("Time left: ") and session["why"] == "the hub's session limit of 1 h 00 min"
    assert not session["extendable"] and session["extension"] is None
    assert monitor.ask_extension() == {"ok": False, "message": "This session cannot be extended here."}
    assert LeaseFiles(tmp_path).extend_wish() is None

    monkeypatch.setenv("PDL_SESSION_EXTENDABLE", "1")
    assert monitor.session()["extendable"]
    assert monitor.ask_extension()["ok"] and monitor.session()["extension"] == "Asking the hub for more time..."
    LeaseFiles(tmp_path).answer_extension(Extended(ends_at=ends_at + 3600, of=ends_at))  # the env has ms
    extended = monitor.session()
    assert extended["ends_at"] == ends_at + 3600 and extended["extension"] == (
        f"Extended: your session now ends at {time.strftime('%H:%M UTC', time.gmtime(ends_at + 3600))}.")
    LeaseFiles(tmp_path).answer_extension(Refusal("Not extended: 1 other user is waiting for workers"))
    assert monitor.session()["extension"] == "Not extended: 1 other user is waiting for workers"


def test_an_engine_gone_between_reading_the_ids_and_asking_it_is_no_error(monkeypatch):
    """CI of issue 44 (side by side): the panel's read answered 500 while the hub took the
    engines back: an engine listed by ``client.ids`` had unregistered when the monitor
    asked it to describe itself (ipyparallel's IndexError). The read now goes on; the
    next one no longer lists it. The client is the fault double: the one seam."""
    monkeypatch.setenv("PDL_CLUSTER_DIR", "/nonexistent/pdl-cluster")

    class ClientDuringARelease:
        ids = [0, 1]

        def queue_status(self):
            return {0: {"queue": 0}, 1: {"queue": 0}}

        def __getitem__(self, eid):
            raise IndexError(f"No such engine: {eid}")

    monitor = ClusterMonitor(hub_cluster_file="", hub_slots=[])
    client = ClientDuringARelease()
    monitor._client = client
    rows = monitor._engine_rows(client, None)
    assert len(rows) == 2 and monitor._pending == {}  # both shown as they are; asked again next read
