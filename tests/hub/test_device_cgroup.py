"""GPU device isolation with the real kernel (:mod:`pdl_spawner.host.device_cgroup`), no mocks.

Stand-in GPUs are char device nodes made here with ``os.mknod`` (a major of Linux's
local/experimental range that no driver has, mode 0666), so file permissions let
everyone open them: opening one fails with ENXIO (no driver) when the device cgroup
lets the open through, and with EPERM when the cgroup stops it. The attacker is a
probe process running as ``nobody``, started inside the cgroup the way the spawner
starts a server (join as root in the child, then give root up), that answers
commands over a pipe, so no test waits with sleeps.

Each test runs with every mechanism this machine has (cgroup v1 devices controller,
cgroup v2 device eBPF). Needs root: skips otherwise, and fails instead with ``$CI``.
"""

from __future__ import annotations

import errno
import os
import pwd
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pdl_spawner.accounts import unix_accounts

from pdl_spawner.host import device_cgroup
from pdl_spawner.host.device_cgroup import DeviceCgroup

pytestmark = pytest.mark.integration

#: The attacker: reads "<verb> <argument>" lines, answers one line each ("ok" or the
#: errno's name). Plain stdlib, run with -I -S by an interpreter nobody can run.
PROBE = r"""
import errno, os, signal, sys

def daemon():
    # fork, setsid, fork again: the grandchild lives on in the background, reparented
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write_end, str(os.getpid()).encode())
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, 256)
            while True:
                signal.pause()
        os._exit(0)
    os.close(write_end)
    pid = os.read(read_end, 32).decode()
    os.waitpid(child, 0)
    return pid

for line in sys.stdin:
    verb, _, argument = line.rstrip("\n").partition(" ")
    try:
        if verb == "open":
            os.close(os.open(argument, os.O_RDWR))
            answer = "ok"
        elif verb == "write":
            path, _, text = argument.partition("\t")
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
            answer = "ok"
        elif verb == "daemon":
            answer = daemon()
        else:
            answer = "unknown verb " + verb
    except OSError as e:
        answer = errno.errorcode.get(e.errno, str(e.errno))
    sys.stdout.write(answer + "\n")
    sys.stdout.flush()
"""


def _cannot_run(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"device cgroup tests cannot run: {reason} (CI is set: failing instead of skipping)")
    pytest.skip(f"device cgroup tests cannot run: {reason}")


@pytest.fixture(params=[device_cgroup.CGROUP1_DEVICES, device_cgroup.CGROUP2_BPF])
def isolation(request) -> device_cgroup.Support:
    """Each mechanism in turn, where this machine has it."""
    if os.geteuid() != 0:
        _cannot_run("not root")
    found = device_cgroup.support(request.param)
    if not found:
        _cannot_run(found.reason)
    return found


@pytest.fixture
def nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        _cannot_run("no account 'nobody'")


@pytest.fixture
def python_for_nobody() -> str:
    """An interpreter every account can run (the venv's may live under /root)."""
    for candidate in (sys.executable, shutil.which("python3"), "/usr/bin/python3", "/usr/local/bin/python3"):
        if candidate and os.path.exists(candidate) and unix_accounts.unreachable_by_others(candidate) is None:
            return candidate
    _cannot_run("no Python interpreter that 'nobody' can run")


@pytest.fixture
def gpu_nodes():
    """Three stand-in GPU nodes, ``<free major>:0..2``, mode 0666, in a folder every
    account can enter (and a file system that honours device nodes)."""
    folder = Path(tempfile.mkdtemp(prefix="pdl-test-gpus-"))
    try:
        folder.chmod(0o755)
        if os.statvfs(folder).f_flag & os.ST_NODEV:
            _cannot_run(f"{folder} is on a nodev file system")
        major = _free_char_major()
        nodes = []
        for minor in range(3):
            node = folder / f"gpu{minor}"
            os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(major, minor))
            node.chmod(0o666)  # past the umask
            nodes.append(node)
        yield nodes
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _free_char_major() -> int:
    """A major of the local/experimental range (240-254) that no driver registered."""
    text = Path("/proc/devices").read_text()
    char_section = text.split("Block devices:")[0]
    taken = {int(fields[0]) for fields in (line.split() for line in char_section.splitlines()[1:]) if fields}
    free = [major for major in range(240, 255) if major not in taken]
    if not free:
        _cannot_run("every major of 240-254 has a driver")
    return free[0]


