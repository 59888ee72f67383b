"""GPUs held idle (pdl_spawner/core/gpu_idle.py): the hub's readings of a server's GPU use
(the embedded default: nvidia-smi on the hub's machine, here a fake one) and the flag
after a time at 0 %. Work in progress: the panel, the admin view and the release follow."""

from __future__ import annotations

import asyncio
import time

import pytest

from lease_double import lease_spawner
from pdl_spawner.core.gpu_idle import SAMPLE_EVERY_S, IdleGpuTracker

pytestmark = pytest.mark.unit


def test_the_gpus_are_idle_from_the_first_sample_at_0_percent_until_one_reads_more():
    tracker = IdleGpuTracker()
    tracker.observe([0.0, 0.0], now=100)
    tracker.observe([0.0, 0.0], now=160)
    assert tracker.idle_for(400) == 300
    tracker.observe(None, now=450)  # no reading: no verdict
    assert tracker.idle_for(500) == 400
    tracker.observe([0.0, 3.0], now=500)  # one GPU at work
    assert tracker.idle_for(900) == 0
    tracker.observe([0.0, 0.0], now=900)
    assert tracker.idle_for(960) == 60


def fake_smi(tmp_path, rows: str) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text(f"#!/bin/sh\nprintf '{rows}'\n")
    path.chmod(0o755)
    return str(path)


def test_the_hub_reads_the_use_of_the_gpus_the_server_holds_and_flags_them_after_the_time_set(tmp_path):
    spawner = lease_spawner(tmp_path, None, pool=["gpu:0", "gpu:1", "gpu:2"], gpu_idle_flag_s=1800,
                            nvidia_smi=fake_smi(tmp_path, "0, 0\\n1, 57\\n2, 0\\n"))
    spawner.slots = ["gpu:0", "gpu:2"]
    assert asyncio.run(spawner.workers.gpu_use()) == [0.0, 0.0]  # gpu:1 is someone else's
    asyncio.run(spawner.sample_gpu_use(now=1000))
    asyncio.run(spawner.sample_gpu_use(now=1000 + SAMPLE_EVERY_S - 1))  # not due: no second reading
    assert spawner.gpu_idle_flag(now=1000 + 1799) is None
    assert spawner.gpu_idle_flag(now=1000 + 1800) == "GPUs held idle: 0 % use for 30 min"

    spawner.slots = ["gpu:1"]
    asyncio.run(spawner.sample_gpu_use(now=3000))
    assert spawner.gpu_idle_flag(now=9000) is None


@pytest.mark.parametrize("rows", ["0, [N/A]\\n", "1, 0\\n", ""])
def test_a_gpu_without_a_reading_gives_no_verdict(tmp_path, rows):
    spawner = lease_spawner(tmp_path, None, pool=["gpu:0", "gpu:1"], gpu_idle_flag_s=60,
                            nvidia_smi=fake_smi(tmp_path, rows))
    spawner.slots = ["gpu:0"]
    assert asyncio.run(spawner.workers.gpu_use()) is None


def test_the_hub_reads_the_memory_of_the_gpus_the_server_holds_into_its_metrics(tmp_path):
    from prometheus_client import REGISTRY

    smi = tmp_path / "nvidia-smi"  # answers what it is asked: the use, or the memory in MiB
    smi.write_text("#!/bin/sh\ncase \"$1\" in\n  *memory*) printf '0, 1024, 81920\\n1, 5, 81920\\n2, 40960, 81920\\n' ;;\n"
                   "  *) printf '0, 30\\n1, 0\\n2, 90\\n' ;;\nesac\n")
    smi.chmod(0o755)
    spawner = lease_spawner(tmp_path, None, pool=["gpu:0", "gpu:1", "gpu:2"], gpu_idle_flag_s=1800,
                            nvidia_smi=str(smi))
    spawner.slots = ["gpu:0", "gpu:2"]
    mib = 1024 * 1024
    assert asyncio.run(spawner.workers.gpu_memory()) == [(1024 * mib, 81920 * mib), (40960 * mib, 81920 * mib)]
    asyncio.run(spawner.sample_gpu_use(now=1000))
    read = lambda name, gpu: REGISTRY.get_sample_value(name, {"user": spawner.owner_key, "gpu": gpu})  # noqa: E731
    assert read("pdl_gpu_memory_used_bytes", "1") == 40960 * mib  # the server's second GPU, gpu:2
    assert read("pdl_gpu_memory_total_bytes", "0") == 81920 * mib
    assert read("pdl_gpu_utilization_ratio", "1") == 0.9
    spawner.clear_state()  # its GPUs given back: their series go
    assert read("pdl_gpu_memory_used_bytes", "0") is None and read("pdl_gpu_utilization_ratio", "0") is None
    spawner.slots = ["mig:0"]  # a MIG slice: nvidia-smi's memory is the whole GPU's, not read
    assert asyncio.run(spawner.workers.gpu_memory()) is None


