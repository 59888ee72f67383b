"""Each server's CPU limit and each slot's cores with the real kernel
(:mod:`pdl_spawner.host.cpu_limits`), no mocks: processes started the way the spawner
starts a server's (joined as root, then ``nobody``) and an engine (joining its slot's
cgroups as itself, as :func:`pdl.runtime.boot.join_slot_cgroups` does). Needs root and
the cgroup v1 cpu and cpuset controllers: skips otherwise, and fails instead with
``$CI``."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdl.engine_contract import EngineContract
from pdl.slots import engine_env
from pdl_spawner.host import cpu_limits, device_cgroup
from pdl_spawner.host.cpu_limits import CpuLimits

pytestmark = pytest.mark.integration

NOBODY = 65534
#: Another account than NOBODY's (Debian's "daemon").
OTHER = 1
#: Busy for argv[1] seconds of wall time, then says the CPU seconds it got in them (not
#: those of its start, which a loaded machine stretches while the quota applies to it too).
BUSY = r"""
import sys, time
used, end = time.process_time(), time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    pass
print(time.process_time() - used, flush=True)
"""
#: As an engine starts (pdl.runtime.boot): joins its slot's cgroups, then asks for every
#: core; says the cores it may run on, and waits for stdin to close.
ENGINE = r"""
import json, os
from pdl.runtime.boot import join_slot_cgroups
join_slot_cgroups()
try:
    os.sched_setaffinity(0, range(os.cpu_count()))
except OSError as e:
    pass
print(json.dumps(sorted(os.sched_getaffinity(0))), flush=True)
os.read(0, 1)
"""


@pytest.fixture
def cpu():
    """This machine's CPU limits under a parent of the test's own, removed afterwards."""
    found = cpu_limits.support()
    if not found:
        if os.environ.get("CI"):
            pytest.fail("; ".join(found.missing))
        pytest.skip("; ".join(found.missing))
    parent = f"pdl-test-{secrets.token_hex(4)}"
    made = CpuLimits(found, hub="pdl-t-", parent=parent)
    yield made
    for root in found.mounts.values():
        for folder in sorted((Path(root) / parent).glob("**/"), key=lambda p: -len(p.parts)):
            device_cgroup.kill_cgroup(folder / "cgroup.procs", 5)
            folder.rmdir()


def as_account(uid: int, procs_files=()):
    def preexec():
        for procs in procs_files:
            device_cgroup.join(procs)
        os.setgid(uid)
        os.setuid(uid)

    return preexec


def engine(cpu: CpuLimits, slot: str, uid: int) -> subprocess.Popen:
    env = {**os.environ, **engine_env(slot, ["cpu:0", "cpu:1"], [0, 1],
                                      slot_cgroups=[str(f) for f in cpu.slot_folders()])}
    return subprocess.Popen([sys.executable, "-c", ENGINE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, preexec_fn=as_account(uid), cwd="/")


@pytest.mark.timing  # the second half measures what an unlimited process gets: the machine's load, alone
def test_a_servers_processes_get_at_most_its_cpu_limit(cpu):
    cpu.limit_server("pdl-ann", 0.25)
    busy = subprocess.run([sys.executable, "-I", "-S", "-c", BUSY, "1.0"], capture_output=True, text=True,
                          timeout=60, preexec_fn=as_account(NOBODY, cpu.server_procs_files("pdl-ann")))
    assert float(busy.stdout) <= 0.25 * 1.0 * 1.2, busy.stdout  # a quarter of a core, and the period's rounding
    cpu.limit_server("pdl-ann", None)  # no limit: a whole core
    busy = subprocess.run([sys.executable, "-I", "-S", "-c", BUSY, "1.0"], capture_output=True, text=True,
                          timeout=60, preexec_fn=as_account(NOBODY, cpu.server_procs_files("pdl-ann")))
    assert float(busy.stdout) > 0.5, busy.stdout


#: Busy on core 0 from monotonic time argv[1] to argv[2] (one clock for every process),
#: then says the CPU seconds it got in that window.
BUSY_WINDOW = r"""
import os, sys, time
os.sched_setaffinity(0, [0])
start, end = float(sys.argv[1]), float(sys.argv[2])
time.sleep(max(0.0, start - time.monotonic()))
used = time.process_time()
while time.monotonic() < end:
    pass
