"""PDLSwarmSpawner's start/stop/poll/state logic against a fake swarm (no Docker).

The spawner is the real class; only its Docker client is :class:`FakeSwarm`, behind
dockerspawner's one seam. The end-to-end test with real Swarm nodes is
tests/swarm/test_swarm_hub.py.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import shutil
import tempfile
import time
from types import SimpleNamespace

import pytest
from jupyterhub.objects import Hub, Server
from tornado import web

from pdl.connection import engine_file
from pdl_spawner.swarm.spawner import PDLSwarmSpawner
from swarm_doubles import FakeSwarm

pytestmark = pytest.mark.unit

#: The hub's queue and reclaim log of these spawners, in a folder made when the module is
#: imported (by each process that collects it) and removed when that process exits.
_STATE_DIR = tempfile.mkdtemp(prefix="pdl-swarm-units-")
atexit.register(shutil.rmtree, _STATE_DIR, True)
STATE_DB = f"{_STATE_DIR}/swarm.sqlite"


def make_spawner(swarm: FakeSwarm, name: str, gpus: int | None, admin=False, **config) -> PDLSwarmSpawner:
    cls = type("FakeSwarmSpawner", (PDLSwarmSpawner,), {"_client": swarm})
    user = SimpleNamespace(name=name, admin=admin, url=f"/user/{name}/", escaped_name=name, id=1,
                           server=None, spawners={}, settings={}, orm_user=None)
    spawner = cls(user=user, hub=Hub(ip="10.77.0.1", port=8081, base_url="/hub/"), api_token=f"token-of-{name}",
                  oauth_client_id=f"jupyterhub-user-{name}", image="pdl-notebook:test", starved_timeout=0.5,
                  environment={"CINIC10_DIR": "/data/cinic10"}, state_db=STATE_DB, **config)
    spawner.server = Server(base_url=f"/user/{name}/")
    spawner.user_options = {} if gpus is None else {"workers": gpus}
    return spawner


def run(coro):
    return asyncio.run(coro)


def services_of(swarm, user):
    return [s for s in swarm.services_.values() if s["Spec"]["Labels"].get("pdl.user") == user]


def keeper_id(swarm) -> str:
    return next(s["ID"] for s in swarm.services_.values() if s["Spec"]["Name"] == "pdl-network-keeper")


def secrets_of(swarm, user):
    return [s for s in swarm.secrets_.values() if s["Spec"]["Labels"].get("pdl.user") == user]


@pytest.fixture(autouse=True)
def no_promises_left():
    yield
    assert PDLSwarmSpawner.promised == {}, "a spawn left GPUs promised"


def test_spawn_creates_notebook_and_one_engine_per_gpu_spread_over_nodes():
    swarm = FakeSwarm()
    alice = make_spawner(swarm, "alice", 3)
    ip, port = run(alice.start())
    notebook_task = [t for t in swarm.running("notebook")][0]
    assert ip == {"node1": "10.77.0.11", "node2": "10.77.0.12", "node3": "10.77.0.13"}[notebook_task["NodeID"]]
    assert port == alice.swarm.port and 20000 <= port <= 32000
    engines = swarm.running("engine")
    assert len(engines) == 3 and {t["NodeID"] for t in engines} == {"node1", "node2", "node3"}
    assert sorted(s["Spec"]["Name"] for s in services_of(swarm, "alice")) == [
        "pdl-alice", "pdl-alice-engine-0", "pdl-alice-engine-1", "pdl-alice-engine-2"]
    # the engines' secret holds exactly the connection info for the controller, at the
    # notebook's address on alice's private network, which her engines are on too
    network = alice.swarm.network
    assert network == "pdl-private-0"
    controller = notebook_task["NetworksAttachments"][0]["Addresses"][0].split("/")[0]
    assert notebook_task["NetworksAttachments"][0]["Network"]["Spec"]["Name"] == network
    kinds = {s["Spec"]["Labels"]["pdl.kind"]: s["ID"] for s in secrets_of(swarm, "alice")}
    secret = json.loads(swarm.secret_data(kinds["engine"]))
    assert secret == engine_file(alice.swarm.keys, alice.swarm.controller_ports, controller)
    assert {n["Network"]["Spec"]["Name"] for t in engines for n in t["NetworksAttachments"]} == {network}
    notebook_secret = json.loads(swarm.secret_data(kinds["notebook"]))
    assert notebook_secret["api_token"] == "token-of-alice"
    # and nothing secret is in any service spec
    specs = json.dumps([s["Spec"] for s in swarm.services_.values()])
    for value in ("token-of-alice", alice.swarm.keys.curve_secretkey, alice.swarm.keys.session_key):
        assert value not in specs
    env = swarm.services_[alice.object_id]["Spec"]["TaskTemplate"]["ContainerSpec"]["Env"]
    assert "PDL_WORKERS=3" in env and f"JUPYTERHUB_SERVICE_URL=http://0.0.0.0:{port}/user/alice/" in env
    engine_env = services_of(swarm, "alice")[1]["Spec"]["TaskTemplate"]["ContainerSpec"]["Env"]
    assert "CINIC10_DIR=/data/cinic10" in engine_env


def test_the_admins_limits_reach_every_container_of_the_server():
    swarm = FakeSwarm()
    alice = make_spawner(swarm, "alice", 2, mem_limit="2G", cpu_limit=1.5, process_limit=500,
                         engine_cpu_limit=2.0)
    run(alice.start())
    resources = {s["Spec"]["Name"]: s["Spec"]["TaskTemplate"].get("Resources", {}) for s in services_of(swarm, "alice")}
    assert resources["pdl-alice"] == {"Limits": {"MemoryBytes": 2 * 2**30, "NanoCPUs": 1_500_000_000, "Pids": 500}}
    for index in (0, 1):  # each engine: the server's memory (no engine_mem_limit), its own cores, reserved
        engine = resources[f"pdl-alice-engine-{index}"]
        assert engine["Limits"] == {"MemoryBytes": 2 * 2**30, "NanoCPUs": 2_000_000_000, "Pids": 500}
        assert engine["Reservations"]["NanoCPUs"] == 2_000_000_000
    with pytest.raises(Exception, match="engine_cpu_limit must be 0 \\(none\\) or a number of cores, got -1"):
        make_spawner(swarm, "bob", 1, engine_cpu_limit=-1.0)


def test_request_that_cannot_be_met_fails_fast_with_one_line_and_creates_nothing():
    swarm = FakeSwarm()
    run(make_spawner(swarm, "alice", 2).start())
    before = swarm.calls.count("create_service")
    bob = make_spawner(swarm, "bob", 2)
    started = time.monotonic()
    with pytest.raises(web.HTTPError) as e:
        run(bob.start())
    assert time.monotonic() - started < 2
    assert e.value.status_code == 409
    assert e.value.log_message == ("Not enough free GPUs: you asked for 2, 1 of 3 are free (2 held by other users). "
                                   "Ask for at most 1, or try again when one frees up.")
    assert swarm.calls.count("create_service") == before and not services_of(swarm, "bob")
    assert not secrets_of(swarm, "bob")
    with pytest.raises(web.HTTPError) as e:
        run(make_spawner(swarm, "root", 2, admin=True).start())
    assert "1 of 3 are free (alice (2))" in e.value.log_message


def test_stop_removes_everything_and_frees_the_gpus():
    swarm = FakeSwarm(stop_polls=3)  # removed tasks keep their GPU for a moment, as in Swarm
    alice = make_spawner(swarm, "alice", 3)
    run(alice.start())
    run(alice.stop())
    assert not services_of(swarm, "alice") and not secrets_of(swarm, "alice")
    assert not swarm.running("notebook") and not swarm.running("engine")
    assert alice.get_state() == {}
    run(make_spawner(swarm, "bob", 3).start())
    assert len(swarm.running("engine")) == 3


def test_gpus_of_engines_scaled_to_0_stay_held_until_their_containers_stop():
    """An idle release scales the engine services to 0; Swarm gives their GPUs to another
    task only once their containers have stopped, and the free count says the same: else
    the user first in the queue gets a spawn whose engines Swarm cannot place."""
    swarm = FakeSwarm(stop_polls=10)  # the double's looks at the swarm until a container has stopped
    alice = make_spawner(swarm, "alice", 3)
    run(alice.start())
    assert len(run(alice.workers.reclaim_idle())) == 3
    bob = make_spawner(swarm, "bob", 2)
    assert run(bob.workers.usage()).holders == {"alice": 3}  # her containers still stop
    usage = [run(bob.workers.usage()) for _ in range(10)]
    assert usage[-1].free == 3 and usage[-1].holders == {}, usage


def test_a_restarted_hub_reattaches_through_the_state():
    swarm = FakeSwarm()
    alice = make_spawner(swarm, "alice", 2)
    run(alice.start())
    state = json.loads(json.dumps(alice.get_state()))  # as JupyterHub stores it
    assert state["pdl_swarm"]["workers"] == 2 and state["pdl_swarm"]["keys"] == alice.swarm.keys.to_dict()
    again = make_spawner(swarm, "alice", None)
    again.load_state(state)
    assert run(again.poll()) is None
    assert again.swarm == alice.swarm and again.port == alice.swarm.port
    run(again.stop())
    assert not services_of(swarm, "alice")
    assert run(again.poll()) == 0


def test_engine_starved_by_a_race_removes_everything_and_says_409():
    swarm = FakeSwarm()

    def grab_a_gpu(method, swarm):
        # someone else takes a GPU between the check and the engines' creation
        if method == "create_service" and not any(s["Spec"]["Name"] == "intruder" for s in swarm.services_.values()):
            swarm.after_call = None
            swarm.create_service({"ContainerSpec": {"Image": "x", "Secrets": []}, "Resources": {"Reservations": {
                "GenericResources": [{"DiscreteResourceSpec": {"Kind": "NVIDIA-GPU", "Value": 1}}]}}},
                name="intruder", labels={})

    swarm.after_call = grab_a_gpu
    alice = make_spawner(swarm, "alice", 3)
    with pytest.raises(web.HTTPError) as e:
        run(alice.start())
    assert e.value.status_code == 409
    assert "you asked for 3, 2 of 3 are free (1 held by other users)" in e.value.log_message
    assert not services_of(swarm, "alice") and not secrets_of(swarm, "alice")
    assert [t["ServiceID"] for t in swarm.running() if t["ServiceID"] != keeper_id(swarm)] == [
        s["ID"] for s in swarm.services_.values() if s["ID"] != keeper_id(swarm)]


def test_concurrent_spawns_in_one_hub_never_promise_a_gpu_twice():
    swarm = FakeSwarm()

    async def both():
        spawners = [make_spawner(swarm, "alice", 2), make_spawner(swarm, "bob", 2)]
        return await asyncio.gather(*(s.start() for s in spawners), return_exceptions=True)

    results = run(both())
    refused = [r for r in results if isinstance(r, web.HTTPError)]
    assert len(refused) == 1 and refused[0].status_code == 409, results
    assert "Not enough free GPUs" in refused[0].log_message
    assert len(swarm.running("engine")) == 2
    # refused before it made anything: the promise lasts until the engines' tasks exist,
    # not only the notebook's (the network keeper, one notebook, two engines)
    assert swarm.calls.count("create_service") == 4, swarm.calls


def network_of(swarm, user) -> set[str]:
    """Names of the networks ``user``'s services are on."""
    by_id = {n["Id"]: name for name, n in swarm.networks_.items()}
    return {by_id[ref["Target"]] for s in services_of(swarm, user) for ref in s["Spec"]["TaskTemplate"]["Networks"]}


