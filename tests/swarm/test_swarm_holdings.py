"""Who holds which GPU of a swarm (pdl_spawner/swarm/gpus.py) and the admin view's
Swarm source (pdl_spawner/swarm/admin_source.py): pure functions over Engine API objects shaped
as docker-py's ``APIClient`` returns them; no Docker, no hub."""

from __future__ import annotations

import pytest

from pdl_spawner.admin.view import reader, render_page
from pdl_spawner.local.admin_source import read_status
from pdl_spawner.swarm import admin_source as swarm_source
from pdl_spawner.swarm.admin_source import read_swarm_status, swarm_status_model
from pdl_spawner.core.reservations import Reclaim, SlotLedger
from pdl_spawner.swarm.gpus import (
    OTHER_SERVICES, PENDING, GpuHolding, SwarmSnapshot, gpu_holdings, gpu_pool, gpu_usage, gpus_in_use,
    parse_timestamp, swarm_snapshot,
)
from pdl_spawner.core.wait_queue import Waiter, WaitQueue
from swarm_doubles import FakeSwarm

pytestmark = pytest.mark.unit

GPU = "NVIDIA-GPU"
SCRIPT = "<script>alert(1)</script>"
T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
TS0 = "2023-11-14T22:13:20.123456789Z"


def node(host, gpus=(), state="ready", availability="active", role="worker", extra=()):
    """A node as ``APIClient.nodes()`` lists it, declaring named GPUs ``gpus``."""
    return {
        "ID": f"id-{host}", "Version": {"Index": 9},
        "Spec": {"Labels": {}, "Role": role, "Availability": availability},
        "Description": {
            "Hostname": host, "Platform": {"Architecture": "x86_64", "OS": "linux"},
            "Resources": {"NanoCPUs": 2_000_000_000, "MemoryBytes": 4 << 30, "GenericResources": [
                *({"NamedResourceSpec": {"Kind": GPU, "Value": g}} for g in gpus), *extra]},
        },
        "Status": {"State": state, "Addr": "10.77.0.11"},
    }


def engine_service(sid, owner, role="engine"):
    """A PDL service as ``APIClient.services()`` lists it (labels on ``Spec.Labels``)."""
    user, _, server = owner.partition("/")
    return {
        "ID": sid, "Version": {"Index": 20},
        "Spec": {
            "Name": f"pdl-{role}-{sid}",
            "Labels": {"pdl.owner": owner, "pdl.user": user, "pdl.server": server, "pdl.role": role},
            "TaskTemplate": {"ContainerSpec": {"Image": "pdl-notebook:test"},
                             "Resources": {"Reservations": {"GenericResources": [
                                 {"DiscreteResourceSpec": {"Kind": GPU, "Value": 1}}]}}},
        },
    }


def task(tid, sid, node_host=None, gpu=None, state="running", desired="running", ts=TS0, key="GenericResources"):
    """A task as ``APIClient.tasks()`` lists it; ``gpu``: the named GPU Swarm assigned."""
    t = {
        "ID": tid, "ServiceID": sid, "Slot": 1, "DesiredState": desired,
        "CreatedAt": "2023-11-14T22:00:00.5Z", "UpdatedAt": "2023-11-14T22:13:21.9Z",
        "Spec": {"ContainerSpec": {"Image": "pdl-notebook:test"},
                 "Resources": {"Reservations": {"GenericResources": [
                     {"DiscreteResourceSpec": {"Kind": GPU, "Value": 1}}]}}},
        "Status": {"Timestamp": ts, "State": state, "Message": state},
    }
    if node_host:
        t["NodeID"] = f"id-{node_host}"
    if gpu:
        t[key] = [{"NamedResourceSpec": {"Kind": GPU, "Value": gpu}}]
    return t


# -- swarm_gpus ---------------------------------------------------------------------


