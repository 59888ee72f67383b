"""The lab's own accounts through a real hub (PDL_AUTH=pam, PDL_ACCOUNTS=lab,
PDL_ALLOWED_GROUP): people log in with their machine passwords through the hub's login
form, and their server and engines run as their own Unix accounts; a person outside the
allowed group cannot log in, and a listed one outside it cannot run. The accounts, the
group and their passwords are real, made here (root)."""

from __future__ import annotations

import os
import pwd
import secrets
import subprocess

import pytest

from hub_harness import open_path_to, remove_account, running, runs_as_root, user_processes
from lab_hub import LabHub

pytestmark = pytest.mark.skipif(not runs_as_root() and not os.environ.get("CI"),
                                reason="the lab's accounts and PAM's password check need root")

POOL = ["cpu:0", "cpu:1"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The lab: ``ann`` and ``ben``, members of its group, ``cid`` and ``dan`` not; each
    with a home and a password. ``ann`` and ``cid`` are listed on the hub (``ann`` its admin)."""
    tag = secrets.token_hex(2)
    root = tmp_path_factory.mktemp("lab-hub")
    homes = root / "lab-homes"
    homes.mkdir()
    open_path_to(homes)
    group = f"lab{tag}"
    names = {who: f"{who}{tag}" for who in ("ann", "ben", "cid", "dan")}
    passwords = {name: secrets.token_urlsafe(12) for name in names.values()}
    subprocess.run(["groupadd", group], check=True)
    try:
        for who, name in names.items():
            groups = ["--groups", group] if who in ("ann", "ben") else []
            subprocess.run(["useradd", "--create-home", "--home-dir", str(homes / name), "--shell", "/bin/bash",
                            *groups, name], check=True)
        subprocess.run(["chpasswd"], input="".join(f"{n}:{p}\n" for n, p in passwords.items()), text=True,
                       check=True)
        hub = LabHub(root, [names["ann"], names["cid"]], POOL, passwords,
                     {"PDL_AUTH": "pam", "PDL_ALLOWED_GROUP": group, "PDL_LOGIN_ATTEMPTS": "2"})
        with running(hub) as started:
            yield started, names
    finally:
        for name in names.values():
            remove_account(name)  # after the hub: no process of it left
        subprocess.run(["groupdel", group], capture_output=True)


def test_a_lab_member_logs_in_with_their_password_and_runs_as_their_own_account(lab):
    hub, names = lab
    ben = names["ben"]  # not listed: a member of the allowed group
    _, refused = hub.try_login(ben, "not-" + hub.password(ben))
    assert refused, "a wrong machine password let ben in"
    _, said = hub.try_login(ben)
    assert said == "", said
    r = hub.spawn(ben, 2)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(ben)
    uid = pwd.getpwnam(ben).pw_uid
    processes = user_processes(hub.home(ben))
    engines = [pid for pid, role in processes.items() if role == "engine"]
    assert len(engines) == 2, processes
    assert {os.stat(f"/proc/{pid}").st_uid for pid in processes} == {uid}, "not all ran as ben's own account"
    assert hub.api("DELETE", f"/users/{ben}/server").status_code in (202, 204)


def test_someone_neither_listed_nor_in_the_group_cannot_log_in(lab):
    hub, names = lab
    _, said = hub.try_login(names["dan"])  # his right machine password
    assert said, "dan, neither listed nor in the group, was let in"
    _, said = hub.try_login(names["cid"])  # listed: he may log in (and is refused a server, below)
    assert said == "", said


def test_a_listed_person_outside_the_group_is_refused_a_server_in_one_line(lab):
    hub, names = lab
    cid = names["cid"]
    r = hub.spawn(cid, 1)
    if r.status_code in (201, 202):  # refused while it starts: the progress says why
        ok, message = hub.wait_spawned(cid)
        assert not ok
    else:
        message = r.json().get("message", r.text)
    assert f"is not in group {hub.hub_env['PDL_ALLOWED_GROUP']}" in message and "\n" not in message, message
    assert not user_processes(hub.home(cid))


def test_wrong_machine_passwords_lock_the_name_at_the_hubs_login(lab):
    """PDL's lockout around PAM, set as for PDL's own login (PDL_LOGIN_ATTEMPTS=2 here)."""
    hub, names = lab
    ann = names["ann"]
    for guess in ("guess-1", "guess-2"):
        _, said = hub.try_login(ann, guess)
        assert said and "Too many" not in said, said
    _, said = hub.try_login(ann)  # her right password, locked out
    assert "Too many failed logins" in said, said
