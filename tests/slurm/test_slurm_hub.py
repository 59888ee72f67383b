"""PDLSlurmSpawner on the simulated Slurm cluster, through a real hub: the reservation is
a Slurm job of the user's own account, the engines its steps on the three nodes, and
Slurm's own view says who holds which GPU."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

import slurm_harness
from pdl_spawner.slurm.job_clock import READ_EVERY_S
from pdl_spawner.host import device_cgroup
from pdl_spawner.host.server import PORTS_A_SERVER
from hub_harness import (Kernel, Progress, admin_status, origin_answers, printed_usage, queue_up, release_ports,
                         squat_ports, usage_seconds)
from fault_cells import SUM, magic
from slurm_hub_harness import slurm_engines, slurm_hub_fixture, spawn_and_sum
from swarm_hub_harness import DDP_CELL, DDP_RESULT, HVD_CELL, HVD_RESULT
from waiting import wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def hub(slurm, tmp_path_factory):
    yield from slurm_hub_fixture(tmp_path_factory.mktemp("slurm-hub"), slurm, ["admin", "ann", "ben"],
                                 extra_config='c.PDLSlurmSpawner.partitions = ["gpu", "short"]\n'
                                              'c.PDLSlurmSpawner.max_time_limit = 30')


def test_three_gpus_are_one_job_of_the_users_account_and_ddp_trains_across_the_nodes(hub, slurm):
    spawned = time.time()
    r = hub.spawn("ann", 3)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ann", timeout=120)
    ready = time.time()

    [job] = hub.pdl_jobs("ann")
    assert job["user"] == hub.account("ann") and job["state"] == "RUNNING", job
    assert job["nodes"] == "3", job

    kernel = Kernel(hub, "ann")
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        out = kernel.execute(DDP_CELL, timeout=300)
        assert out["error"] is None, f"{out}\n{hub.log_tail()}"
        assert "Warning" not in out["stdout"] + out["stderr"], out
        hvd = kernel.execute(HVD_CELL, timeout=300)  # the same steps, now Horovod's ranks
        assert hvd["error"] is None, hvd
        hang = hang_report_then_ctrl_c(kernel)
    finally:
        kernel.close()
    # the hang watchdog reaches every step on its node (its signal goes through ipyparallel's nanny)
    sections = re.split(r"--- rank (\d) \((\S+)\), most recent call last ---\n", hang)
    stacks = {rank: (host, stack) for rank, host, stack in zip(sections[1::3], sections[2::3], sections[3::3])}
    assert sorted(stacks) == ["0", "1", "2"], hang
    assert sorted(host for host, _ in stacks.values()) == ["n1", "n2", "n3"], hang
    assert "dist.barrier()  # the others never arrive" in stacks["0"][1], hang
    assert all("time.sleep(600)" in stacks[rank][1] for rank in "12"), hang
    hvd_ranks = {int(rank): (int(cross), host) for rank, cross, host in HVD_RESULT.findall(hvd["stdout"])}
    assert sorted(hvd_ranks) == [0, 1, 2], hvd["stdout"]
    assert sorted(host for _, host in hvd_ranks.values()) == ["n1", "n2", "n3"]
    assert all(cross == rank for rank, (cross, _) in hvd_ranks.items()), hvd["stdout"]
    ranks = {int(m[0]): m[1:] for m in DDP_RESULT.findall(out["stdout"])}
    assert sorted(ranks) == [0, 1, 2], out["stdout"]
    assert sorted(host for host, *_ in ranks.values()) == ["n1", "n2", "n3"]
    assert {gpu for _, gpu, *_ in ranks.values()} == {"0"}
    assert len({weights for *_, weights in ranks.values()}) == 1, "DDP replicas diverged"

    # stop frees every GPU, in Slurm's own view
    stopping = time.time()
    r = hub.api("DELETE", "/users/ann/server")
    assert r.status_code in (202, 204), r.text
    wait_until(lambda: not hub.pdl_jobs("ann") and {n["state"] for n in slurm.nodes().values()} == {"idle"}, 60,
               what=lambda: f"ann's job gone and every node idle: {slurm.jobs()} {slurm.nodes()}")
    # by its id, and the log says which (the stop used to forget the id first: by name only)
    hub.wait_for_log(f"Cancelled Slurm job {job['id']} of ann", 10)

    # the usage report's GPU-hours come from Slurm's accounting (sacct), once slurmdbd has
    # the job's end: at least what the job surely held (3 GPUs from ready to the stop),
    # at most its whole life (Slurm's times are whole seconds)
    seen: list[float] = []
    wait_until(lambda: seen.append(usage_seconds(printed_usage(hub), "ann", "gpu")) or seen[-1:] == seen[-2:-1],
               30, what=lambda: f"slurmdbd to record the end of ann's job: {seen}")
    booked = seen[-1]
    assert 3 * (stopping - ready - 2) <= booked <= 3 * (time.time() - spawned + 2), (booked, stopping - ready)
    assert {r["kind"] for r in printed_usage(hub) if r["user"] == "ann"} == {"slurm"}
    [anns] = [r for r in admin_status(hub)["usage"] if r["user"] == "ann"]
    assert max(anns["gpu_week_h"], anns["gpu_month_h"]) * 3600 == pytest.approx(booked, abs=1.0), anns


HANG_CELL = """%%distributed -n 3 --hang-timeout 2
import time, torch.distributed as dist
if rank == 0:
    dist.barrier()  # the others never arrive
