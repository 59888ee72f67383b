"""The admin view's Slurm source (pdl_spawner/admin_view.py): the pure model and page
from recorded ``scontrol`` output (Slurm 22.05), the reader with Slurm's commands
answered from that recording, and the choice of source; no Slurm, no hub."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from html import escape

import pytest

from pdl_spawner import admin_view
from pdl_spawner.admin_view import (
    SLURM_RECLAIMS_NOTE, read_slurm_status, reader_from_env, render_page, slurm_epoch, slurm_job_owner,
    slurm_status_model,
)
from pdl_spawner.slurm_cli import SlurmCommands
from pdl_spawner.slurm_jobs import parse_jobs, parse_nodes

pytestmark = pytest.mark.unit

SCRIPT = "<script>alert(1)</script>"
NOW = datetime(2026, 11, 25, tzinfo=timezone.utc).timestamp()  # 2026-11-25T00:00:00Z

#: ``scontrol -d -o show job``: ann's PDL job on n1 and n2 (GPU 0 of each), cat's own
#: job (not PDL's) on n3 (GPUs 0-1) and n10, gus's PDL job completing with no detail,
#: and four pending jobs: ben's (2 GPUs, Resources), dan's named server (1 GPU, higher
#: priority, an estimated start), fay's (a partition limit) and eve's without GPUs.
JOBS = "\n".join([
    "JobId=1 JobName=pdl:ann UserId=t1a2-ann(999) GroupId=t1a2-ann(999) MCS_label=N/A Priority=4294901759 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=0 Restarts=0 BatchFlag=1 "
    "Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:26:19 TimeLimit=UNLIMITED TimeMin=N/A "
    "SubmitTime=2026-11-24T23:33:40 EligibleTime=2026-11-24T23:33:40 AccrueTime=2026-11-24T23:33:40 "
    "StartTime=2026-11-24T23:33:41 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
    "LastSchedEval=2026-11-24T23:33:41 Scheduler=Main Partition=gpu AllocNode:Sid=login:4242 ReqNodeList=(null) "
    "ExcNodeList=(null) NodeList=n[1-2] BatchHost=n1 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=2,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* "
    "JOB_GRES=gpu:2 Nodes=n[1-2] CPU_IDs=1 Mem=0 GRES=gpu:1(IDX:0) MinCPUsNode=1 MinMemoryNode=0 "
    "MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) "
    "Network=(null) Command=(null) WorkDir=/home/t1a2-ann StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null "
    "Power= CpusPerTres=gres:gpu:1 TresPerTask=gres:gpu:1",
    "JobId=3 JobName=train UserId=t1a2-cat(996) GroupId=t1a2-cat(996) MCS_label=N/A Priority=4294901760 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) StartTime=2026-11-24T22:00:00 "
    "EndTime=Unknown Partition=gpu NodeList=n[3,10] BatchHost=n3 NumNodes=2 NumCPUs=3 NumTasks=3 CPUs/Task=1 "
    "TRES=cpu=3,node=2,billing=3 JOB_GRES=gpu:3 Nodes=n3 CPU_IDs=0-1 Mem=0 GRES=gpu:2(IDX:0-1) "
    "Nodes=n10 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0) MinCPUsNode=1 Features=(null) Command=/home/t1a2-cat/train.sh "
    "TresPerNode=gres:gpu:2",
    "JobId=7 JobName=pdl:gus UserId=t1a2-gus(993) GroupId=t1a2-gus(993) Priority=4294901755 Nice=0 "
    "JobState=COMPLETING Reason=None StartTime=2026-11-24T23:59:00 EndTime=2026-11-24T23:59:50 Partition=gpu "
    "NodeList=n2 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 JOB_GRES=gpu:1 TresPerTask=gres:gpu:1",
    "JobId=2 JobName=pdl:ben UserId=t1a2-ben(995) GroupId=t1a2-ben(995) MCS_label=N/A Priority=4294901758 Nice=0 "
    "Account=(null) QOS=(null) JobState=PENDING Reason=Resources Dependency=(null) StartTime=Unknown "
    "EndTime=Unknown Partition=gpu NodeList=(null) NumNodes=1-2 NumCPUs=2 NumTasks=2 CPUs/Task=1 "
    "TRES=cpu=2,node=1,billing=2 JOB_GRES=(null) TresPerTask=gres:gpu:1",
    "JobId=4 JobName=pdl:dan:big UserId=t1a2-dan(994) GroupId=t1a2-dan(994) Priority=4294901800 Nice=0 "
    "JobState=PENDING Reason=Priority StartTime=2026-11-25T01:00:00 EndTime=Unknown Partition=gpu "
    "NodeList=(null) NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 JOB_GRES=(null) TresPerTask=gres:gpu:1",
    "JobId=6 JobName=pdl:fay UserId=t1a2-fay(992) GroupId=t1a2-fay(992) Priority=4294901757 Nice=0 "
    "JobState=PENDING Reason=PartitionNodeLimit StartTime=Unknown Partition=gpu NodeList=(null) NumNodes=8 "
    "NumCPUs=8 NumTasks=8 CPUs/Task=1 JOB_GRES=(null) TresPerTask=gres:gpu:1",
    "JobId=5 JobName=etl UserId=t1a2-eve(991) GroupId=t1a2-eve(991) Priority=1 Nice=0 JobState=PENDING "
    "Reason=Priority StartTime=Unknown Partition=gpu NodeList=(null) NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1",
])

#: ``scontrol -o show node``: partition gpu has n1, n2, n3, n10 (two GPUs each, n10 one)
#: and n4, down; n5 is in partition cpu only.
_NODE = ("NodeName={name} Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=2 CPUTot=2 CPULoad=0.87 "
         "AvailableFeatures=(null) ActiveFeatures=(null) Gres={gres} GresDrain=N/A GresUsed=gpu:1 "
         "NodeAddr=10.78.0.{ip} NodeHostName={name} Version=22.05.8 OS=Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC "
         "RealMemory=1000 AllocMem=0 FreeMem=N/A Sockets=2 Boards=1 State={state} ThreadsPerCore=1 TmpDisk=0 "
         "Weight=1 Owner=N/A MCS_label=N/A Partitions={parts} BootTime=2026-11-24T23:30:00 "
         "SlurmdStartTime=2026-11-24T23:30:05 CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES=cpu=1")
NODES = "\n".join(_NODE.format(name=name, gres=gres, ip=ip, state=state, parts=parts) for name, gres, ip, state, parts in [
    ("n1", "gpu:2", 11, "MIXED", "gpu"), ("n10", "gpu:1", 20, "MIXED", "gpu"), ("n2", "gpu:2(S:0)", 12, "MIXED", "gpu"),
    ("n3", "gpu:2", 13, "ALLOCATED", "gpu"), ("n4", "gpu:2", 14, "DOWN*", "gpu"), ("n5", "gpu:4", 15, "IDLE", "cpu"),
])
PARTITIONS = ("PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL Default=YES QoS=N/A "
              "Nodes=n[1-4,10] State=UP TotalCPUs=10\n"
              "PartitionName=cpu AllowGroups=ALL Default=NO Nodes=n5 State=UP TotalCPUs=2\n")
#: ``scontrol show hostnames <list>``, for the lists the jobs above name.
HOSTNAMES = {"n[1-2]": ["n1", "n2"], "n3": ["n3"], "n10": ["n10"]}


def model(jobs=JOBS, nodes=NODES, **kwargs) -> dict:
    kwargs.setdefault("default_partition", "gpu")
    return slurm_status_model(parse_jobs(jobs), parse_nodes(nodes), HOSTNAMES.__getitem__, NOW, tz=timezone.utc,
                              **kwargs)


def test_one_row_per_held_gpu_by_node_pdl_jobs_as_their_hub_user_others_as_their_account():
    status = model()
    assert [(r["node"], r["slot"], r["owner"], r["user"], r["server"], r["account"], r["job"], r["pdl"], r["state"])
            for r in status["reservations"]] == [
        ("n1", "gpu:0", "ann", "ann", "", "t1a2-ann", 1, True, "RUNNING"),
        ("n2", "gpu:0", "ann", "ann", "", "t1a2-ann", 1, True, "RUNNING"),
        ("n3", "gpu:0", "t1a2-cat", "t1a2-cat", "", "t1a2-cat", 3, False, "RUNNING"),
        ("n3", "gpu:1", "t1a2-cat", "t1a2-cat", "", "t1a2-cat", 3, False, "RUNNING"),
        ("n10", "gpu:0", "t1a2-cat", "t1a2-cat", "", "t1a2-cat", 3, False, "RUNNING"),
        ("", "gpu:?", "gus", "gus", "", "t1a2-gus", 7, True, "COMPLETING"),  # Slurm gave no placement
    ]
    ann, cat = status["reservations"][0], status["reservations"][2]
    assert (ann["since"], ann["held_s"], ann["partition"]) == ("2026-11-24T23:33:41Z", 26 * 60 + 19, "gpu")
    assert (cat["since"], cat["held_s"]) == ("2026-11-24T22:00:00Z", 7200)


def test_the_pool_is_every_gpu_of_the_partition_and_free_leaves_out_held_gpus_and_down_nodes():
    status = model()
    assert (status["source"], status["partition"], status["now"]) == ("slurm", "gpu", "2026-11-25T00:00:00Z")
    assert status["nodes"] == ["n1", "n2", "n3", "n4", "n10"] and status["unavailable"] == ["n4"]
    assert status["pool"] == ["n1/gpu:0", "n1/gpu:1", "n2/gpu:0", "n2/gpu:1", "n3/gpu:0", "n3/gpu:1",
                              "n4/gpu:0", "n4/gpu:1", "n10/gpu:0"]
    assert status["free"] == ["n1/gpu:1", "n2/gpu:1"] and status["error"] is None
    assert "reclaims" not in status  # Slurm keeps no PDL log
    assert json.loads(json.dumps(status)) == status
    # the partition PDL names wins over the default; none at all: every node
    assert model(partition="cpu")["nodes"] == ["n5"] and model(partition="cpu")["free"] == [f"n5/gpu:{i}" for i in range(4)]
    assert model(default_partition="")["nodes"] == ["n1", "n2", "n3", "n4", "n5", "n10"]


def test_the_queue_is_the_pending_jobs_that_want_gpus_in_slurms_order_with_its_reason():
    queue = model()["queue"]
    assert [(q["position"], q["owner"], q["user"], q["server"], q["account"], q["job"], q["gpus"], q["reason"],
             q["never_starts"], q["expected_start"]) for q in queue] == [
        (1, "dan/big", "dan", "big", "t1a2-dan", 4, 1, "Priority", False, "2026-11-25T01:00:00Z"),
        (2, "ben", "ben", "", "t1a2-ben", 2, 2, "Resources", False, ""),
        (3, "fay", "fay", "", "t1a2-fay", 6, 8, "PartitionNodeLimit", True, ""),
    ]  # eve's job asks for no GPU


def test_owners_and_times_as_slurm_writes_them():
    def job(name):
        return parse_jobs(f"JobId=9 JobName={name} UserId=t1a2-x(1) JobState=RUNNING Partition=gpu")[0]

    assert slurm_job_owner(job("pdl:ann")) == ("ann", "ann", "")
    assert slurm_job_owner(job("pdl:ann:big")) == ("ann/big", "ann", "big")
    assert slurm_job_owner(job("pdl:")) == ("t1a2-x", "t1a2-x", "")
    assert slurm_job_owner(job("jupyter")) == ("t1a2-x", "t1a2-x", "")
    assert slurm_epoch("2026-11-24T23:33:41", timezone.utc) == datetime(2026, 11, 24, 23, 33, 41,
                                                                      tzinfo=timezone.utc).timestamp()
    assert slurm_epoch("") is None and slurm_epoch("Unknown") is None


def test_the_slurm_page_escapes_names_shows_both_tables_and_says_where_reclaims_are():
    hostile = JOBS.replace("JobName=train", f"JobName={SCRIPT}").replace("JobName=pdl:ben", f"JobName=pdl:{SCRIPT}")
    page = render_page(model(jobs=hostile))
    assert "<script" not in page
    assert "Partition gpu, nodes n1, n2, n3, n4, n10: 2 of 9 GPU(s) free; not available: n4." in page
    assert ("<td>gpu:0</td><td>n1</td><td>ann</td><td>t1a2-ann</td><td>1</td><td>RUNNING</td>"
            "<td>2026-11-24T23:33:41Z</td><td>26 min 19 s</td>") in page
    assert "<td>gpu:?</td><td></td><td>gus</td><td>t1a2-gus</td><td>7</td><td>COMPLETING</td>" in page
    assert "<td>1</td><td>gpu</td><td>dan/big</td><td>t1a2-dan</td><td>4</td><td>1</td><td>Priority</td>" \
           "<td>2026-11-25T01:00:00Z</td>" in page
    assert "<td>2</td><td>gpu</td><td>&lt;script&gt;alert(1)&lt;/script&gt;</td>" in page
    assert "<td>PartitionNodeLimit (will not start)</td><td>unknown</td>" in page
    assert f"<h2>Recent reclaims</h2>\n<p class=\"empty\">{escape(SLURM_RECLAIMS_NOTE)}</p>" in page
    assert "could not be read" not in page
    empty = render_page(model(jobs=""))
    assert "No GPU is held." in empty and "Nobody is waiting." in empty and "7 of 9 GPU(s) free" in empty


def test_an_unreadable_slurm_is_one_line_on_the_page_not_an_exception(tmp_path):
    status = read_slurm_status(partition="gpu", slurm_env={"PATH": str(tmp_path)})  # no scontrol there
    assert status["pool"] is None and status["free"] is None and status["reservations"] == []
    assert status["partition"] == "gpu" and status["error"].startswith("scontrol: cannot run it")
    assert "\n" not in status["error"]
    page = render_page(status)
    assert '<p class="error">Slurm could not be read: scontrol: cannot run it' in page
    assert "Partition gpu, nodes (none): GPUs unknown." in page


def test_the_reader_asks_slurms_own_commands_and_expands_node_lists_with_them(monkeypatch):
    asked = []

    async def run(self, argv, *, account=None, timeout=30.0):
        asked.append(argv)
        assert account is None and self.env["SLURM_CONF"] == "/etc/lab/slurm.conf"
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return "\n".join(HOSTNAMES[argv[3]]) + "\n"
        return {("scontrol", "-d", "-o", "show", "job"): JOBS, ("scontrol", "-o", "show", "node"): NODES,
                ("scontrol", "-o", "show", "partition"): PARTITIONS}[tuple(argv)]

    monkeypatch.setattr(SlurmCommands, "run", run)
    env = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "SLURM_CONF": "/etc/lab/slurm.conf"}
    status = read_slurm_status(partition="", slurm_env=env)
    assert status["error"] is None and status["partition"] == "gpu" and status["free"] == ["n1/gpu:1", "n2/gpu:1"]
    assert [(r["node"], r["slot"], r["job"]) for r in status["reservations"]][:5] == \
        [("n1", "gpu:0", 1), ("n2", "gpu:0", 1), ("n3", "gpu:0", 3), ("n3", "gpu:1", 3), ("n10", "gpu:0", 3)]
    assert sorted(a[3] for a in asked if a[1] == "show") == ["n10", "n3", "n[1-2]"]  # each list once
    asked.clear()
    assert read_slurm_status(partition="cpu", slurm_env=env)["nodes"] == ["n5"]
    assert ["scontrol", "-o", "show", "partition"] not in asked  # PDL named its partition


def test_the_environment_picks_the_slurm_source_with_no_file():
    reader = reader_from_env({"PDL_SLURM": "1", "PDL_SLURM_PARTITION": " gpu ", "PATH": "/opt/slurm/bin:/usr/bin",
                              "SLURM_CONF": "/etc/lab/slurm.conf", "PDL_DOCKER_HOST": "tcp://m:2375"})
    assert reader.func is admin_view.read_slurm_status and reader.args == ()
    assert reader.keywords == {"partition": "gpu", "slurm_env": {
        "PATH": "/opt/slurm/bin:/usr/bin", "LANG": "C.UTF-8", "SLURM_CONF": "/etc/lab/slurm.conf"}}
    # as jupyterhub_config.py gives it: SLURM_CONF empty when the hub had none
    default = reader_from_env({"PDL_SLURM": "1", "PDL_SLURM_PARTITION": "", "SLURM_CONF": "", "PATH": ""})
    assert default.keywords == {"partition": "", "slurm_env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}}
    with pytest.raises(KeyError):  # any other value is not Slurm: the ledger file is needed
        reader_from_env({"PDL_SLURM": "0"})