def test_timestamps_parse_to_epoch_seconds_to_the_nanosecond_and_bad_ones_to_none():
    assert parse_timestamp(TS0) == pytest.approx(T0 + 0.123456789, abs=1e-6)
    assert parse_timestamp("2023-11-14T22:13:20Z") == T0
    assert parse_timestamp("2023-11-14T23:13:20.5+01:00") == T0 + 0.5
    assert parse_timestamp("2023-11-14T21:13:20-01:00") == T0
    for bad in (None, "", "0001-01-01T00:00:00Z", "yesterday", "2023-11-14 22:13", "2023-13-40T22:13:20Z"):
        assert parse_timestamp(bad) is None, bad


def test_a_running_engine_task_holds_its_named_gpu_on_its_node_since_its_timestamp():
    nodes = [node("pdl-node1", ["GPU-fake-1"]), node("pdl-node2", ["GPU-fake-2"])]
    holdings = gpu_holdings(nodes, [engine_service("s1", "alice/big")],
                            [task("t1", "s1", "pdl-node2", "GPU-fake-2")], GPU)
    assert holdings == [GpuHolding("GPU-fake-2", "pdl-node2", "alice/big", "alice", pytest.approx(T0 + 0.123456789))]


def test_assigned_gpus_are_read_under_either_api_name_and_only_of_the_resource_kind():
    services = [engine_service("s1", "alice"), engine_service("s2", "bob")]
    other_kind = task("t3", "s2", "pdl-node1")
    other_kind["GenericResources"] = [{"NamedResourceSpec": {"Kind": "SSD", "Value": "ssd-1"}},
                                      {"DiscreteResourceSpec": {"Kind": GPU, "Value": 1}}]
    tasks = [task("t1", "s1", "pdl-node1", "GPU-a", key="AssignedGenericResources"), other_kind]
    assert [(h.gpu, h.user) for h in gpu_holdings([node("pdl-node1", ["GPU-a"])], services, tasks, GPU)] == \
        [("GPU-a", "alice"), (f"{GPU} (1)", "bob")]


def test_stopped_tasks_and_services_that_are_not_pdl_engines_hold_no_gpu_of_theirs():
    nodes = [node("pdl-node1", ["GPU-fake-1"])]
    services = [engine_service("s1", "alice"), engine_service("nb", "alice", role="notebook"),
                {"ID": "x", "Spec": {"Name": "someone-elses", "Labels": {"team": "vision"}}}]
    tasks = [
        task("t1", "s1", "pdl-node1", "GPU-fake-1", state="shutdown", desired="shutdown"),
        task("t2", "s1", "pdl-node1", "GPU-fake-1", state="failed", desired="shutdown"),
        task("t3", "s1", "pdl-node1", "GPU-fake-1", state="complete"),
        task("t4", "s1", "pdl-node1", "GPU-fake-1", state="running", desired="shutdown"),  # being stopped
        task("t5", "nb", "pdl-node1", "GPU-fake-1"),
        task("t6", "x", "pdl-node1", "GPU-fake-1"),
        task("t7", "gone", "pdl-node1", "GPU-fake-1"),  # its service was removed
    ]
    # the stopped tasks hold no GPU of their own; the engine service that Swarm will start a
    # new task for still holds one for its user (pending), as the spawner counts it ...
    stopped = tasks[:3] + tasks[4:]
    assert [(h.gpu, h.node, h.owner) for h in gpu_holdings(nodes, services, stopped, GPU)] == [(PENDING, "", "alice")]
    # ... and nothing once it is scaled to 0 (its engines released for idleness)
    services[0]["Spec"]["Mode"] = {"Replicated": {"Replicas": 0}}
    assert gpu_holdings(nodes, services, stopped, GPU) == []
    # the GPU other services' running tasks hold is in use all the same; stopped ones free theirs
    assert gpus_in_use(nodes, tasks, GPU) == [("pdl-node1", "GPU-fake-1")]
    assert gpus_in_use(nodes, tasks[:3], GPU) == []