else:
    time.sleep(600)
"""


def hang_report_then_ctrl_c(kernel: Kernel) -> str:
    """Run :data:`HANG_CELL`, press Ctrl-C once the watchdog has reported, check every
    rank stopped; the report (stderr, from "No rank has made progress")."""
    def interrupt_after_report(_, text):
        if "Still waiting" in text:
            kernel.interrupt()

    out = kernel.execute(HANG_CELL, timeout=120, on_output=interrupt_after_report)
    assert out["error"] is not None and out["error"]["ename"] == "KeyboardInterrupt", out
    assert "all 3 ranks stopped" in out["stderr"], out
    text = re.sub(r"\x1b\[[0-9;]*m", "", out["stderr"])
    assert "No rank has made progress" in text and "Still waiting" in text, text
    return text[text.index("No rank has made progress"):text.index("Still waiting")]


def test_busy_gpus_a_direct_spawn_is_refused_with_slurms_reason_a_queued_one_waits_then_is_served(hub, slurm):
    r = hub.spawn("ann", 3)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ann", timeout=120)

    # refused in one line with Slurm's own reason, quickly, and no job left behind
    started = time.monotonic()
    r = hub.spawn("ben", 1)
    assert r.status_code == 409, r.text
    assert time.monotonic() - started < 20
    message = r.json()["message"]
    assert "Slurm cannot start 1 GPU(s) for you now (reason Resources)" in message and "\n" not in message
    wait_until(lambda: not hub.pdl_jobs("ben"), 30, what=lambda: f"ben's refused job to go: {slurm.jobs()}")
    if device_cgroup.support():  # nor his server's device cgroup (an empty one was left)
        assert not device_cgroup.DeviceCgroup(hub.account("ben")).path.exists()

    # with "wait in the queue": Slurm's queue, its reason and position on the spawn page (the
    # request returns once JupyterHub finds the spawn slow; after a failed spawn it says 201)
    r = hub.api("POST", "/users/ben/server", json={"workers": 1, "queue": True})
    assert r.status_code in (201, 202), r.text
    progress = Progress(hub, "ben")
    wait_until(lambda: progress.saw("Waiting in Slurm's queue for 1 GPU(s)") and progress.saw("reason Resources"),
               60, what=lambda: f"ben's progress to show Slurm's reason: {progress.messages}")
    [job] = hub.pdl_jobs("ben")
    assert job["state"] == "PENDING" and job["user"] == hub.account("ben"), job
    assert any(f"job {job['id']}, number 1 in partition gpu" in m for m in progress.messages), progress.messages

    # ann stops: Slurm starts ben's job, and his server comes up
    hub.api("DELETE", "/users/ann/server")
    wait_until(lambda: progress.ended is not None, 120, what="ben's spawn to end")
    assert progress.ended.get("ready"), progress.ended
    assert [j["state"] for j in hub.pdl_jobs("ben")] == ["RUNNING"]
    assert not hub.pdl_jobs("ann")
    hub.api("DELETE", "/users/ben/server")
    hub.wait_no_pdl_jobs()


def test_cancelling_a_queued_spawn_cancels_its_job(hub, slurm):
    slurm.sbatch("--ntasks=3", "--gpus-per-task=1", "--output=/dev/null", "--wrap=sleep 600", user=slurm_harness.ANN)
    queue_up(hub, "ben", 2)
    wait_until(lambda: [j["state"] for j in hub.pdl_jobs("ben")] == ["PENDING"], 30,
               what=lambda: f"ben's job pending: {slurm.jobs()}")
    r = hub.api("DELETE", "/users/ben/server")
    assert r.status_code in (202, 204), r.text
    wait_until(lambda: not hub.pdl_jobs("ben"), 30, what=lambda: f"ben's job cancelled: {slurm.jobs()}")
    wait_until(lambda: not hub.user_model("ben")["servers"], 30, what="ben's spawn to end")
    slurm.reset()


def test_a_dead_engine_comes_back_as_a_new_step_of_the_same_job_and_a_hub_restart_reattaches(hub, slurm):
    r = hub.spawn("ann", 3)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ann", timeout=120)
    [job] = hub.pdl_jobs("ann")
    engines = wait_until(lambda: e if len(e := slurm_engines(hub.root)) == 3 else None, 60, what="3 engine steps")
    assert {env["SLURM_JOB_ID"] for env in engines.values()} == {job["id"]}
    assert sorted(env["SLURMD_NODENAME"] for env in engines.values()) == ["n1", "n2", "n3"]

    kernel = Kernel(hub, "ann")
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        assert "sum 3" in kernel.execute_ok(magic(SUM, 3), timeout=120)["stdout"]
        kernel.execute_ok("x = 41")

        # an engine dies on its node: the server starts a new step in the same allocation
        victim = next(pid for pid, env in engines.items() if env["SLURMD_NODENAME"] == "n2")
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: len(e := slurm_engines(hub.root)) == 3 and victim not in e, 60,
                   what="a new engine step in place of the killed one")
        assert "sum 3" in kernel.execute_ok(magic(SUM, 3), timeout=180)["stdout"]
        assert [j["id"] for j in hub.pdl_jobs("ann")] == [job["id"]]
        kernel.detach()

        # the hub restarts (and then is killed and restarts): same job, engines, kernel state
        for sig in (signal.SIGTERM, signal.SIGKILL):
            steps = set(slurm_engines(hub.root))
            hub.stop_hub(sig)
            hub.start()
            hub.wait_ready("ann", timeout=60)
            assert [(j["id"], j["state"]) for j in hub.pdl_jobs("ann")] == [(job["id"], "RUNNING")]
            assert set(slurm_engines(hub.root)) == steps
        kernel = Kernel(hub, "ann", kernel.id)
        out = kernel.execute_ok(magic(SUM, 3), timeout=180)
        assert "sum 3" in out["stdout"]
        assert kernel.execute_ok("print(x + 1)")["stdout"].strip() == "42"
    finally:
        kernel.close()
    hub.api("DELETE", "/users/ann/server")
    wait_until(lambda: not hub.pdl_jobs() and not slurm_engines(hub.root), 60,
               what=lambda: f"ann's job and engines gone: {slurm.jobs()}")


def test_ben_cannot_reach_anns_job_engines_or_files(hub, slurm):
    """Guards that ann's job, its steps and her files are hers alone: the job is submitted
    as her own account (pdl_spawner/slurm/spawner.py: ``submit(argv, account=self.account)``), so
    Slurm's owner checks refuse ben's scancel, srun into it and scontrol update; her
    engines run as her account, so ben cannot signal them; her home is hers (mode 0700,
    unix_accounts). With one account shared by all users' jobs, each of these would work."""
    for user, gpus in (("ann", 2), ("ben", 1)):
        r = hub.spawn(user, gpus)
        assert r.status_code in (201, 202), r.text
        hub.wait_ready(user, timeout=120)
    [job] = hub.pdl_jobs("ann")
    assert job["user"] == hub.account("ann")
    assert origin_answers(hub, "ann") == {"own": 200, "hub": 302}  # her server is an origin of its own
    ben, ben_home = hub.account("ben"), str(hub.home("ben"))
    anns_engine = wait_until(lambda: next((p for p, env in slurm_engines(hub.root).items()
                                           if env["HOME"] == str(hub.home("ann"))), None), 60, what="ann's engine")

    tried = {
        "scancel": slurm.run("scancel", job["id"], user=ben, netns=None, home=ben_home),
        "srun": slurm.run("srun", f"--jobid={job['id']}", "--overlap", "-n1", "hostname", user=ben, netns=None, home=ben_home),
        "scontrol update": slurm.run("scontrol", "update", f"JobId={job['id']}", "TimeLimit=1", user=ben, netns=None, home=ben_home),
        "home": slurm.run("ls", str(hub.home("ann")), user=ben, netns=None, home=ben_home),
        "signal": slurm.run("kill", "-KILL", str(anns_engine), user=ben, netns=None, home=ben_home),
    }
    for what, done in tried.items():
        assert done.returncode != 0, f"ben could {what}: {done.stdout} {done.stderr}"
    assert "Access/permission denied" in tried["scancel"].stderr + tried["scancel"].stdout, tried["scancel"]
    assert [(j["id"], j["state"]) for j in hub.pdl_jobs("ann")] == [(job["id"], "RUNNING")]
    assert anns_engine in slurm_engines(hub.root)
    for user in ("ann", "ben"):
        hub.api("DELETE", f"/users/{user}/server")
    hub.wait_no_pdl_jobs()