print(time.process_time() - used, flush=True)
"""


def test_on_a_core_both_want_an_engine_and_the_servers_get_half_each(cpu):
    """An engine busy on its slot's core and a server's process busy on the same core,
    over the same two seconds: each gets about half of it (the server's kernels and
    controller must answer while engines train on every core; with 1/5 they were seconds
    late on a loaded machine). A ratio of the two's CPU seconds, so other load on the
    core does not change it."""
    cpu.grant("cpu:0", [0], NOBODY)
    cpu.limit_server("pdl-ann", None)
    start = time.monotonic() + 1.0  # both started by then
    busy = [sys.executable, "-I", "-S", "-c", BUSY_WINDOW, str(start), str(start + 2.0)]
    engine_busy = subprocess.Popen(busy, stdout=subprocess.PIPE, text=True,
                                   preexec_fn=as_account(NOBODY, cpu.slot_procs_files("cpu:0")))
    server_busy = subprocess.Popen(busy, stdout=subprocess.PIPE, text=True,
                                   preexec_fn=as_account(NOBODY, cpu.server_procs_files("pdl-ann")))
    engine_s = float(engine_busy.communicate(timeout=60)[0])
    server_s = float(server_busy.communicate(timeout=60)[0])
    share = server_s / (engine_s + server_s)
    assert 0.4 < share < 0.6, (engine_s, server_s)


#: A server's process: at each line on stdin, asks for every core and says the cores it
#: may run on; ends at the end of stdin.
SERVER = r"""
import json, os, sys
for _ in sys.stdin:
    try:
        os.sched_setaffinity(0, range(os.cpu_count()))
    except OSError:
        pass
    print(json.dumps(sorted(os.sched_getaffinity(0))), flush=True)
"""


def test_a_server_keeps_off_the_cores_of_another_accounts_slot(cpu):
    """While NOBODY holds the slot of core 0, the server of another account runs on core
    1 only, whatever it asks for; NOBODY's own server keeps every core; when the slot is
    taken back, the other server has core 0 again."""
    servers = {}
    for owner, uid in (("pdl-ann", NOBODY), ("pdl-ben", OTHER)):
        cpu.limit_server(owner, None)
        servers[owner] = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True, cwd="/",
                                          preexec_fn=as_account(uid, cpu.server_procs_files(owner)))

    def cores(owner):
        servers[owner].stdin.write("\n")
        servers[owner].stdin.flush()
        return json.loads(servers[owner].stdout.readline())

    try:
        assert cores("pdl-ann") == cores("pdl-ben") == [0, 1]
        cpu.grant("cpu:0", [0], NOBODY)
        assert cores("pdl-ann") == [0, 1]
        assert cores("pdl-ben") == [1]
        cpu.take_back("cpu:0")
        assert cores("pdl-ben") == [0, 1]
    finally:
        for server in servers.values():
            server.stdin.close()
            server.wait(timeout=10)


def test_an_engine_stays_on_its_slots_cores_and_the_take_back_ends_it(cpu):
    cpu.grant("cpu:1", [1], NOBODY)
    ran = engine(cpu, "cpu:1", NOBODY)
    try:
        assert json.loads(ran.stdout.readline()) == [1]  # asked for every core, kept to its slot's
        assert cpu.pids_on("cpu:1") == [ran.pid]
        assert cpu.take_back("cpu:1") == []
        assert ran.wait(timeout=10) == -9
        assert all(procs.stat().st_uid == 0 for procs in cpu.slot_procs_files("cpu:1"))
        again = engine(cpu, "cpu:1", NOBODY)  # the slot is no longer the account's to join
        assert json.loads(again.stdout.readline()) == [0, 1]
        assert "not in its slot's cgroup" in again.communicate("", timeout=10)[1]
    finally:
        ran.kill()
        ran.wait()


def test_another_account_cannot_put_its_processes_on_a_slot_it_was_not_given(cpu):
    cpu.grant("cpu:0", [0], NOBODY)
    other = engine(cpu, "cpu:0", OTHER)
    assert json.loads(other.stdout.readline()) == [0, 1]  # not joined: anywhere, as the server's processes
    assert "not in its slot's cgroup" in other.communicate("", timeout=10)[1]
    assert cpu.pids_on("cpu:0") == []


def test_bad_limits_are_refused_in_one_line(cpu):
    with pytest.raises(ValueError, match=r"^cpu_limit is a number of cores, 0 or more \(0: none\), got -1$"):
        cpu.limit_server("pdl-ann", -1)
    with pytest.raises(ValueError, match=r"^slot cpu:0 needs at least one core$"):
        cpu.grant("cpu:0", [], NOBODY)


def test_the_engine_contract_carries_the_slots_cgroups():
    env = engine_env("cpu:1", ["cpu:0", "cpu:1"], [0, 1], slot_cgroups=["/c/cpu/pdl/slots/h", "/c/cpuset/pdl/slots/h"])
    assert EngineContract.from_env(env).cgroups == ("/c/cpu/pdl/slots/h/cpu-1", "/c/cpuset/pdl/slots/h/cpu-1")
    assert "PDL_ENGINE_CGROUPS" not in engine_env("cpu:1", ["cpu:0", "cpu:1"], [0, 1])
