"""Another local account can neither listen to a user's kernel nor join their torch group.

The embedded default runs the hub, the users' servers and their engines on one host.
Each attack below comes from outside the user's processes (as ``nobody`` when the
tests run as root) and must fail; each fails when the protection its test's
docstring names is removed:

- a kernel started by a real Jupyter server with PDL's installed config, whose IOPub
  (like every kernel channel) has no key for subscribers;
- a torch.distributed group formed by a DistributedSession on local engines, whose
  rendezvous store would let anyone read and set keys or claim a rank.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from hub_harness import Kernel, listening_tcp, open_path_to, pids_matching
from lab_harness import LabServer
from pdl.runtime import engine
from waiting import wait_until

pytestmark = pytest.mark.integration

ATTACKER = "nobody"
MARKER = "pdl-private-" + uuid.uuid4().hex[:8]


def as_attacker(script: str, timeout: float) -> dict:
    """Run ``script`` (which prints one JSON line) as :data:`ATTACKER` when root, else
    as this account; its result."""
    kwargs = {}
    if os.geteuid() == 0:
        entry = pwd.getpwnam(ATTACKER)
        kwargs = dict(user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                          cwd="/", env={"PATH": os.environ.get("PATH", ""), "HOME": "/nonexistent"}, **kwargs)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def private_folder(path: str) -> bool:
    """Whether ``path`` is a folder that only this account can enter (rwx------; Jupyter
    also sets the sticky bit on its runtime dir) and owns."""
    st = os.stat(path)
    return stat.S_ISDIR(st.st_mode) and st.st_mode & 0o777 == 0o700 and st.st_uid == os.geteuid()


# -- the kernel ------------------------------------------------------------------------


#: The server runs under /user/<USER>/, as a hub user's does, so that hub_harness's
#: websocket client (:class:`hub_harness.Kernel`) drives its kernels.
USER = "me"


def start_server(root: Path) -> LabServer:
    """PDL's Jupyter server (the installed config) in ``root``, at /user/:data:`USER`/."""
    server = LabServer(root, extra_args=[f"--ServerApp.base_url=/user/{USER}/"])
    origin, server.url = server.url, f"{server.url}/user/{USER}"
    server.start()
    server.as_hub = SimpleNamespace(url=origin, user_url=lambda user: f"{origin}/user/{user}",
                                    user_token=lambda user: server.token)
    return server


def start_kernel(server: LabServer) -> Kernel:
    """A kernel on ``server``, with its ``pid``, ``connection_file`` and connection ``info``."""
    k = Kernel(server.as_hub, USER)
    k.pid = wait_until(lambda: pids_matching(lambda cmd, cwd: f"kernel-{k.id}.json" in cmd), 30,
                       what="the kernel process")[0]
    argv = psutil.Process(k.pid).cmdline()
    k.connection_file = argv[argv.index("-f") + 1]
    k.execute_ok("1")  # the kernel has bound its sockets
    k.info = json.loads(Path(k.connection_file).read_text())
    return k


@pytest.fixture(scope="module")
def lab():
    """PDL's Jupyter server (the installed config) in a new folder of the temporary
    folder; its runtime dir is not made yet: the server makes it. Every folder above
    it lets others through, so that only the runtime dir's own mode keeps them out."""
    root = Path(tempfile.mkdtemp(prefix="pdl-lab-"))  # short: see test_a_runtime_dir_too_deep...
    open_path_to(root)
    server = start_server(root)
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def kernel(lab):
    k = start_kernel(lab)
    yield k
    k.close()


def tcp_besides_the_output_pipe(k: Kernel) -> list[tuple[str, int]]:
    """The TCP sockets ``k`` listens on, except ipykernel's pipe for output from forked
    subprocesses: always TCP on 127.0.0.1, but a PULL socket that drops any message
    not carrying the kernel's random 16-byte token, so it gives nothing away."""
    shown = k.execute_ok("from ipykernel.kernelapp import IPKernelApp\n"
                         "print(IPKernelApp.instance().iopub_thread._pipe_port)")["stdout"]
    return [(ip, port) for ip, port in listening_tcp([k.pid]) if (ip, port) != ("127.0.0.1", int(shown))]


