"""The lab's LDAP directory through a real hub (PDL_AUTH=ldap, PDL_ACCOUNTS=lab,
PDL_ALLOWED_GROUP): a real slapd holds the lab's people and groups, nslcd makes them Unix
accounts of the machine (tests/harness/lab_directory.py), and jupyterhub-ldapauthenticator
binds as the person. People log in with their directory password, and their server, kernel
and engines run as their directory uid; a person neither listed nor in the group cannot
log in, a listed one outside it cannot run, wrong passwords lock the name, and a name
that could be a filter or a DN never reaches the directory."""

from __future__ import annotations

import json
import os
import pwd
import secrets

import pytest

import lab_directory
from hub_harness import Kernel, open_path_to, running, user_processes
from lab_hub import LabHub

pytestmark = pytest.mark.skipif(lab_directory.problem() is not None and not os.environ.get("CI"),
                                reason=str(lab_directory.problem()))

POOL = ["cpu:0", "cpu:1"]


def free_uids(count: int) -> int:
    """The first of ``count`` uids in a row (and gids: each person's own group has their
    number) that no account or group of the machine has, from 40000 up."""
    import grp

    taken = {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    first = 40000 + secrets.randbelow(20000)
    while any(uid in taken for uid in range(first, first + count)):
        first += count
    return first


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The lab's directory: ``ann`` and ``ben`` in its group, ``cid`` and ``dan`` not, each
    with a home and a password; ``ann`` (the admin) and ``cid`` listed on the hub."""
    tag = secrets.token_hex(2)
    root = tmp_path_factory.mktemp("ldap-hub")
    homes = root / "lab-homes"
    homes.mkdir()
    open_path_to(homes)
    group = f"ml{tag}"
    first = free_uids(5)
    people = [lab_directory.Person(f"{who}{tag}", first + i, secrets.token_urlsafe(12), homes / f"{who}{tag}",
                                   (group,) if who in ("ann", "ben") else ())
              for i, who in enumerate(("ann", "ben", "cid", "dan"))]
    names = {p.name[:3]: p.name for p in people}
    with lab_directory.lab_directory(root / "directory", people, {group: first + 4}) as directory:
        hub = LabHub(root, [names["ann"], names["cid"]], POOL, {p.name: p.password for p in people},
                     {"PDL_AUTH": "ldap", "PDL_LDAP_URL": directory.url, "PDL_LDAP_USER_DN": directory.user_dn,
                      "PDL_ALLOWED_GROUP": group, "PDL_LOGIN_ATTEMPTS": "2"})
        with running(hub) as started:
            yield started, names, directory


def test_a_person_logs_in_with_their_directory_password_and_a_cell_runs_on_two_workers_as_their_uid(lab):
    hub, names, directory = lab
    ben = names["ben"]  # not listed: a member of the allowed group
    _, refused = hub.try_login(ben, "not-" + hub.password(ben))
    assert refused, "a wrong directory password let ben in"
    _, said = hub.try_login(ben)
    assert said == "", said
    r = hub.spawn(ben, 2)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(ben)
    uid = directory.people[ben].uid
    kernel = Kernel(hub, ben)
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        # each rank's uid and home, gathered through the cell's process group (rank 0 prints)
        out = kernel.execute_ok("%%distributed -n 2\nimport json, os, torch.distributed as dist\n"
                                "seen = [None] * world_size\n"
                                "dist.all_gather_object(seen, {'rank': rank, 'uid': os.getuid(), "
                                "'home': os.environ['HOME']})\n"
                                "print(json.dumps(seen))")
        seen = json.loads(out["stdout"].strip().splitlines()[-1])
        assert sorted(s["rank"] for s in seen) == [0, 1], out
        assert {s["uid"] for s in seen} == {uid} and {s["home"] for s in seen} == {str(hub.home(ben))}, seen
        processes = user_processes(hub.home(ben))
        assert sum(role == "engine" for role in processes.values()) == 2, processes
        assert {os.stat(f"/proc/{pid}").st_uid for pid in processes} == {uid}, "not all ran as ben's own uid"
    finally:
        kernel.close()
    assert hub.api("DELETE", f"/users/{ben}/server").status_code in (202, 204)


def test_someone_neither_listed_nor_in_the_group_cannot_log_in(lab):
    hub, names, _ = lab
    _, said = hub.try_login(names["dan"])  # his right directory password
    assert said, "dan, neither listed nor in the group, was let in"
    _, said = hub.try_login(names["cid"])  # listed: he may log in (and is refused a server, below)
    assert said == "", said


def test_a_listed_person_outside_the_group_is_refused_a_server_in_one_line(lab):
    hub, names, _ = lab
    cid = names["cid"]
    r = hub.spawn(cid, 1)
    if r.status_code in (201, 202):  # refused while it starts: the progress says why
        ok, message = hub.wait_spawned(cid)
        assert not ok
    else:
        message = r.json().get("message", r.text)
    assert f"is not in group {hub.hub_env['PDL_ALLOWED_GROUP']}" in message and "\n" not in message, message
    assert not user_processes(hub.home(cid))


@pytest.mark.parametrize("name", ["*", "ann)(uid=*", "uid=ann,ou=people,dc=lab,dc=test"])
def test_a_name_that_could_be_a_filter_or_a_dn_never_logs_in(lab, name):
    """Guards the name check of GuardedLogin (pdl_spawner/accounts/lab_logins.py) before
    the directory hears of a name: a filter or a DN in the name field binds as nobody."""
    hub, names, _ = lab
    _, said = hub.try_login(name, hub.password(names["ann"]))
    assert said and "Too many" not in said, said


def test_wrong_directory_passwords_lock_the_name_at_the_hubs_login(lab):
    """PDL's lockout around the LDAP bind, set as for PDL's own login (PDL_LOGIN_ATTEMPTS=2 here)."""
    hub, names, _ = lab
    ann = names["ann"]
    for guess in ("guess-1", "guess-2"):
        _, said = hub.try_login(ann, guess)
        assert said and "Too many" not in said, said
    _, said = hub.try_login(ann)  # her right password, locked out
    assert "Too many failed logins" in said, said
