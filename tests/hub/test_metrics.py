"""How the hub's metrics (pdl_spawner/hub/metrics.py) turn the kind's status into series:
readings of the same status model the admin view draws, in and out."""

from __future__ import annotations

import secrets

import pytest
from prometheus_client import REGISTRY

from pdl_spawner.admin.frame import gpu_idle_rows, reservation_row
from pdl_spawner.hub import metrics

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0


def value(name: str, **labels) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


class Status:
    """A kind's status model as the admin view's readers make it, changed by the test."""

    def __init__(self):
        self.rows: list[dict] = []
        self.idle: dict[str, float] = {}
        self.queue: list[dict] = []
        self.now = T0

    def hold(self, slot: str, owner: str, since: float, gpu_type: str = "", **more) -> None:
        self.rows.append({**reservation_row(slot, "node1", owner, owner.partition("/")[0], since, self.now),
                          "gpu_type": gpu_type, "_since": since, **more})

    def __call__(self) -> dict:
        """The status at :attr:`now`: each row's ``held_s`` from its ``since``."""
        rows = [{**r, "held_s": max(0, int(self.now - r["_since"]))} for r in self.rows]
        return {"reservations": rows, "gpu_idle": gpu_idle_rows(self.idle, self.now), "queue": self.queue}


@pytest.fixture
def kind():
    """A kind name of this test's own, so that its series are its own in the process's registry."""
    return f"k{secrets.token_hex(3)}"


def test_held_workers_add_their_seconds_between_readings_and_go_to_zero_when_given_back(kind):
    status = Status()
    sampler = metrics.PDLMetrics(status, kind)
    status.hold("gpu:0", "ann", T0 - 100, "a100")
    status.hold("gpu:1", "ann", T0 - 100, "a100")
    status.hold("cpu:0", "ben", T0 + 5)  # taken after the first reading
    sampler.sample(now=T0)
    labels = dict(user="ann", kind=kind, worker="gpu", gpu_type="a100")
    assert value("pdl_workers_held", **labels) == 2
    assert value("pdl_worker_seconds_total", **labels) is None  # nothing counted before the first reading
    status.now = T0 + 10
    sampler.sample(now=T0 + 10)
    assert value("pdl_worker_seconds_total", **labels) == pytest.approx(20)  # 2 GPUs x 10 s
    assert value("pdl_worker_seconds_total", user="ben", kind=kind, worker="cpu", gpu_type="") == pytest.approx(5)
    status.rows = [r for r in status.rows if r["user"] != "ann"]  # ann gave hers back
    status.now = T0 + 20
    sampler.sample(now=T0 + 20)
    assert value("pdl_workers_held", **labels) == 0
    assert value("pdl_worker_seconds_total", **labels) == pytest.approx(20)
    assert value("pdl_worker_seconds_total", user="ben", kind=kind, worker="cpu", gpu_type="") == pytest.approx(15)


def test_workers_given_back_count_up_to_then_and_servers_stopped_together_share_one_reading(kind, monkeypatch):
    """A stop (or reclaim) takes a reading first (metrics.count_until_now): the periodic
    reading before it may be up to sample_s old, or late on a busy machine."""
    import asyncio
    import time

    status, readings = Status(), []

    def read() -> dict:  # a reader takes a while (the ledger, Docker, Slurm's commands)
        time.sleep(0.2)
        readings.append(time.time())
        status.now = time.time()
        return status()

    sampler = metrics.PDLMetrics(read, kind)
    status.hold("gpu:0", "ann", time.time() - 60)
    sampler.sample()  # the last periodic reading
    asyncio.run(metrics.count_until_now())
    assert len(readings) == 1  # no sampler running (not the hub): nothing to count
    monkeypatch.setattr(metrics, "_registered", sampler)
    monkeypatch.setattr(sampler, "_thread", object())  # as in the hub: its sampler runs
    time.sleep(1.0)
    stopped = time.time()

    async def five_stops():
        await asyncio.gather(*(metrics.count_until_now() for _ in range(5)))

    asyncio.run(five_stops())
    assert len(readings) == 2  # one reading for all five
    counted = value("pdl_worker_seconds_total", user="ann", kind=kind, worker="gpu", gpu_type="")
    assert stopped - readings[0] <= counted <= time.time() - readings[0]


def test_gpus_flagged_idle_count_from_when_they_read_zero_and_other_jobs_count_nothing(kind):
    status = Status()
    sampler = metrics.PDLMetrics(status, kind)
    status.hold("gpu:0", "ann", T0 - 100)
    status.hold("gpu:1", "ann", T0 - 100)
    status.hold("gpu:2", "someone", T0 - 100, pdl=False)  # a Slurm job that is not PDL's
    status.hold("(pending)", "ben", T0 - 100)  # a Swarm task not placed yet holds nothing
    sampler.sample(now=T0)
    status.idle = {"ann": T0 + 4}
    status.now = T0 + 10
    sampler.sample(now=T0 + 10)
    assert value("pdl_gpu_idle_seconds_total", user="ann", kind=kind) == pytest.approx(12)  # 2 GPUs x 6 s
    assert value("pdl_workers_held", user="someone", kind=kind, worker="gpu", gpu_type="") is None
    assert value("pdl_workers_held", user="ben", kind=kind, worker="gpu", gpu_type="") is None


def test_the_queue_and_the_events_are_counted(kind):
    status = Status()
    status.queue = [{"owner": "ann"}, {"owner": "ben"}]
    metrics.PDLMetrics(status, kind).sample(now=T0)
    assert value("pdl_queue_length", kind=kind) == 2
    metrics.waited(kind, 42.0)
    assert value("pdl_queue_wait_seconds_count", kind=kind) == 1
    assert value("pdl_queue_wait_seconds_sum", kind=kind) == 42.0
    before = value("pdl_spawn_refusals_total", reason="over_limit") or 0
    metrics.refused("over_limit")
    assert value("pdl_spawn_refusals_total", reason="over_limit") == before + 1