def ipc_paths(info: dict) -> list[str]:
    return [f"{info['ip']}-{info[name]}" for name in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")]


def test_kernel_listens_on_ipc_sockets_in_a_private_folder_and_still_runs_cells(lab, kernel):
    """Guards ``jupyter-config/jupyter_server_config.py`` (``KernelManager.transport =
    ipc``): the kernel's channels are Unix sockets next to its connection file in the
    runtime dir, which Jupyter makes 0700, and the kernel listens on no TCP port but
    ipykernel's output pipe (see :func:`tcp_besides_the_output_pipe`)."""
    runtime = lab.environment()["JUPYTER_RUNTIME_DIR"]
    assert kernel.info["transport"] == "ipc", kernel.info
    assert os.path.dirname(kernel.connection_file) == runtime
    paths = ipc_paths(kernel.info)
    assert {os.path.dirname(p) for p in paths} == {runtime}
    assert all(stat.S_ISSOCK(os.stat(p).st_mode) for p in paths), paths
    assert private_folder(runtime), oct(os.stat(runtime).st_mode)
    assert tcp_besides_the_output_pipe(kernel) == []
    bound = {c.laddr for c in psutil.Process(kernel.pid).net_connections("unix")}
    assert set(paths) <= bound, bound

    out = kernel.execute_ok(f"print({MARKER!r}, 6 * 7)")
    assert out["stdout"] == f"{MARKER} 42\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the attacker as another account")
def test_another_account_cannot_subscribe_to_the_kernels_iopub(lab, kernel):
    """Guards ``jupyter-config/jupyter_server_config.py`` (ipc transport) and the 0700
    runtime dir: while the kernel prints, another account subscribes on every TCP port
    it listens on and on each of its ipc sockets, and tries to enter the runtime dir."""
    runtime = lab.environment()["JUPYTER_RUNTIME_DIR"]
    tcp = listening_tcp([kernel.pid])
    script = f"""
import errno, json, socket, time, zmq
ctx = zmq.Context()
subs, refused = [], {{}}
for url in [f"tcp://{{'::1' if ':' in a else '127.0.0.1'}}:{{p}}" for a, p in {tcp!r}] + \\
        ["ipc://" + p for p in {ipc_paths(kernel.info)!r}]:
    s = ctx.socket(zmq.SUB); s.setsockopt(zmq.SUBSCRIBE, b""); s.setsockopt(zmq.LINGER, 0)
    s.connect(url); subs.append(s)
for path in {ipc_paths(kernel.info)!r}:
    raw = socket.socket(socket.AF_UNIX)
    try:
        raw.connect(path); refused[path] = 0
    except OSError as e:
        refused[path] = e.errno
    raw.close()
try:
    import os; os.listdir({runtime!r}); listed = 0
except OSError as e:
    listed = e.errno
poller = zmq.Poller()
for s in subs:
    poller.register(s, zmq.POLLIN)
heard, deadline = [], time.monotonic() + 3
while time.monotonic() < deadline:
    for s, _ in poller.poll(200):
        heard.append(b"".join(s.recv_multipart()).decode(errors="replace"))
print(json.dumps({{"heard": [h for h in heard if {MARKER!r} in h], "refused": refused, "listed": listed}}))
"""
    found = {}

    def attack_once_printing(_, text):
        if MARKER in text and not found:
            found.update(as_attacker(script, timeout=60))

    # prints for 10 s; the attacker listens for 3 s of it
    kernel.execute_ok(f"import time\nfor _ in range(100):\n    print({MARKER!r}, flush=True)\n    time.sleep(0.1)",
                      on_output=attack_once_printing)
    assert found["heard"] == []
    assert found["listed"] == errno.EACCES
    assert set(found["refused"].values()) == {errno.EACCES}, found["refused"]


