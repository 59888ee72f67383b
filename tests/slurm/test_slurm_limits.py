"""Limits per user are Slurm's own: a QOS with ``MaxTRESPerUser`` (slurmdbd's accounting
on the simulated cluster), applied to PDL's reservations and the user's other jobs alike.
PDL adds each user to the lab's Slurm account (``PDL_SLURM_ACCOUNT``) and keeps no
count of its own."""

from __future__ import annotations

import pytest

import slurm_harness
from hub_harness import running
from slurm_hub_harness import SlurmHub, slurm_hub_fixture
from waiting import wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def hub(slurm, tmp_path_factory):
    # every reservation under the QOS that allows 2 GPUs per user; PDL's own cap is higher
    yield from slurm_hub_fixture(tmp_path_factory.mktemp("slurm-limits"), slurm, ["admin", "ann", "ben"],
                                 extra_config=f'c.PDLSlurmSpawner.sbatch_args = ["--qos={slurm_harness.TWO_GPU_QOS}"]\n'
                                              'c.PDLSlurmSpawner.max_workers = 3')


def refusal(r) -> str:
    assert r.status_code == 409, r.text
    message = r.json()["message"]
    assert "\n" not in message, message
    return message


def test_a_qos_per_user_limit_counts_pdl_and_other_jobs_of_the_person_and_nobody_else(hub, slurm):
    # the form says what Slurm allows her before she asks: the QOS's 2 within PDL's 3
    qos_line = f"Slurm QOS {slurm_harness.TWO_GPU_QOS}: at most 2 GPUs per user."
    assert f"You may hold 2 workers; you hold 0. {qos_line}" in hub.login("ann").get(f"{hub.url}/hub/spawn").text
    # more than the QOS allows one person: refused at once in Slurm's words, no job left
    message = refusal(hub.spawn("ann", 3))
    assert "reason QOSMaxGRESPerUser" in message, message
    wait_until(lambda: not hub.pdl_jobs("ann"), 30, what=lambda: f"ann's refused job to go: {slurm.jobs()}")

    # PDL made ann a member of the lab's account, so the account's QOS applies to her
    account = hub.account("ann")
    def limits():
        assoc = slurm.run("sacctmgr", "--noheader", "--parsable2", "list", "associations", f"users={account}",
                          "format=Account,QOS", check=True).stdout.split()
        qos = slurm.run("sacctmgr", "--noheader", "--parsable2", "list", "qos", slurm_harness.TWO_GPU_QOS,
                        "format=MaxTRESPU", check=True).stdout.split()
        return assoc, qos

    assert limits() == ([f"{slurm_harness.LAB_ACCOUNT}|normal,{slurm_harness.TWO_GPU_QOS}"], ["gres/gpu=2"])
    # ...and she cannot raise her own limit, nor join another account: only Slurm's
    # administrators change a QOS or an association
    for change in (["modify", "qos", slurm_harness.TWO_GPU_QOS, "set", "MaxTRESPerUser=gres/gpu=3"],
                   ["add", "user", account, "account=root"]):
        raised = slurm.run("sacctmgr", "--immediate", *change, user=account, home=str(hub.home("ann")))
        said = raised.stdout + raised.stderr
        assert raised.returncode != 0 and ("permission denied" in said or "privilege" in said), said
    assert limits() == ([f"{slurm_harness.LAB_ACCOUNT}|normal,{slurm_harness.TWO_GPU_QOS}"], ["gres/gpu=2"])

    # a batch job of her own under the same QOS holds 1 GPU: Slurm counts it with PDL's job
    own = slurm.run("sbatch", "--parsable", f"--qos={slurm_harness.TWO_GPU_QOS}",
                    f"--account={slurm_harness.LAB_ACCOUNT}", "--gpus=1", "--output=/dev/null",
                    "--wrap=exec sleep infinity", user=account, home=str(hub.home("ann")), check=True)
    own_id = own.stdout.strip().split(";")[0]
    wait_until(lambda: (slurm.job(int(own_id)) or {}).get("state") == "RUNNING", 30,
               what=lambda: f"ann's own job to run: {slurm.jobs()}")
    message = refusal(hub.spawn("ann", 2))
    assert "reason QOSMaxGRESPerUser" in message, message
    assert f"You may hold 2 workers; you hold 1. {qos_line}" in hub.login("ann").get(f"{hub.url}/hub/spawn").text

    # ...while the limit is per person: ben gets 2 of the GPUs left at once
    r = hub.spawn("ben", 2)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ben", timeout=120)
    [bens] = hub.pdl_jobs("ben")
    assert bens["state"] == "RUNNING" and bens["nodes"] == "2", bens

    # once her own job has ended, ann gets the one GPU left
    slurm.run("scancel", own_id, check=True)
    wait_until(lambda: slurm.job(int(own_id)) is None, 30, what=lambda: f"ann's own job to end: {slurm.jobs()}")
    r = hub.spawn("ann", 1)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ann", timeout=120)
    [anns] = hub.pdl_jobs("ann")
    assert anns["state"] == "RUNNING" and anns["user"] == account, anns

    for user in ("ann", "ben"):
        r = hub.api("DELETE", f"/users/{user}/server")
        assert r.status_code in (202, 204), r.text
    wait_until(lambda: not hub.pdl_jobs() and {n["state"] for n in slurm.nodes().values()} == {"idle"}, 60,
               what=lambda: f"every PDL job gone and every node idle: {slurm.jobs()} {slurm.nodes()}")
    # first spawns of new accounts, refusals, stops: nothing the admin must look into
    assert [line for line in hub.log_tail(2000).splitlines() if "could not cancel" in line] == []