def test_cpu_slots_are_not_watched(tmp_path):
    spawner = lease_spawner(tmp_path, None, gpu_idle_flag_s=60)
    spawner.slots = ["cpu:0"]
    assert asyncio.run(spawner.workers.gpu_use()) is None
    assert asyncio.run(spawner.workers.gpu_memory()) is None


def test_the_server_is_told_the_flag_once_and_its_lifting_and_the_gpus_are_taken_back_after_the_release(tmp_path):
    """The attack: a server told to release GPUs held idle that does not; the hub frees them."""
    from pdl.lease import GpuIdle
    from pdl_spawner.core.reservations import SlotLedger
    from pdl_spawner.core.session_limit import ENFORCE_AFTER_S

    holding = {"released": None, "want": None, "grant": None}
    spawner = lease_spawner(tmp_path, holding, pool=["gpu:0", "gpu:1"], gpu_idle_flag_s=600,
                            gpu_idle_release_s=900, nvidia_smi=fake_smi(tmp_path, "0, 0\\n1, 0\\n"))
    told = []
    double = spawner.fetch_lease

    async def fetch(body=None, part=""):
        if part == "gpu-idle":
            told.append(body)
            return {"ok": True}
        return await double(body, part)

    spawner.fetch_lease = fetch
    spawner.slots = SlotLedger(spawner.reservations_db).reserve("alice", 2, spawner.pool)
    now = 10_000.0
    asyncio.run(spawner.sample_gpu_use(now=now))
    asyncio.run(spawner.tell_gpu_idle(now=now + 599))
    asyncio.run(spawner.tell_gpu_idle(now=now + 600))
    asyncio.run(spawner.tell_gpu_idle(now=now + 700))  # unchanged: not told again
    assert told == [{"gpu_idle_since": 0.0, "release_at": 0.0},
                    {"gpu_idle_since": now, "release_at": now + 900}]
    assert spawner.gpu_idle_notice(now + 600).line(now + 600).startswith("GPUs held idle: 0 % use since ")
    assert not spawner.gpu_release_due(now + 900 + ENFORCE_AFTER_S - 1)
    assert spawner.gpu_release_due(now + 900 + ENFORCE_AFTER_S)

    spawner.gpu_tracker.idle_since = time.time() - 900 - ENFORCE_AFTER_S  # the release was due a while ago
    asyncio.run(spawner.tend_lease())
    assert SlotLedger(spawner.reservations_db).held_by("alice") == []
    [reclaim] = SlotLedger(spawner.reservations_db).reclaims()
    assert reclaim.reason.startswith("GPUs held idle (0 % use) for ")
    assert spawner.gpu_idle_notice() == GpuIdle(since=0.0)  # watched afresh


def test_the_admin_view_lists_gpus_held_idle_until_the_flag_lifts_or_the_slots_go(tmp_path):
    from pdl_spawner.admin.frame import render_page
    from pdl_spawner.core.reservations import SlotLedger
    from pdl_spawner.local.admin_source import PAGE, read_status

    db = tmp_path / "r.sqlite"
    ledger = SlotLedger(db)
    ledger.reserve("alice", 1, ["gpu:0", "gpu:1"])
    ledger.reserve("bob<script>", 1, ["gpu:1"])
    ledger.flag_gpu_idle("alice", time.time() - 2100)
    ledger.flag_gpu_idle("bob<script>", time.time() - 60)
    status = read_status(db, node="box", pool=["gpu:0", "gpu:1"])
    assert [(r["owner"], r["idle_s"] // 60) for r in status["gpu_idle"]] == [("alice", 35), ("bob<script>", 1)]
    page = render_page(status, PAGE)
    assert "GPUs held idle (0 % use)" in page and "<td>alice</td>" in page and "bob&lt;script&gt;" in page
    ledger.flag_gpu_idle("alice", None)
    ledger.release("bob<script>")  # the slots go: so does the flag
    status = read_status(db, node="box", pool=["gpu:0", "gpu:1"])
    assert status["gpu_idle"] == [] and "No GPU is held idle." in render_page(status, PAGE)


def test_a_reading_overdue_after_a_slow_look_is_taken_at_once_not_after_the_long_poll(tmp_path):
    """A look that took longer than ``gpu_sample_s`` (a slow ``srun`` step on a loaded
    machine) left the next reading in the past; the watch waited the long poll's 30 s for
    it, and a flag due 4 s after the GPUs went idle came 30 s late."""
    from pdl_spawner.core.spawner import CLOCK_SLACK_S

    spawner = lease_spawner(tmp_path, None, pool=["gpu:0"], gpu_idle_flag_s=4, gpu_sample_s=1,
                            nvidia_smi=fake_smi(tmp_path, "0, 0\\n"))
    spawner.slots = ["gpu:0"]
    asyncio.run(spawner.sample_gpu_use(now=time.time() - 1.5))  # the look began 1.5 s ago
    assert spawner.lease_due_in_s() <= CLOCK_SLACK_S
    asyncio.run(spawner.sample_gpu_use())
    assert 0.9 < spawner.lease_due_in_s() <= 1 + CLOCK_SLACK_S