def test_a_runtime_dir_too_deep_for_socket_paths_falls_back_to_a_private_folder(tmp_path_factory):
    """Guards the fallback in ``jupyter-config/jupyter_server_config.py``: a Unix socket's
    path has at most 107 bytes, so when the runtime dir is too deep for the kernels'
    sockets the server uses a new 0700 folder in the temporary folder (removed when it
    stops) instead of failing to start kernels, or leaving them on TCP."""
    root = tmp_path_factory.mktemp("deep-" + "d" * 48)
    server = start_server(root)
    try:
        assert len(server.environment()["JUPYTER_RUNTIME_DIR"]) + 51 > 107
        k = start_kernel(server)
        try:
            runtime = os.path.dirname(k.connection_file)
            assert os.path.dirname(runtime) == tempfile.gettempdir() and private_folder(runtime)
            assert k.info["transport"] == "ipc" and os.path.dirname(k.info["ip"]) == runtime
            assert tcp_besides_the_output_pipe(k) == []
            assert k.execute_ok("print(6 * 7)")["stdout"] == "42\n"
        finally:
            k.close()
    finally:
        server.stop()
    assert not os.path.exists(runtime)


# -- the torch group ---------------------------------------------------------------------

ALL_REDUCE = "import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nint(t.item())"
STORE_FILE = "import pdl.runtime.engine\npdl.runtime.engine.group_store_file()"


