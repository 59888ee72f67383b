"""GPU-hours of PDL's jobs from Slurm's accounting (pdl_spawner/slurm/accounting.py): the
pure reading of ``sacct --json`` (jobs shaped as Slurm 22.05 writes them), the days a
job spans, and which jobs count; ``pdl-usage`` and the admin view on a Slurm hub, with
sacct answered from such output. The real sacct: tests/slurm/test_slurm_hub.py."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from pdl_spawner.admin.view import SETTINGS_FILE, usage_source
from pdl_spawner.admin.usage_report import main
from pdl_spawner.hub.usage_book import Usage
from pdl_spawner.slurm.accounting import SlurmAccounting, day_spans, job_gpus, sacct_argv, usage_rows
from pdl_spawner.slurm.cli import SlurmCommands, SlurmError

pytestmark = pytest.mark.unit


def at(day: int, hour: int, minute: int = 0) -> int:
    """Epoch seconds of a time of 2026-12-``day``, UTC."""
    return int(datetime(2026, 12, day, hour, minute, tzinfo=timezone.utc).timestamp())


def sacct_job(job_id: int, name: str, user: str, start: int, end: int, gpus: dict[str, int] | None = None) -> dict:
    """One job of ``sacct --json`` (the fields read, and a few others); ``gpus``: GRES
    TRES name ("gpu", "gpu:a100") -> count allocated."""
    allocated = [{"type": "cpu", "name": None, "id": 1, "count": 4}, {"type": "node", "name": None, "id": 4,
                                                                     "count": 2}]
    allocated += [{"type": "gres", "name": gres, "id": 1001, "count": n} for gres, n in (gpus or {}).items()]
    return {"job_id": job_id, "name": name, "user": user, "account": "lab", "partition": "gpu",
            "state": {"current": "COMPLETED" if end else "RUNNING", "reason": "None"},
            "time": {"elapsed": (end or at(3, 12)) - start, "start": start, "end": end, "submission": start},
            "tres": {"allocated": allocated, "requested": allocated}}


JOBS = [
    sacct_job(1, "pdl:ann", "pdl-ann", at(1, 23), at(2, 1), {"gpu": 3}),  # across midnight
    sacct_job(2, "pdl:ben:big", "pdl-ben", at(2, 9), at(2, 9, 30), {"gpu": 2, "gpu:a100": 2}),  # a named server
    sacct_job(3, "pdl:ann", "pdl-cat", at(2, 9), at(2, 10), {"gpu": 1}),  # cat named it after ann: not PDL's
    sacct_job(4, "train", "pdl-ann", at(2, 9), at(2, 10), {"gpu": 4}),  # ann's own job: not PDL's
    sacct_job(5, "pdl:dan", "pdl-dan", 0, 0, {"gpu": 1}),  # never started
    sacct_job(6, "pdl:eve", "pdl-eve", at(3, 11), 0, {"gpu": 1}),  # still running
    sacct_job(7, "pdl:fay", "pdl-fay", at(2, 9), at(2, 10)),  # no GPU accounted
]


def test_pdl_jobs_count_their_gpus_times_their_seconds_in_each_utc_day():
    rows = usage_rows(JOBS, since=at(1, 0), until=at(4, 0), now=at(3, 12))
    assert rows == [
        Usage("2026-12-01", "ann", "slurm", "gpu", "", 3 * 3600.0),
        Usage("2026-12-02", "ann", "slurm", "gpu", "", 3 * 3600.0),
        Usage("2026-12-02", "ben", "slurm", "gpu", "a100", 2 * 1800.0),  # the typed entries, not both
        Usage("2026-12-03", "eve", "slurm", "gpu", "", 3600.0),  # until now
    ]


def test_the_days_asked_clip_a_job():
    rows = usage_rows(JOBS, since=at(2, 0), until=at(2, 9, 15), now=at(3, 12))
    assert rows == [Usage("2026-12-02", "ann", "slurm", "gpu", "", 3 * 3600.0),
                    Usage("2026-12-02", "ben", "slurm", "gpu", "a100", 2 * 900.0)]


def test_lab_accounts_have_no_prefix():
    rows = usage_rows([sacct_job(8, "pdl:ann", "ann", at(2, 9), at(2, 10), {"gpu": 1}),
                       sacct_job(9, "pdl:ben", "pdl-ben", at(2, 9), at(2, 10), {"gpu": 1})],
                      since=at(2, 0), until=at(3, 0), now=at(3, 12), account_prefix="")
    assert [(r.user, r.seconds) for r in rows] == [("ann", 3600.0)]


@pytest.mark.parametrize(("tres", "gpus"), [
    ([{"type": "gres", "name": "gpu", "count": 2}], {"": 2}),
    ([{"type": "gres", "name": "gpu", "count": 3}, {"type": "gres", "name": "gpu:t4", "count": 1},
      {"type": "gres", "name": "gpu:a100", "count": 2}], {"t4": 1, "a100": 2}),
    ([{"type": "gres", "name": "gpumem", "count": 80}, {"type": "cpu", "name": None, "count": 8}], {}),
    ([], {}),
])
def test_a_jobs_gpus_are_its_allocated_gres_gpu_tres(tres, gpus):
    assert job_gpus({"tres": {"allocated": tres}}) == gpus


def test_a_span_is_cut_at_each_utc_midnight():
    assert day_spans(at(1, 22), at(3, 2)) == [("2026-12-01", 7200.0), ("2026-12-02", 86400.0),
                                              ("2026-12-03", 7200.0)]
    assert day_spans(at(2, 9), at(2, 9)) == []


def test_sacct_is_asked_for_every_users_jobs_as_json():
    argv = sacct_argv(at(1, 0), at(2, 0))
    assert argv[:3] == ["sacct", "--json", "--allusers"] and argv[3] == "--starttime" and argv[5] == "--endtime"


def answer_sacct(monkeypatch, out: str | Exception) -> list[list[str]]:
    """Slurm's commands answer ``out`` (or fail with it): the seam where Slurm's output
    is injected. Returns the argument lists run."""
    ran = []

    async def run(self, argv, **kwargs):
        ran.append(argv)
        if isinstance(out, Exception):
            raise out
        return out

    monkeypatch.setattr(SlurmCommands, "run", run)
    return ran


def slurm_state(tmp_path) -> str:
    """A hub state folder whose settings say Slurm, as the hub writes them."""
    (tmp_path / SETTINGS_FILE).write_text(json.dumps({
        "kind": "slurm", "partition": "", "account_prefix": "pdl-", "flags_db": "", "slurm_conf": "/etc/slurm.conf",
        "path": "/usr/bin", "usage_db": str(tmp_path / "usage.sqlite")}))
    return str(tmp_path)


def test_pdl_usage_on_a_slurm_hub_prints_sacct_hours(tmp_path, monkeypatch, capsys):
    ran = answer_sacct(monkeypatch, json.dumps({"meta": {}, "errors": [], "jobs": JOBS}))
    assert main(["--since", "2026-12-01", "--until", "2026-12-02", "--csv", "--state-dir", slurm_state(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "day,user,kind,worker,gpu_type,hours",
        "2026-12-01,ann,slurm,gpu,,3.0000",
        "2026-12-02,ann,slurm,gpu,,3.0000",
        "2026-12-02,ben,slurm,gpu,a100,1.0000",
    ]
    assert ran and ran[0][:3] == ["sacct", "--json", "--allusers"]


@pytest.mark.parametrize(("out", "said"), [
    (SlurmError("sacct", "Slurm accounting storage is disabled"), "sacct: Slurm accounting storage is disabled"),
    ("sacct: error: not JSON", "Expecting value"),
    ('{"jobs": null}', "sacct --json gave no list of jobs"),
])
def test_pdl_usage_says_in_one_line_when_slurm_cannot_be_read(tmp_path, monkeypatch, capsys, out, said):
    answer_sacct(monkeypatch, out)
    assert main(["--since", "2026-12-01", "--state-dir", slurm_state(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pdl-usage: ") and said in err and err.count("\n") == 1, err


def test_the_admin_view_of_a_slurm_hub_reads_slurms_accounting_and_reuses_it_briefly(tmp_path, monkeypatch):
    slurm_state(tmp_path)
    source = usage_source(json.loads((tmp_path / SETTINGS_FILE).read_text()))
    assert isinstance(source, SlurmAccounting)
    ran = answer_sacct(monkeypatch, json.dumps({"jobs": JOBS}))
    first = source.report("2026-12-01", "2026-12-02")
    assert source.report("2026-12-01", "2026-12-02") == first and len(ran) == 1
    source.report("2026-12-02")
    assert len(ran) == 2
