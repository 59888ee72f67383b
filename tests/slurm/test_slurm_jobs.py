"""What Slurm says, read into PDL's terms (pdl_spawner/slurm/jobs.py): the sbatch
arguments of a reservation, and ``squeue --json`` / ``sinfo --json`` output (the shape
Slurm 22.05 writes, openapi v0.0.38, and the newer number and state forms) read into
jobs, nodes, GPU usage and queue positions; no Slurm."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone

import pytest

from pdl_spawner.core.usage import GpuReading
from pdl_spawner.slurm.jobs import (
    JOB_NAME_PREFIX, SlurmJob, SlurmNode, default_partition, gpu_types, gpu_usage, gpu_use_argv, job_name,
    parse_gpu_readings, partition_gpu_types,
    parse_job_id, parse_jobs, parse_nodes, pdl_job_owner, pending_message, queue_position, sbatch_argv,
)

pytestmark = pytest.mark.unit


def _allocated(name: str) -> dict:
    return {"sockets": {"1": {"cores": {"0": "allocated"}}}, "nodename": name, "cpus_used": 0, "memory_used": 0,
            "memory_allocated": 0}


#: ``squeue --json`` jobs as Slurm 22.05 writes them (trimmed to the fields read, plus a
#: few others): a user-chosen name that looks like other fields, running on n1 and n2
#: (GPU 0 of each); and a pending job asking for 3 tasks of one GPU each.
RUNNING = {"job_id": 1, "name": "x JobId=9 UserId=root(0) y", "user_name": "pdl-sl-ann", "user_id": 999,
           "group_name": "pdl-sl-ann", "account": "", "job_state": "RUNNING", "state_reason": "None",
           "partition": "gpu", "priority": 4294901759, "submit_time": 1795563985, "start_time": 1795563986,
           "end_time": 0, "nodes": "n[1-2]", "batch_host": "n1", "command": "/home/pdl-sl-ann/x JobId=9",
           "gres_detail": ["gpu:1(IDX:0)", "gpu:1(IDX:0)"], "tres_per_task": "gres:gpu:1", "tres_per_job": "",
           "tres_per_node": "", "node_count": 2, "tasks": 2,
           "job_resources": {"nodes": "n[1-2]", "allocated_cores": 2, "allocated_hosts": 2,
                             "allocated_nodes": [_allocated("n1"), _allocated("n2")]}}
PENDING = {"job_id": 2, "name": "pend", "user_name": "pdl-sl-ben", "user_id": 995, "job_state": "PENDING",
           "state_reason": "Resources", "partition": "gpu", "priority": 4294901758, "start_time": 0, "nodes": "",
           "gres_detail": [], "tres_per_task": "gres:gpu:1", "tres_per_job": "", "tres_per_node": "",
           "node_count": 3, "tasks": 3, "job_resources": None}
#: ``sinfo --json`` node entries (Slurm 22.05).
NODE = {"name": "n2", "hostname": "n2", "address": "10.78.0.12", "architecture": "x86_64", "cpus": 2,
        "gres": "gpu:1", "gres_drained": "N/A", "gres_used": "gpu:1", "state": "mixed", "state_flags": [],
        "operating_system": "Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC", "partitions": ["gpu", "debug"],
        "reason": "", "weight": 1}


def squeue(*jobs: dict) -> str:
    """``squeue --json`` output holding ``jobs``."""
    return json.dumps({"meta": {"plugin": {"type": "openapi/v0.0.38"}, "Slurm": {"release": "22.05.8"}},
                       "errors": [], "jobs": list(jobs)})


def sinfo(*nodes: dict) -> str:
    """``sinfo --json`` output holding ``nodes``."""
    return json.dumps({"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [], "nodes": list(nodes)})


def changed(base: dict, **fields) -> dict:
    """A deep copy of ``base`` with ``fields`` replaced."""
    return {**copy.deepcopy(base), **fields}


def number(n: int, *, set: bool = True, infinite: bool = False) -> dict:
    """A number as newer Slurm versions write it."""
    return {"set": set, "infinite": infinite, "number": n}


def job(id, user="u", state="RUNNING", gpus=1, partition="gpu", priority=100, reason="None", start_time=0.0):
    return SlurmJob(id=id, name=job_name(user), user=f"t1a2-{user}", state=state, reason=reason, partition=partition,
                    gpus=gpus, priority=priority, start_time=start_time)


def node(name, gpus=2, state="IDLE", partitions=("gpu",)):
    return SlurmNode(name=name, addr="10.78.0.1", gpus=gpus, state=state, partitions=partitions)


# -- sbatch ---------------------------------------------------------------------------


def test_a_reservation_asks_one_gpu_per_task_with_no_environment_and_the_admins_options_kept():
    argv = sbatch_argv("pdl:ann", 3, extra=("--qos=lab", "--account=ml"))
    assert argv[0] == "sbatch" and argv[-1] == "--wrap=exec sleep infinity"
    assert {"--parsable", "--job-name=pdl:ann", "--ntasks=3", "--gpus-per-task=1", "--cpus-per-task=1",
            "--export=NONE", "--no-requeue"} <= set(argv)
    assert argv[-3:-1] == ["--qos=lab", "--account=ml"]  # the admin's, in order, after PDL's own
    assert not [a for a in argv if a.startswith(("--partition", "--time", "--gpus=", "--gres"))]
    timed = sbatch_argv("pdl:ann:big", 1, partition="gpu", time_limit_min=90, cpus_per_gpu=4, account="lab")
    assert {"--partition=gpu", "--time=90", "--cpus-per-task=4", "--job-name=pdl:ann:big",
            "--account=lab"} <= set(timed)
    assert job_name("ann") == f"{JOB_NAME_PREFIX}ann" == "pdl:ann" and job_name("ann", "big") == "pdl:ann:big"


def test_the_job_id_is_what_sbatch_parsable_prints_last():
    assert parse_job_id("123\n") == 123
    assert parse_job_id("123;cluster\n") == 123
    assert parse_job_id("sbatch: warning: something\n77\n") == 77
    for out in ("", "\n", "sbatch: error: Batch job submission failed\n"):
        with pytest.raises(ValueError):
            parse_job_id(out)


# -- jobs and nodes -------------------------------------------------------------------


def test_jobs_as_squeue_shows_them():
    running, pending = parse_jobs(squeue(RUNNING, PENDING))
    assert (running.id, running.user, running.state, running.reason, running.partition) == \
        (1, "pdl-sl-ann", "RUNNING", "None", "gpu")
    assert (running.gpus, running.priority, running.start_time) == (2, 4294901759, 1795563986.0)
    assert running.node_gpus == {"n1": [0], "n2": [0]}  # keyed by the real node: no node list to expand
    assert running.holding and not running.waiting and not running.never_starts
    assert (pending.id, pending.user, pending.state, pending.reason) == (2, "pdl-sl-ben", "PENDING", "Resources")
    assert (pending.gpus, pending.start_time, pending.node_gpus) == (3, 0.0, {})  # 3 tasks, one GPU each
    assert pending.waiting and not pending.holding
    assert parse_jobs(squeue()) == [] and parse_jobs(json.dumps({"jobs": []})) == []


def test_a_job_name_that_looks_like_other_fields_keeps_the_jobs_own_id_user_and_whole_name():
    [parsed] = parse_jobs(squeue(RUNNING))
    assert (parsed.id, parsed.user, parsed.name) == (1, "pdl-sl-ann", "x JobId=9 UserId=root(0) y")
    [quoted] = parse_jobs(squeue(changed(RUNNING, name='a" "job_id": 9, "user_name": "root')))
    assert (quoted.id, quoted.user, quoted.name) == (1, "pdl-sl-ann", 'a" "job_id": 9, "user_name": "root')


def test_the_newer_schema_numbers_as_dicts_and_states_as_lists():
    newer = changed(RUNNING, job_id=number(1), priority=number(4294901759), start_time=number(1795563986),
                    job_state=["RUNNING"], tasks=number(2), node_count=number(2))
    old, new = parse_jobs(squeue(RUNNING))[0], parse_jobs(squeue(newer))[0]
    assert new == old and new.start_time == 1795563986.0 and new.state == "RUNNING"
    waiting = changed(PENDING, job_id=number(2), job_state=["PENDING"], start_time=number(0, set=False),
                      priority=number(7), tasks=number(3), node_count=number(3))
    [pending] = parse_jobs(squeue(waiting))
    assert (pending.id, pending.state, pending.start_time, pending.priority, pending.gpus) == (2, "PENDING", 0.0, 7, 3)
    assert pending.waiting
    [endless] = parse_jobs(squeue(changed(waiting, start_time=number(0, infinite=True))))
    assert endless.start_time == 0.0  # unknown, not a date
    [n2] = parse_nodes(sinfo(changed(NODE, state=["MIXED"])))
    assert n2.state.upper() == "MIXED" and n2.usable
    assert not parse_nodes(sinfo(changed(NODE, state=["DOWN"])))[0].usable


def test_a_node_drained_in_the_newer_state_list_is_not_usable():
    [n2] = parse_nodes(sinfo(changed(NODE, state=["IDLE", "DRAIN"])))
    assert not n2.usable


def test_a_pending_jobs_gpus_per_task_times_tasks_per_node_times_nodes_or_per_job():
    def gpus(**fields):
        return parse_jobs(squeue(changed(PENDING, **fields)))[0].gpus

    assert gpus() == 3  # gres:gpu:1 per task, 3 tasks
    assert gpus(tres_per_task="gres:gpu:2", tasks=4) == 8
    assert gpus(tres_per_task="", tres_per_node="gres:gpu:4", node_count=2) == 8
    assert gpus(tres_per_task="", tres_per_node="gres:gpu:a100:2", node_count=number(3)) == 6
    assert gpus(tres_per_task="", tres_per_job="gres:gpu:5") == 5
    assert gpus(tres_per_task="", tasks=None) == 0  # asks for no GPU
    assert gpus(tres_per_task="gres:gpu:1", tasks=None) == 1  # no task count: one


def test_gpu_indexes_per_node_keyed_by_node_name():
    multi = changed(RUNNING, job_id=3, nodes="n[3,10]", gres_detail=["gpu:a100:2(IDX:0,2)", "gpu:a100:1(IDX:1)"],
                    job_resources={"nodes": "n[3,10]", "allocated_nodes": [_allocated("n3"), _allocated("n10")]})
    [parsed] = parse_jobs(squeue(multi))
    assert parsed.gpus == 3 and parsed.node_gpus == {"n3": [0, 2], "n10": [1]}
    ranged = changed(multi, gres_detail=["gpu:4(IDX:0-3)", "gpu:2(IDX:1,3)"])
    assert parse_jobs(squeue(ranged))[0].node_gpus == {"n3": [0, 1, 2, 3], "n10": [1, 3]}
    # completing with no detail: no placement, the GPUs it asked for still counted
    [done] = parse_jobs(squeue(changed(RUNNING, job_state="COMPLETING", gres_detail=[], job_resources=None)))
    assert done.node_gpus == {} and done.gpus == 2 and done.holding


def test_nodes_as_sinfo_shows_them_each_once():
    [n2] = parse_nodes(sinfo(NODE))
    assert n2 == SlurmNode(name="n2", addr="10.78.0.12", gpus=1, state="mixed", partitions=("gpu", "debug"),
                           gpu_types={"": 1})
    assert n2.usable
    typed = parse_nodes(sinfo(changed(NODE, gres="gpu:a100:4(S:0-1)", state="idle")))[0]
    assert (typed.gpus, typed.gpu_types) == (4, {"a100": 4})
    mixed = parse_nodes(sinfo(changed(NODE, gres="gpu:a100:2(S:0),gpu:t4:1(S:1),shard:8")))[0]
    assert (mixed.gpus, mixed.gpu_types) == (3, {"a100": 2, "t4": 1})  # every type of a node counts
    assert parse_nodes(sinfo(changed(NODE, gres="")))[0].gpus == 0
    n1 = changed(NODE, name="n1", address="10.78.0.11")
    assert [n.name for n in parse_nodes(sinfo(n1, NODE, n1, changed(NODE, state="idle")))] == ["n1", "n2"]
    assert parse_nodes(sinfo()) == []


def test_a_drained_down_or_failing_node_is_not_usable():
    drained = parse_nodes(sinfo(changed(NODE, state="idle", state_flags=["DRAIN"])))[0]
    assert not drained.usable and "DRAIN" in drained.state
    for state, flags in (("down", []), ("down", ["NOT_RESPONDING"]), ("mixed", ["DRAIN"]), ("idle", ["FAIL"]),
                         ("inval", []), ("idle", ["NOT_RESPONDING"])):
        assert not parse_nodes(sinfo(changed(NODE, state=state, state_flags=flags)))[0].usable, (state, flags)
    for state, flags in (("idle", []), ("mixed", []), ("allocated", []), ("idle", ["CLOUD"])):
        assert parse_nodes(sinfo(changed(NODE, state=state, state_flags=flags)))[0].usable, (state, flags)


def test_the_default_partition_is_the_one_marked_so():
    text = ("PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO "
            "QoS=N/A DefaultTime=NONE Nodes=n1 State=UP TotalCPUs=2 TotalNodes=1\n"
            "PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES "
            "QoS=N/A DefaultTime=NONE Nodes=n[1-3] State=UP TotalCPUs=6 TotalNodes=3\n")
    assert default_partition(text) == "gpu"
    assert default_partition(text.replace("Default=YES", "Default=NO")) == ""
    assert default_partition("") == ""


# -- usage and the queue --------------------------------------------------------------


def test_gpu_usage_sums_each_users_holding_jobs_in_the_partition_over_its_usable_nodes():
    nodes = [node("n1"), node("n2"), node("n3", state="DOWN*"), node("n4", state="IDLE+DRAIN"),
             node("n5", gpus=8, partitions=("other",))]
    jobs = [job(1, "ann", gpus=2), job(2, "ann", gpus=1, state="COMPLETING"), job(3, "ben", gpus=1),
            job(4, "cat", state="PENDING", gpus=2), job(5, "dan", partition="other", gpus=8),
            job(6, "eve", gpus=0), job(7, "ann", gpus=1, state="COMPLETED")]
    usage = gpu_usage(nodes, jobs, partition="gpu")
    assert usage.total == 4 and usage.holders == {"t1a2-ann": 3, "t1a2-ben": 1} and usage.free == 0
    assert gpu_usage(nodes, jobs, partition="gpu", exclude_job=1).holders == {"t1a2-ann": 1, "t1a2-ben": 1}
    named = gpu_usage(nodes, jobs, default_partition="gpu", users={"t1a2-ann": "ann"})
    assert named.total == 4 and named.holders == {"ann": 3, "t1a2-ben": 1}
    assert gpu_usage(nodes, jobs, partition="other").holders == {"t1a2-dan": 8}
    assert gpu_usage(nodes, jobs).total == 12  # no partition known: every usable node


def test_the_queue_position_is_by_priority_then_submission_within_the_partition():
    a, b, c = job(10, "a", "PENDING", priority=50), job(11, "b", "PENDING", priority=90), job(12, "c", "PENDING",
                                                                                               priority=50)
    other, running = job(9, "d", "PENDING", priority=99, partition="other"), job(8, "e", priority=99)
    jobs = [a, b, c, other, running]
    assert [queue_position(j, jobs) for j in (b, a, c)] == [1, 2, 3]
    assert queue_position(other, jobs) == 1


def test_the_pending_message_names_slurms_reason_the_position_and_an_estimate_only_when_known():
    ahead, mine = job(20, "a", "PENDING", priority=90), job(21, "b", "PENDING", gpus=2, priority=50,
                                                              reason="Resources")
    text = pending_message(mine, [ahead, mine])
    assert "2 GPU(s)" in text and "job 21" in text and "number 2 in partition gpu" in text
    assert "reason Resources" in text and "expects" not in text
    at = datetime(2026, 11, 25, 1, 0, tzinfo=timezone.utc).timestamp()
    dated = job(21, "b", "PENDING", gpus=2, priority=50, reason="Priority", start_time=at)
    assert "Slurm expects it to start at 2026-11-25 01:00 UTC" in pending_message(dated, [ahead, dated])


def test_a_job_never_starts_only_while_it_waits_for_what_waiting_will_not_bring():
    assert job(1, state="PENDING", reason="PartitionNodeLimit").never_starts
    assert job(1, state="PENDING", reason="ReqNodeNotAvail,").never_starts  # "ReqNodeNotAvail, UnavailableNodes:n3"
    assert job(1, state="PENDING", reason="JobHeldAdmin").never_starts
    for reason in ("Resources", "Priority", "QOSMaxGRESPerUser", "None"):
        assert not job(1, state="PENDING", reason=reason).never_starts, reason
    assert not job(1, state="RUNNING", reason="PartitionNodeLimit").never_starts
    [limited] = parse_jobs(squeue(changed(PENDING, state_reason="PartitionNodeLimit")))
    assert limited.never_starts


def test_a_job_is_pdls_only_when_its_name_and_its_account_agree():
    """Guards pdl_job_owner: anyone may name a job ``pdl:ben``; only ben's account's is his."""
    mine = job(1, user="ben")
    assert pdl_job_owner(mine, "t1a2-") == ("ben", "")
    assert pdl_job_owner(SlurmJob(**{**mine.__dict__, "name": "pdl:ben:big"}), "t1a2-") == ("ben", "big")
    assert pdl_job_owner(SlurmJob(**{**mine.__dict__, "user": "t1a2-ann"}), "t1a2-") is None  # ann's, named ben's
    assert pdl_job_owner(mine, "pdl-") is None  # not an account of this hub's users
    assert pdl_job_owner(SlurmJob(**{**mine.__dict__, "name": "train"}), "t1a2-") is None
    assert pdl_job_owner(SlurmJob(**{**mine.__dict__, "name": JOB_NAME_PREFIX}), "t1a2-") is None


def test_a_jobs_gpu_use_and_memory_are_read_by_one_overlapping_step_task_per_node_of_the_admins_nvidia_smi():
    job = SlurmJob(id=12, name="pdl:ann", user="pdl-ann", state="RUNNING", reason="None", partition="gpu", gpus=3,
                   node_gpus={"n2": [0, 1], "n1": [3]})
    argv = gpu_use_argv(job, "/opt/nvidia/bin/nvidia-smi")
    assert argv[:9] == ["srun", "--jobid=12", "--overlap", "--nodes=2", "--nodelist=n1,n2", "--ntasks-per-node=1",
                        "--quiet", "--export=NONE", "/bin/sh"]
    assert argv[-1] == "/opt/nvidia/bin/nvidia-smi" and '--id="$CUDA_VISIBLE_DEVICES"' in argv[-2]
    assert "--query-gpu=utilization.gpu,memory.used,memory.total" in argv[-2]
    mib = 1024 * 1024
    assert parse_gpu_readings("0, 10, 80\n37, 20, 80\n100, [N/A], 80\n", job) == [
        GpuReading(0.0, 10 * mib, 80 * mib), GpuReading(37.0, 20 * mib, 80 * mib), GpuReading(100.0)]
    assert parse_gpu_readings("0\n37\n100\n", job) == [GpuReading(0.0), GpuReading(37.0), GpuReading(100.0)]
    assert parse_gpu_readings("0\n37\n", job) is None          # a node did not answer
    assert parse_gpu_readings("0\n[N/A], 1, 2\n5\n", job) is None    # a GPU without a reading
    assert parse_gpu_readings("", job) is None


def test_gpu_types_are_read_from_every_gres_and_tres_form_slurm_writes():
    assert gpu_types("gpu:a100:2(S:0),gpu:t4:1") == {"a100": 2, "t4": 1}
    assert gpu_types("gpu:4(S:0-1)") == {"": 4} and gpu_types("gres/gpu=2") == {"": 2}
    assert gpu_types("gres:gpu:a100:1") == {"a100": 1} and gpu_types("gres/gpu:a100=2") == {"a100": 2}
    assert gpu_types("gpu:1g.10gb:2(IDX:0-1)") == {"1g.10gb": 2}  # a MIG profile as a GRES type
    assert gpu_types("") == {} and gpu_types(None) == {} and gpu_types("N/A") == {}


def test_a_jobs_gpu_type_is_the_one_it_holds_or_asks_for():
    [held] = parse_jobs(squeue(changed(RUNNING, gres_detail=["gpu:a100:1(IDX:2)", "gpu:a100:1(IDX:0)"])))
    assert (held.gpu_type, held.gpus, held.node_gpus) == ("a100", 2, {"n1": [2], "n2": [0]})
    [untyped] = parse_jobs(squeue(RUNNING))
    assert untyped.gpu_type == ""
    [asks] = parse_jobs(squeue(changed(PENDING, tres_per_task="gres:gpu:t4:1")))
    assert (asks.gpu_type, asks.gpus) == ("t4", 3)
    [mixed] = parse_jobs(squeue(changed(RUNNING, gres_detail=["gpu:a100:1(IDX:0),gpu:t4:1(IDX:1)", "gpu:t4:1(IDX:0)"])))
    assert (mixed.gpu_type, mixed.gpus, mixed.node_gpus) == ("", 3, {"n1": [0, 1], "n2": [0]})


def test_usage_by_gpu_type_counts_only_that_types_gpus_and_holders():
    nodes = [SlurmNode(name="n1", addr="", gpus=3, state="idle", partitions=("gpu",), gpu_types={"a100": 2, "t4": 1}),
             SlurmNode(name="n2", addr="", gpus=1, state="idle", partitions=("gpu",), gpu_types={"t4": 1}),
             SlurmNode(name="n3", addr="", gpus=4, state="down", partitions=("gpu",), gpu_types={"h100": 4})]
    jobs = [SlurmJob(id=1, name="x", user="ann", state="RUNNING", reason="None", partition="gpu", gpus=1,
                     gpu_type="t4"),
            SlurmJob(id=2, name="y", user="ben", state="RUNNING", reason="None", partition="gpu", gpus=2,
                     gpu_type="a100")]
    assert partition_gpu_types(nodes, partition="gpu") == ["a100", "t4"]  # not the down node's h100
    t4 = gpu_usage(nodes, jobs, partition="gpu", gpu_type="t4")
    assert (t4.total, t4.free, t4.holders) == (2, 1, {"ann": 1})
    every = gpu_usage(nodes, jobs, partition="gpu")
    assert (every.total, every.free) == (4, 1)
    assert "--gpus-per-task=t4:1" in sbatch_argv("pdl:ann", 2, gpu_type="t4")
    assert "--gpus-per-task=1" in sbatch_argv("pdl:ann", 2)
