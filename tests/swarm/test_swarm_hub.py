"""End to end on the simulated 3-node swarm: a real JupyterHub with PDLSwarmSpawner.

The hub runs in the root namespace (10.77.0.1 on the sim's bridge) and drives the
swarm through node1's (the manager's) socket. A user asking for 3 GPUs gets a notebook
service and 3 engine services, one per node's GPU; ``%%distributed -n 3`` trains a
small DDP model across the three nodes, and the same engines then run a Horovod
allreduce (``--backend horovod``). A second user is refused at once while the
GPUs are held, and spawns once the first user's server (every service and secret of
it) is gone. All traffic stays on 127.0.0.1 and 10.77.0.0/24.
"""

from __future__ import annotations

import time

import pytest

from hub_harness import Kernel, printed_usage, usage_seconds
from notebook_run import check_notebook, small_run_env
from swarm_hub_harness import (DDP_CELL, DDP_RESULT, HVD_CELL, HVD_RESULT, inspect_task, pdl_objects,
                               swarm_hub_fixture)
from waiting import wait_until

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    # the notebook's small run (tests/harness/notebook_run.py), on the engines' own generated sample,
    # one thread per engine as on the embedded default and Slurm here (the same arithmetic)
    env = {**small_run_env("/tmp/no-cinic10-here"), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    yield from swarm_hub_fixture(tmp_path_factory.mktemp("swarm-hub"), swarm, ["admin", "alice", "bob"],
                                 extra_config=f"c.Spawner.environment.update({env!r})\n"
                                              f"c.PDLMetrics.sample_s = {EVERY_S}")


#: Seconds between the hub's readings of who holds what, for its usage book.
EVERY_S = 1.0
#: Most seconds of a holding a run of the hub may leave uncounted at each of its ends:
#: a reading's interval and the reading itself (the swarm's services, asked of Docker).
READING_LAG_S = EVERY_S + 2.0


def test_three_gpu_server_trains_across_nodes_and_frees_its_gpus_on_stop(hub, swarm):
    spawned = time.time()
    r = hub.spawn("alice", 3)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("alice", timeout=240)
    ready = time.time()

    services, secrets = pdl_objects(swarm, "alice")
    assert services == ["pdl-alice", "pdl-alice-engine-0", "pdl-alice-engine-1", "pdl-alice-engine-2"]
    assert len(secrets) == 2
    hosts = swarm.hostnames_by_node_id()
    engines = [t for s in swarm.manager.services.list(filters={"label": "pdl.role=engine"})
               for t in s.tasks(filters={"desired-state": "running"})]
    assert sorted(hosts[t["NodeID"]] for t in engines) == [swarm.hostname(i) for i in swarm.node_ids()]

    # secure defaults, as the processes actually run
    for service, program, secret in (("pdl-alice", "pdl-singleuser", "/run/secrets/pdl-notebook.json"),
                                     ("pdl-alice-engine-1", "pdl-engine", "/run/secrets/pdl-engine.json")):
        seen = inspect_task(swarm, service, program, secret)
        assert seen["uid"] == "1000" and seen["cap_eff"] == "0000000000000000", seen
        assert seen["no_new_privs"] == "1" and not seen["docker_socket"], seen
        assert seen["secret_mode"] == "0o400" and seen["secret_uid"] == 1000, seen
        assert "API_TOKEN" not in seen["environ"] and "SECRETKEY" not in seen["environ"], service

    kernel = Kernel(hub, "alice")
    try:
        out = kernel.execute("%load_ext pdl_magics")
        assert out["error"] is None, out
        out = kernel.execute(DDP_CELL, timeout=300)
        assert out["error"] is None, f"{out}\n{hub.log_tail()}"
        # no warning the user cannot act on (ipyparallel's lookup of the controller's empty location)
        assert "Warning" not in out["stdout"] + out["stderr"], out
        hvd = kernel.execute(HVD_CELL, timeout=300)
        assert hvd["error"] is None, hvd
    finally:
        kernel.close()
    hvd_ranks = {int(rank): (int(cross), host) for rank, cross, host in HVD_RESULT.findall(hvd["stdout"])}
    assert sorted(hvd_ranks) == [0, 1, 2], hvd["stdout"]
    assert sorted(host for _, host in hvd_ranks.values()) == [swarm.hostname(i) for i in swarm.node_ids()]
    assert all(cross == rank for rank, (cross, _) in hvd_ranks.items()), hvd["stdout"]
    print(out["stdout"])
    ranks = {int(m[0]): m[1:] for m in DDP_RESULT.findall(out["stdout"])}
    assert sorted(ranks) == [0, 1, 2], out["stdout"]
    assert sorted(host for host, *_ in ranks.values()) == [swarm.hostname(i) for i in swarm.node_ids()]
    assert sorted(gpu for _, gpu, *_ in ranks.values()) == [swarm.gpu(i) for i in swarm.node_ids()]
    assert len({weights for *_, weights in ranks.values()}) == 1, "DDP replicas diverged"
    assert all(float(loss) < 0.1 for _, _, loss, _ in ranks.values()), out["stdout"]

    # every GPU is held: another user is refused at once, with who holds them only for admins
    started = time.monotonic()
    r = hub.spawn("bob", 1)
    print(f"409 after {time.monotonic() - started:.2f} s: {r.json().get('message')}")
    assert time.monotonic() - started < 5
    assert r.status_code == 409
    assert "Not enough free GPUs: you asked for 1, 0 of 3 are free (3 held by other users)" in r.json()["message"]
    assert pdl_objects(swarm, "bob") == ([], [])
    r = hub.spawn("admin", 1)
    assert r.status_code == 409 and "0 of 3 are free (alice (3))" in r.json()["message"]

    # a hub restart re-attaches to alice's running server: same services, engines usable
    before = {s.id: s.attrs["Version"]["Index"] for s in swarm.manager.services.list()}
    restarting = time.time()
    hub.stop_hub()
    hub.start()
    hub.wait_ready("alice", timeout=60)
    back = time.time()
    assert {s.id: s.attrs["Version"]["Index"] for s in swarm.manager.services.list()} == before
    kernel = Kernel(hub, "alice")
    try:
        kernel.execute("%load_ext pdl_magics")
        out = kernel.execute("%%distributed -n 3\nimport torch, torch.distributed as dist\n"
                             "t = torch.ones(1); dist.all_reduce(t); print('sum', int(t.item()))", timeout=300)
        assert out["error"] is None and "sum 3" in out["stdout"], out
    finally:
        kernel.close()

    # stopping removes every service and secret of alice and frees the GPUs
    stopping = time.time()
    assert hub.api("DELETE", "/users/alice/server").status_code in (202, 204)
    wait_until(lambda: pdl_objects(swarm, "alice") == ([], []), 60, what="alice's services and secrets to go")
    gone = time.time()
    # the hub's usage book kept alice's GPU-hours across the restart (nothing counted
    # while the hub was down): at least her 3 GPUs' time seen while the hub ran, less a
    # reading at each end of its two runs, at most her server's whole life
    held = 3 * ((restarting - ready) + (stopping - back) - 2 * READING_LAG_S)
    booked = usage_seconds(printed_usage(hub), "alice", "gpu")
    assert held <= booked <= 3 * (gone - spawned), (booked, held, gone - spawned)
    r = hub.spawn("bob", 2)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("bob", timeout=240)
    assert pdl_objects(swarm, "bob")[0] == ["pdl-bob", "pdl-bob-engine-0", "pdl-bob-engine-1"]


def test_the_cinic10_notebook_trains_across_the_nodes_and_recovers_from_failures(hub, swarm):
    """The same notebook, unchanged, as on the embedded default and on Slurm."""
    for user in ("alice", "bob"):  # what the module's other tests left running
        hub.api("DELETE", f"/users/{user}/server")
    wait_until(lambda: pdl_objects(swarm) == ([], []), 120, what="every server's services to go")
    r = hub.spawn("alice", 3)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("alice", timeout=240)
    try:
        check_notebook(hub, "alice")
    finally:
        hub.api("DELETE", "/users/alice/server")
    wait_until(lambda: pdl_objects(swarm, "alice") == ([], []), 120, what="alice's services to go")