class Probe:
    """One probe process; :meth:`ask` sends a command and returns its one-line answer."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.pid = process.pid

    def ask(self, verb: str, argument: object = "") -> str:
        self.process.stdin.write(f"{verb} {argument}\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        assert answer, f"probe {self.pid} died: {self.process.stderr.read()}"
        return answer.strip()

    def opens(self, nodes) -> list[str]:
        return [self.ask("open", node) for node in nodes]


@pytest.fixture
def lab(isolation, nobody, python_for_nobody):
    """Makes owners' cgroups under a parent unique to this test, and probes running as
    nobody; kills and removes all of them afterwards, whatever the test (or the product)
    did: probes and their daemons are killed through handles of the test's own, not
    only by ``kill_all``."""
    parent = f"pdl-test-{os.getpid()}-{secrets.token_hex(3)}"
    made: list[DeviceCgroup] = []
    probes: list[Probe] = []
    daemons: list[int] = []  # pidfds

    class Lab:
        def cgroup(self, owner: str) -> DeviceCgroup:
            group = DeviceCgroup(owner, parent=parent, isolation=isolation)
            made.append(group)
            group.create()
            return group

        def probe(self, group: DeviceCgroup | None) -> Probe:
            """A probe as nobody, inside ``group`` (or where the test runs, with None)."""
            procs = str(group.procs_file) if group else None

            def preexec():  # what the spawner does: join as root, then give root up
                if procs:
                    device_cgroup.join(procs)
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)

            process = subprocess.Popen([python_for_nobody, "-I", "-S", "-c", PROBE], cwd="/", text=True,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       preexec_fn=preexec)
            probe = Probe(process)
            probes.append(probe)
            return probe

        def daemon(self, probe: Probe) -> int:
            """Have ``probe`` double-fork a background process; its pid (killed at the end)."""
            pid = int(probe.ask("daemon"))
            daemons.append(os.pidfd_open(pid))  # at once: the daemon waits in pause()
            return pid

    try:
        yield Lab()
    finally:
        for probe in probes:
            probe.process.kill()
            probe.process.communicate()
        for pidfd in daemons:
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(pidfd)
        problems = []
        for group in made:
            left = group.kill_all(10)
            try:
                group.remove()
            except OSError as e:
                problems.append(f"{group.path}: {e} (processes left: {left})")
        try:
            (isolation.root / parent).rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            problems.append(f"{isolation.root / parent}: {e}")
        assert not problems, "cleanup failed: " + "; ".join(problems)


def test_only_the_reserved_node_opens(lab, gpu_nodes):
    """Guards ``DeviceCgroup.restrict`` denying every pool node but the allowed ones
    (v1: the ``devices.deny`` lines; v2: the eBPF filter) and :func:`join` putting the
    child in the cgroup before it gives root up. Only the cgroup stops the opens: the
    nodes are mode 0666."""
    ann, ben = lab.cgroup("ann"), lab.cgroup("ben/named-server")
    ann.restrict([gpu_nodes[0]], gpu_nodes)
    ben.restrict(gpu_nodes[1:], gpu_nodes)

    in_ann, in_ben, outside = lab.probe(ann), lab.probe(ben), lab.probe(None)

    assert in_ann.opens(gpu_nodes) == ["ENXIO", "EPERM", "EPERM"]
    assert in_ben.opens(gpu_nodes) == ["EPERM", "ENXIO", "ENXIO"]
    assert outside.opens(gpu_nodes) == ["ENXIO", "ENXIO", "ENXIO"]
    assert in_ann.pid in ann.pids() and in_ann.pid not in ben.pids()
    # other devices are not affected
    assert in_ann.opens(["/dev/null", "/dev/urandom"]) == ["ok", "ok"]


def test_restrict_again_replaces_the_rule(lab, gpu_nodes):
    """Guards ``DeviceCgroup.restrict`` replacing the previous rule (v1: the
    ``devices.allow`` line that lifts a deny; v2: detaching the old filter), for
    processes already running in the cgroup and for new ones."""
    ann = lab.cgroup("ann")
    ann.restrict([gpu_nodes[0]], gpu_nodes)
    running = lab.probe(ann)
    assert running.opens(gpu_nodes) == ["ENXIO", "EPERM", "EPERM"]

    ann.restrict([gpu_nodes[1]], gpu_nodes)
    assert running.opens(gpu_nodes) == ["EPERM", "ENXIO", "EPERM"]
    assert lab.probe(ann).opens(gpu_nodes) == ["EPERM", "ENXIO", "EPERM"]

    ann.restrict([], gpu_nodes)  # idle engines gave every GPU back
    assert running.opens(gpu_nodes) == ["EPERM", "EPERM", "EPERM"]

    ann.restrict(gpu_nodes, gpu_nodes)  # granted all of them
    assert lab.probe(ann).opens(gpu_nodes) == ["ENXIO", "ENXIO", "ENXIO"]


def test_process_cannot_leave_its_cgroup(lab, gpu_nodes, isolation):
    """Guards ``DeviceCgroup.create`` leaving the cgroup's files root's (no delegation
    to the user) and the join happening before the child gives root up: the user's
    process can neither move itself out nor rewrite its own rule."""
    ann = lab.cgroup("ann")
    ann.restrict([gpu_nodes[0]], gpu_nodes)
    probe = lab.probe(ann)

    assert probe.ask("write", f"{ann.path.parent / 'cgroup.procs'}\t0") == "EACCES"
    assert probe.ask("write", f"{isolation.root / 'cgroup.procs'}\t0") == "EACCES"
    if isolation.mechanism == device_cgroup.CGROUP1_DEVICES:
        assert probe.ask("write", f"{ann.path / 'devices.allow'}\ta *:* rwm") == "EACCES"
    assert probe.pid in ann.pids()
    assert probe.opens(gpu_nodes) == ["ENXIO", "EPERM", "EPERM"]


def test_kill_all_leaves_nothing(lab, gpu_nodes):
    """Guards ``DeviceCgroup.kill_all`` (every process in the cgroup, double-forked
    daemons included, dead when it returns) and ``DeviceCgroup.remove``."""
    ann = lab.cgroup("ann")
    ann.restrict([gpu_nodes[0]], gpu_nodes)
    probe = lab.probe(ann)
    daemon = lab.daemon(probe)
    assert daemon != probe.pid
    assert set(ann.pids()) == {probe.pid, daemon}
    with pytest.raises(OSError) as busy:
        ann.remove()
    assert busy.value.errno == errno.EBUSY

    exits = select.poll()  # a pidfd turns readable when its process has exited
    pidfds = [os.pidfd_open(pid) for pid in (probe.pid, daemon)]
    try:
        for fd in pidfds:
            exits.register(fd, select.POLLIN)
        assert ann.kill_all(10) == []
        assert len(exits.poll(0)) == 2
    finally:
        for fd in pidfds:
            os.close(fd)
    assert probe.process.wait() == -9
    assert ann.pids() == []

    ann.remove()
    assert not ann.path.exists()
    ann.remove()  # gone already: nothing to do
    assert ann.kill_all(1) == []


@pytest.mark.unit
def test_cgroup_names():
    """Guards ``cgroup_name``: distinct owners get distinct, safe directory names;
    path tricks are refused."""
    assert device_cgroup.cgroup_name("ann") == "ann"
    assert device_cgroup.cgroup_name("ann/named-server") == "ann%2Fnamed-server"
    assert device_cgroup.cgroup_name("ann%2Fnamed-server") == "ann%252Fnamed-server"
    assert device_cgroup.cgroup_name("a.b") == "a%2Eb"
    assert device_cgroup.cgroup_name("tasks") == "%74asks"  # not the cgroup's own file
    assert device_cgroup.cgroup_name("é") == "%C3%A9"
    for bad in ["", "..", "ann/../ben", "a\0b", "a\nb", "é" * 100]:
        with pytest.raises(ValueError):
            device_cgroup.cgroup_name(bad)
    with pytest.raises(ValueError):
        DeviceCgroup("ann", parent="../etc")


def test_processes_holding_finds_every_open_handle_on_a_gpu_node(tmp_path):
    """Guards ``processes_holding`` (what the hub looks at before it frees a GPU): a
    process with a node open is found whatever path it opened (a copy of the node with
    the same major:minor counts), with the node named; once it closes it, it is not."""
    if os.geteuid() != 0:
        _cannot_run("makes device nodes: needs root")
    if os.statvfs(tmp_path).f_flag & os.ST_NODEV:
        _cannot_run(f"{tmp_path} is on a nodev file system")
    gpu, copy = tmp_path / "gpu0", tmp_path / "copy-of-gpu0"
    for node in (gpu, copy):  # /dev/full's numbers: a real driver, so an open succeeds
        os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(1, 7))
    holder = subprocess.Popen([sys.executable, "-c", f"""
import os, sys
fd = os.open({str(copy)!r}, os.O_RDONLY)
print("open", flush=True)
sys.stdin.readline()
os.close(fd)
print("closed", flush=True)
sys.stdin.readline()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        others = [os.getpid()]
        assert device_cgroup.processes_holding([gpu], [holder.pid, *others]) == {holder.pid: [str(gpu)]}
        assert holder.pid in device_cgroup.processes_of_uid(os.geteuid())
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "closed"
        assert device_cgroup.processes_holding([gpu], [holder.pid, *others]) == {}
    finally:
        holder.kill()
        holder.wait()