def test_ben_cannot_squat_the_ports_the_hub_gives_servers_on_the_login_node(hub, slurm):
    """The attack of issue 27, 5, on Slurm: servers run on the login node (as on the
    embedded default), where ben's kernel tried to bind every port of port_range. Guards
    ``PDLLocalSpawner.restrict_ports``, which PDLSlurmSpawner's start keeps: of the range,
    ben's processes may bind only his own server's ports (its own and its controller's).
    And issue 60's shared channels there too (the attacks between two users are
    tests/hub/test_hub_neighbours.py's): his server has a System V IPC namespace of its
    own, not the login node's, and cannot lower its OOM score."""
    from pdl_spawner.host.account_limits import USER_OOM_SCORE_ADJ

    low, high = hub.port_range
    assert hub.spawn("ben", 1).status_code in (201, 202)
    hub.wait_ready("ben", timeout=120)
    kernel = Kernel(hub, "ben")
    try:
        found = squat_ports(kernel, low, high)
        release_ports(kernel)
        channels = json.loads(kernel.execute_ok("""
import json, os
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("0")
    lowered = "lowered"
except OSError as e:
    lowered = type(e).__name__
print(json.dumps({"ipc": os.stat("/proc/self/ns/ipc").st_ino, "lowered": lowered,
                  "score": int(open("/proc/self/oom_score_adj").read())}))
""")["stdout"].strip().splitlines()[-1])
    finally:
        kernel.close()
        hub.api("DELETE", "/users/ben/server")
        wait_until(lambda: not hub.pdl_jobs(), 60, what=lambda: f"ben's job to go: {slurm.jobs()}")
    assert set(found["squatted"]) <= set(found["own"]) and len(found["own"]) == PORTS_A_SERVER, found
    assert found["refused"] == high - low + 1 - PORTS_A_SERVER, found
    assert not low <= found["outside"] <= high
    assert channels["ipc"] != os.stat(f"/proc/{hub.proc.pid}/ns/ipc").st_ino, channels  # not the hub's
    assert channels["lowered"] == "OSError" and channels["score"] == USER_OOM_SCORE_ADJ, channels


