"""The lab's own accounts through a real hub (PDL_ACCOUNTS=lab, PDL_ALLOWED_GROUP), with
each of the lab's logins:

- ``pam`` (PDL_AUTH=pam): local accounts, their group and passwords made here with
  useradd and chpasswd, checked by the machine's real PAM;
- ``ldap`` (PDL_AUTH=ldap): the people and group of a real slapd of the test's own, made
  Unix accounts of the machine by nslcd (tests/harness/lab_directory.py), checked by
  jupyterhub-ldapauthenticator's bind as the person.

Either way people log in with the lab's password through the hub's login form, and their
server, kernel and engines run as their own uid; a person neither listed nor in the
group cannot log in, a listed one outside it cannot run, the first listed is the admin
(the admin view), wrong passwords lock the name, and a name that could be a filter or a
DN never logs in. Needs root."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import subprocess

import pytest

import lab_directory
from hub_harness import Kernel, open_path_to, remove_account, running, runs_as_root, uid_of, user_processes
from lab_hub import LabHub

pytestmark = pytest.mark.skipif(not runs_as_root() and not os.environ.get("CI"),
                                reason="the lab's accounts and their password checks need root")

POOL = ["cpu:0", "cpu:1"]
#: The lab's people: members of its group, then not.
MEMBERS, OTHERS = ("ann", "ben"), ("cid", "dan")


@contextlib.contextmanager
def local_accounts(homes, names: dict[str, str], passwords: dict[str, str], group: str):
    """The lab's accounts in /etc/passwd (useradd), removed afterwards."""
    subprocess.run(["groupadd", group], check=True)
    try:
        for who, name in names.items():
            groups = ["--groups", group] if who in MEMBERS else []
            subprocess.run(["useradd", "--create-home", "--home-dir", str(homes / name), "--shell", "/bin/bash",
                            *groups, name], check=True)
        subprocess.run(["chpasswd"], input="".join(f"{n}:{p}\n" for n, p in passwords.items()), text=True,
                       check=True)
        yield {"PDL_AUTH": "pam"}
    finally:
        for name in names.values():
            remove_account(name)  # after the hub: no process of it left
        subprocess.run(["groupdel", group], capture_output=True)


@contextlib.contextmanager
def directory_accounts(root, homes, names: dict[str, str], passwords: dict[str, str], group: str):
    """The lab's people and group in a real LDAP directory, Unix accounts through nslcd."""
    if lab_directory.problem() is not None and not os.environ.get("CI"):
        pytest.skip(lab_directory.problem())
    first = lab_directory.free_ids(len(names) + 1)
    people = [lab_directory.Person(name, first + i, passwords[name], homes / name,
                                   (group,) if who in MEMBERS else ())
              for i, (who, name) in enumerate(names.items())]
    with lab_directory.lab_directory(root / "directory", people, {group: first + len(names)}) as directory:
        yield {"PDL_AUTH": "ldap", "PDL_LDAP_URL": directory.url, "PDL_LDAP_USER_DN": directory.user_dn}


@pytest.fixture(scope="module", params=["pam", "ldap"])
def lab(request, tmp_path_factory):
    """The lab, with the login ``request.param``: ``ann`` and ``ben``, members of its group,
    ``cid`` and ``dan`` not; each with a home and a password. ``ann`` and ``cid`` are listed
    on the hub (``ann`` its admin)."""
    tag = secrets.token_hex(2)
    root = tmp_path_factory.mktemp(f"lab-hub-{request.param}")
    homes = root / "lab-homes"
    homes.mkdir()
    open_path_to(homes)
    group = f"lab{tag}"
    names = {who: f"{who}{tag}" for who in (*MEMBERS, *OTHERS)}
    passwords = {name: secrets.token_urlsafe(12) for name in names.values()}
    accounts = (local_accounts(homes, names, passwords, group) if request.param == "pam"
                else directory_accounts(root, homes, names, passwords, group))
    with accounts as login_env:
        hub = LabHub(root, [names["ann"], names["cid"]], POOL, passwords,
                     {**login_env, "PDL_ALLOWED_GROUP": group, "PDL_LOGIN_ATTEMPTS": "2"})
        with running(hub) as started:
            yield started, names


def test_a_member_logs_in_with_the_labs_password_and_a_cell_runs_on_two_workers_as_their_uid(lab):
    hub, names = lab
    ben = names["ben"]  # not listed: a member of the allowed group
    _, refused = hub.try_login(ben, "not-" + hub.password(ben))
    assert refused, "a wrong password let ben in"
    _, said = hub.try_login(ben)
    assert said == "", said
    r = hub.spawn(ben, 2)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(ben)
    uid = pwd.getpwnam(ben).pw_uid
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
        assert {uid_of(pid) for pid in processes} - {None} == {uid}, "not all ran as ben's own uid"
    finally:
        kernel.close()
    assert hub.api("DELETE", f"/users/{ben}/server").status_code in (202, 204)


def test_someone_neither_listed_nor_in_the_group_cannot_log_in(lab):
    hub, names = lab
    _, said = hub.try_login(names["dan"])  # his right password
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


def test_the_admin_logged_in_with_the_labs_password_sees_the_admin_view_and_others_do_not(lab):
    """The first listed person is the hub's admin, whichever login proved them."""
    hub, names = lab
    view = f"{hub.service_url('pdl-admin')}/"
    page = hub.login(names["ann"]).get(view, timeout=30)
    assert page.status_code == 200 and page.url == view, (page.status_code, page.url)
    assert hub.login(names["cid"]).get(view, timeout=30).status_code == 403


@pytest.mark.parametrize("name", ["*", "ann)(uid=*", "uid=ann,ou=people,dc=lab,dc=test"])
def test_a_name_that_could_be_a_filter_or_a_dn_never_logs_in(lab, name):
    """Guards GuardedLogin's name check (pdl_spawner/accounts/lab_logins.py), before PAM or
    the directory hears of a name: a filter or a DN in the name field is nobody."""
    hub, names = lab
    _, said = hub.try_login(name, hub.password(names["ann"]))
    assert said and "Too many" not in said, said


def test_a_huge_name_at_the_labs_login_gets_400_in_one_line_and_is_not_filled_back(lab):
    """The attack (issue 60, 1): a failed login's name, of any length, stayed in the hub
    (the lockout's counts) and came back whole in the page. The lab's login page
    (pdl_spawner/accounts/pages.py LabLoginHandler) refuses a name past 256 characters
    before the lab's check hears of it, and quotes none of it."""
    import requests

    from hub_harness import page_alert

    hub, _ = lab
    browser = requests.Session()
    browser.get(f"{hub.url}/hub/login", timeout=10).raise_for_status()
    r = browser.post(f"{hub.url}/hub/login", timeout=30, allow_redirects=False, data={
        "_xsrf": browser.cookies.get("_xsrf", ""), "username": "n" * 300_000, "password": "a-guess"})
    assert r.status_code == 400 and "n" * 300 not in r.text, (r.status_code, len(r.text))
    assert page_alert(r.text) == "The user name may have at most 256 characters; this one has 300000."


def test_wrong_passwords_lock_the_name_at_the_hubs_login(lab):
    """PDL's lockout around the lab's check, set as for PDL's own login (PDL_LOGIN_ATTEMPTS=2 here)."""
    hub, names = lab
    ann = names["ann"]
    for guess in ("guess-1", "guess-2"):
        _, said = hub.try_login(ann, guess)
        assert said and "Too many" not in said, said
    _, said = hub.try_login(ann)  # her right password, locked out
    assert "Too many failed logins" in said, said
