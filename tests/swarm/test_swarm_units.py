"""Swarm spawner logic that needs no Docker: GPU counting, messages, ports, state,
connection files, and the engine's GPU-to-slot mapping (pure functions)."""

from __future__ import annotations

import random
from importlib.metadata import entry_points

import pytest
from tornado import web

from pdl.connection import PORTS_NEEDED, ClusterKeys, controller_files, engine_file
from pdl_spawner.swarm.engine_boot import gpu_slot_env
from pdl_spawner.core import form
from pdl_spawner.swarm.gpus import OTHER_SERVICES, Promise, gpu_types, gpu_usage
from pdl_spawner.swarm.state import (
    SwarmServer, network_address, node_address, pick_ports, starved_tasks, task_error, used_ports,
)

pytestmark = pytest.mark.unit

GPU = "NVIDIA-GPU"
KEYS = ClusterKeys(curve_publickey="P" * 40, curve_secretkey="S" * 40, session_key="k" * 64)
PORTS = list(range(30001, 30001 + PORTS_NEEDED))


def node(name, gpus=("GPU-a",), state="ready", availability="active", addr="10.77.0.11"):
    return {
        "ID": name, "Status": {"State": state, "Addr": addr}, "Spec": {"Availability": availability},
        "Description": {"Hostname": name, "Resources": {"GenericResources": [
            {"NamedResourceSpec": {"Kind": GPU, "Value": g}} for g in gpus]}},
    }


def service(sid, user=None, owner=None, role="engine", ports=None, gpus=None):
    labels = {}
    if user:
        labels = {"pdl.user": user, "pdl.owner": owner or user, "pdl.role": role}
    if ports:
        labels["pdl.ports"] = ",".join(map(str, ports))
    spec = {"Labels": labels}
    if gpus:
        spec["TaskTemplate"] = {"Resources": {"Reservations": {"GenericResources": [
            {"DiscreteResourceSpec": {"Kind": GPU, "Value": gpus}}]}}}
    return {"ID": sid, "Spec": spec}


def task(sid, state="running", desired="running", gpus=1, err=None):
    reservations = {"GenericResources": [{"DiscreteResourceSpec": {"Kind": GPU, "Value": gpus}}]} if gpus else {}
    status = {"State": state, **({"Err": err} if err else {})}
    return {"ServiceID": sid, "DesiredState": desired, "Status": status,
            "Spec": {"Resources": {"Reservations": reservations}}}


def test_gpu_usage_counts_ready_nodes_and_active_tasks():
    nodes = [node("n1"), node("n2", gpus=("GPU-b", "GPU-c")), node("n3", state="down"),
             node("n4", availability="drain"),
             {**node("n5", gpus=()), "Description": {"Resources": {"GenericResources": [
                 {"DiscreteResourceSpec": {"Kind": GPU, "Value": 2}}]}}}]
    services = [service("a1", "alice"), service("a2", "alice"), service("b1", "bob"), service("x", None)]
    tasks = [
        task("a1"), task("a2", state="pending", err="no suitable node (insufficient resources on 3 nodes)"),
        task("b1", state="starting"), task("x"),
        task("b1", state="failed", desired="shutdown"),     # an old, failed task of bob's
        task("a1", state="shutdown", desired="shutdown"),   # stopped: not counted
        task("x", gpus=0),                                    # reserves no GPU
    ]
    usage = gpu_usage(nodes, services, tasks, GPU)
    assert usage.total == 5
    assert usage.holders == {"alice": 2, "bob": 1, OTHER_SERVICES: 1}
    assert usage.free == 1
    # a server's own tasks are not counted against itself; promised GPUs are
    again = gpu_usage(nodes, services, tasks, GPU, exclude_owner="alice", promised={"carol": Promise("carol", 1)})
    assert again.holders == {"bob": 1, OTHER_SERVICES: 1, "carol": 1} and again.free == 2
    # a task being stopped holds its GPU until it has stopped, as Swarm counts it
    stopping = gpu_usage(nodes, services, [*tasks, task("a1", state="running", desired="shutdown")], GPU)
    assert stopping.holders == {"alice": 3, "bob": 1, OTHER_SERVICES: 1} and stopping.free == 0