def test_concurrent_spawns_get_networks_of_their_own_and_a_full_pool_is_a_409_that_creates_nothing():
    swarm = FakeSwarm(gpus_per_node=(2, 2, 2))

    async def both():
        spawners = [make_spawner(swarm, name, 1, private_networks=2) for name in ("alice", "bob")]
        return await asyncio.gather(*(s.start() for s in spawners))

    run(both())
    assert {frozenset(network_of(swarm, u)) for u in ("alice", "bob")} == {
        frozenset({"pdl-private-0"}), frozenset({"pdl-private-1"})}
    keeper = swarm.services_[keeper_id(swarm)]["Spec"]
    assert keeper["Mode"] == {"Global": {}} and len(keeper["TaskTemplate"]["Networks"]) == 2
    assert len(swarm.running()) == 2 + 2 + 3  # two notebooks, two engines, a keeper per node

    carol = make_spawner(swarm, "carol", 1, private_networks=2)
    with pytest.raises(web.HTTPError) as e:
        run(carol.start())
    assert e.value.status_code == 409 and e.value.log_message == (
        "No private network is free for your server (0 of 2 are free); try again when a server stops, or ask the "
        "admin to raise PDLSwarmSpawner.private_networks")
    assert not services_of(swarm, "carol") and not secrets_of(swarm, "carol")

    # a larger pool: the keeper joins the new network too, and carol gets it
    run(make_spawner(swarm, "carol", 1, private_networks=3).start())
    assert network_of(swarm, "carol") == {"pdl-private-2"}
    assert len(swarm.services_[keeper_id(swarm)]["Spec"]["TaskTemplate"]["Networks"]) == 3


