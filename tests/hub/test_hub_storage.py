"""Storage on the embedded default, through a real JupyterHub: a user's home is a local
folder that outlives the server (a file the notebook or rank 0 wrote is there after a
restart), and every engine reads the same dataset (``CINIC10_DIR``, set by the admin in
``c.Spawner.environment``) through one cache per machine. The Swarm counterpart is
tests/swarm/test_swarm_storage.py."""

from __future__ import annotations

import hashlib
import re
import secrets

import pytest

from hub_harness import Kernel, hub_fixture, open_path_to
from waiting import wait_until

pytestmark = pytest.mark.hub

USERS = ["admin", "alice"]
POOL = ["cpu:0", "cpu:1", "cpu:2"]

HOME_CELL = """%%distributed -n 3
import os
if rank == 0:
    with open(os.path.expanduser("~/from-rank0.txt"), "w") as f:   # e.g. a checkpoint
        f.write(f"rank 0 pid {os.getpid()}")
"""

DATA_CELL = """%%distributed -n 3 --all-output
import hashlib, os
from pdl_cinic10 import cache
images, labels = cache.load(os.environ["CINIC10_DIR"], "test")
folder = cache.cache_dir_for(os.environ["CINIC10_DIR"])
print(f"rank {rank} dataset {os.environ['CINIC10_DIR']} cache {folder} "
      f"images {hashlib.sha256(images.numpy().tobytes()).hexdigest()}")
"""
DATA_RESULT = re.compile(r"rank (\d) dataset (\S+) cache (\S+) images (\w+)")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A small CINIC-10 sample in a folder of the machine, as an admin would put it."""
    from pdl_cinic10.sample import make_sample

    root = tmp_path_factory.mktemp("hub-storage-data") / "cinic10"
    make_sample(root, train_per_class=1, test_per_class=2, valid_per_class=1)
    open_path_to(root)  # every user's account reads it
    return root


@pytest.fixture(scope="module")
def hub(tmp_path_factory, dataset):
    yield from hub_fixture(tmp_path_factory.mktemp("hub-storage"), USERS, POOL,
                           spawner_env={"CINIC10_DIR": str(dataset)})


def restart_server(hub, user: str, workers: int) -> None:
    assert hub.api("DELETE", f"/users/{user}/server").status_code in (202, 204)
    wait_until(lambda: user not in hub.running_servers() and not hub.reservations(), 60,
               what=f"{user}'s server to stop")
    assert hub.spawn(user, workers).status_code in (201, 202)
    hub.wait_ready(user)


def test_the_home_outlives_the_server_and_every_engine_reads_the_same_dataset(hub, dataset, tmp_path):
    from pdl_cinic10.cache import load

    token = secrets.token_hex(8)
    assert hub.spawn("alice", 3).status_code in (201, 202)
    hub.wait_ready("alice")
    kernel = Kernel(hub, "alice")
    try:
        kernel.execute_ok(f"import os\nopen(os.path.expanduser('~/note.txt'), 'w').write({token!r})")
        kernel.execute_ok("%load_ext pdl_magics")
        kernel.execute_ok(HOME_CELL, timeout=180)
        out = kernel.execute_ok(DATA_CELL, timeout=180)
    finally:
        kernel.close()
    ranks = {int(m[0]): m[1:] for m in DATA_RESULT.findall(out["stdout"])}
    assert sorted(ranks) == [0, 1, 2], out["stdout"]
    images, _ = load(dataset, "test", cache_dir=tmp_path / "cache")
    expected = hashlib.sha256(images.numpy().tobytes()).hexdigest()
    assert len(set(ranks.values())) == 1, ranks  # one dataset, one cache, the same images
    seen_dataset, cache, seen_images = ranks[0]
    assert (seen_dataset, seen_images) == (str(dataset), expected)
    assert cache.startswith(str(hub.home("alice") / ".cache" / "pdl" / "cinic10") + "/"), cache
    rank0 = (hub.home("alice") / "from-rank0.txt").read_text()

    restart_server(hub, "alice", 1)
    kernel = Kernel(hub, "alice")
    try:
        read = ("import os\nos.chdir(os.path.expanduser('~'))\n"
                "print(open('note.txt').read(), open('from-rank0.txt').read())")
        assert kernel.execute_ok(read)["stdout"].strip() == f"{token} {rank0}"
    finally:
        kernel.close()
    hub.api("DELETE", "/users/alice/server")
    wait_until(lambda: not hub.running_servers() and not hub.reservations(), 60, what="alice's server to stop")