def test_an_engine_service_between_a_dead_task_and_its_replacement_keeps_its_gpu():
    nodes = [node("n1"), node("n2"), node("n3")]
    services = [service("a1", "alice", gpus=1), service("a2", "alice", gpus=1), service("b1", "bob", gpus=1)]
    tasks = [task("a1"), task("b1"),
             task("a2", state="failed", desired="shutdown")]  # killed; Swarm restarts it after a delay
    usage = gpu_usage(nodes, services, tasks, GPU)
    assert usage.holders == {"alice": 2, "bob": 1} and usage.free == 0
    # two replicas of another service hold two GPUs; a removed PDL service holds none once stopped
    other = gpu_usage(nodes + [node("n4")], [service("x")],
                      [task("x"), task("x"), task("a1", state="shutdown", desired="shutdown")], GPU)
    assert other.holders == {OTHER_SERVICES: 2} and other.free == 2
    # a spawn in progress counts once: by its promise, not also by the services it created
    starting = gpu_usage(nodes, [service("c1", "carol", gpus=1)], [], GPU, promised={"carol": Promise("carol", 1)})
    assert starting.holders == {"carol": 1} and starting.free == 2


def typed_node(name, gpu_type, gpus=("GPU-a",), **kw):
    found = node(name, gpus=gpus, **kw)
    found["Spec"]["Labels"] = {"pdl.gpu-type": gpu_type} if gpu_type else {}
    return found


def placed_task(sid, node_id, gpu):
    """A running task of ``sid`` that Swarm placed on ``node_id`` with GPU ``gpu``."""
    return {**task(sid), "NodeID": node_id, "GenericResources": [{"NamedResourceSpec": {"Kind": GPU, "Value": gpu}}]}


def test_gpus_count_per_type_of_their_nodes_and_untyped_claims_count_for_every_type():
    nodes = [typed_node("n1", "a100", gpus=("GPU-1", "GPU-2")), typed_node("n2", "a100", gpus=("GPU-3",)),
             typed_node("n3", "t4", gpus=("GPU-4",)), typed_node("n4", "", gpus=("GPU-5",)),
             typed_node("n5", "v100", gpus=("GPU-6",), availability="drain")]
    typed_service = service("b1", "bob", gpus=1)
    typed_service["Spec"]["Labels"]["pdl.gpu-type"] = "t4"
    services = [service("a1", "alice"), typed_service, service("c1", "carol")]
    placed = placed_task("a1", "n1", "GPU-1")
    tasks = [placed, task("b1", state="pending"), task("c1", state="pending")]
    promised = {"dave": Promise("dave", 1, "a100")}

    assert gpu_types(nodes, GPU) == ["a100", "t4", "v100"]  # a drained node's type stays offered
    any_type = gpu_usage(nodes, services, tasks, GPU, promised=promised)
    assert any_type.total == 5 and any_type.holders == {"alice": 1, "bob": 1, "carol": 1, "dave": 1}
    # a100: alice's GPU on n1, dave's promise, and carol's untyped task that Swarm may place there
    a100 = gpu_usage(nodes, services, tasks, GPU, promised=promised, gpu_type="a100")
    assert a100.total == 3 and a100.holders == {"alice": 1, "carol": 1, "dave": 1} and a100.free == 0
    t4 = gpu_usage(nodes, services, tasks, GPU, promised=promised, gpu_type="t4")
    assert t4.total == 1 and t4.holders == {"bob": 1, "carol": 1} and t4.free == 0
    v100 = gpu_usage(nodes, services, tasks, GPU, promised=promised, gpu_type="v100")
    assert v100.total == 0 and v100.free == 0
    # once bob's task runs on n3 it holds a t4 and nothing of a100; an untyped promise counts everywhere
    tasks[1] = placed_task("b1", "n3", "GPU-4")
    a100 = gpu_usage(nodes, services, tasks, GPU, promised={"erin": Promise("erin", 1)}, gpu_type="a100")
    assert a100.holders == {"alice": 1, "carol": 1, "erin": 1}


def test_named_servers_count_for_their_user():
    services = [service("s1", "alice", owner="alice/big")]
    usage = gpu_usage([node("n1", gpus=("a", "b"))], services, [task("s1")], GPU, exclude_owner="alice")
    assert usage.holders == {"alice": 1}