def test_gpus_stay_promised_between_the_notebook_task_and_the_engines():
    """A spawn that comes while alice's notebook runs but her engines do not exist yet
    is refused at once: her GPUs are still promised to her (the notebook holds none)."""
    swarm = FakeSwarm()
    during = []

    def spawn_bob_between(method, swarm):
        if method == "inspect_node" and not during:  # start_object: notebook running, no engines yet
            during.append("bob")
            try:
                asyncio.run(make_spawner(swarm, "bob", 1).start())
                during.append("started")
            except web.HTTPError as e:
                during.append(e.log_message)

    swarm.after_call = spawn_bob_between
    run(make_spawner(swarm, "alice", 3).start())
    assert during == ["bob", "Not enough free GPUs: you asked for 1, 0 of 3 are free (3 held by other users). "
                             "Try again when one frees up."], during
    assert len(swarm.running("engine")) == 3 and not services_of(swarm, "bob")


def test_a_task_that_cannot_start_fails_the_spawn_and_leaves_nothing():
    swarm = FakeSwarm(reject_images={"pdl-engine:missing"})
    alice = make_spawner(swarm, "alice", 2, engine_image="pdl-engine:missing")
    with pytest.raises(RuntimeError, match="engine task of alice did not start: rejected: No such image"):
        run(alice.start())
    assert not services_of(swarm, "alice") and not secrets_of(swarm, "alice")


