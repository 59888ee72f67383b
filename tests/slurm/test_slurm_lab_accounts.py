"""Slurm with the lab's own accounts (PDL_SPAWNER=slurm, PDL_AUTH=ldap, PDL_ACCOUNTS=lab,
no PDL_SLURM_ACCOUNT): the lab's people are in a real LDAP directory, Unix accounts of
every node of the simulated cluster through the same nslcd (one machine's NSS), and the
lab's admin gave each an association in Slurm's accounting, as a site does. A person logs
in with their directory password; their reservation job and its engine steps run as
their own uid on the nodes and are charged to their own association, in Slurm's own
view (squeue, sacct)."""

from __future__ import annotations

import os
import secrets

import pytest

import lab_directory
from hub_harness import open_path_to, running
from lab_hub import LabAccounts
from slurm_hub_harness import SlurmHub, slurm_engines, spawn_and_sum
from waiting import wait_until

pytestmark = pytest.mark.slurm


class LabSlurmHub(LabAccounts, SlurmHub):
    """:class:`SlurmHub` whose users log in as the lab's people (``login_env``) and run as
    their own accounts, charged to the associations they have (PDL adds none)."""

    def __init__(self, root, slurm, users: list[str], passwords: dict[str, str], login_env: dict[str, str]):
        super().__init__(root, slurm, users, hub_env={**login_env, "PDL_ACCOUNTS": "lab", "PDL_SLURM_ACCOUNT": ""})
        self.passwords = dict(passwords)


@pytest.fixture(scope="module")
def lab(slurm, tmp_path_factory):
    """The lab's people ``ann`` and ``ben`` in its directory, each with an association
    under the lab's own Slurm account; a hub where they log in. Afterwards no job of
    theirs is left, and their associations are gone."""
    if lab_directory.problem() is not None and not os.environ.get("CI"):
        pytest.skip(lab_directory.problem())
    tag = secrets.token_hex(2)
    root = tmp_path_factory.mktemp("slurm-lab")
    homes = root / "lab-homes"
    homes.mkdir()
    open_path_to(homes)  # every node sees the test's folder: one file system
    first = lab_directory.free_ids(2)
    people = [lab_directory.Person(f"{who}{tag}", first + i, secrets.token_urlsafe(12), homes / f"{who}{tag}")
              for i, who in enumerate(("ann", "ben"))]
    names = [p.name for p in people]
    account = f"lab{tag}"
    with lab_directory.lab_directory(root / "directory", people, {}) as directory:
        slurm.run("sacctmgr", "--immediate", "add", "account", account, "Description=the-lab", "Organization=lab",
                  check=True)
        slurm.run("sacctmgr", "--immediate", "add", "user", ",".join(names), f"Account={account}", check=True)
        try:
            hub = LabSlurmHub(root, slurm, names, {p.name: p.password for p in people},
                              {"PDL_AUTH": "ldap", "PDL_LDAP_URL": directory.url,
                               "PDL_LDAP_USER_DN": directory.user_dn})
            with running(hub) as started:
                yield started, directory, account
            wait_until(lambda: not [j for j in slurm.jobs() if j["user"] in names], 60,
                       what=lambda: f"the lab's people's jobs to leave Slurm's queue: {slurm.jobs()}")
        finally:
            slurm.run("sacctmgr", "--immediate", "delete", "user", f"name={','.join(names)}")
            slurm.run("sacctmgr", "--immediate", "delete", "account", account)


def test_a_person_runs_a_job_as_their_own_uid_charged_to_their_own_association(lab, slurm):
    hub, directory, account = lab
    ann = next(name for name in directory.people if name.startswith("ann"))
    uid = directory.people[ann].uid
    _, said = hub.try_login(ann)
    assert said == "", said
    job, kernel = spawn_and_sum(hub, ann, 2)  # an all-reduce over her 2 engines, on 2 nodes
    kernel.close()
    # Slurm's own view of her reservation: her name, her uid, her association's account
    seen = slurm.run("squeue", "-h", "-j", job["id"], "-o", "%u|%U|%a", check=True).stdout.strip()
    assert seen == f"{ann}|{uid}|{account}", seen
    engines = slurm_engines(hub.root)
    assert len(engines) == 2 and {os.stat(f"/proc/{pid}").st_uid for pid in engines} == {uid}, engines
    assert hub.api("DELETE", f"/users/{ann}/server").status_code in (202, 204)
    wait_until(lambda: not hub.pdl_jobs(ann), 60, what=lambda: f"ann's job to go: {slurm.jobs()}")

    def charged():
        out = slurm.run("sacct", "-n", "-X", "-P", "-j", job["id"], "-o", "User,Account,State").stdout.strip()
        return out if out and "RUNNING" not in out else None

    assert wait_until(charged, 30, what="her job in Slurm's accounting").split("|")[:2] == [ann, account]
