"""Each server's own temporary places with the real kernel (:mod:`pdl_spawner.host.private_tmp`),
no mocks: a process started the way the spawner starts a server (the namespace entered
as root in the forked child, then root given up) writes to /tmp, /var/tmp and /dev/shm,
and the machine's own places never see it, nor does it see theirs. Needs root: skips
otherwise, and fails instead with ``$CI``."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from pdl_spawner.host.private_tmp import PLACES, PrivateTmp

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"), reason="mount namespaces need root"),
]

NOBODY = 65534

#: Run as nobody inside the namespace: writes a file in each place, says what it sees.
LOOK = r"""
import json, os, sys
marker = sys.argv[1]
for place in ("/tmp", "/var/tmp", "/dev/shm"):
    with open(os.path.join(place, marker + "-inside"), "w") as f:
        f.write("inside")
options = {}
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    if fields[4] in ("/tmp", "/var/tmp", "/dev/shm"):
        options[fields[4]] = fields[5].split(",")
print(json.dumps({"sees_marker": [p for p in ("/tmp", "/var/tmp", "/dev/shm") if os.path.exists(os.path.join(p, marker))],
                  "options": options, "uid": os.getuid()}))
"""


def run_inside(own: PrivateTmp, marker: str) -> dict:
    def preexec():
        own.enter()
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    done = subprocess.run([sys.executable, "-I", "-S", "-c", LOOK, marker], capture_output=True, text=True,
                          preexec_fn=preexec, cwd="/", timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_server_writes_to_its_own_places_and_sees_none_of_the_machines(tmp_path):
    own = PrivateTmp("pdl-ann", tmp_path / "private")
    own.prepare()
    marker = f"pdl-test-marker-{secrets.token_hex(6)}"
    machine = [Path(place) / marker for place in PLACES]
    try:
        for path in machine:
            path.write_text("the machine's")
        seen = run_inside(own, marker)
    finally:
        for path in machine:
            path.unlink(missing_ok=True)
    assert seen["uid"] == NOBODY and seen["sees_marker"] == []
    for place in PLACES:
        assert {"nosuid", "nodev"} <= set(seen["options"][place]), seen["options"]
        assert not (Path(place) / f"{marker}-inside").exists()  # the machine's places got nothing
    for folder in ("tmp", "var-tmp"):  # kept for the server's other processes, in root's folder
        assert (own.path / folder / f"{marker}-inside").read_text() == "inside"
    assert (tmp_path / "private").stat().st_mode & 0o777 == 0o700 and own.path.stat().st_mode & 0o777 == 0o700
    own.remove()
    assert not own.path.exists()


def test_two_owners_never_share_a_place(tmp_path):
    ann, ben = PrivateTmp("pdl-ann", tmp_path / "private"), PrivateTmp("pdl-ben", tmp_path / "private")
    ann.prepare()
    ben.prepare()
    run_inside(ben, "bens")
    assert not (ann.path / "tmp" / "bens-inside").exists() and (ben.path / "tmp" / "bens-inside").exists()


def test_a_new_start_begins_empty_and_links_inside_are_removed_not_followed(tmp_path):
    own = PrivateTmp("pdl-ann", tmp_path / "private")
    own.prepare()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not the server's")
    (own.path / "tmp" / "link").symlink_to(outside)
    (own.path / "tmp" / "left").write_text("from the last start")
    own.prepare()
    assert sorted(os.listdir(own.path / "tmp")) == [] and (outside / "keep").exists()


@pytest.mark.parametrize("planted", ["link", "wide", "foreign"])
def test_a_root_folder_someone_else_could_have_made_is_refused_in_one_line(tmp_path, planted):
    root = tmp_path / "private"
    if planted == "link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        root.symlink_to(tmp_path / "elsewhere")
    else:
        root.mkdir(mode=0o700)
        if planted == "wide":
            root.chmod(0o777)
        else:
            os.chown(root, NOBODY, NOBODY)
    with pytest.raises(RuntimeError, match=r"must be a folder of root's that only root can open") as refused:
        PrivateTmp("pdl-ann", root).prepare()
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "elsewhere" / "pdl-ann").exists()


def test_pdl_installed_under_tmp_is_refused_at_spawn_in_one_line(tmp_path):
    """Each server's own /tmp hides the machine's: a PDL installed there (a checkout in
    /tmp) could not start any server, and the spawn failed with a bare HTTP 500."""
    from tornado import web

    from pdl_spawner.host.private_tmp import hiding_place
    from pdl_spawner.local.spawner import PDLLocalSpawner

    assert hiding_place("/tmp/pdl/.venv/bin/python") == "/tmp" and hiding_place("/dev/shm") == "/dev/shm"
    assert hiding_place("/tmpfoo/python") is None and hiding_place("/opt/pdl/.venv/bin/python") is None
    user = type("User", (), {"name": "ann", "admin": False, "url": "/user/ann/", "escaped_name": "ann", "id": 1,
                             "server": None, "spawners": {}, "settings": {}, "orm_user": None})()
    spawner = PDLLocalSpawner(user=user, system_users=True, cmd=["/tmp/checkout/.venv/bin/python", "-m", "x"],
                              reservations_db=str(tmp_path / "r.sqlite"), pool=["cpu:0"])
    with pytest.raises(web.HTTPError) as refused:
        spawner._check_runnable()
    message = refused.value.log_message
    assert "has its own /tmp" in message and "\n" not in message and refused.value.status_code == 500