def test_the_form_offers_the_admins_partitions_and_time_limits_and_refuses_others(hub, slurm):
    """Guards SlurmJobGpus.more_options and slurm_form: a partition or time
    limit the admin did not offer is refused in one line naming the valid ones, and
    nothing is submitted."""
    page = hub.login("ann").get(f"{hub.url}/hub/spawn").text
    assert "3 of 3 GPUs free" in page
    assert "You may hold 3 workers; you hold 0." in page
    assert 'name="partition"' in page and '<option value="gpu">' in page and '<option value="short">' in page
    assert 'name="time_limit"' in page and 'max="30"' in page
    for options, refusal in (({"workers": 1, "partition": "secret"}, "partition must be one of 'gpu', 'short'"),
                             ({"workers": 1, "time_limit": 99}, "time_limit must be minutes, a whole number from 1 "
                                                                "to 30, got 99"),
                             ({"workers": 1, "qos": "high"}, "spawn option not allowed: 'qos'")):
        r = hub.api("POST", "/users/ann/server", json=options)
        assert r.status_code == 400 and refusal in r.json()["message"], (options, r.text)
    assert not hub.pdl_jobs("ann")

    # Slurm's own limits decide, and the user reads Slurm's words at once: 3 GPUs are 3
    # nodes here, and the short partition allows 2 a job (Slurm refuses it at submission)
    started = time.monotonic()
    r = hub.api("POST", "/users/ann/server", json={"workers": 3, "partition": "short"})
    assert r.status_code == 409, r.text
    assert r.json()["message"] == ("Slurm refused a job for 3 GPU(s) in partition short: Batch job submission failed: "
                                   "Requested node configuration is not available"), r.text
    assert time.monotonic() - started < 20
    wait_until(lambda: not hub.pdl_jobs("ann"), 30, what=lambda: f"ann's refused job to go: {slurm.jobs()}")

    # the user's choice reaches Slurm
    r = hub.api("POST", "/users/ann/server", json={"workers": 2, "partition": "short", "time_limit": 20})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ann", timeout=120)
    [job] = hub.pdl_jobs("ann")
    seen = next(j for j in json.loads(slurm.run("squeue", "--json", check=True).stdout)["jobs"]
                if str(j["job_id"]) == job["id"])
    assert seen["partition"] == "short" and seen["time_limit"] in (20, {"set": True, "infinite": False, "number": 20})
    hub.api("DELETE", "/users/ann/server")
    hub.wait_no_pdl_jobs()