def test_a_task_being_stopped_holds_its_gpu_until_it_has_stopped_as_swarm_counts_it():
    """The race (issue 44's side-by-side runs, tests/swarm/test_swarm_reclaim.py): alice's
    idle engines were scaled to 0 and their GPUs counted free at once, while their
    containers still stopped; bob, first in the queue, got a spawn whose engines Swarm
    could not place ("insufficient resources") and was refused with "3 of 3 are free"."""
    nodes = [node("pdl-node1", ["GPU-fake-1"])]
    services = [engine_service("s1", "alice")]
    services[0]["Spec"]["Mode"] = {"Replicated": {"Replicas": 0}}  # released for idleness
    stopping = [task("t1", "s1", "pdl-node1", "GPU-fake-1", state="running", desired="shutdown")]
    assert [(h.gpu, h.node, h.owner) for h in gpu_holdings(nodes, services, stopping, GPU)] == [
        ("GPU-fake-1", "pdl-node1", "alice")]
    assert gpu_usage(nodes, services, stopping, GPU).free == 0
    assert gpus_in_use(nodes, stopping, GPU) == [("pdl-node1", "GPU-fake-1")]
    stopped = [task("t1", "s1", "pdl-node1", "GPU-fake-1", state="shutdown", desired="shutdown")]
    assert gpu_holdings(nodes, services, stopped, GPU) == [] and gpu_usage(nodes, services, stopped, GPU).free == 1
    # a task never placed holds nothing once it is not meant to run
    unplaced = [task("t2", "s1", state="pending", desired="shutdown")]
    assert gpu_holdings(nodes, services, unplaced, GPU) == []


def test_a_pending_task_holds_a_pending_gpu_on_no_node_listed_after_the_placed_ones():
    nodes = [node("pdl-node1", ["GPU-fake-1"]), node("pdl-node2", ["GPU-fake-2"])]
    services = [engine_service("s1", "alice"), engine_service("s2", "bob/x")]
    pending = task("t9", "s2", state="pending", ts="2023-11-14T22:14:00Z")
    pending["Status"]["Err"] = "no suitable node (insufficient resources on 2 nodes)"
    tasks = [pending, task("t2", "s1", "pdl-node2", "GPU-fake-2"), task("t1", "s1", "pdl-node1", "GPU-fake-1")]
    holdings = gpu_holdings(nodes, services, tasks, GPU)
    assert [(h.node, h.gpu, h.owner) for h in holdings] == [
        ("pdl-node1", "GPU-fake-1", "alice"), ("pdl-node2", "GPU-fake-2", "alice"), ("", PENDING, "bob/x")]
    assert holdings[-1].since == T0 + 40
    assert ("", PENDING) not in gpus_in_use(nodes, tasks, GPU)


def test_holdings_sort_by_node_then_gpu_with_numbers_by_value():
    nodes = [node("pdl-node10", ["GPU-2"]), node("pdl-node2", [f"GPU-{i}" for i in (10, 2, 1)])]
    tasks = [task("a", "s", "pdl-node10", "GPU-2")]
    tasks += [task(g, "s", "pdl-node2", g) for g in ("GPU-10", "GPU-2", "GPU-1")]
    holdings = gpu_holdings(nodes, [engine_service("s", "alice")], tasks, GPU)
    assert [(h.node, h.gpu) for h in holdings] == [
        ("pdl-node2", "GPU-1"), ("pdl-node2", "GPU-2"), ("pdl-node2", "GPU-10"), ("pdl-node10", "GPU-2")]


def test_nodes_that_are_down_paused_or_drained_offer_nothing_to_the_pool():
    nodes = [
        node("pdl-node1", ["GPU-fake-1"], extra=[{"DiscreteResourceSpec": {"Kind": GPU, "Value": 2}},
                                                 {"NamedResourceSpec": {"Kind": "SSD", "Value": "ssd-1"}}]),
        node("pdl-node2", ["GPU-fake-2"], state="down"),
        node("pdl-node3", ["GPU-fake-3"], availability="drain"),
        node("pdl-node4", ["GPU-fake-4"], availability="pause"),
        node("pdl-node5", ["GPU-fake-5b", "GPU-fake-5a"], role="manager"),
    ]
    assert gpu_pool(nodes, GPU) == [("pdl-node1", "GPU-fake-1"), ("pdl-node5", "GPU-fake-5a"),
                                    ("pdl-node5", "GPU-fake-5b")]


