"""Each account's limits with the real kernel (:mod:`pdl_spawner.host.account_limits`), no
mocks: a process started the way the spawner starts a server (joins the account's cgroups
as root in the forked child, then gives root up as ``nobody``) forks until the kernel
says no, or allocates past its memory. Needs root and the cgroup v1 pids and memory
controllers: skips otherwise, and fails instead with ``$CI``."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from pdl_spawner.host import account_limits, device_cgroup
from pdl_spawner.host.account_limits import AccountLimits
from waiting import wait_until

pytestmark = pytest.mark.integration

NOBODY = 65534
MIB = 1 << 20
#: Forks until one fails, then says how many it made and why it stopped; its children
#: wait for stdin to close.
FORKER = r"""
import json, os
children, error = [], None
try:
    while len(children) < 200:
        pid = os.fork()
        if pid == 0:
            os.read(0, 1)
            os._exit(0)
        children.append(pid)
except OSError as e:
    error = type(e).__name__
print(json.dumps({"children": len(children), "error": error}), flush=True)
os.read(0, 1)
"""
#: Touches N MiB, one page at a time, then says so.
ALLOCATE = r"""
import sys
block = bytearray(int(sys.argv[1]) << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
print("allocated", flush=True)
"""


@pytest.fixture
def mounts():
    found = account_limits.support()
    if found.missing:
        if os.environ.get("CI"):
            pytest.fail("; ".join(found.missing))
        pytest.skip("; ".join(found.missing))
    return found.mounts


@pytest.fixture
def limits(mounts):
    """An account's cgroups under a parent of the test's own, removed afterwards."""
    parent = f"pdl-test-{secrets.token_hex(4)}"
    made = AccountLimits("pdl-ann", mounts, parent=parent)
    yield made
    made.remove()
    for root in mounts.values():
        if (Path(root) / parent).exists():
            (Path(root) / parent).rmdir()


def as_nobody_in(limits: AccountLimits):
    def preexec():
        for procs in limits.procs_files:
            device_cgroup.join(procs)
        account_limits.mark_user_process()
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    return preexec


def test_an_accounts_processes_stop_at_its_limit_and_the_cgroups_go_with_the_last(limits):
    limits.apply(processes=20)
    forker = subprocess.Popen([sys.executable, "-I", "-S", "-c", FORKER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, preexec_fn=as_nobody_in(limits), cwd="/")
    try:
        found = json.loads(forker.stdout.readline())
        assert found == {"children": 19, "error": "BlockingIOError"}  # the forker itself is the 20th
        assert limits.processes_now() == 20
        assert not limits.remove()  # still in use: kept
    finally:
        forker.stdin.close()
        forker.wait(timeout=30)
    wait_until(lambda: limits.processes_now() == 0, 30, what="the forker's children to end")
    assert limits.remove() and not any(path.exists() for path in limits.paths.values())


def test_an_allocation_past_the_accounts_memory_ends_that_process_alone(limits):
    limits.apply(memory_bytes=96 * MIB)
    run = [sys.executable, "-I", "-S", "-c", ALLOCATE]
    within = subprocess.run([*run, "32"], capture_output=True, text=True, preexec_fn=as_nobody_in(limits), timeout=60)
    assert within.returncode == 0 and "allocated" in within.stdout
    past = subprocess.run([*run, "400"], capture_output=True, text=True, preexec_fn=as_nobody_in(limits), timeout=60)
    assert past.returncode == -9 and "allocated" not in past.stdout  # the OOM killer, in the account's cgroup
    assert "oom_kill 1" in (limits.paths["memory"] / "memory.oom_control").read_text()
    # this process (the test, outside the account) allocates as much and goes on
    assert len(bytearray(400 * MIB)) == 400 * MIB


def test_the_users_processes_are_picked_by_the_oom_killer_before_the_hub(limits):
    """The hub lowers its own OOM score where it may (protect_hub), which what it starts
    inherits; a user's processes are marked higher in the forked child."""
    limits.apply()

    def oom_score(then) -> str:
        def preexec():
            account_limits.protect_hub()  # as in a child of the hub (may be refused: CAP_SYS_RESOURCE)
            then()
        done = subprocess.run([sys.executable, "-I", "-S", "-c", "print(open('/proc/self/oom_score_adj').read())"],
                              capture_output=True, text=True, preexec_fn=preexec, timeout=60)
        return done.stdout.strip()

    hubs = int(oom_score(lambda: None))
    assert hubs in (account_limits.HUB_OOM_SCORE_ADJ, 0)
    assert int(oom_score(as_nobody_in(limits))) == account_limits.USER_OOM_SCORE_ADJ > hubs


def test_limits_below_zero_are_refused_in_one_line(limits):
    with pytest.raises(ValueError, match=r"^limits are 0 \(none\) or more: processes -1, memory 0 bytes$"):
        limits.apply(processes=-1)
