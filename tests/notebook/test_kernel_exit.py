"""Outside a hub, the local cluster the magic started goes away with the kernel.

A real IPython shell runs in a child process, loads the extension and runs a
``%%distributed`` cell; then the child either exits normally or is killed with
SIGKILL (a crashed or force-restarted kernel). Either way, the controller and
every engine it started must be gone within seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from pdl.process import pid_alive
from waiting import wait_until

pytestmark = pytest.mark.integration

KERNEL = textwrap.dedent(
    """
    import sys, time
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "pdl_magics")
    ip.run_cell_magic("distributed", "-n 2", "import torch.distributed as dist; print('ranks', dist.get_world_size())")
    print("READY", flush=True)
    sys.stdin.readline()  # the test has counted this kernel's processes
    if sys.argv[1] == "wait":
        time.sleep(600)
    """
)


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_local_cluster_stops_when_the_kernel_goes(tmp_path, how):
    env = dict(os.environ, IPYTHONDIR=str(tmp_path / "ipython"), PYTHONUNBUFFERED="1")
    env.pop("PDL_CLUSTER_FILE", None)
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL, "wait" if how == "sigkill" else "exit"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        lines = []
        for line in kernel.stdout:
            lines.append(line)
            if line.startswith("READY"):
                break
        assert "ranks 2\n" in lines, "".join(lines)
        started = descendants(kernel.pid)
        assert len(started) >= 3, f"expected a controller and 2 engines, found {started}"
        kernel.stdin.write("go\n")
        kernel.stdin.flush()
        if how == "sigkill":
            os.kill(kernel.pid, signal.SIGKILL)
        kernel.wait(timeout=60)
        wait_until(lambda: not any(pid_alive(p) for p in started), 15, interval=0.1,
                   what=lambda: f"the kernel's processes to end; left running after the kernel {how}: "
                                f"{[p for p in started if pid_alive(p)]}")
    finally:
        if kernel.poll() is None:
            kernel.kill()
        for pid in descendants(kernel.pid):
            os.kill(pid, signal.SIGKILL)
