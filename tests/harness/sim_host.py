"""What the simulated clusters (swarm_harness, slurm_harness) share on the host.

- :func:`run`: one host command, its output captured, raising with its stderr.
- Their processes: :func:`cmdline`, :func:`pids_naming` (by program and run directory),
  :func:`terminate` (SIGTERM, then SIGKILL).
- :class:`RunDirLock`: a second test session waits for the first's cluster instead of
  tearing it down; :class:`SimulatedCluster`: the lifecycle both share (``up()`` under
  that lock, after cleaning up what a crashed run left; ``down()``; timings).
- Their network: :func:`bridged_namespaces` makes one network namespace per node on a
  bridge in a namespace of its own, plus a veth that gives the root namespace an
  address on that bridge; :func:`remove_namespaces` and :func:`remove_links` undo it,
  stopping whatever still runs inside.

Each simulation names its namespaces and veths with its own prefix and removes only
those names: names are at most 15 characters (IFNAMSIZ).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pdl.process import pid_alive


def run(*cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd`` with its output captured as text; with ``check``, a non-zero exit
    raises RuntimeError naming the command and its stderr."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    p = subprocess.run(list(cmd), check=False, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {(p.stderr or p.stdout or '').strip()}")
    return p


def cmdline(pid: int) -> str:
    """The command line of ``pid``, its arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def pids_naming(text: str, commands: tuple[str, ...]) -> list[int]:
    """PIDs of the programs whose name (``/proc/PID/comm``) starts with one of
    ``commands`` and whose command line contains ``text`` (this process aside)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith(commands) and text in cmdline(int(entry.name)):
            pids.append(int(entry.name))
    return pids


def terminate(pids, timeout: float = 20.0) -> None:
    """SIGTERM the given PIDs, wait up to ``timeout``, then SIGKILL what is left."""
    pids = [p for p in set(pids) if p > 1 and p != os.getpid()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)


class RunDirLock:
    """An exclusive lock on ``<run_dir>.lock``, held from :meth:`acquire` to :meth:`release`
    (flock: the kernel drops it when a crashed holder's process ends)."""

    def __init__(self, run_dir: Path):
        self.path = Path(str(run_dir) + ".lock")
        self._file = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self, timeout: float = 1800) -> None:
        """Wait up to ``timeout`` s for the lock (TimeoutError naming the file after that)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w")  # noqa: SIM115 - held open as long as the lock is
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self._file.close()
                    self._file = None
                    raise TimeoutError(f"another session holds {self.path}") from None
                time.sleep(1)

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


class SimulatedCluster:
    """The lifecycle of a simulated cluster that lives in one run directory.

    A subclass sets :attr:`unavailable` (its exception) and provides
    :meth:`unavailable_reason`, :meth:`_stages` (what ``up()`` does, in order),
    :meth:`_cleanup_leftovers` (stop and remove all of its own, whether this object or
    a crashed run started it) and :meth:`logs`; :meth:`_stop` is what ``down()`` does
    (by default, the cleanup).
    """

    unavailable: type[Exception] = RuntimeError

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self._lock = RunDirLock(run_dir)
        self.timings: dict[str, object] = {}  # stage -> seconds since up() began; "down": seconds

    def unavailable_reason(self) -> str | None:
        """Why this machine cannot run the cluster (None: it can, as far as we can tell)."""
        raise NotImplementedError

    def _stages(self) -> list[tuple[str, Callable[[], None]]]:
        raise NotImplementedError

    def _cleanup_leftovers(self) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        self._cleanup_leftovers()

    def logs(self, tail: int = 40) -> str:
        raise NotImplementedError

    def up(self):
        """Start the cluster (:attr:`unavailable` where this machine cannot run it). Waits
        for the lock first, then cleans up what a crashed run left; on a failure, prints
        the logs, stops what it started and raises."""
        reason = self.unavailable_reason()
        if reason:
            raise self.unavailable(reason)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        t0 = time.monotonic()
        try:
            self._cleanup_leftovers()
            self.timings["cleanup"] = time.monotonic() - t0
            for name, stage in self._stages():
                stage()
                self.timings[name] = time.monotonic() - t0
        except BaseException:
            with contextlib.suppress(Exception):
                sys.stderr.write(self.logs(tail=30))
            self.down()
            raise
        return self

    def down(self, purge: bool = False) -> None:
        """Stop everything; ``purge`` also deletes the run directory.

        Safe to call on a new object to clean up a crashed run: it first waits for the
        lock, so it never tears down another session's cluster."""
        if not self._lock.held:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()
        try:
            t0 = time.monotonic()
            self._stop()
            self.timings["down"] = time.monotonic() - t0
            with contextlib.suppress(OSError):
                (self.run_dir / "timings.json").write_text(json.dumps(self.timings, indent=1) + "\n")
            if purge:
                shutil.rmtree(self.run_dir, ignore_errors=True)
        finally:
            self._lock.release()

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