def test_the_snapshot_pools_only_pdls_nodes_and_names_the_unavailable_ones():
    nodes = [node("pdl-node1", ["GPU-fake-1"]), node("pdl-node2", ["GPU-fake-2"], availability="drain"),
             node("gpu-shared", ["GPU-s"])]
    services = [engine_service("s1", "alice")]
    tasks = [task("t1", "s1", "pdl-node1", "GPU-fake-1"), task("t2", "other", "gpu-shared", "GPU-s")]
    snap = swarm_snapshot(nodes, services, tasks, GPU, ["pdl-node2", "pdl-node1", "pdl-node9"])
    assert snap.nodes == ["pdl-node2", "pdl-node1", "pdl-node9"]
    assert snap.unavailable == ["pdl-node2", "pdl-node9"]
    assert snap.pool == [("pdl-node1", "GPU-fake-1")]
    assert [(h.node, h.gpu) for h in snap.holdings] == [("pdl-node1", "GPU-fake-1")]
    everything = swarm_snapshot(nodes, services, tasks, GPU, [])
    assert everything.nodes == ["gpu-shared", "pdl-node1", "pdl-node2"] and everything.unavailable == ["pdl-node2"]
    assert everything.pool == [("gpu-shared", "GPU-s"), ("pdl-node1", "GPU-fake-1")]


def test_the_free_count_and_the_admin_view_read_the_same_holders():
    """One definition of held: the spawn form's count (gpu_usage) is the admin view's
    holdings (gpu_holdings) per user, plus what other services' tasks reserve."""
    nodes = [node("pdl-node1", ["GPU-fake-1", "GPU-fake-2"]), node("pdl-node2", ["GPU-fake-3", "GPU-fake-4"])]
    services = [engine_service("s1", "alice/big"), engine_service("s2", "bob"), engine_service("s3", "carol")]
    tasks = [task("t1", "s1", "pdl-node1", "GPU-fake-1"),
             task("t2", "s2", "pdl-node2", "GPU-fake-3", state="failed", desired="shutdown"),  # restarting
             task("t3", "other", "pdl-node2", "GPU-fake-4")]
    holdings = gpu_holdings(nodes, services, tasks, GPU)
    per_user = {}
    for h in holdings:
        per_user[h.user] = per_user.get(h.user, 0) + 1
    assert per_user == {"alice": 1, "bob": 1, "carol": 1}
    usage = gpu_usage(nodes, services, tasks, GPU)
    assert usage.holders == {**per_user, OTHER_SERVICES: 1} and usage.total == 4 and usage.free == 0


def test_the_fake_swarms_placed_engine_reads_as_a_holding_of_its_gpu():
    fake = FakeSwarm(gpus_per_node=(1, 1))
    labels = engine_service("-", "carol")["Spec"]["Labels"]
    template = {"ContainerSpec": {"Image": "pdl-notebook:test", "Secrets": []},
                "Resources": {"Reservations": {"GenericResources": [
                    {"DiscreteResourceSpec": {"Kind": GPU, "Value": 1}}]}}}
    fake.create_service(template, name="pdl-engine-carol-0", labels=labels)
    nodes, tasks = fake.nodes(), fake.tasks()
    (holding,) = gpu_holdings(nodes, fake.services(filters={"label": ["pdl.role=engine"]}), tasks, GPU)
    placed = {n["ID"]: n["Description"]["Hostname"] for n in nodes}[tasks[0]["NodeID"]]
    assert (holding.node, holding.gpu, holding.owner) == (placed, f"GPU-fake-{placed[-1]}-0", "carol")


# -- the admin view's Swarm source ----------------------------------------------------