def test_not_enough_message_is_one_line_and_names_holders_only_to_admins():
    usage = gpu_usage([node("n1"), node("n2"), node("n3")], [service("a", "alice")], [task("a", gpus=1)] * 2, GPU)
    user = form.not_enough_message(3, usage.free, usage.total, usage.holders, show_names=False, unit="GPUs")
    admin = form.not_enough_message(3, usage.free, usage.total, usage.holders, show_names=True, unit="GPUs")
    assert user == ("Not enough free GPUs: you asked for 3, 1 of 3 are free (2 held by other users). "
                    "Ask for at most 1, or try again when one frees up.")
    assert "alice (2)" in admin and "\n" not in admin


def test_starved_tasks_and_errors():
    starved = task("a", state="pending", err="no suitable node (insufficient resources on 3 nodes)")
    assert starved_tasks([starved, task("b", state="pending"), task("c")]) == [starved]
    assert task_error(task("a", state="rejected", err="No such image: pdl-notebook:test")) == \
        "rejected: No such image: pdl-notebook:test"


def test_ports_avoid_those_other_notebooks_bind():
    used = used_ports([service("n1", "bob", role="notebook", ports=[20000, 20002]), service("x")])
    assert used == {20000, 20002}
    picked = pick_ports(3, used, 20000, 20004, random.Random(1))
    assert sorted(picked) == [20001, 20003, 20004]
    with pytest.raises(ValueError, match="only 3 ports left"):
        pick_ports(4, used, 20000, 20004)


def test_node_address_of_a_manager_reporting_0000():
    assert node_address(node("n1", addr="10.77.0.12")) == "10.77.0.12"
    manager = {**node("n1", addr="0.0.0.0"), "ManagerStatus": {"Addr": "10.77.0.11:2377"}}
    assert node_address(manager) == "10.77.0.11"
    with pytest.raises(ValueError):
        node_address(node("n1", addr=""))


def test_the_controller_address_is_the_notebook_task_s_own_on_its_private_network():
    task = {"ID": "t1", "NetworksAttachments": [
        {"Network": {"Spec": {"Name": "pdl-private-0"}}, "Addresses": ["10.201.3.7/24"]},
        {"Network": {"Spec": {"Name": "pdl-private-1"}}, "Addresses": ["10.201.4.9/24"]},
    ]}
    assert network_address(task, "pdl-private-1") == "10.201.4.9"
    with pytest.raises(ValueError, match="no address on network pdl-private-2"):
        network_address(task, "pdl-private-2")


def test_state_round_trip_keeps_what_a_restarted_hub_needs():
    server = SwarmServer(workers=3, port=20001, controller_ports=PORTS, node_addr="10.77.0.12", keys=KEYS,
                         engine_services=["e0", "e1", "e2"], secrets=["s0", "s1"], network="pdl-private-2")
    state = server.to_state()
    import json

    assert json.loads(json.dumps(state)) == state  # JupyterHub stores it as JSON
    assert SwarmServer.from_state(state) == server
    assert SwarmServer.from_state(None) == SwarmServer()
    # the state a hub of 0.1.0 saved (the count under "gpus") reads the same after an upgrade
    older = {k: v for k, v in state.items() if k != "workers"} | {"gpus": 3}
    assert SwarmServer.from_state(older) == server
    assert "keys" not in SwarmServer().to_state()


def test_connection_files_give_engines_the_node_address_and_the_controller_every_interface():
    files = controller_files(KEYS, PORTS)
    eng = engine_file(KEYS, PORTS, "10.77.0.12")
    assert files["engine"]["interface"] == files["client"]["interface"] == "tcp://0.0.0.0"
    assert files["client"]["location"] == ""
    assert eng == {
        "interface": "tcp://10.77.0.12", "location": "10.77.0.12",
        "registration": 30001, "control": 30002, "mux": 30003, "task": 30004, "iopub": 30005,
        "hb_ping": 30006, "hb_pong": 30007, "broadcast": [30008, 30009],
        "key": "k" * 64, "curve_serverkey": "P" * 40,
        "pack": "json", "unpack": "json", "signature_scheme": "hmac-sha256", "ssh": "",
    }
    assert {k: v for k, v in files["engine"].items() if k not in ("interface", "location")} == \
        {k: v for k, v in eng.items() if k not in ("interface", "location")}
    client_ports = [files["client"][k] for k in ("control", "mux", "task", "iopub", "notification", "broadcast")]
    assert client_ports == list(range(30010, 30016)) and files["client"]["registration"] == 30001
    with pytest.raises(ValueError, match="distinct ports"):
        engine_file(KEYS, [1] * PORTS_NEEDED, "10.77.0.12")


