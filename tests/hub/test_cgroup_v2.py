"""A server's cgroup v2 folder and leaves (:mod:`pdl_spawner.host.cgroup_v2`) with the real
kernel, no mocks: processes started the way the spawner starts a server's (joined to the
main leaf as root, then the user's account) and an engine (moving itself into its slot's
leaf, as :func:`pdl.runtime.boot.join_slot_cgroups` does).

This machine's cgroup2 mount has none of the controllers the limits need (they are bound
to cgroup v1 here), so what is tested here is what holds without them: the layout, who
may move what where, the bind filter of the server's folder holding in its leaves, taking
a slot back, killing and removing the whole tree; and that the hub says why it uses the v1
controllers instead. Needs root and a cgroup2 mount: skips otherwise, and fails instead
with ``$CI``."""

from __future__ import annotations

import errno
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from pdl_spawner.host import cgroup_v2, device_cgroup, port_filter
from pdl_spawner.host.cgroup_v2 import ServerTree

pytestmark = pytest.mark.integration

ANN, BEN = 65534, 1  # "nobody" and Debian's "daemon"
#: As an engine starts: moves itself into each folder of argv[1:] in turn, says what each
#: move did, and waits for stdin to close.
MOVER = r"""
import json, os, sys
said = []
for folder in sys.argv[1:]:
    try:
        with open(os.path.join(folder, "cgroup.procs"), "w") as procs:
            procs.write("0")
        said.append("moved")
    except OSError as e:
        said.append(e.strerror)
print(json.dumps(said), flush=True)
os.read(0, 1)
"""


@pytest.fixture
def root():
    """This machine's cgroup2 mount, with a parent folder of the test's own, removed afterwards."""
    found = port_filter.cgroup2_root()
    if found is None:
        problem = "no writable cgroup2 mount (or not root)"
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    parent = f"pdl-test-{secrets.token_hex(4)}"
    yield found, parent
    cgroup_v2.kill(found / parent, 5)
    cgroup_v2.remove(found / parent)


def tree_with_slot(root, owner: str = "pdl-ann", uid: int = ANN, slot: str = "cpu:0") -> ServerTree:
    """``owner``'s server tree under the test's parent (no controllers), made, with
    ``slot`` granted to ``uid``."""
    mount, parent = root
    tree = ServerTree(owner, mount, parent, controllers=())
    tree.make()
    tree.grant(slot, [0], uid)
    return tree


def start(uid: int, tree: ServerTree, *moves: Path) -> subprocess.Popen:
    """A process of account ``uid`` in ``tree``'s main leaf (joined as root, as the
    spawner's preexec does) that then moves itself into ``moves``; returns once it said
    what each move did (``.said``)."""
    def preexec():
        device_cgroup.join(tree.procs_file)
        os.setgid(uid)
        os.setuid(uid)

    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", MOVER, *map(str, moves)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, preexec_fn=preexec)
    proc.said = json.loads(proc.stdout.readline())
    return proc


def test_a_user_moves_only_into_the_leaves_of_slots_their_own_server_holds(root):
    mount, parent = root
    ann, ben = tree_with_slot(root), tree_with_slot(root, "pdl-ben", BEN, "cpu:1")
    assert oct(ann.path.stat().st_mode & 0o777) == "0o755" and (ann.path / cgroup_v2.MAIN).is_dir()
    procs = []
    try:
        # ann's engine: into her slot's leaf, not into ben's leaf or main, not back into the pool's parent
        procs.append(start(ANN, ann, ben.slot_path("cpu:1"), ben.path / cgroup_v2.MAIN, mount / parent,
                           ann.slot_path("cpu:0")))
        assert procs[-1].said == ["Permission denied"] * 3 + ["moved"]
        assert ann.slot_pids("cpu:0") == [procs[-1].pid] and ann.pids() == [procs[-1].pid]
        # ben's process, started in his own main leaf: not into ann's slot (granted to her)
        procs.append(start(BEN, ben, ann.slot_path("cpu:0")))
        assert procs[-1].said == ["Permission denied"]
        assert ben.pids() == [procs[-1].pid] and ann.slot_pids("cpu:0") == [procs[0].pid]
        # a slot not granted has no leaf
        assert not ann.slot_path("cpu:2").exists() and procs[0].poll() is None
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_taking_a_slot_back_ends_what_is_in_its_leaf_and_nothing_else(root):
    ann = tree_with_slot(root)
    kernel = start(ANN, ann)  # stays in main
    engine = start(ANN, ann, ann.slot_path("cpu:0"))
    procs = [kernel, engine]
    try:
        assert engine.said == ["moved"]
        assert ann.take_back("cpu:0") == []
        assert engine.wait(10) == -9 and kernel.poll() is None
        assert not ann.slot_path("cpu:0").exists()
        # given back to root: ann cannot move into the slot even where its leaf is made again
        ann.grant("cpu:0", [0], ANN)
        os.chown(ann.slot_path("cpu:0") / "cgroup.procs", 0, -1)
        procs.append(start(ANN, ann, ann.slot_path("cpu:0")))
        assert procs[-1].said == ["Permission denied"]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_killing_the_tree_ends_every_leaf_and_removing_it_leaves_nothing(root):
    mount, parent = root
    ann = tree_with_slot(root)
    procs = [start(ANN, ann), start(ANN, ann, ann.slot_path("cpu:0"))]
    assert sorted(ann.pids()) == sorted(p.pid for p in procs)
    with pytest.raises(OSError) as busy:
        ann.remove()
    assert busy.value.errno == errno.EBUSY
    assert ann.kill_all(10) == []
    assert [p.wait(10) for p in procs] == [-9, -9]
    ann.remove()
    assert not ann.path.exists() and (mount / parent).is_dir()


def test_the_bind_filter_of_the_servers_folder_holds_in_its_leaves(root):
    """The device and bind filters are attached to the server's folder; its processes run
    in the leaves below it, where the kernel applies the folder's programs too."""
    mount, parent = root
    problem = port_filter.support()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    ann = tree_with_slot(root)
    port_filter.PortCgroup("pdl-ann", parent=parent).restrict(29921, 29930, 29925, 29925)
    binds = ("import socket\nfor port in (29922, 29925):\n    s = socket.socket()\n    try:\n"
             "        s.bind(('127.0.0.1', port)); print(port, 'bound')\n"
             "    except OSError as e:\n        print(port, e.strerror)\n    s.close()\n")
    for leaf in (ann.path / cgroup_v2.MAIN, ann.slot_path("cpu:0")):
        done = subprocess.run([sys.executable, "-I", "-S", "-c", binds], capture_output=True, text=True, timeout=30,
                              preexec_fn=lambda leaf=leaf: device_cgroup.join(leaf / "cgroup.procs"))
        assert done.stdout.splitlines() == ["29922 Operation not permitted", "29925 bound"], (leaf, done)


def test_where_the_v1_controllers_have_them_the_hub_says_why_it_uses_those():
    if os.geteuid() != 0:
        pytest.skip("needs root")
    v1 = {c for kind, _, options in device_cgroup.cgroup_mounts() if kind == "cgroup" for c in options}
    bound_to_v1 = [c for c in cgroup_v2.CONTROLLERS if c in v1]
    found, why = cgroup_v2.support()
    if not bound_to_v1:
        pytest.skip("this machine's v1 hierarchies hold none of the controllers")
    assert found is None
    assert why.startswith("cgroup v2 limits are off: ") and all(c in why for c in bound_to_v1), why
