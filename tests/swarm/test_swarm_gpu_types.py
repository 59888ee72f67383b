"""The GPU type at spawn on the simulated swarm, whose nodes the test labels with two
kinds of GPU (``pdl.gpu-type``: a100 on pdl-node1 and pdl-node2, t4 on pdl-node3): the
spawn form offers each type with its free count, the engines run only on the chosen
type's nodes, a type the swarm lacks is refused in one line and a type with no free GPU
with a 409 naming it while the other type's GPUs stay free, and the panel and the admin
view name the type."""

from __future__ import annotations

import pytest

from hub_harness import admin_status, gpu_type_choices
from swarm_hub_harness import swarm_hub_fixture
from waiting import wait_until

pytestmark = pytest.mark.docker

TYPES = {"pdl-node1": "a100", "pdl-node2": "a100", "pdl-node3": "t4"}


@pytest.fixture(scope="module")
def typed_swarm(swarm):
    """The swarm with its nodes labelled by GPU type; unlabelled again afterwards."""
    nodes = swarm.hostnames_by_node_id()
    for node_id, host in nodes.items():
        swarm.set_labels(node_id, {"pdl.gpu-type": TYPES[host]})
    yield swarm
    for node_id in nodes:
        swarm.set_labels(node_id, {})


@pytest.fixture(scope="module")
def hub(typed_swarm, tmp_path_factory):
    yield from swarm_hub_fixture(tmp_path_factory.mktemp("swarm-gpu-types"), typed_swarm, ["admin", "ann", "ben"])


def engine_hosts(swarm, user: str) -> list[str]:
    """The hostnames of the nodes where ``user``'s engine tasks run."""
    hosts = swarm.hostnames_by_node_id()
    found = []
    for service in swarm.manager.services.list(filters={"label": ["pdl.role=engine", f"pdl.user={user}"]}):
        found += [hosts[t["NodeID"]] for t in service.tasks(filters={"desired-state": "running"})
                  if t["Status"]["State"] == "running"]
    return sorted(found)


def test_each_gpu_type_is_offered_with_its_free_count_and_its_engines_run_on_its_nodes(hub, typed_swarm):
    assert gpu_type_choices(hub, "ann") == {"": "Any type (3 of 3 free)", "a100": "a100 (2 of 2 free)",
                                            "t4": "t4 (1 of 1 free)"}

    r = hub.api("POST", "/users/ann/server", json={"workers": 1, "gpu_type": "h100"})
    assert r.status_code == 400, r.text
    assert "gpu_type must be one of 'a100', 't4', or '' for any, got 'h100'" in r.json()["message"]

    try:
        assert hub.api("POST", "/users/ann/server", json={"workers": 1, "gpu_type": "t4"}).status_code in (201, 202)
        hub.wait_ready("ann", timeout=180)
        assert engine_hosts(typed_swarm, "ann") == ["pdl-node3"]  # the t4 node
        cluster = hub.server_api("ann", "/pdl/api/cluster")
        assert cluster["gpu_type"] == "t4", cluster  # the panel says "Reserved: 1 t4 GPUs"

        choices = gpu_type_choices(hub, "ben")
        assert (choices["t4"], choices["a100"]) == ("t4 (0 of 1 free)", "a100 (2 of 2 free)")
        r = hub.api("POST", "/users/ben/server", json={"workers": 1, "gpu_type": "t4"})
        assert r.status_code == 409, r.text
        assert r.json()["message"].startswith("Not enough free t4 GPUs: you asked for 1, 0 of 1 are free"), r.text

        rows = [(r["owner"], r["node"], r["gpu_type"]) for r in admin_status(hub)["reservations"]]
        assert rows == [("ann", "pdl-node3", "t4")], rows
    finally:
        hub.api("DELETE", "/users/ann/server")
    wait_until(lambda: not engine_hosts(typed_swarm, "ann"), 60, what="ann's engines to go")
