"""Storage of PDLSwarmSpawner: homes that follow the user, one read-only dataset for every
engine, a node-local cache.

The unit tests drive the real spawner against :class:`swarm_doubles.FakeSwarm`. The
docker tests run a real JupyterHub on the simulated 3-node swarm with
``home_storage = "path"`` and a dataset folder (``data_storage`` kind "path"), both
under a temporary folder of this host. In the simulation the three nodes are network
namespaces on one host and share its filesystem, so a host folder IS shared by all
nodes, as an NFS export mounted at the same path on every node would be: what these
tests show is what a lab gets with NFS.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import time

import pytest
from docker.errors import APIError, NotFound
from tornado import web

from hub_harness import Kernel
from swarm_doubles import FakeSwarm
from swarm_hub_harness import pdl_objects, swarm_hub_fixture
from test_swarm_spawner import make_spawner, run, services_of
from waiting import wait_until

USERS = ["admin", "hana", "ivan", "jude"]  # jude has no home folder


def container_specs(swarm: FakeSwarm, user: str) -> dict[str, dict]:
    """Service name -> ContainerSpec of ``user``'s services."""
    return {s["Spec"]["Name"]: s["Spec"]["TaskTemplate"]["ContainerSpec"] for s in services_of(swarm, user)}


# -- the spawner, on a fake swarm ------------------------------------------------------------


@pytest.mark.unit
def test_notebook_and_engines_get_the_same_storage_and_admin_env_wins():
    swarm = FakeSwarm()
    alice = make_spawner(swarm, "alice", 2, home_storage="path", home_path_template="/srv/pdl/home/{username}",
                         data_storage={"kind": "path", "source": "/srv/pdl/data"},
                         volumes={"/srv/pdl/models": "/models"})
    alice.environment = {"CINIC10_CACHE": "/home/jovyan/cache"}
    run(alice.start())
    specs = container_specs(swarm, "alice")
    assert sorted(specs) == ["pdl-alice", "pdl-alice-engine-0", "pdl-alice-engine-1"]
    for name, spec in specs.items():
        assert [(m["Type"], m["Source"], m["Target"], m.get("ReadOnly", False)) for m in spec["Mounts"]] == [
            ("bind", "/srv/pdl/home/alice", "/home/jovyan", False),
            ("bind", "/srv/pdl/data", "/data", True),
            ("volume", "pdl-cache-alice", "/var/tmp", False),
            ("bind", "/srv/pdl/models", "/models", False),  # dockerspawner's `volumes`, after PDL's
        ], name
        assert "CINIC10_DIR=/data/cinic10" in spec["Env"], name
        assert "CINIC10_CACHE=/home/jovyan/cache" in spec["Env"], name  # the admin's environment wins
    run(alice.stop())


@pytest.mark.unit
@pytest.mark.parametrize("config, message", [
    ({"home_storage": "path"}, "PDLSwarmSpawner storage: home_storage is 'path' but home_path_template is empty"),
    ({"volumes": {"/var/run/docker.sock": "/var/run/docker.sock"}},
     "PDLSwarmSpawner storage: refusing to mount /var/run/docker.sock into a user's container"),
    ({"volumes": {"/srv/other": "/home/jovyan"}},
     "PDLSwarmSpawner storage: two mounts at /home/jovyan in one container"),
])
def test_storage_that_cannot_work_fails_the_spawn_in_one_line_before_any_docker_call(config, message):
    swarm = FakeSwarm()
    with pytest.raises(web.HTTPError) as e:
        run(make_spawner(swarm, "alice", 1, **config).start())
    assert e.value.status_code == 500 and e.value.log_message == message
    assert swarm.calls == []


@pytest.mark.unit
@pytest.mark.parametrize("config, message", [
    ({"home_storage": "nfs"}, "home_storage must be 'volume' or 'path', got 'nfs'"),
    ({"home_path_template": "/srv/pdl/home"}, "home_path_template must contain {username}"),
    ({"data_storage": {"kind": "path", "source": "/"}}, "refusing to mount / into"),
    ({"data_storage": {"kind": "nfs", "addr": "10.0.0.5"}}, "data_storage must be None, {'kind': 'path'"),
    ({"cache_volume": "/var/cache"}, "cache_volume must be a Docker volume name"),
])
def test_bad_storage_settings_are_refused_when_configured(config, message):
    with pytest.raises(ValueError) as e:
        make_spawner(FakeSwarm(), "alice", 1, **config)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.unit