def snapshot(owner="alice", host="pdl-node1", gpu="GPU-fake-1"):
    return SwarmSnapshot(
        nodes=[host, "pdl-node2", "pdl-node3"], unavailable=["pdl-node3"],
        pool=[(host, gpu), ("pdl-node2", "GPU-fake-2"), ("pdl-node2", "GPU-fake-3")],
        in_use=[(host, gpu), ("pdl-node2", "GPU-fake-3"), ("elsewhere", "GPU-x")],
        holdings=[GpuHolding(gpu, host, owner, owner.partition("/")[0], T0 - 90),
                  GpuHolding(PENDING, "", "bob/x", "bob", T0, "t4")],
    )


def test_the_swarm_status_names_gpus_by_node_and_counts_other_services_not_free():
    status = swarm_status_model(snapshot("alice/big"), [Waiter("carol", "carol", 1, T0 + 5)],
                                [Reclaim("dave", ["pdl-node2/GPU-fake-2"], T0, "engines idle for 600 s")], now=T0 + 65)
    assert status == {
        "source": "swarm", "nodes": ["pdl-node1", "pdl-node2", "pdl-node3"], "unavailable": ["pdl-node3"], "now": "2023-11-14T22:14:25Z",
        "pool": ["pdl-node1/GPU-fake-1", "pdl-node2/GPU-fake-2", "pdl-node2/GPU-fake-3"],
        "free": ["pdl-node2/GPU-fake-2"], "other_services": ["pdl-node2/GPU-fake-3"],
        "reservations": [
            {"slot": "GPU-fake-1", "node": "pdl-node1", "owner": "alice/big", "user": "alice", "server": "big",
             "since": "2023-11-14T22:11:50Z", "held_s": 155, "gpu_type": ""},
            {"slot": PENDING, "node": "", "owner": "bob/x", "user": "bob", "server": "x",
             "since": "2023-11-14T22:13:20Z", "held_s": 65, "gpu_type": "t4"},
        ],
        "queue": [{"position": 1, "owner": "carol", "user": "carol", "server": "", "workers": 1, "gpu_type": "",
                   "since": "2023-11-14T22:13:25Z", "waiting_s": 60}],
        "reclaims": [{"at": "2023-11-14T22:13:20Z", "owner": "dave", "user": "dave",
                      "slots": ["pdl-node2/GPU-fake-2"], "reason": "engines idle for 600 s"}],
        "gpu_idle": [],
        "error": None,
    }


def test_gpus_held_idle_are_listed_for_owners_whose_engines_hold_gpus():
    flags = {"alice/big": T0 - 600, "zed": T0 - 60}  # zed's engines hold nothing (released, stopped)
    status = swarm_status_model(snapshot("alice/big"), [], [], now=T0, gpu_idle=flags)
    assert status["gpu_idle"] == [{"owner": "alice/big", "user": "alice", "server": "big",
                                   "since": "2023-11-14T22:03:20Z", "idle_s": 600}]
    assert "GPUs held idle (0 % use)" in render_page(status) and "alice/big" in render_page(status)


def test_the_swarm_page_summarises_the_nodes_and_escapes_every_value():
    snap = snapshot(f"a{SCRIPT}", host=f"h{SCRIPT}", gpu=f"g{SCRIPT}")
    page = render_page(swarm_status_model(snap, [Waiter(f"w{SCRIPT}", "w", 1, T0)],
                                          [Reclaim("dave", [f"pdl-node2/{SCRIPT}"], T0, f"idle {SCRIPT}")], now=T0))
    assert "<script" not in page
    # the host in the summary and its row; the gpu, owner, waiter, reclaimed slot and reason
    assert page.count("&lt;script&gt;") == 7
    assert ("Nodes h&lt;script&gt;alert(1)&lt;/script&gt;, pdl-node2, pdl-node3: 1 of 3 GPU(s) free, "
            "1 held by other services; not available: pdl-node3.") in page
    assert "<th>GPU</th><th>Node</th>" in page and "<th>GPUs</th>" in page
    assert f"<td>{PENDING} (t4)</td><td></td><td>bob/x</td>" in page  # the type it asked for
    assert "pdl-node2/&lt;script&gt;alert(1)&lt;/script&gt;" in page and "Docker could not be read" not in page