def test_generated_keys_are_fresh_curve_keypairs():
    import zmq

    a, b = ClusterKeys.generate(), ClusterKeys.generate()
    assert a != b and len(a.curve_publickey) == len(a.curve_secretkey) == 40 and len(a.session_key) == 64
    assert zmq.curve_public(a.curve_secretkey.encode()) == a.curve_publickey.encode()


@pytest.mark.parametrize("assigned, slot, visible", [
    ("GPU-8f2c1e7a-0000-1111-2222-333344445555", "gpu:0", "GPU-8f2c1e7a-0000-1111-2222-333344445555"),
    ("GPU-fake-2", "gpu:0", "GPU-fake-2"),
    ("3", "gpu:3", "3"),
    (None, "cpu:0", ""),
])
def test_engine_sees_only_the_gpu_swarm_assigned(assigned, slot, visible):
    env = gpu_slot_env(assigned, n_cpus=8)
    assert env["PDL_SLOT"] == slot and env["CUDA_VISIBLE_DEVICES"] == visible
    assert env["PDL_GPU"] == (assigned or "") and env["PDL_CPUS"] == "0,1,2,3,4,5,6,7"


def test_swarm_spawner_is_registered_and_documents_its_config():
    from pdl_spawner.swarm.spawner import PDLSwarmSpawner

    assert entry_points(group="jupyterhub.spawners")["pdl-swarm"].load() is PDLSwarmSpawner
    own = ["default_workers", "max_workers", "default_gpus", "max_gpus", "engine_image", "gpu_resource", "run_as",
           "container_home", "port_range", "starved_timeout"]
    traits = PDLSwarmSpawner.class_traits(config=True)
    for name in own:
        assert traits[name].help.strip(), f"{name} has no help text"


def test_the_worker_limits_have_one_name_and_the_gpu_names_still_set_them(tmp_path):
    """``max_workers``/``default_workers`` on both spawners; Swarm's older ``max_gpus`` and
    ``default_gpus`` set them (a config written for 0.1.0 keeps working)."""
    from types import SimpleNamespace

    from pdl_spawner.swarm.spawner import PDLSwarmSpawner

    user = SimpleNamespace(name="alice", admin=False, url="/user/alice/")
    older = PDLSwarmSpawner(user=user, max_gpus=2, default_gpus=2, state_db=str(tmp_path / "s.sqlite"))
    assert (older.max_workers, older.default_workers, older.workers_limit) == (2, 2, 2)
    spawner = PDLSwarmSpawner(user=user, max_workers=3, state_db=str(tmp_path / "s.sqlite"))
    spawner.user_options = {"workers": 4}
    with pytest.raises(web.HTTPError) as e:
        spawner.requested_workers()
    assert e.value.status_code == 400 and "from 1 to 3, got 4" in e.value.log_message


def test_the_swarm_spawner_takes_the_queue_option_from_the_api_and_the_form(tmp_path):
    from types import SimpleNamespace

    from pdl_spawner.swarm.spawner import PDLSwarmSpawner

    spawner = PDLSwarmSpawner(user=SimpleNamespace(name="alice", admin=False, url="/user/alice/"),
                              state_db=str(tmp_path / "swarm.sqlite"))
    spawner.user_options = {"workers": 2, "queue": True}
    assert spawner.requested_workers() == 2 and spawner.wants_queue
    assert spawner.options_from_form({"workers": ["1"], "queue": ["on"]}) == {"workers": 1, "queue": True}
    assert spawner.options_from_form({"workers": ["1"]}) == {"workers": 1}


def test_a_swarm_engine_keeps_the_thread_counts_the_admin_set():
    from pdl_spawner.swarm.engine_boot import admin_threads

    assert admin_threads({"OMP_NUM_THREADS": "1", "PATH": "/bin"}) == {"OMP_NUM_THREADS": "1"}
    assert admin_threads({"OMP_NUM_THREADS": ""}) == {}


def test_a_swarm_engines_environment_is_read_back_through_the_engine_contract():
    from pdl.engine_contract import EngineContract

    contract = EngineContract.from_env(gpu_slot_env("GPU-8f2c", n_cpus=2))
    assert (contract.slot, contract.gpu, contract.cpus) == ("gpu:0", "GPU-8f2c", (0, 1))
    assert EngineContract.from_env(gpu_slot_env("", n_cpus=2)).gpu == ""