def test_a_hub_killed_while_a_spawn_waits_in_slurms_queue_leaves_no_job(hub, slurm):
    """Guards PDLSlurmSpawner.release_blocking (clear_state): the restarted hub finds no
    server for ben and cancels the job his interrupted spawn submitted, by its name and
    his account; without it the job would start later and hold GPUs for nobody."""
    slurm.sbatch("--ntasks=3", "--gpus-per-task=1", "--output=/dev/null", "--wrap=sleep 600", user=slurm_harness.ANN)
    r = hub.api("POST", "/users/ben/server", json={"workers": 1, "queue": True})
    assert r.status_code in (201, 202), r.text
    wait_until(lambda: [j["state"] for j in hub.pdl_jobs("ben")] == ["PENDING"], 30,
               what=lambda: f"ben's job pending: {slurm.jobs()}")
    hub.stop_hub(signal.SIGKILL)
    hub.start()
    wait_until(lambda: not hub.pdl_jobs("ben"), 60, what=lambda: f"ben's orphaned job cancelled: {slurm.jobs()}")
    assert not hub.server_ready("ben")
    slurm.reset()


def test_a_job_that_ends_under_its_engines_is_a_release_and_the_next_cell_gets_a_new_one(hub, slurm):
    """Guards pdl-singleuser's supervision on Slurm (pdl_server/singleuser.py: a dead
    engine whose job has ended is not restarted, the job's end is recorded as a
    release): without it the server starts steps in the ended job forever, and the
    next cell waits for engines that never come."""
    first, kernel = spawn_and_sum(hub, "ann", 2)
    try:
        slurm.run("scancel", first["id"], check=True)  # as its time limit would, or an admin
        wait_until(lambda: not hub.pdl_jobs("ann") and not slurm_engines(hub.root), 60,
                   what=lambda: f"ann's job and engines gone: {slurm.jobs()}")
        # her Cluster panel says so, as it does for idle engines
        released = (f"Engines released (Slurm job {first['id']} ended): "
                    "the next %%distributed cell asks for them again.")
        wait_until(lambda: hub.server_api("ann", "/pdl/api/cluster")["message"] == released, 30,
                   what=lambda: f"the panel to say: {released}")
        out = kernel.execute_ok(magic(SUM, 2), timeout=180)
        assert f"Your engines were stopped (Slurm job {first['id']} ended)" in out["stderr"], out
        assert "sum 2" in out["stdout"], out
        [second] = hub.pdl_jobs("ann")
        assert second["id"] != first["id"] and second["state"] == "RUNNING"
    finally:
        kernel.close()
        hub.api("DELETE", "/users/ann/server")
    hub.wait_no_pdl_jobs()