def test_a_user_slurm_does_not_know_is_refused_in_one_line_naming_slurms_reason(hub, slurm, tmp_path_factory):
    """Without PDL_SLURM_ACCOUNT, PDL leaves associations to the admin: a user who has
    none cannot submit, and is told so in Slurm's words."""
    root = tmp_path_factory.mktemp("slurm-no-account")
    with running(SlurmHub(root, slurm, ["cat"], hub_env={"PDL_SLURM_ACCOUNT": ""})) as bare:
        message = refusal(bare.spawn("cat", 1))
        assert message.startswith("Slurm refused a job for 1 GPU(s)"), message
        assert "Invalid account" in message, message
        assert not bare.pdl_jobs("cat")


def test_extend_raises_the_jobs_time_limit_up_to_the_qos_maxwall_and_then_says_so_in_slurms_words(hub, slurm):
    """Guards PDLSlurmSpawner.extend_session: the hub extends the job as one of Slurm's
    administrators, which Slurm would let past the QOS, so it holds it to MaxWall itself."""
    r = hub.spawn("ann", 1)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ann", timeout=120)
    [job] = hub.pdl_jobs("ann")
    qos = slurm_harness.TWO_GPU_QOS
    slurm.run("scontrol", "update", f"JobId={job['id']}", "TimeLimit=10", check=True)
    slurm.run("sacctmgr", "--immediate", "modify", "qos", qos, "set", "MaxWall=00:40:00", check=True)
    try:
        token = hub.user_token("ann")
        def extension():
            session = hub.server_api("ann", "/pdl/api/cluster", token)["session"]
            return session and session["extendable"] and session["extension"]

        assert hub.server_api("ann", "/pdl/api/extend", token, method="POST")["ok"]
        said = wait_until(lambda: (e := extension()) and not e.startswith("Asking") and e, 30,
                          what="the hub's answer to ann's Extend")
        assert said.startswith("Extended: your session now ends at "), said
        limit = slurm.run("squeue", "-h", "-j", str(job["id"]), "-o", "%l", check=True).stdout.strip()
        assert limit == "40:00", limit  # 10 + 60 minutes asked, 40 allowed

        assert hub.server_api("ann", "/pdl/api/extend", token, method="POST")["ok"]
        said = wait_until(lambda: (e := extension()) and not e.startswith("Asking") and e, 30,
                          what="the hub's answer to ann's second Extend")
        assert said == f"Not extended: Slurm QOS {qos} allows jobs of at most 00:40:00 (MaxWall)", said
    finally:
        slurm.run("sacctmgr", "--immediate", "modify", "qos", qos, "set", "MaxWall=-1", check=True)
        hub.api("DELETE", "/users/ann/server")
    wait_until(lambda: not hub.pdl_jobs(), 60, what=lambda: f"ann's job to go: {slurm.jobs()}")