def test_a_servers_gpu_readings_go_when_it_gives_its_gpus_back():
    owner = f"u{secrets.token_hex(3)}"
    metrics.gpu_use(owner, [37.0, 0.0])
    assert value("pdl_gpu_utilization_ratio", user=owner, gpu="0") == pytest.approx(0.37)
    assert value("pdl_gpu_utilization_ratio", user=owner, gpu="1") == 0.0
    metrics.gpu_use(owner, [50.0])  # one GPU left
    assert value("pdl_gpu_utilization_ratio", user=owner, gpu="1") is None
    metrics.gpu_use_gone(owner)
    assert value("pdl_gpu_utilization_ratio", user=owner, gpu="0") is None


def test_a_servers_gpu_memory_is_in_bytes_kept_when_unread_and_goes_with_its_gpus():
    owner = f"u{secrets.token_hex(3)}"
    gib = 1024 ** 3
    metrics.gpu_memory(owner, [(3 * gib, 80 * gib), (0.0, 80 * gib)])
    metrics.gpu_use(owner, [37.0, 0.0])  # the use's own reading leaves the memory's series
    assert value("pdl_gpu_memory_used_bytes", user=owner, gpu="0") == 3 * gib
    assert value("pdl_gpu_memory_total_bytes", user=owner, gpu="1") == 80 * gib
    metrics.gpu_memory(owner, None)  # not read this time: the last reading stays
    assert value("pdl_gpu_memory_used_bytes", user=owner, gpu="1") == 0.0
    metrics.gpu_memory(owner, [(1 * gib, 80 * gib)])  # one GPU left
    assert value("pdl_gpu_memory_used_bytes", user=owner, gpu="1") is None
    metrics.gpu_use_gone(owner)
    assert value("pdl_gpu_memory_used_bytes", user=owner, gpu="0") is None
    assert value("pdl_gpu_memory_total_bytes", user=owner, gpu="0") is None


def test_the_usage_book_adds_each_readings_seconds_to_the_day_and_pdl_usage_prints_them(kind, tmp_path, capsys):
    from pdl_spawner.admin import usage_report
    from pdl_spawner.hub import usage_book

    book = usage_book.UsageBook(tmp_path / usage_book.FILE_NAME)
    status = Status()
    sampler = metrics.PDLMetrics(status, kind, book)
    day_end = 1_799_971_200.0  # 2027-01-15 00:00 UTC
    status.now = day_end - 1800
    status.hold("gpu:0", "ann", day_end - 3600, "a100")
    sampler.sample(now=day_end - 1800)
    status.now = day_end - 1
    sampler.sample(now=day_end - 1)  # 1799 s on the 14th
    status.now = day_end + 3600
    sampler.sample(now=day_end + 3600)  # 3601 s, read on the 15th
    assert book.report("2027-01-14") == [
        usage_book.Usage("2027-01-14", "ann", kind, "gpu", "a100", 1799.0),
        usage_book.Usage("2027-01-15", "ann", kind, "gpu", "a100", 3601.0)]
    assert book.report("2027-01-15", "2027-01-15")[0].hours == pytest.approx(1.0003, abs=1e-4)

    assert usage_report.main(["--since", "2027-01-15", "--csv", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == ["day,user,kind,worker,gpu_type,hours",
                                                    f"2027-01-15,ann,{kind},gpu,a100,1.0003"]
    assert usage_report.main(["--since", "2027-01-14", "--state-dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 3 and table[1].split() == ["2027-01-14", "ann", kind, "gpu", "a100", "0.50"]


def test_pdl_usage_names_what_is_valid_for_a_bad_date(capsys, tmp_path):
    from pdl_spawner.admin import usage_report

    with pytest.raises(SystemExit) as exited:
        usage_report.main(["--since", "last week", "--state-dir", str(tmp_path)])
    assert exited.value.code == 2
    assert "'last week' is not a date: use YYYY-MM-DD" in capsys.readouterr().err


def test_the_admin_view_shows_each_persons_hours_of_this_week_and_this_month(tmp_path):
    from pdl_spawner.admin.frame import usage_section
    from pdl_spawner.hub import usage_book

    book = usage_book.UsageBook(tmp_path / usage_book.FILE_NAME)
    day = 86400.0
    wednesday = 1_799_971_200.0 + 5 * day + 3600  # Wednesday 2027-01-20, 01:00 UTC
    book.add(wednesday - 3 * day, {("ann", "local", "gpu", "a100"): 7200.0})  # Sunday the 17th: the month only
    book.add(wednesday - day, {("ann", "local", "gpu", "a100"): 3600.0, ("ben", "local", "cpu", ""): 1800.0})
    book.add(wednesday - 20 * day, {("ann", "local", "gpu", "a100"): 3600.0})  # December: neither
    rows = usage_book.summary_rows(book, wednesday)
    assert rows == [
        {"user": "ann", "gpu_week_h": 1.0, "gpu_month_h": 3.0, "cpu_week_h": 0.0, "cpu_month_h": 0.0},
        {"user": "ben", "gpu_week_h": 0.0, "gpu_month_h": 0.0, "cpu_week_h": 0.5, "cpu_month_h": 0.5},
    ]
    html = usage_section({"usage": rows})
    assert "<td>ann</td><td>1.00</td><td>3.00</td><td>0.00</td><td>0.00</td>" in html
    assert usage_section({}) == ""  # a status without the book shows no table