def test_storage_settings_are_documented():
    from pdl_spawner.swarm.spawner import PDLSwarmSpawner

    traits = PDLSwarmSpawner.class_traits(config=True)
    for name in ("home_storage", "home_volume_driver", "home_volume_driver_opts", "home_path_template",
                 "data_storage", "cache_volume"):
        assert traits[name].help.strip(), f"{name} has no help text"


# -- on the simulated swarm ------------------------------------------------------------------

HOME_CELL = """%%distributed -n 1
import os
with open(os.path.expanduser("~/from-rank0.txt"), "w") as f:   # e.g. a checkpoint
    f.write(os.environ["PDL_ENGINE_HOST"])
"""

DATA_CELL = """%%distributed -n 3 --all-output
import hashlib, os
from pdl_cinic10 import cache
probe = hashlib.sha256(open("/data/probe.bin", "rb").read()).hexdigest()
try:
    open("/data/written-by-an-engine", "w")
    writable = "yes"
except OSError as e:
    writable = f"errno{e.errno}"
images, labels = cache.load(os.environ["CINIC10_DIR"], "test")
folder = cache.cache_dir_for(os.environ["CINIC10_DIR"])
print(f"rank {rank} host {os.environ['PDL_ENGINE_HOST']} probe {probe} writable {writable} cache {folder} "
      f"verify {cache.verify(folder, 'test')} images {hashlib.sha256(images.numpy().tobytes()).hexdigest()}")
"""
DATA_RESULT = re.compile(r"rank (\d) host (\S+) probe (\w+) writable (\S+) cache (\S+) verify (\S+) images (\w+)")


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The "shared storage": homes of hana and ivan (owned by the containers' uid), none
    for jude; a dataset folder with a probe file and a small CINIC-10 sample."""
    from pdl_cinic10.sample import make_sample

    root = tmp_path_factory.mktemp("swarm-storage-shared")
    for user in ("hana", "ivan"):
        home = root / "home" / user
        home.mkdir(parents=True, mode=0o700)
        os.chown(home, 1000, 1000)
    data = root / "data"
    data.mkdir(mode=0o755)
    (data / "probe.bin").write_bytes(secrets.token_bytes(256 * 1024))
    make_sample(data / "cinic10", train_per_class=1, test_per_class=3, valid_per_class=1)
    return root


@pytest.fixture(scope="module")
def hub(swarm, shared, tmp_path_factory):
    config = f"""
c.PDLSwarmSpawner.home_storage = "path"
c.PDLSwarmSpawner.home_path_template = {str(shared / 'home' / '{username}')!r}
c.PDLSwarmSpawner.data_storage = {{"kind": "path", "source": {str(shared / 'data')!r}}}
"""
    try:
        yield from swarm_hub_fixture(tmp_path_factory.mktemp("swarm-storage-hub"), swarm, USERS, extra_config=config)
    finally:
        for node in swarm.manager.nodes.list():
            swarm.set_availability(node.id, "active")
        for i in swarm.node_ids():  # the cache volumes this module made, once their containers are gone
            wait_until(lambda i=i: remove_volumes(swarm.client(i), [f"pdl-cache-{u}" for u in USERS]), 60,
                       what=f"the cache volumes on {swarm.hostname(i)} to be free")


def remove_volumes(client, names: list[str]) -> bool:
    """Remove those of the named volumes that exist; False while one is still in use."""
    for name in names:
        try:
            client.volumes.get(name).remove()
        except NotFound:
            pass
        except APIError as e:
            if e.status_code == 409:  # in use by a container Swarm is still removing
                return False
            raise
    return True


def notebook_node(swarm, user: str) -> str:
    """Hostname of the node running ``user``'s notebook task."""
    tasks = swarm.manager.services.get(f"pdl-{user}").tasks(filters={"desired-state": "running"})
    return swarm.hostnames_by_node_id()[tasks[0]["NodeID"]]


def stop_server(hub, swarm, user: str) -> None:
    assert hub.api("DELETE", f"/users/{user}/server").status_code in (202, 204)
    wait_until(lambda: pdl_objects(swarm, user) == ([], []), 60, what=f"{user}'s services and secrets to go")
    wait_until(lambda: user not in hub.running_servers(), 60, what=f"{user}'s server to stop")


def run_cells(hub, user: str, *cells: str) -> list[dict]:
    kernel = Kernel(hub, user)
    try:
        outs = []
        for cell in cells:
            out = kernel.execute(cell, timeout=300)
            assert out["error"] is None, f"{out}\n{hub.log_tail()}"
            outs.append(out)
        return outs
    finally:
        kernel.close()


@pytest.mark.docker
def test_a_missing_home_folder_fails_the_spawn_in_one_line(hub, swarm, shared):
    started = time.monotonic()
    r = hub.spawn("jude", 1)
    if r.status_code == 500:  # failed within the hub's slow-spawn timeout: the POST says why
        ok, message = False, r.json()["message"]
    else:
        assert r.status_code in (201, 202), r.text
        ok, message = hub.wait_spawned("jude", timeout=120)
    print(f"failed after {time.monotonic() - started:.1f} s: {message}")
    assert not ok and "\n" not in message and time.monotonic() - started < 60
    assert "notebook task of jude did not start" in message and "does not exist" in message
    assert str(shared / "home" / "jude") in message
    wait_until(lambda: pdl_objects(swarm, "jude") == ([], []), 60, what="jude's services and secrets to go")


@pytest.mark.docker
def test_a_file_in_the_home_survives_a_restart_on_another_node(hub, swarm, shared):
    token = secrets.token_hex(8)
    assert hub.spawn("hana", 1).status_code in (201, 202)
    hub.wait_ready("hana", timeout=240)
    first = notebook_node(swarm, "hana")
    write = f"import os\nopen(os.path.expanduser('~/note.txt'), 'w').write({token!r})\nprint(os.environ['HOME'])"
    out, _, _ = run_cells(hub, "hana", write, "%load_ext pdl_magics", HOME_CELL)
    assert out["stdout"].strip() == "/home/jovyan"
    home = shared / "home" / "hana"
    assert (home / "note.txt").read_text() == token and (home / "note.txt").stat().st_uid == 1000
    engine_host = (home / "from-rank0.txt").read_text()
    stop_server(hub, swarm, "hana")

    # the next server cannot run on the node the first one ran on
    node_id = {host: nid for nid, host in swarm.hostnames_by_node_id().items()}[first]
    swarm.set_availability(node_id, "drain")
    try:
        assert hub.spawn("hana", 1).status_code in (201, 202)
        hub.wait_ready("hana", timeout=240)
        second = notebook_node(swarm, "hana")
        read = "import os\nos.chdir(os.path.expanduser('~'))\nprint(open('note.txt').read(), open('from-rank0.txt').read())"
        (out,) = run_cells(hub, "hana", read)
    finally:
        swarm.set_availability(node_id, "active")
    print(f"first server on {first}, rank 0 on {engine_host}; second server on {second}")
    assert second != first
    assert out["stdout"].split() == [token, engine_host]
    stop_server(hub, swarm, "hana")


@pytest.mark.docker
def test_every_engine_reads_the_same_read_only_dataset_and_stages_it_on_its_node(hub, swarm, shared):
    from pdl_cinic10.cache import load

    assert hub.spawn("ivan", 3).status_code in (201, 202)
    hub.wait_ready("ivan", timeout=240)
    nb, _, out = run_cells(hub, "ivan", "import os\nprint(os.environ['CINIC10_DIR'], sorted(os.listdir('/data')))",
                           "%load_ext pdl_magics", DATA_CELL)
    assert nb["stdout"].split() == ["/data/cinic10", "['cinic10',", "'probe.bin']"]
    print(out["stdout"])
    ranks = {int(m[0]): m[1:] for m in DATA_RESULT.findall(out["stdout"])}
    assert sorted(ranks) == [0, 1, 2], out["stdout"]
    assert sorted(host for host, *_ in ranks.values()) == [swarm.hostname(i) for i in swarm.node_ids()]
    probe = hashlib.sha256((shared / "data" / "probe.bin").read_bytes()).hexdigest()
    images, _ = load(shared / "data" / "cinic10", "test", cache_dir=shared / "host-cache")
    expected = hashlib.sha256(images.numpy().tobytes()).hexdigest()
    for host, seen, writable, folder, verify, staged in ranks.values():
        assert seen == probe, host
        assert writable == "errno30", host  # EROFS: the dataset is read-only
        assert (folder, verify, staged) == ("/var/tmp/cinic10", "None", expected), host
    assert not (shared / "data" / "written-by-an-engine").exists()
    # staged once per node, in that node's own cache volume of ivan's
    for i in swarm.node_ids():
        assert swarm.client(i).volumes.get("pdl-cache-ivan").attrs["Labels"] == {
            "pdl.volume": "cache", "pdl.user": "ivan"}
    stop_server(hub, swarm, "ivan")