#: Seconds the time-limit test needs left of a job when its limit is set: the kernel's
#: next reading of the end (READ_EVERY_S), a cell and the release's margin, with room.
LEFT_S = 50


def elapsed_s(slurm, job_id: str) -> int:
    """Seconds job ``job_id`` has run (squeue's ``%M``: ``M:SS``, ``H:MM:SS``)."""
    text = slurm.run("squeue", "-h", "-j", job_id, "-o", "%M", check=True).stdout.strip()
    seconds = 0
    for part in text.split("-")[-1].split(":"):
        seconds = seconds * 60 + int(part)
    return seconds


def test_a_jobs_time_limit_is_shown_warned_of_and_ends_in_a_release_the_next_cell_explains(hub, slurm):
    """Guards pdl_server/session_clock.py and its uses: the panel shows the time left of
    the job holding the GPUs and the warning, cells warn in one line, and the server
    releases the engines just before the limit, so the next cell says why in one line
    and gets a new job (not "rank died" from engines Slurm killed under it)."""
    first, kernel = spawn_and_sum(hub, "ann", 2)
    why = f"Slurm job {first['id']}'s time limit"
    try:
        # the job's limit, set by an admin, the soonest Slurm's whole minutes allow that
        # leaves the test its LEFT_S (a panel reading, the kernel's next reading, a cell)
        minutes = -(-(elapsed_s(slurm, first["id"]) + LEFT_S) // 60)
        slurm.run("scontrol", "update", f"JobId={first['id']}", f"TimeLimit={minutes}", check=True)
        session = wait_until(lambda: hub.server_api("ann", "/pdl/api/cluster")["session"], 30,
                             what="the panel to show the job's time left")
        assert session["text"].startswith("Time left: ") and session["text"].endswith(f" ({why})"), session
        assert 0 < session["left_s"] <= LEFT_S + 60 and session["warning"].startswith("Your session ends in "), session
        time.sleep(READ_EVERY_S)  # the kernel's reading of the end, from its first cell, is due again
        out = kernel.execute_ok(magic(SUM, 2), timeout=120)
        assert f"({why}): save your work, or extend it." in out["stderr"] and "sum 2" in out["stdout"], out

        released = f"Engines released ({why} reached at "
        wait_until(lambda: (hub.server_api("ann", "/pdl/api/cluster")["message"] or "").startswith(released), 150,
                   what=lambda: f"the panel to say: {released}...; jobs {slurm.jobs()}")
        out = kernel.execute_ok(magic(SUM, 2), timeout=180)
        assert f"Your engines were stopped ({why} reached at " in out["stderr"] and "sum 2" in out["stdout"], out
        assert "died" not in out["stderr"], out
        [second] = hub.pdl_jobs("ann")
        assert second["id"] != first["id"] and second["state"] == "RUNNING"
    finally:
        kernel.close()
        hub.api("DELETE", "/users/ann/server")
    hub.wait_no_pdl_jobs()
