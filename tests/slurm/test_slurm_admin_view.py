"""The admin view's Slurm source (pdl_spawner/slurm/admin_source.py): the pure model and page
from ``squeue --json`` / ``sinfo --json`` output shaped as Slurm 22.05 writes it, the
reader with Slurm's commands answered from that, and the choice of source; no Slurm,
no hub."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from html import escape

import pytest

from pdl_spawner.admin.view import reader, render_page
from pdl_spawner.core.reservations import SlotLedger
from pdl_spawner.slurm import admin_source as slurm_source
from pdl_spawner.slurm.admin_source import (
    SLURM_RECLAIMS_NOTE, read_slurm_status, slurm_job_owner, slurm_status_model,
)
from pdl_spawner.slurm.cli import SlurmCommands
from pdl_spawner.slurm.jobs import parse_jobs, parse_nodes

pytestmark = pytest.mark.unit

SCRIPT = "<script>alert(1)</script>"
NOW = datetime(2026, 11, 25, tzinfo=timezone.utc).timestamp()  # 2026-11-25T00:00:00Z


def at(hour: int, minute: int = 0, second: int = 0, day: int = 24) -> int:
    """Epoch seconds of a time of 2026-11-``day``, UTC."""
    return int(datetime(2026, 11, day, hour, minute, second, tzinfo=timezone.utc).timestamp())


def sjob(job_id: int, name: str, user: str, state: str, *, reason: str = "None", priority: int = 4294901759,
         start: int = 0, tasks: int = 1, node_count: int = 1, per_task: str = "gres:gpu:1", per_node: str = "",
         placed: dict[str, str] | None = None) -> dict:
    """One ``squeue --json`` job (the fields read, and a few others); ``placed``: node ->
    its ``gres_detail`` entry, for a job Slurm has placed."""
    placed = placed or {}
    return {"job_id": job_id, "name": name, "user_name": user, "user_id": 900 + job_id, "account": "",
            "job_state": state, "state_reason": reason, "partition": "gpu", "priority": priority,
            "start_time": start, "end_time": 0, "nodes": ",".join(placed), "gres_detail": list(placed.values()),
            "tres_per_task": per_task, "tres_per_job": "", "tres_per_node": per_node, "node_count": node_count,
            "tasks": tasks,
            "job_resources": {"nodes": ",".join(placed), "allocated_hosts": len(placed), "allocated_nodes": [
                {"sockets": {"1": {"cores": {"0": "allocated"}}}, "nodename": node, "cpus_used": 0,
                 "memory_used": 0, "memory_allocated": 0} for node in placed]} if placed else None}


def squeue(*jobs: dict) -> str:
    return json.dumps({"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [], "jobs": list(jobs)})


#: ann's PDL job on n1 and n2 (GPU 0 of each), cat's own job (not PDL's) on n3 (GPUs
#: 0-1) and n10, gus's PDL job completing with no placement, and four pending jobs:
#: ben's (2 GPUs, Resources), dan's named server (1 GPU, higher priority, an estimated
#: start), fay's (a partition limit) and eve's without GPUs.
JOB_LIST = [
    sjob(1, "pdl:ann", "t1a2-ann", "RUNNING", start=at(23, 33, 41), tasks=2, node_count=2,
         placed={"n1": "gpu:1(IDX:0)", "n2": "gpu:1(IDX:0)"}),
    sjob(3, "train", "t1a2-cat", "RUNNING", priority=4294901760, start=at(22), tasks=3, node_count=2, per_task="",
         per_node="gres:gpu:2", placed={"n3": "gpu:2(IDX:0-1)", "n10": "gpu:1(IDX:0)"}),
    sjob(7, "pdl:gus", "t1a2-gus", "COMPLETING", priority=4294901755, start=at(23, 59)),
    sjob(2, "pdl:ben", "t1a2-ben", "PENDING", reason="Resources", priority=4294901758, tasks=2, node_count=2),
    sjob(4, "pdl:dan:big", "t1a2-dan", "PENDING", reason="Priority", priority=4294901800, start=at(1, day=25)),
    sjob(6, "pdl:fay", "t1a2-fay", "PENDING", reason="PartitionNodeLimit", priority=4294901757, tasks=8,
         node_count=8),
    sjob(5, "etl", "t1a2-eve", "PENDING", reason="Priority", priority=1, per_task=""),
]
JOBS = squeue(*JOB_LIST)

#: ``sinfo --json``: partition gpu has n1, n2, n3, n10 (two GPUs each, n10 one) and n4,
#: down; n5 is in partition cpu only. sinfo may list a node more than once.
NODE_LIST = [
    {"name": name, "hostname": name, "address": f"10.78.0.{ip}", "gres": gres, "gres_used": "gpu:1",
     "state": state, "state_flags": flags, "partitions": parts, "operating_system": "Linux 6.18.44 #1 SMP"}
    for name, gres, ip, state, flags, parts in [
        ("n1", "gpu:2", 11, "mixed", [], ["gpu"]), ("n10", "gpu:1", 20, "mixed", [], ["gpu"]),
        ("n2", "gpu:2(S:0)", 12, "mixed", [], ["gpu"]), ("n3", "gpu:2", 13, "allocated", [], ["gpu"]),
        ("n4", "gpu:2", 14, "down", ["NOT_RESPONDING"], ["gpu"]), ("n5", "gpu:4", 15, "idle", [], ["cpu"]),
        ("n1", "gpu:2", 11, "mixed", [], ["gpu"]),
    ]
]
NODES = json.dumps({"meta": {}, "errors": [], "nodes": NODE_LIST})
PARTITIONS = ("PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL Default=YES QoS=N/A "
              "Nodes=n[1-4,10] State=UP TotalCPUs=10\n"
              "PartitionName=cpu AllowGroups=ALL Default=NO Nodes=n5 State=UP TotalCPUs=2\n")


def model(jobs=JOBS, nodes=NODES, **kwargs) -> dict:
    kwargs.setdefault("default_partition", "gpu")
    kwargs.setdefault("account_prefix", "t1a2-")  # the accounts of the jobs above
    return slurm_status_model(parse_jobs(jobs), parse_nodes(nodes), NOW, **kwargs)


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


def test_owners_as_slurm_writes_them():
    def job(name, account="t1a2-ann"):
        return parse_jobs(squeue(sjob(9, name, account, "RUNNING")))[0]

    assert slurm_job_owner(job("pdl:ann"), "t1a2-") == ("ann", "ann", "")
    assert slurm_job_owner(job("pdl:ann:big"), "t1a2-") == ("ann/big", "ann", "big")
    assert slurm_job_owner(job("pdl:", "t1a2-x"), "t1a2-") == ("t1a2-x", "t1a2-x", "")
    assert slurm_job_owner(job("jupyter", "t1a2-x"), "t1a2-") == ("t1a2-x", "t1a2-x", "")


def test_a_job_named_after_another_user_shows_as_its_own_account():
    """Guards slurm_jobs.pdl_job_owner: a job's name is its submitter's to choose; ann
    naming hers ``pdl:ben`` must not show ben holding GPUs."""
    forged = parse_jobs(squeue(sjob(9, "pdl:ben", "t1a2-ann", "RUNNING")))[0]
    assert slurm_job_owner(forged, "t1a2-") == ("t1a2-ann", "t1a2-ann", "")
    assert slurm_job_owner(forged, "pdl-") == ("t1a2-ann", "t1a2-ann", "")


def test_a_job_name_that_looks_like_other_fields_shows_as_the_jobs_own_account():
    forged = sjob(1, "x JobId=9 UserId=root(0) y", "pdl-sl-ann", "RUNNING", start=at(23), tasks=2, node_count=2,
                  placed={"n1": "gpu:1(IDX:0)", "n2": "gpu:1(IDX:0)"})
    rows = model(jobs=squeue(forged))["reservations"]
    assert [(r["node"], r["slot"], r["job"], r["owner"], r["account"], r["pdl"]) for r in rows] == [
        ("n1", "gpu:0", 1, "pdl-sl-ann", "pdl-sl-ann", False), ("n2", "gpu:0", 1, "pdl-sl-ann", "pdl-sl-ann", False)]


def test_times_are_slurms_epoch_seconds_and_unknown_when_zero():
    running = sjob(1, "pdl:ann", "t1a2-ann", "RUNNING", start=0, placed={"n1": "gpu:1(IDX:1)"})
    [row] = model(jobs=squeue(running))["reservations"]
    assert (row["node"], row["slot"], row["since"], row["held_s"]) == ("n1", "gpu:1", "", None)
    assert "<td>gpu:1</td><td>n1</td><td>ann</td><td>t1a2-ann</td><td>1</td><td>RUNNING</td><td></td><td></td>" \
        in render_page(model(jobs=squeue(running)))
    newer = {**running, "start_time": {"set": True, "infinite": False, "number": at(23)}, "job_state": ["RUNNING"],
             "job_id": {"set": True, "infinite": False, "number": 1}}
    [row] = model(jobs=squeue(newer))["reservations"]
    assert (row["job"], row["state"], row["since"], row["held_s"]) == (1, "RUNNING", "2026-11-24T23:00:00Z", 3600)


def test_the_slurm_page_escapes_names_shows_both_tables_and_says_where_reclaims_are():
    names = {"train": SCRIPT, "pdl:ben": f"pdl:{SCRIPT}"}
    accounts = {"pdl:ben": f"t1a2-{SCRIPT}"}  # as if an account could be so named: the page still escapes it
    hostile = squeue(*({**j, "name": names.get(j["name"], j["name"]),
                        "user_name": accounts.get(j["name"], j["user_name"])} for j in JOB_LIST))
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
    empty = render_page(model(jobs=squeue()))
    assert "No GPU is held." in empty and "Nobody is waiting." in empty and "7 of 9 GPU(s) free" in empty


def test_an_unreadable_slurm_is_one_line_on_the_page_not_an_exception(tmp_path):
    status = read_slurm_status(partition="gpu", slurm_env={"PATH": str(tmp_path)})  # no squeue there
    assert status["pool"] is None and status["free"] is None and status["reservations"] == []
    assert status["partition"] == "gpu" and status["error"].startswith("squeue: cannot run it")
    assert "\n" not in status["error"]
    page = render_page(status)
    assert '<p class="error">Slurm could not be read: squeue: cannot run it' in page
    assert "Partition gpu, nodes (none): GPUs unknown." in page


@pytest.mark.parametrize("out", ["squeue: error: invalid option\nnot JSON\n", "[1, 2]", '{"jobs": null}',
                                 '{"jobs": [null]}'])
def test_slurm_output_that_is_not_the_json_expected_is_one_line_on_the_page(monkeypatch, out):
    async def run(self, argv, *, account=None, timeout=30.0):
        return out if argv[0] == "squeue" else {"sinfo": NODES, "scontrol": PARTITIONS}[argv[0]]

    monkeypatch.setattr(SlurmCommands, "run", run)
    status = read_slurm_status(partition="gpu", slurm_env={"PATH": "/usr/bin"})
    assert status["pool"] is None and status["reservations"] == [] and status["queue"] == []
    assert status["error"].startswith("Slurm's output could not be understood: ") and "\n" not in status["error"]
    assert '<p class="error">Slurm could not be read: Slurm&#x27;s output could not be understood' in \
        render_page(status)


def test_the_reader_asks_slurms_own_commands_for_json_and_expands_no_node_list(monkeypatch):
    asked = []

    async def run(self, argv, *, account=None, timeout=30.0):
        asked.append(argv)
        assert account is None and self.env["SLURM_CONF"] == "/etc/lab/slurm.conf"
        return {("squeue", "--all", "--json"): JOBS, ("sinfo", "--json"): NODES,
                ("scontrol", "-o", "show", "partition"): PARTITIONS}[tuple(argv)]

    monkeypatch.setattr(SlurmCommands, "run", run)
    env = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "SLURM_CONF": "/etc/lab/slurm.conf"}
    status = read_slurm_status(partition="", slurm_env=env)
    assert status["error"] is None and status["partition"] == "gpu" and status["free"] == ["n1/gpu:1", "n2/gpu:1"]
    assert [(r["node"], r["slot"], r["job"]) for r in status["reservations"]][:5] == \
        [("n1", "gpu:0", 1), ("n2", "gpu:0", 1), ("n3", "gpu:0", 3), ("n3", "gpu:1", 3), ("n10", "gpu:0", 3)]
    assert asked == [["squeue", "--all", "--json"], ["sinfo", "--json"], ["scontrol", "-o", "show", "partition"]]
    asked.clear()
    assert read_slurm_status(partition="cpu", slurm_env=env)["nodes"] == ["n5"]
    assert asked == [["squeue", "--all", "--json"], ["sinfo", "--json"]]  # PDL named its partition


def test_the_hubs_settings_pick_the_slurm_source_and_its_flags_file():
    settings = {"kind": "slurm", "partition": " gpu ", "path": "/opt/slurm/bin:/usr/bin",
                "slurm_conf": "/etc/lab/slurm.conf", "account_prefix": "pdl-", "flags_db": ""}
    slurm = reader(settings)
    assert slurm.func is slurm_source.read_slurm_status and slurm.args == ()
    assert slurm.keywords == {"partition": "gpu", "account_prefix": "pdl-", "flags_db": "", "slurm_env": {
        "PATH": "/opt/slurm/bin:/usr/bin", "LANG": "C.UTF-8", "SLURM_CONF": "/etc/lab/slurm.conf"}}
    # as the hub gives them: no SLURM_CONF when the hub had none
    default = reader({"kind": "slurm", "partition": "", "slurm_conf": "", "path": "", "account_prefix": "lab-",
                      "flags_db": "/srv/hub/slurm-flags.sqlite"})
    assert default.keywords == {"partition": "", "account_prefix": "lab-", "flags_db": "/srv/hub/slurm-flags.sqlite",
                                "slurm_env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}}
    with pytest.raises(ValueError, match="PDL_SPAWNER must be one of local, slurm, swarm, got 'kubernetes'"):
        reader({"kind": "kubernetes"})


def test_gpus_held_idle_are_listed_for_the_pdl_job_that_holds_them_since_the_flag(tmp_path, monkeypatch):
    """The hub's flags (its file) show for a running PDL job that started before them:
    not an older job's flag (gus's job completes, ann's new one started after it), not
    another account's job, not a user with no job."""
    flags = tmp_path / "slurm-flags.sqlite"
    ledger = SlotLedger(flags)
    ledger.flag_gpu_idle("ann", at(23, 50))           # her job started 23:33:41
    ledger.flag_gpu_idle("gus", at(23, 0))            # before his job's start: an older job's
    ledger.flag_gpu_idle("t1a2-cat", at(23, 0))       # not a PDL job
    ledger.flag_gpu_idle("zed", at(23, 0))            # no job at all
    status = model(gpu_idle=ledger.gpu_idle_flags())
    assert [(r["owner"], r["since"], r["idle_s"]) for r in status["gpu_idle"]] == \
        [("ann", "2026-11-24T23:50:00Z", 600)]
    assert "GPUs held idle (0 % use)" in slurm_source.sections(status) and ">ann<" in slurm_source.sections(status)

    async def run(self, argv, *, account=None, timeout=30.0):
        return {("squeue", "--all", "--json"): JOBS, ("sinfo", "--json"): NODES}[tuple(argv)]

    monkeypatch.setattr(SlurmCommands, "run", run)
    env = {"PATH": "/usr/bin", "LANG": "C.UTF-8"}
    assert [r["owner"] for r in read_slurm_status(partition="gpu", slurm_env=env, flags_db=str(flags),
                                                  account_prefix="t1a2-")["gpu_idle"]] \
        == ["ann"]
    missing = tmp_path / "none.sqlite"  # no flag yet: none shown, and the view makes no file
    assert read_slurm_status(partition="gpu", slurm_env=env, flags_db=str(missing))["gpu_idle"] == []
    assert not missing.exists()


def test_a_typed_gpu_shows_its_type_in_the_reservations_and_the_queue():
    jobs = squeue(sjob(1, "pdl:ann", "t1a2-ann", "RUNNING", start=at(23), placed={"n1": "gpu:a100:1(IDX:1)"}),
                  sjob(2, "pdl:ben", "t1a2-ben", "PENDING", reason="Resources", per_task="gres:gpu:t4:1"))
    status = model(jobs=jobs)
    assert [(r["slot"], r["gpu_type"]) for r in status["reservations"]] == [("gpu:1", "a100")]
    assert [(q["gpus"], q["gpu_type"]) for q in status["queue"]] == [(1, "t4")]
    page = slurm_source.sections(status)
    assert "<td>gpu:1 (a100)</td>" in page and "<td>1 (t4)</td>" in page