def test_bad_requests_are_400():
    swarm = FakeSwarm()
    with pytest.raises(web.HTTPError) as e:
        run(make_spawner(swarm, "alice", 0).start())
    assert e.value.status_code == 400
    with pytest.raises(web.HTTPError) as e:
        run(make_spawner(swarm, "alice", 3, max_workers=2).start())
    assert e.value.status_code == 400 and "from 1 to 2" in e.value.log_message


def test_swarm_spawner_refuses_mounts_before_any_docker_call():
    swarm = FakeSwarm()
    cls = type("FakeSwarmSpawner", (PDLSwarmSpawner,), {"_client": swarm})
    user = SimpleNamespace(name="alice", admin=False, url="/user/alice/", escaped_name="alice", id=1,
                           server=None, spawners={}, settings={}, orm_user=None)
    spawner = cls(user=user, hub=Hub(ip="10.77.0.1", port=8081, base_url="/hub/"),
                  api_token="token", image="pdl-notebook:test")
    for options in ({"mounts": [{"source": "/", "target": "/host"}]}, {"image": "evil", "workers": 1}):
        spawner.user_options = options
        with pytest.raises(web.HTTPError) as e:
            asyncio.run(spawner.start())
        assert e.value.status_code == 400 and "the options are 'workers'" in e.value.reason
    assert swarm.calls == [] and PDLSwarmSpawner.promised == {}


def test_spawn_form_says_what_is_free():
    swarm = FakeSwarm()
    run(make_spawner(swarm, "alice", 2).start())
    bob = make_spawner(swarm, "bob", None)
    page = run(bob.get_options_form())
    assert "1 of 3 GPUs free" in page and "2 held by other users" in page and "alice" not in page
    assert bob.options_from_form({"workers": ["1"]}) == {"workers": 1}


def test_named_nodes_limit_the_gpus_handed_out_and_where_engines_run():
    swarm = FakeSwarm()
    alice = make_spawner(swarm, "alice", 3, nodes=["node1", "node2"])
    with pytest.raises(web.HTTPError) as e:
        run(alice.start())
    assert e.value.status_code == 409 and "2 of 2 are free" in e.value.log_message
    alice = make_spawner(swarm, "alice", 2, nodes=["node1", "node2"])
    run(alice.start())
    engines = [s for s in services_of(swarm, "alice") if s["Spec"]["Labels"]["pdl.role"] == "engine"]
    assert len(engines) == 2
    for service in engines:
        assert service["Spec"]["TaskTemplate"]["Placement"]["Constraints"] == ["node.hostname!=node3"]
    run(alice.stop())


def test_a_named_node_that_is_not_in_the_swarm_is_a_one_line_error():
    swarm = FakeSwarm()
    with pytest.raises(web.HTTPError) as e:
        run(make_spawner(swarm, "alice", 1, nodes=["node1", "gpu9"]).start())
    assert e.value.log_message == ("PDLSwarmSpawner.nodes: node(s) gpu9 not in the swarm; "
                                   "its nodes are: node1, node2, node3")
    assert not services_of(swarm, "alice") and not secrets_of(swarm, "alice")
