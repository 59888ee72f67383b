"""Engines forked from a warm parent (pdl_server.warm_engines, pdl.runtime.warm_parent):
one torch import per server, each engine its own slot, threads, device, keys and random
state, a replacement forked from the same parent, a cold start where forking cannot be
used, and nobody but the server able to ask the parent for an engine."""

from __future__ import annotations

import os
import signal
import sys
import time

import ipyparallel as ipp
import psutil
import pytest

from pdl.engine_contract import ENGINE_COMMAND
from pdl.process import pid_alive
from pdl.runtime.warm_parent import refusal
from pdl.slots import engine_env
from pdl_server import clusters, warm_engines
from waiting import wait_until

pytestmark = pytest.mark.integration

POOL = ["gpu:0", "gpu:1"]


@ipp.interactive
def inside_the_engine() -> dict:
    """What an engine says of itself (run by ``apply``, before any cell imported torch)."""
    import os
    import sys

    warm = "torch" in sys.modules  # a cold engine imports torch only when a cell does
    import numpy
    import torch
    from ipyparallel.engine.app import IPEngine

    return dict(pid=os.getpid(), parent=os.getppid(), session=os.getsid(0), torch_before=warm,
                cpus=sorted(os.sched_getaffinity(0)), threads=torch.get_num_threads(),
                omp=os.environ.get("OMP_NUM_THREADS"), visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
                slot=os.environ.get("PDL_SLOT"), cuda_initialised=torch.cuda.is_initialized(),
                key=IPEngine.instance().curve_publickey.decode(), engine_id=IPEngine.instance().id, draw=float(numpy.random.random()),
                command=open("/proc/self/cmdline", "rb").read().replace(b"\0", b" ").decode(),
                shown_env=dict(item.decode().split("=", 1)
                               for item in open("/proc/self/environ", "rb").read().split(b"\0") if b"=" in item))


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A local cluster whose process warmed up (the parent inherits 4 OpenMP threads)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    c = clusters.new_cluster(cluster_id=f"warm{os.getpid()}", profile_dir=str(tmp_path / "profile"))
    parent = warm_engines.warm_up(c)
    clusters.start_controller(c)
    try:
        yield c, parent
    finally:
        c.stop_cluster_sync()
        warm_engines.stop_warm_parent(c)
        assert not pid_alive(parent.pid)


def engines_report(c, count: int) -> list[dict]:
    client = c.connect_client_sync()
    try:
        client.wait_for_engines(count, timeout=60)
        return sorted(client[:].apply_sync(inside_the_engine), key=lambda r: r["slot"])
    finally:
        client.close()


def test_engines_of_one_server_are_forked_from_one_warm_parent_each_with_its_own_state(cluster):
    c, parent = cluster
    clusters.start_slot_engines(c, POOL, POOL)
    first, second = engines_report(c, 2)
    for engine, slot in zip((first, second), POOL):
        assert engine["parent"] == parent.pid and engine["torch_before"], engine  # imported once, there
        assert engine["slot"] == slot and engine["visible"] == slot[-1], engine  # its own device
        assert engine["cpus"] == sorted(int(c) for c in engine_env(slot, POOL)["PDL_CPUS"].split(",")), engine
        assert engine["omp"] == engine_env(slot, POOL)["OMP_NUM_THREADS"] != "4", engine
        assert engine["threads"] == int(engine["omp"]), engine  # not the parent's 4
        assert engine["session"] == engine["pid"] and not engine["cuda_initialised"], engine
        assert " ".join(ENGINE_COMMAND) in engine["command"], engine  # ps shows an engine
        assert engine["shown_env"]["PDL_SLOT"] == slot and "PDL_WARM_ROOM" not in engine["shown_env"], engine
    assert first["key"] != second["key"], "two engines with one CurveZMQ keypair"
    assert first["draw"] != second["draw"], "two engines drew the same 'random' number"


