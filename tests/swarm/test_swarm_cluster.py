"""The simulated 3-node Docker Swarm that the swarm spawner's tests run on.

What PDL's GPU scheduling relies on: every node advertises exactly one GPU, a service
that reserves ``NVIDIA-GPU=1`` per task gets one GPU per task (a different one for
each), a request beyond the free GPUs stays pending with "insufficient resources"
(and starts when a GPU frees), and the notebook image runs on a node as a non-root
user with PDL importable.
"""

from __future__ import annotations

import pytest

from swarm_harness import GPU_KIND
from waiting import wait_until

pytestmark = pytest.mark.docker

NOTEBOOK = "pdl-notebook:test"
# What a task sees: the GPU Swarm assigned to it (a hyphenated name: read it in Python)
PRINT_GPU = "import os, time; print(os.environ['DOCKER_RESOURCE_NVIDIA-GPU'], flush=True); time.sleep(1e6)"


def gpu_service(client, name, replicas, **kw):
    from docker.types import EndpointSpec, Resources, ServiceMode

    return client.services.create(
        NOTEBOOK, ["python", "-c", PRINT_GPU], name=name,
        mode=ServiceMode("replicated", replicas=replicas),
        resources=Resources(generic_resources={GPU_KIND: 1}),
        endpoint_spec=EndpointSpec(mode="dnsrr"), init=True, **kw,
    )


def test_three_ready_nodes_with_one_gpu_each(swarm):
    nodes = swarm.manager.nodes.list()
    by_host = {n.attrs["Description"]["Hostname"]: n.attrs for n in nodes}
    assert sorted(by_host) == [swarm.hostname(i) for i in swarm.node_ids()]
    for i in swarm.node_ids():
        attrs = by_host[swarm.hostname(i)]
        assert attrs["Status"]["State"] == "ready"
        assert attrs["Status"]["Addr"] == swarm.node_addr(i)
        assert attrs["Description"]["Resources"]["GenericResources"] == [
            {"NamedResourceSpec": {"Kind": GPU_KIND, "Value": swarm.gpu(i)}}
        ]
    managers = [h for h, a in by_host.items() if a["Spec"]["Role"] == "manager"]
    assert managers == [swarm.hostname(1)]


def test_one_gpu_task_per_node_and_a_fourth_waits(clean_swarm):
    swarm = clean_swarm
    svc = gpu_service(swarm.manager, "gpus", 3)
    tasks = swarm.wait_tasks("gpus", 3, timeout=60)
    hosts = swarm.hostnames_by_node_id()
    placed = {hosts[t["NodeID"]]: t["GenericResources"][0]["NamedResourceSpec"]["Value"] for t in tasks}
    assert placed == {swarm.hostname(i): swarm.gpu(i) for i in swarm.node_ids()}

    # each task's own process sees its GPU, and they all differ
    seen = {}
    for i in swarm.node_ids():
        containers = swarm.containers(i, label=f"com.docker.swarm.service.id={svc.id}")
        assert len(containers) == 1, f"{swarm.hostname(i)} runs {len(containers)} GPU tasks"
        seen[swarm.hostname(i)] = wait_until(lambda: containers[0].logs().decode().strip(), 30,
                                             what=f"the task on {swarm.hostname(i)} to print its GPU")
    assert seen == placed

    # a 4th GPU request can't be placed: it waits, with the reason, until a GPU frees
    extra = gpu_service(swarm.manager, "gpu-extra", 1)

    def pending_reason():
        tasks = extra.tasks()
        return tasks and tasks[0]["Status"]["State"] == "pending" and tasks[0]["Status"].get("Err", "")

    err = wait_until(pending_reason, 30, what="the 4th GPU task to be pending with an error")
    assert "insufficient resources" in err, err
    assert swarm.manager.services.get("gpu-extra").tasks()[0]["Status"]["State"] == "pending"

    svc.remove()
    (task,) = swarm.wait_tasks("gpu-extra", 1, timeout=60)
    assert task["GenericResources"][0]["NamedResourceSpec"]["Value"] in placed.values()


def test_notebook_image_runs_on_a_node_as_non_root(swarm):
    out = swarm.client(2).containers.run(
        NOTEBOOK,
        ["sh", "-c", 'id -u; python -c "import pdl_magics, pdl_spawner, torch, ipyparallel; print(torch.__version__)"'],
        network_mode="none", remove=True, init=True,
    ).decode().split()
    uid, torch_version = out[0], out[-1]
    assert uid != "0"
    assert torch_version.startswith("2.")


def test_nodes_reach_each_other_and_the_root_namespace(swarm):
    """The node addresses are real: node3 reaches node1 and the root namespace's 10.77.0.1."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind((swarm.host_addr, 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    got = []
    threading.Thread(target=lambda: got.append(srv.accept()[0].recv(16)), daemon=True).start()
    code = (f"import socket; s = socket.create_connection(('{swarm.host_addr}', {port}), timeout=5); "
            "s.sendall(b'hi from node3')")
    try:
        swarm.client(3).containers.run(NOTEBOOK, ["python", "-c", code], network_mode="host", remove=True)
        wait_until(lambda: got, 10, what="the connection from node3")
    finally:
        srv.close()
    assert got == [b"hi from node3"]
    # and the manager's API is reachable from node3's network (what a joining node uses)
    out = swarm.client(3).containers.run(
        NOTEBOOK, ["python", "-c", f"import socket; socket.create_connection(('{swarm.node_addr(1)}', 2377), 5); print('ok')"],
        network_mode="host", remove=True)
    assert out.decode().strip() == "ok"