# -- network namespaces --------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """A node's namespace on the bridge: ``addr`` (CIDR) on its ``eth0``, which is made as
    the veth ``outer`` in the root namespace, its peer ``port`` joining the bridge."""

    netns: str
    addr: str
    outer: str
    port: str


def netns_names() -> list[str]:
    """The named network namespaces (``ip netns list``)."""
    out = run("ip", "netns", "list", check=False).stdout
    return [line.split(" ", 1)[0].strip() for line in out.splitlines() if line.strip()]


def veth_names() -> list[str]:
    """The veths in the root network namespace."""
    out = run("ip", "-o", "link", "show", "type", "veth", check=False).stdout
    return [line.split(":", 2)[1].strip().split("@", 1)[0] for line in out.splitlines()]


def bridged_namespaces(bridge_ns: str, members: list[Member], host_if: str, host_peer: str,
                       host_addr: str) -> None:
    """Make ``bridge_ns`` with a bridge ``br0``, each member's namespace with ``eth0`` on
    that bridge, and the veth ``host_if`` (``host_addr``, CIDR) in the root namespace,
    its peer ``host_peer`` on the bridge. Nothing else is routed."""
    run("ip", "netns", "add", bridge_ns)
    run("ip", "-n", bridge_ns, "link", "set", "lo", "up")
    run("ip", "-n", bridge_ns, "link", "add", "br0", "type", "bridge")
    run("ip", "-n", bridge_ns, "link", "set", "br0", "up")
    for m in members:
        run("ip", "netns", "add", m.netns)
        run("ip", "link", "add", m.outer, "type", "veth", "peer", "name", m.port)
        run("ip", "link", "set", m.outer, "netns", m.netns)
        run("ip", "link", "set", m.port, "netns", bridge_ns)
        run("ip", "-n", bridge_ns, "link", "set", m.port, "master", "br0")
        run("ip", "-n", bridge_ns, "link", "set", m.port, "up")
        run("ip", "-n", m.netns, "link", "set", "lo", "up")
        run("ip", "-n", m.netns, "link", "set", m.outer, "name", "eth0")
        run("ip", "-n", m.netns, "addr", "add", m.addr, "dev", "eth0")
        run("ip", "-n", m.netns, "link", "set", "eth0", "up")
    run("ip", "link", "add", host_if, "type", "veth", "peer", "name", host_peer)
    run("ip", "link", "set", host_peer, "netns", bridge_ns)
    run("ip", "-n", bridge_ns, "link", "set", host_peer, "master", "br0")
    run("ip", "-n", bridge_ns, "link", "set", host_peer, "up")
    run("ip", "addr", "add", host_addr, "dev", host_if)
    run("ip", "link", "set", host_if, "up")


def netns_pids(name: str) -> list[int]:
    """The processes in network namespace ``name``."""
    return [int(p) for p in run("ip", "netns", "pids", name, check=False).stdout.split()]


def remove_namespaces(names: list[str], timeout: float = 10) -> None:
    """Stop every process in the given network namespaces, then delete them."""
    for name in names:
        terminate(netns_pids(name), timeout=timeout)
    for name in names:
        run("ip", "netns", "del", name, check=False)


def remove_links(names: list[str]) -> None:
    """Delete these links of the root namespace (a veth's peer goes with it)."""
    for name in names:
        run("ip", "link", "del", name, check=False)