def test_a_killed_engine_is_replaced_from_the_same_parent_and_leaves_no_zombie(cluster):
    c, parent = cluster
    clusters.start_slot_engines(c, POOL, POOL)
    before = {e["slot"]: e for e in engines_report(c, 2)}
    victim = before["gpu:0"]["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: not pid_alive(victim), 10, interval=0.05, what="the killed engine to be reaped")
    assert not psutil.pid_exists(victim), "the warm parent left the killed engine a zombie"
    clusters.restart_slot_engine(c, "gpu:0", POOL)
    client = c.connect_client_sync()
    try:
        # the victim's id stays listed until the controller misses its heart: ask only the live two
        wait_until(lambda: len(client.ids) == 2 and before["gpu:0"]["engine_id"] not in client.ids, 60,
                   what="the replacement to register and the victim to be unregistered")
        after = {e["slot"]: e for e in client[:].apply_sync(inside_the_engine)}
    finally:
        client.close()
    assert after["gpu:0"]["parent"] == parent.pid and after["gpu:0"]["pid"] != victim
    assert after["gpu:1"]["pid"] == before["gpu:1"]["pid"]


def test_without_its_warm_parent_an_engine_starts_cold(cluster):
    c, parent = cluster
    os.kill(parent.pid, signal.SIGKILL)
    parent.process.wait()
    clusters.start_slot_engines(c, POOL[:1], POOL)
    (engine,) = engines_report(c, 1)
    assert engine["parent"] == os.getpid() and not engine["torch_before"], engine
    assert engine["slot"] == "gpu:0" and engine["threads"] == int(engine["omp"])


def test_a_warm_parent_reaches_only_the_server_and_forks_only_pdls_engine(cluster):
    c, parent = cluster
    listening = [conn for conn in psutil.Process(parent.pid).net_connections(kind="all")
                 if conn.status == psutil.CONN_LISTEN or conn.laddr]
    assert listening == [], f"the warm parent can be reached from outside: {listening}"
    assert "only PDL's engine" in refusal([sys.executable, "-c", "import os; os.system('id')"])
    assert "only PDL's engine" in refusal(["/bin/sh", "-c", "id"])
    assert refusal([*ENGINE_COMMAND, "--cluster-id=x"]) is None
    with open(os.devnull, "rb") as stdin, open(os.devnull, "wb") as out:
        assert parent.fork(["/bin/sh", "-c", "id"], {}, "/", stdin.fileno(), out.fileno()) is None
        # a refused stranger's command does not spoil the parent for PDL's engines
    clusters.start_slot_engines(c, POOL[:1], POOL)
    (engine,) = engines_report(c, 1)
    assert engine["parent"] == parent.pid


def test_ending_one_clusters_warm_parent_leaves_another_clusters_engines_running(cluster, tmp_path):
    """Each cluster has its own warm parent: a kernel that closes one of its sessions must
    not take the engines of another with it (they die with their parent)."""
    c, parent = cluster
    clusters.start_slot_engines(c, POOL[:1], POOL)
    (engine,) = engines_report(c, 1)
    other = clusters.new_cluster(cluster_id=f"other{os.getpid()}", profile_dir=str(tmp_path / "other"))
    other_parent = warm_engines.warm_up(other)
    assert other_parent.pid != parent.pid
    warm_engines.stop_warm_parent(other)
    assert not pid_alive(other_parent.pid)
    assert pid_alive(engine["pid"]) and warm_engines.warm_parent(c.profile_dir, c.cluster_id) is parent


def test_engines_forked_while_the_controller_is_stalled_register_once_it_answers(cluster, tmp_path):
    """A forked engine asks to register at once, while the controller may still be busy
    starting on a loaded machine: it waits for the answer (ipyparallel's own 5 s made it
    exit unregistered, and a cell found one engine of two)."""
    c, _parent = cluster
    security = tmp_path / "profile" / "security"
    wait_until(lambda: len(list(security.glob(f"ipcontroller-{c.cluster_id}-*.json"))) >= 2, 60,
               what="the controller's connection files")
    controller = psutil.Process(c.controller.process.pid)
    stalled = [controller, *controller.children(recursive=True)]
    for process in stalled:
        process.send_signal(signal.SIGSTOP)
    try:
        clusters.start_slot_engines(c, POOL, POOL)
        time.sleep(8)  # the stall: longer than ipyparallel's 5 s
    finally:
        for process in stalled:
            process.send_signal(signal.SIGCONT)
    client = c.connect_client_sync()
    try:
        client.wait_for_engines(len(POOL), timeout=clusters.ENGINE_TIMEOUT_S, interactive=False)
        assert all(clusters.engine_set_running(es) for es in c.engines.values()), "an engine exited"
        assert sorted(info["slot"] for info in client[:].apply_sync(inside_the_engine)) == POOL
    finally:
        client.close()