@pytest.fixture(scope="module")
def engine_tmp(tmp_path_factory):
    """The engines' temporary folder (where a local cluster's rendezvous files go), set
    before ``pdl_session`` starts them."""
    root = tmp_path_factory.mktemp("engine-tmp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(root))
        mp.delenv("PDL_CLUSTER_DIR", raising=False)
        yield root


def run(session, code: str, n: int) -> list:
    return [ast.literal_eval(v) for v in session.run(code, n).values]


def joins_as_tcp_store_client(port: int) -> bool:
    """Whether the attacker, as a torch TCPStore client of 127.0.0.1:``port``, can add a
    key. Each try runs in its own process, killed after 15 s: a port that is not a
    TCPStore may keep a client waiting past its timeout."""
    try:
        return as_attacker(f"""
import datetime, json
import torch.distributed as dist
try:
    store = dist.TCPStore("127.0.0.1", {port}, is_master=False, timeout=datetime.timedelta(seconds=1))
    store.add("pdl-intruder", 1)
    print(json.dumps(True))
except Exception:
    print(json.dumps(False))
""", timeout=15)
    except subprocess.TimeoutExpired:
        return False


def store_folders(root: Path) -> list[Path]:
    return sorted(root.glob(engine.STORE_FOLDER_PREFIX + "*"))


def test_one_host_group_has_no_store_port_another_account_could_join(engine_tmp, pdl_session):
    """Guards ``DistributedSession._torch_calls`` and ``pdl.runtime.engine.init_torch``: ranks on
    one host meet on a FileStore in a fresh 0700 folder, not on a TCPStore on 127.0.0.1.
    Another account tries every TCP port the ranks listen on as a TCPStore client (and
    claims a key), and opens the store file."""
    assert run(pdl_session, ALL_REDUCE, 3) == [3, 3, 3]
    files = run(pdl_session, STORE_FILE, 3)
    assert files[0] is not None and set(files) == {files[0]}, files
    folder = os.path.dirname(files[0])
    assert os.path.dirname(folder) == str(engine_tmp) and private_folder(folder)
    assert os.path.isfile(files[0])

    pids = run(pdl_session, "import os\nos.getpid()", 3)
    ports = sorted({port for _, port in listening_tcp(pids)})
    with ThreadPoolExecutor(len(ports) or 1) as pool:  # at once: a try may take its whole time limit
        joined = [port for port, ok in zip(ports, pool.map(joins_as_tcp_store_client, ports)) if ok]
    opened = as_attacker(f"""
import json
try:
    open({files[0]!r}, "rb").close(); opened = 0
except OSError as e:
    opened = e.errno
print(json.dumps(opened))
""", timeout=30)
    assert joined == []
    assert opened == (errno.EACCES if os.geteuid() == 0 else 0)  # only another account is kept out
    assert run(pdl_session, ALL_REDUCE, 3) == [3, 3, 3]  # the same group, unharmed
    assert run(pdl_session, STORE_FILE, 3) == files


def test_re_formed_groups_leave_no_store_files_behind(engine_tmp, pdl_session):
    """Guards ``pdl.runtime.engine.abort_group`` removing the store folder of the group it leaves:
    after many re-formations (each change of ``n`` forms a new group), only the current
    group's folder is left."""
    seen = set()
    for n in (2, 3, 1, 3, 2, 3, 1, 2, 3):
        assert run(pdl_session, ALL_REDUCE, n) == [n] * n
        files = run(pdl_session, STORE_FILE, n)
        assert set(files) == {files[0]}
        seen.add(files[0])
    assert len(seen) == 9  # a fresh file for every group
    assert store_folders(engine_tmp) == [Path(files[0]).parent]


def test_store_folder_goes_in_the_cluster_dir_when_set(tmp_path, monkeypatch):
    """Guards ``pdl.runtime.engine.new_store_file``: under a hub, the rendezvous folder is made in
    the user's ``$PDL_CLUSTER_DIR``, 0700, and the file is left for torch to create."""
    monkeypatch.setenv("PDL_CLUSTER_DIR", str(tmp_path))
    path = engine.new_store_file()
    assert os.path.dirname(os.path.dirname(path)) == str(tmp_path)
    assert private_folder(os.path.dirname(path)) and not os.path.exists(path)
    engine.remove_store_file(path)
    assert list(tmp_path.iterdir()) == []


def test_a_killed_groups_store_folder_is_swept_by_the_next_formation(tmp_path, monkeypatch):
    """Guards the sweep in ``pdl.runtime.engine.new_store_file``: engines killed with SIGKILL (as
    a local cluster's are when its kernel dies) run no cleanup. A store folder that no
    live process holds and older than ``STORE_GRACE_S`` is removed; one that a live
    process holds, or one just made, is kept."""
    monkeypatch.setenv("PDL_CLUSTER_DIR", str(tmp_path))
    stale, held, fresh = (tmp_path / (engine.STORE_FOLDER_PREFIX + name) for name in ("stale", "held", "fresh"))
    long_ago = time.time() - engine.STORE_GRACE_S - 1
    for folder in (stale, held, fresh):
        folder.mkdir(mode=0o700)
        (folder / "store").write_bytes(b"")
    for folder in (stale, held):
        os.utime(folder, (long_ago, long_ago))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\n"
         "fcntl.flock(fd, fcntl.LOCK_SH)\nprint('held', flush=True)\nsys.stdin.read()", str(held)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        path = engine.new_store_file()
        try:
            left = {p.name for p in tmp_path.iterdir()}
            assert left == {held.name, fresh.name, Path(path).parent.name}
        finally:
            engine.remove_store_file(path)
    finally:
        holder.stdin.close()
        holder.wait(10)


def test_closing_the_session_leaves_no_store_files(tmp_path):
    """Guards the engines removing their store folder when they exit (``atexit`` in
    ``pdl.runtime.engine``): a local cluster stopped with its session leaves nothing behind."""
    from pdl_magics import DistributedSession

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
        mp.setenv("TMPDIR", str(tmp_path))
        mp.setenv("PDL_STATUS_DIR", str(tmp_path / "status"))
        for name in ("PDL_CLUSTER_FILE", "PDL_SLOTS", "PDL_CLUSTER_DIR"):
            mp.delenv(name, raising=False)
        session = DistributedSession(local_slots=["cpu:0", "cpu:1"], preflight=False)
        try:
            assert run(session, ALL_REDUCE, 2) == [2, 2]
            assert len(store_folders(tmp_path)) == 1
        finally:
            session.close()
    wait_until(lambda: not store_folders(tmp_path), 15,
               what=lambda: f"the store folders to go: {store_folders(tmp_path)}")