def test_the_swarm_page_says_when_nothing_is_held_and_when_docker_cannot_be_read():
    empty = render_page(swarm_status_model(SwarmSnapshot(nodes=["pdl-node1"], pool=[("pdl-node1", "G")]), [], [],
                                           now=T0))
    assert "Node pdl-node1: 1 of 1 GPU(s) free." in empty
    assert "No GPU is held." in empty and "No GPU was reclaimed." in empty and "Nobody is waiting." in empty
    down = swarm_status_model(SwarmSnapshot(nodes=[]), [Waiter("carol", "carol", 1, T0)], [], now=T0,
                              error=f"tcp://10.77.0.2:2375: refused {SCRIPT}")
    assert down["pool"] is None and down["free"] is None and len(down["queue"]) == 1
    page = render_page(down)
    assert "Nodes (none): GPUs unknown." in page and "<script" not in page
    assert '<p class="error">Docker could not be read: tcp://10.77.0.2:2375: refused &lt;script&gt;' in page
    assert "<td>1</td><td>carol</td>" in page


def test_the_hubs_settings_pick_the_swarm_source(tmp_path):
    db = str(tmp_path / "reservations.sqlite")
    swarm = reader({"kind": "swarm", "state_db": db, "docker_host": "tcp://10.77.0.2:2375",
                    "nodes": ["pdl-node1", "pdl-node2"], "gpu_resource": None})
    assert swarm.func is read_swarm_status and swarm.args == (db,)
    assert swarm.keywords == {"docker_host": "tcp://10.77.0.2:2375", "resource": "NVIDIA-GPU",
                              "node_names": ["pdl-node1", "pdl-node2"]}
    assert reader({"kind": "swarm", "state_db": db, "docker_host": "unix:///x.sock",
                   "gpu_resource": "AMD-GPU"}).keywords["resource"] == "AMD-GPU"
    local = reader({"kind": "local", "reservations_db": db, "pool": ["cpu:0", "cpu:1"]})
    assert local.func is read_status and local.keywords["pool"] == ["cpu:0", "cpu:1"]


def test_the_swarm_reader_takes_holdings_from_docker_and_the_queue_and_reclaims_from_the_file(tmp_path, monkeypatch):
    db = tmp_path / "reservations.sqlite"
    WaitQueue(db).join("bob", "bob", 1)
    ledger = SlotLedger(db)
    ledger.reserve("carol", 1, ["pdl-node1/GPU-fake-1"])
    ledger.reclaim("carol", "engines idle for 600 s")
    api = ([node("pdl-node1", ["GPU-fake-1"]), node("pdl-node2", ["GPU-fake-2"])], [engine_service("s1", "alice")],
           [task("t1", "s1", "pdl-node1", "GPU-fake-1")])
    monkeypatch.setattr(swarm_source, "read_swarm", lambda host: api if host == "tcp://m:2375" else None)
    status = read_swarm_status(db, docker_host="tcp://m:2375", resource=GPU, node_names=[])
    assert [(r["node"], r["slot"], r["owner"]) for r in status["reservations"]] == \
        [("pdl-node1", "GPU-fake-1", "alice")]
    assert status["free"] == ["pdl-node2/GPU-fake-2"] and status["error"] is None
    assert [q["owner"] for q in status["queue"]] == ["bob"]
    assert [(r["owner"], r["slots"]) for r in status["reclaims"]] == [("carol", ["pdl-node1/GPU-fake-1"])]


def test_an_unreachable_docker_is_reported_not_raised(tmp_path):
    pytest.importorskip("docker")
    status = read_swarm_status(tmp_path / "reservations.sqlite", docker_host=f"unix://{tmp_path}/no-docker.sock",
                               resource=GPU, node_names=["pdl-node1"])
    assert status["nodes"] == ["pdl-node1"] and status["pool"] is None and status["reservations"] == []
    assert status["error"].startswith(f"unix://{tmp_path}/no-docker.sock: ") and "\n" not in status["error"]
