"""The hostile neighbour: ben, from his own kernel and terminal, goes after ann's work.

A real JupyterHub, run as root as the README's default is, with ann and ben each
holding one GPU of a pool of four; twice: with PDL's own accounts and passwords, and with
the lab's (people of a real LDAP directory, Unix accounts through nslcd, running as
their own uids: tests/harness/lab_directory.py). The GPUs are stand-in device nodes made for the test
(character devices, mode 0666, so that file permissions protect nothing): opening
one gets EPERM when the device cgroup stops it; when it lets the open through, ben's
(``gpu:1``, the ledger's second, with /dev/full's numbers: a real driver) opens and
reads zeros, the others (a major of Linux's local-use range, no driver) get ENXIO. Every attack must fail;
each test's docstring names the line of the product it guards.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import secrets
import signal
import time
from pathlib import Path

import pytest
import requests
import websocket

import lab_directory
from hub_harness import (Hub, Kernel, listening_tcp, open_path_to, release_ports, running, runs_as_root, squat_ports,
                         uid_of)
from lab_hub import LabHub
from pdl.connection import CONTROLLER_PORTS
from pdl_spawner.accounts.unix_accounts import account_exists
from pdl_spawner.host.server import PORTS_A_SERVER
from waiting import wait_until

pytestmark = [
    pytest.mark.hub,
    pytest.mark.skipif(not runs_as_root() and not os.environ.get("CI"),
                       reason="users get their own accounts only when the hub runs as root"),
]

POOL = ["gpu:0", "gpu:1", "gpu:2", "gpu:3"]
USERS = ["admin", "ann", "ben"]
#: A major number of Linux's "local/experimental use" range: no driver behind it.
STAND_IN_MAJOR = 240
#: ben's GPU (the ledger gives the first free slot, and ann spawns first): /dev/full's
#: major:minor, so that ben can open it and hold a handle as on a real GPU.
BENS_GPU, OPENABLE = 1, (1, 7)
MAX_WORKERS = 2
#: Processes and threads each user may have (the default is 4,096): a server with its
#: kernel, controller and one engine runs some tens.
PROCESS_LIMIT = 400
#: Memory each user may take (JupyterHub's mem_limit).
MEMORY_LIMIT_MIB = 2048


@pytest.fixture(scope="module")
def devices(tmp_path_factory):
    """Stand-in GPU device nodes /…/nvidia0..3, mode 0666; ben's opens (/dev/full's numbers)."""
    folder = tmp_path_factory.mktemp("devices")
    for index in range(len(POOL)):
        node = folder / f"nvidia{index}"
        os.mknod(node, 0o666 | 0o020000, os.makedev(*OPENABLE) if index == BENS_GPU
                 else os.makedev(STAND_IN_MAJOR, index))
        node.chmod(0o666)
    return folder


@contextlib.contextmanager
def lab_people(root: Path):
    """The lab's directory (a real slapd, its people Unix accounts through nslcd) with
    :data:`USERS` as its people, each with a password and a home: the login settings of
    a hub whose users log in there and run as those accounts (``PDL_ACCOUNTS=lab``)."""
    if lab_directory.problem() is not None and not os.environ.get("CI"):
        pytest.skip(lab_directory.problem())
    taken = [name for name in USERS if account_exists(name)]
    assert not taken, f"the machine has accounts {taken} already: the directory's people would not be its own"
    homes = root / "lab-homes"
    homes.mkdir()
    open_path_to(homes)
    first = lab_directory.free_ids(len(USERS))
    people = [lab_directory.Person(name, first + i, secrets.token_urlsafe(12), homes / name)
              for i, name in enumerate(USERS)]
    with lab_directory.lab_directory(root / "directory", people, {}) as directory:
        yield {p.name: p.password for p in people}, {
            "PDL_AUTH": "ldap", "PDL_LDAP_URL": directory.url, "PDL_LDAP_USER_DN": directory.user_dn}


@pytest.fixture(scope="module", params=["pdl accounts", "ldap accounts"])
def hub(request, tmp_path_factory, devices):
    """The hub, its users with PDL's own accounts and passwords, or the lab's people of a
    real LDAP directory running as their own accounts."""
    open_path_to(devices)
    config = f"""
c.PDLLocalSpawner.gpu_device_template = {str(devices / 'nvidia{index}')!r}
c.PDLLocalSpawner.max_workers = {MAX_WORKERS}
c.Spawner.process_limit = {PROCESS_LIMIT}
c.Spawner.mem_limit = "{MEMORY_LIMIT_MIB}M"
"""
    root = tmp_path_factory.mktemp("neighbours-hub")
    # the stand-in GPUs are no GPUs to torch: the preflight would stop every cell
    settings = dict(spawner_env={"PDL_PREFLIGHT_SKIP": "gpu"}, hub_env={"PDL_ENGINE_IDLE_TIMEOUT": "3600"},
                    extra_config=config)
    with contextlib.ExitStack() as stack:
        if request.param == "ldap accounts":
            passwords, login_env = stack.enter_context(lab_people(root))
            hub = LabHub(root, USERS, POOL, passwords, login_env, **settings)
        else:
            hub = Hub(root, USERS, POOL, **settings)
        stack.enter_context(running(hub))
        for user in ("ann", "ben"):
            r = hub.spawn(user, 1)
            assert r.status_code in (201, 202), r.text
            hub.wait_ready(user)
        yield hub


@pytest.fixture(scope="module")
def ann(hub):
    """ann's kernel, with a checkpoint saved in her home and a process group formed."""
    kernel = Kernel(hub, "ann")
    kernel.execute_ok("%load_ext pdl_magics")
    kernel.execute_ok("""%%distributed -n 1
import pdl, torch
pdl.save_checkpoint("ckpt.pt", model=torch.nn.Linear(2, 2), epoch=1)
""")
    yield kernel
    kernel.close()


@pytest.fixture(scope="module")
def ben(hub):
    kernel = Kernel(hub, "ben")
    yield kernel
    kernel.close()


def run_as_ben(ben: Kernel, code: str) -> dict:
    """Run ``code`` in ben's kernel; it must print one JSON line: its findings."""
    out = ben.execute_ok(code, timeout=120)
    return json.loads(out["stdout"].strip().splitlines()[-1])


def post_to_bens_lease(ben: Kernel, path: str, body: dict) -> dict:
    """ben's own JSON, posted from his kernel to his own server's lease API
    (``/pdl/api/lease<path>``) with the token his kernel has: whatever the product would send."""
    return run_as_ben(ben, f"""
import json
from pdl_server.lease_client import LeaseClient
print(json.dumps(LeaseClient.of_this_server()._call("POST", {path!r}, {body!r})))
""")


def account_of(hub, user: str) -> pwd.struct_passwd:
    return pwd.getpwnam(hub.account(user))


def test_ben_cannot_log_in_as_ann_with_his_own_password(hub):
    """Guards the per-user credential (pdl_spawner/accounts/authenticator.py): no password is shared."""
    session = hub.login("ann", password=hub.password("ben"))
    assert "jupyterhub-hub-login" not in session.cookies
    assert hub.login("ann").cookies.get("jupyterhub-hub-login")  # her own password does


def test_nothing_of_a_user_runs_as_root_and_each_runs_as_their_own_account(hub, ann):
    """Guards ``PDLLocalSpawner.make_preexec_fn`` (setuid to the user's account) and
    ``PDLLocalSpawner.start`` refusing to run servers as root."""
    for user in ("ann", "ben"):
        processes = hub.processes_of(user)
        assert {"pdl-singleuser", "server", "controller", "engine"} <= set(processes.values()), processes
        uids = {pid: uid for pid in processes if (uid := uid_of(pid)) is not None}
        assert set(uids.values()) == {account_of(hub, user).pw_uid}, (user, uids)
    home = hub.home("ann")
    assert home.stat().st_uid == account_of(hub, "ann").pw_uid and home.stat().st_mode & 0o777 == 0o700


def test_ben_cannot_read_anns_home_keys_or_checkpoints_nor_the_hubs_secrets(hub, ann, ben):
    """Guards ``unix_accounts.ensure_account`` (home 0700) and the config's ``state_dir.chmod(0o700)``."""
    home = hub.home("ann")
    targets = {
        "home": str(home),
        "checkpoint": str(home / "ckpt.pt"),
        "controller key": str(home / ".pdl/cluster/profile/security/ipcontroller-pdl-client.json"),
        "hub password": str(hub.state_dir / "password"),
        "cookie secret": str(hub.state_dir / "jupyterhub_cookie_secret"),
        "hub database": str(hub.state_dir / "jupyterhub.sqlite"),
        "slot ledger": str(hub.state_dir / "reservations.sqlite"),
    }
    assert (home / "ckpt.pt").exists() and (hub.state_dir / "jupyterhub.sqlite").exists()
    found = run_as_ben(ben, f"""
import json, os
found = {{}}
for what, path in {targets!r}.items():
    try:
        found[what] = os.listdir(path) if os.path.isdir(path) else open(path, "rb").read(16).hex()
    except OSError as e:
        found[what] = e.errno
print(json.dumps(found))
""")
    assert found == {what: errno.EACCES for what in targets}


def test_ben_cannot_signal_trace_or_read_the_environment_of_anns_processes(hub, ann, ben):
    """Guards the uid separation of ``PDLLocalSpawner.make_preexec_fn``: signals, ptrace
    and /proc/<pid>/environ (which holds ann's API token) need the same uid."""
    victims = {pid: role for pid, role in hub.processes_of("ann").items() if role in ("engine", "kernel", "server")}
    found = run_as_ben(ben, f"""
import ctypes, json, os, signal
libc = ctypes.CDLL(None, use_errno=True)
found = {{}}
for pid in {sorted(victims)!r}:
    r = {{}}
    try:
        os.kill(pid, signal.SIGKILL); r["kill"] = "sent"
    except OSError as e:
        r["kill"] = e.errno
    PTRACE_ATTACH = 16
    r["ptrace"] = ctypes.get_errno() if libc.ptrace(PTRACE_ATTACH, pid, None, None) == -1 else "attached"
    try:
        r["environ"] = open(f"/proc/{{pid}}/environ", "rb").read(64).hex()
    except OSError as e:
        r["environ"] = e.errno
    found[str(pid)] = r
print(json.dumps(found))
""")
    assert found == {str(pid): {"kill": errno.EPERM, "ptrace": errno.EPERM, "environ": errno.EACCES}
                     for pid in victims}
    assert all(os.path.exists(f"/proc/{pid}") for pid in victims)


def test_ben_cannot_subscribe_to_anns_kernel_or_reach_her_controller_and_engines(hub, ann, ben):
    """Guards the kernels' IPC transport (jupyter-config/jupyter_server_config.py) in ann's
    0700 runtime folder (``PDLLocalSpawner.user_env``: ``JUPYTER_RUNTIME_DIR``), and the
    cluster's private connection files (CurveZMQ): while ann's kernel prints a marker,
    ben subscribes to every TCP port that her processes or the hub listen on (as
    /proc/net/tcp tells anyone; the rest of the machine's ports belong to tests running
    beside this one) and to her kernel's IPC sockets (their paths follow from her
    kernel's command line, which anyone can read); he hears nothing, although she was
    printing all along."""
    marker = f"ann-secret-{os.getpid()}"
    loop = ann.send(f"import time\nfor _ in range(480):\n    print({marker!r}, flush=True); time.sleep(0.25)")
    kernels = [pid for pid, role in hub.processes_of("ann").items() if role == "kernel"]
    anns_uid = pwd.getpwnam(hub.account("ann")).pw_uid
    hubs_ports = {hub.port, hub.internal_port, hub.proxy_api_port, hub.admin_view_port}
    found = run_as_ben(ben, f"""
import json, os, time, zmq
endpoints = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        fields = line.split()
        port = int(fields[1].rsplit(':', 1)[1], 16)
        if fields[3] == "0A" and (int(fields[7]) == {anns_uid} or port in {hubs_ports!r}):  # LISTEN
            endpoints.append(f"tcp://127.0.0.1:{{port}}")
for pid in {kernels!r}:  # ann's kernels: "... -f <runtime>/kernel-<id>.json"
    args = open(f"/proc/{{pid}}/cmdline", "rb").read().split(b"\\0")
    connection = args[args.index(b"-f") + 1].decode()
    endpoints += [f"ipc://{{connection[:-len('.json')]}}-ipc-{{n}}" for n in range(1, 6)]
ctx = zmq.Context()
poller = zmq.Poller()
for endpoint in endpoints:
    s = ctx.socket(zmq.SUB); s.setsockopt(zmq.SUBSCRIBE, b""); s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint); poller.register(s, zmq.POLLIN)
heard = []
deadline = time.monotonic() + 4
while time.monotonic() < deadline:
    for s, _ in poller.poll(200):
        heard.append(b"".join(s.recv_multipart()).decode(errors="replace"))
print(json.dumps({{"ipc": sum(e.startswith("ipc://") for e in endpoints), "tcp": sum(e.startswith("tcp://") for e in endpoints),
                  "heard": [h[-300:] for h in heard if {marker!r} in h][:3]}}))
""")
    ann.interrupt()
    printed = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            msg = json.loads(ann.ws.recv())
        except websocket.WebSocketTimeoutException:
            continue
        if msg.get("parent_header", {}).get("msg_id") != loop:
            continue
        printed += msg["msg_type"] == "stream" and marker in msg["content"]["text"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    assert found["tcp"] > 0 and found["ipc"] == 5 * len(kernels) > 0 and found["heard"] == []
    assert printed > 0, "ann's kernel printed nothing: the attack proved nothing"


#: ben's attack on one port: join the TCP store there as a client and add a key.
JOIN_STORE = """
import datetime, sys
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=datetime.timedelta(seconds=2))
store.add("pdl-intruder", 1)
print("joined")
"""


def test_ben_cannot_join_anns_process_group(hub, ann, ben):
    """Guards the one-host rendezvous in a private file (``pdl/runtime/engine.py`` ``init_torch``
    with a FileStore in the user's 0700 folder, not a TCPStore on 127.0.0.1): while
    ann's group exists, ben tries every port her engines listen on as a torch TCPStore
    client (each try in a process of its own, bounded in time)."""
    ann.execute_ok("%%distributed -n 1\nimport torch.distributed as dist\nassert dist.is_initialized()")
    engines = [pid for pid, role in hub.processes_of("ann").items() if role == "engine"]
    ports = sorted({port for _, port in listening_tcp(engines)})
    found = run_as_ben(ben, f"""
import json, subprocess, sys
joined = []
for port in {ports!r}:
    try:
        done = subprocess.run([sys.executable, "-c", {JOIN_STORE!r}, str(port)], capture_output=True, text=True,
                              timeout=15, env={{"TORCH_CPP_LOG_LEVEL": "FATAL", "PATH": "/usr/bin:/bin"}})
        if "joined" in done.stdout:
            joined.append(port)
    except subprocess.TimeoutExpired:
        pass
print(json.dumps({{"joined": joined}}))
""")
    assert found == {"joined": []}


def test_ben_cannot_plant_a_compile_cache_or_any_file_in_anns_temporary_places(hub, ann, ben):
    """Guards ``pdl_spawner/host/private_tmp.py`` (each server's own /tmp, /var/tmp and
    /dev/shm). The attack (issue 45, 1): torch keeps its compile cache in
    ``/tmp/torchinductor_<account>`` and makes it without checking who owns it; ben made
    ann's first, opened it to everyone and planted a module that her kernel then ran as
    her. Now ben's folders are in his places only: ann's kernel and engines never see
    them, and her torch cache lands in her own /tmp; nor does ben see what ann writes."""
    victim = hub.account("ann")
    planted = run_as_ben(ben, f"""
import json, os
planted = []
for place in ("/tmp", "/var/tmp", "/dev/shm"):
    folder = os.path.join(place, "torchinductor_{victim}")
    os.makedirs(folder, exist_ok=True)
    os.chmod(folder, 0o777)
    with open(os.path.join(folder, "planted.py"), "w") as f:
        f.write("import os; os.system('touch /tmp/ran-as-ann')")
    planted.append(os.path.join(folder, "planted.py"))
print(json.dumps(planted))
""")
    assert len(planted) == 3
    look = f"""
import json, os
from torch._inductor.runtime.cache_dir_utils import cache_dir
folder = cache_dir()  # torch's own default for this account, made if missing
print(json.dumps({{"seen": [p for p in {planted!r} if os.path.exists(p)], "cache": folder,
                  "cache_owner": os.stat(folder).st_uid, "me": os.getuid()}}))
"""
    in_kernel = json.loads(ann.execute_ok(look)["stdout"].strip().splitlines()[-1])
    in_engine = json.loads(ann.execute_ok("%%distributed -n 1\n" + look)["stdout"].strip().splitlines()[-1])
    for seen in (in_kernel, in_engine):
        assert seen["seen"] == [] and seen["cache"] == f"/tmp/torchinductor_{victim}", seen
        assert seen["cache_owner"] == seen["me"] == account_of(hub, "ann").pw_uid, seen

    # ann's own places: shared by her kernel and engines (the collectives' /dev/shm), never with ben
    ann.execute_ok("for place in ('/tmp', '/var/tmp', '/dev/shm'):\n"
                   "    open(place + '/anns-notes', 'w').write('hers')")
    assert "hers hers hers" in ann.execute_ok(
        "%%distributed -n 1\nprint(*(open(p + '/anns-notes').read() for p in ('/tmp', '/var/tmp', '/dev/shm')))")["stdout"]
    found = run_as_ben(ben, """
import json, os
print(json.dumps([p + "/anns-notes" for p in ("/tmp", "/var/tmp", "/dev/shm") if os.path.exists(p + "/anns-notes")]))
""")
    assert found == []
    assert not any(Path(p).exists() for p in planted), "ben's files went to the machine's shared places"


def test_bens_runaway_processes_stop_at_his_limit_while_ann_and_the_admin_start_theirs(hub, ann, ben):
    """Guards ``pdl_spawner/host/account_limits.py`` (a pids cgroup per account). The
    attack (issue 45, 3): ben's kernel started 3,000 processes in 6 s and would have gone
    on, to the machine's limit, where nobody can start anything. Now his processes stop
    at his limit with an error in his kernel, and while he holds them all, ann starts a
    kernel and the admin a server."""
    held = run_as_ben(ben, f"""
import json, os, signal, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children that end are reaped at once
children, error = [], None
try:
    while len(children) < {2 * PROCESS_LIMIT}:
        pid = os.fork()
        if pid == 0:
            time.sleep(300)
            os._exit(0)
        children.append(pid)
except OSError as e:
    error = f"{{type(e).__name__}}: {{e}}"
print(json.dumps({{"children": len(children), "error": error, "kernel": os.getpid()}}))
""")
    try:
        assert held["error"] == "BlockingIOError: [Errno 11] Resource temporarily unavailable", held
        assert PROCESS_LIMIT / 2 < held["children"] < PROCESS_LIMIT, held
        second = Kernel(hub, "ann")  # a new kernel of ann's: a process of hers
        try:
            assert second.execute_ok("print(6 * 7)")["stdout"].strip() == "42"
        finally:
            second.close()
        assert hub.spawn("admin", 1).status_code in (201, 202)
        hub.wait_ready("admin")
    finally:  # ben's kernel cannot start a thread at his limit: his children go from here
        for pid in children_of(held["kernel"]):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not children_of(held["kernel"]), 60, what="ben's children to end")
        ben.execute_ok("import signal\nsignal.signal(signal.SIGCHLD, signal.SIG_DFL)")
        hub.api("DELETE", "/users/admin/server")
    wait_until(lambda: "admin" not in hub.running_servers(), 60, what="the admin's server to stop")


def children_of(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` now."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == parent:
                found.append(int(entry))
    return found


def test_bens_allocation_past_his_memory_limit_ends_his_process_alone(hub, ann, ben):
    """Guards ``pdl_spawner/host/account_limits.py`` (a memory cgroup per account, limited
    to JupyterHub's ``mem_limit``). The attack (issue 45, 3): with ``mem_limit = "1G"``,
    ben's kernel touched 1.5 GiB; nothing enforced it, and the hub had the same OOM score
    as everyone's processes. Now the OOM killer ends ben's allocation in his own cgroup;
    his kernel, ann's kernel and engine, and the hub go on."""
    found = run_as_ben(ben, f"""
import json, subprocess, sys
grab = "b = bytearray({MEMORY_LIMIT_MIB + 512} << 20)\\nfor i in range(0, len(b), 4096): b[i] = 1\\nprint('allocated')"
done = subprocess.run([sys.executable, "-c", grab], capture_output=True, text=True, timeout=120)
print(json.dumps({{"returncode": done.returncode, "stdout": done.stdout}}))
""")
    assert found == {"returncode": -9, "stdout": ""}, found  # SIGKILL, from the OOM killer
    # on his engine, the notebook says what ended it, in one line
    ben.execute_ok("%load_ext pdl_magics")
    out = ben.execute(f"%%distributed -n 1\nb = bytearray({MEMORY_LIMIT_MIB + 512} << 20)\n"
                      f"for i in range(0, len(b), 4096): b[i] = 1", timeout=180)
    assert (f"died: its engine was ended by your memory limit of {MEMORY_LIMIT_MIB / 1024:.3g} GiB (all your "
            f"processes together, as the admin set it)") in out["stderr"] + str(out["error"]), out
    assert ann.execute_ok("print(6 * 7)")["stdout"].strip() == "42"
    assert "rank 0 alive" in ann.execute_ok("%%distributed -n 1\nprint('rank 0 alive')")["stdout"]
    assert hub.api("GET", "/users").status_code == 200
    scores = {role: int(open(f"/proc/{pid}/oom_score_adj").read())
              for pid, role in hub.lasting_processes_of("ben").items()}
    hubs = int(open(f"/proc/{hub.proc.pid}/oom_score_adj").read())
    assert min(scores.values()) > hubs, (scores, hubs)  # the machine's OOM killer picks ben's before the hub


def test_a_kernel_that_bens_memory_limit_ended_is_named_in_his_next_cell(hub, ben):
    """Guards ``pdl_lab/kernel_ends.py``: ben's kernel itself goes past his ``mem_limit``;
    the OOM killer ends it, Jupyter starts another in its place, and the next cell says in
    one line what ended the old one (the notebook alone says only that it died), once.
    The new kernel is not "busy" as the old one was when it died: the kernels API said so
    forever, and a page opened again sent its first cell before the server had checked
    that the new kernel's output reached it (its output was lost, 1 run in 2)."""
    kernel = Kernel(hub, "ben")
    try:
        kernel.execute_ok("x = 1")
        before = {pid for pid, role in hub.processes_of("ben").items() if role == "kernel"}
        kernel.send(f"b = bytearray({MEMORY_LIMIT_MIB + 512} << 20)\nfor i in range(0, len(b), 4096): b[i] = 1")
        wait_until(lambda: {pid for pid, role in hub.processes_of("ben").items() if role == "kernel"} - before,
                   120, what="Jupyter to start a kernel in place of the one ben's limit ended")
        assert kernel.state() == "starting"
        kernel.reattach()
        out = kernel.execute("print('x' in dir())", timeout=120)
        assert out["error"] is None and out["stdout"].strip() == "False", out  # a new kernel
        assert out["stderr"].startswith("Your kernel was ended at "), out
        assert (f" by your memory limit of {MEMORY_LIMIT_MIB / 1024:.3g} GiB (all your processes together, as the "
                "admin set it); this is a new kernel: its variables are gone.") in out["stderr"], out
        assert out["stderr"].count("\n") == 1, out  # one line
        assert kernel.execute_ok("print(2)")["stderr"] == ""  # once
        assert kernel.state() == "idle"
    finally:
        kernel.close()


def test_ben_cannot_open_anns_gpu_only_his_own(hub, devices, ben):
    """Guards ``PDLLocalSpawner.restrict_devices`` (the device cgroup follows the ledger):
    file permissions allow everyone; only the cgroup stops ben."""
    owners = hub.reservations()
    anns = next(int(slot.split(":")[1]) for slot, owner in owners.items() if owner == "ann")
    bens = next(int(slot.split(":")[1]) for slot, owner in owners.items() if owner == "ben")
    free = next(i for i in range(len(POOL)) if f"gpu:{i}" not in owners)
    found = run_as_ben(ben, f"""
import json, os
found = {{}}
for name, index in (("ann", {anns}), ("ben", {bens}), ("free", {free})):
    try:
        os.close(os.open({str(devices)!r} + f"/nvidia{{index}}", os.O_RDWR))
        found[name] = "opened"
    except OSError as e:
        found[name] = e.errno
from pathlib import Path
path = Path({str(devices)!r})
blocked = [str(p) for p in [*path.parents, path] if not os.access(p, os.X_OK)]
print(json.dumps({{"opened": found, "blocked": blocked, "id": os.getuid()}}))
""")
    assert bens == BENS_GPU
    assert found["opened"] == {"ann": errno.EPERM, "ben": "opened", "free": errno.EPERM}, found


def test_a_gpu_ben_still_holds_open_is_never_freed_by_his_lease(hub, devices, ben):
    """The attack (issue 27, 2): ben opened his GPU, then told his lease that his engines
    were released; the hub freed the GPU (for the next user) while his handle still read
    data. Guards ``LedgerSlots.reclaim_idle``: while a process of ben holds
    the GPU open, it stays his, whatever his lease says; once he closes it, the hub frees it."""
    gpu = f"gpu:{BENS_GPU}"
    assert hub.reservations().get(gpu) == "ben"
    run_as_ben(ben, f"""
import json, os
held_gpu = os.open({str(devices / f'nvidia{BENS_GPU}')!r}, os.O_RDONLY)
print(json.dumps({{}}))
""")
    assert post_to_bens_lease(ben, "/released", {"reason": "idle", "workers": 1, "slots": []}) == {"ok": True}
    hub.wait_for_log(f"Kept {gpu} for ben, whose lease says released", 30)  # he holds it open
    time.sleep(3)  # while it keeps a release, the hub looks again each second: three more looks
    assert hub.reservations().get(gpu) == "ben"
    read = run_as_ben(ben, "import json, os\nn = len(os.read(held_gpu, 8))\nos.close(held_gpu)\n"
                           "print(json.dumps({'read': n}))")
    assert read == {"read": 8}
    wait_until(lambda: "ben" not in hub.reservations().values(), 30, what="the hub to free ben's GPU once closed")
    hub.wait_for_log(f"Reclaimed {gpu} from ben", 15)


def test_bens_lease_files_get_him_no_more_than_his_limit_nor_anns_slot(hub, devices, ben):
    """Guards ``PDLLocalSpawner.tend_lease`` (counts through ``checked_workers``, slots
    from the ledger, read over the server's HTTP API) and the device cgroup following
    the ledger: ben sends his own lease messages to ask for 4 workers (past
    max_workers=2), then -1, then grants himself ann's slot."""
    anns = next(slot for slot, owner in hub.reservations().items() if owner == "ann")

    def lease_now():
        return run_as_ben(ben, """
import json
from pdl_server.lease_client import LeaseClient
print(json.dumps(LeaseClient.of_this_server().view().to_json()))
""")

    post_to_bens_lease(ben, "/released", {"reason": "forged\n[I hub] admin logged in", "workers": 1, "slots": []})
    wait_until(lambda: "ben" not in hub.reservations().values(), 30, what="the hub to take ben's slot back")
    for wanted in (4, -1):
        post_to_bens_lease(ben, "/want", {"workers": wanted})
        grant = wait_until(lambda: lease_now()["grant"], 30, what="the hub's answer")
        assert grant["refused"] == f"workers must be a whole number from 1 to {MAX_WORKERS}, got {wanted}"
        assert "ben" not in hub.reservations().values()
        post_to_bens_lease(ben, "/forget", {})
    assert "admin logged in" not in hub.log_tail(400)

    # ben grants himself ann's slot: the ledger and the device cgroup do not follow his grant
    assert post_to_bens_lease(ben, "", {"workers": 1, "slots": [anns], "job": 0}) == {"ok": True}
    index = int(anns.split(":")[1])
    found = run_as_ben(ben, f"""
import json, os
try:
    os.close(os.open({str(devices)!r} + "/nvidia{index}", os.O_RDWR)); found = "opened"
except OSError as e:
    found = e.errno
print(json.dumps({{"anns": found}}))
""")
    assert found == {"anns": errno.EPERM}
    assert hub.reservations()[anns] == "ann"


def test_ben_cannot_squat_the_ports_the_hub_gives_servers(hub, ben):
    """The attack (issue 27, 5): ben's kernel bound every free port of port_range (its
    file limit raised to the hard one), and the next user's spawn failed with "503 no
    free port". Guards ``PDLLocalSpawner.restrict_ports`` (port_filter): of the range, a
    server's processes may bind only their own server's ports. And ``HostServer.pick_port``
    with ``clusters.start_controller``: the next server's controller listens on exactly
    the ports the hub gave it, none of which ben could take first (a controller that
    picked free ports itself lost one now and then to another user's controller, and its
    engines never became ready)."""
    low, high = hub.port_range
    found = squat_ports(ben, low, high)
    try:
        # every port but his own server's is refused; port 0 still works
        assert set(found["squatted"]) <= set(found["own"]) and len(found["own"]) == PORTS_A_SERVER, found
        assert found["refused"] == high - low + 1 - PORTS_A_SERVER, found
        assert not low <= found["outside"] <= high
        r = hub.spawn("admin", 1)
        assert r.status_code in (201, 202), r.text
        hub.wait_ready("admin")
        admin = Kernel(hub, "admin")
        try:
            admin.execute_ok("%load_ext pdl_magics")
            assert admin.execute_ok("%%distributed -n 1\nprint(6 * 7)")["stdout"].strip() == "42"
            given = admin.execute_ok("from pdl.contract import ServerContract\n"
                                     "print(*ServerContract.from_env().controller_ports)")["stdout"].split()
        finally:
            admin.close()
        controller = [pid for pid, role in hub.processes_of("admin").items() if role == "controller"]
        assert sorted({port for _, port in listening_tcp(controller)}) == [int(port) for port in given]
        assert len(given) == CONTROLLER_PORTS and not set(map(int, given)) & set(found["own"])
    finally:
        release_ports(ben)
        hub.api("DELETE", "/users/admin/server")
        wait_until(lambda: "admin" not in hub.running_servers(), 60, what="the admin's server to stop")


def test_ben_cannot_see_or_attach_to_anns_system_v_ipc(hub, ann, ben):
    """Guards ``pdl_spawner/host/private_ipc.py`` (an IPC namespace per server). The attack
    (issue 60, 3): System V IPC was one namespace for all users; ``ipcs`` listed ann's
    segments and one made with mode 0666 was open to ben. Now ann's segment is hers: ben's
    ``ipcs`` lists nothing of hers, her key gets him a new segment of his own, her id none."""
    made = json.loads(ann.execute_ok(SHM_HELPERS + """
key = 0x5D1_0060
shmid = libc.shmget(key, 4096, IPC_CREAT | 0o666)
assert shmid >= 0, ctypes.get_errno()
print(json.dumps({"shmid": shmid, "listed": str(shmid) in ipcs()}))
""")["stdout"].strip().splitlines()[-1])
    assert made["listed"], made  # ann sees her own
    found = run_as_ben(ben, SHM_HELPERS + f"""
key = 0x5D1_0060
attached = libc.shmat({made['shmid']}, None, 0)
mine = libc.shmget(key, 4096, 0)  # without IPC_CREAT: only an existing segment of that key
print(json.dumps({{"listed": "{made['shmid']}" in ipcs() or hex(key) in ipcs(), "attached": attached != -1,
                  "by_key": mine >= 0}}))
""")
    assert found == {"listed": False, "attached": False, "by_key": False}, found


#: What the IPC tests run in a kernel: libc's shmget/shmat and ``ipcs -m``'s list.
SHM_HELPERS = """
import ctypes, json, subprocess
IPC_CREAT = 0o1000
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_ssize_t
def ipcs():
    return subprocess.run(["ipcs", "-m"], capture_output=True, text=True).stdout
"""

#: What the abstract-socket tests run in a kernel: a listener on an abstract name, kept
#: in the kernel, and a connection to one.
ABSTRACT_HELPERS = """
import json, socket
def listen(name):
    s = socket.socket(socket.AF_UNIX)
    s.bind("\\0" + name)
    s.listen()
    return s
def reach(name):
    c = socket.socket(socket.AF_UNIX)
    try:
        c.connect("\\0" + name)
        c.sendall(b"hello")
        return "connected"
    except OSError as e:
        return type(e).__name__
    finally:
        c.close()
"""


def test_ben_and_ann_cannot_reach_each_others_abstract_unix_sockets(hub, ann, ben):
    """Guards ``pdl_spawner/host/private_ipc.py`` (a Landlock domain per server, scoped to
    abstract Unix sockets). The attack (issue 60, 3): ann's process connected to an
    abstract socket that ben's process listened on, and delivered bytes to it (abstract
    sockets have no file permissions; the network namespace is the machine's). Now
    neither reaches the other's, while a user's own processes still reach each other's,
    as the collectives between a user's engines do."""
    from pdl_spawner.host import private_ipc

    if not private_ipc.support() and not os.environ.get("CI"):
        pytest.skip(private_ipc.support().reason)
    name = f"pdl-bens-{secrets.token_hex(4)}"
    ben.execute_ok(ABSTRACT_HELPERS + f"bens_listener = listen({name!r})")
    try:
        found = json.loads(ann.execute_ok(ABSTRACT_HELPERS + f"""
anns_listener = listen("anns-{name}")
import subprocess, sys
child = subprocess.run([sys.executable, "-c", {ABSTRACT_HELPERS!r} + "print(reach('anns-{name}'))"],
                       capture_output=True, text=True).stdout.strip()
print(json.dumps({{"bens": reach({name!r}), "own_child": child}}))
""")["stdout"].strip().splitlines()[-1])
        bens = run_as_ben(ben, ABSTRACT_HELPERS + f"print(json.dumps({{'anns': reach('anns-{name}')}}))")
    finally:
        ben.execute_ok("bens_listener.close()")
        ann.execute_ok("anns_listener.close()")
    assert found == {"bens": "PermissionError", "own_child": "connected"}, found
    assert bens == {"anns": "PermissionError"}, bens


def test_ben_cannot_lower_his_oom_score_below_his_neighbours(hub, ann, ben):
    """Guards ``pdl_spawner/host/account_limits.py`` (hold_oom_score: the server's /proc
    read-only). The attack (issue 60, 4): PDL gave every user's process an OOM score
    adjustment of 500 and ben's kernel lowered its own to 0, below every neighbour's, so
    that in a machine-wide shortage the OOM killer picked ann first (the kernel's floor,
    set by root before ``exec``, does not hold across it). Now neither his kernel nor a
    process it starts, nor one in a user namespace of his own, gets below 500."""
    from pdl_spawner.host.account_limits import USER_OOM_SCORE_ADJ

    found = run_as_ben(ben, """
import json, subprocess
def lower(path="/proc/self/oom_score_adj"):
    try:
        with open(path, "w") as f:
            f.write("0")
        return "lowered"
    except OSError as e:
        return type(e).__name__
shell = subprocess.run(["sh", "-c", "echo 0 > /proc/self/oom_score_adj && echo lowered; "
                        "unshare -Urm sh -c 'echo 0 > /proc/self/oom_score_adj && echo lowered-in-userns'"],
                       capture_output=True, text=True).stdout.strip()
print(json.dumps({"kernel": lower(), "shell": shell, "now": int(open("/proc/self/oom_score_adj").read())}))
""")
    assert found == {"kernel": "OSError", "shell": "", "now": USER_OOM_SCORE_ADJ}, found
    scores = {role: int(open(f"/proc/{pid}/oom_score_adj").read())
              for user in ("ann", "ben") for pid, role in hub.lasting_processes_of(user).items()}
    assert min(scores.values()) >= USER_OOM_SCORE_ADJ, scores


def test_bens_terminal_runs_as_ben_and_cannot_read_the_hubs_password(hub):
    """Guards the terminal's process, a child of ben's server, running as his account."""
    token = hub.user_token("ben")
    base = f"{hub.user_url('ben')}/api/terminals"
    r = requests.post(base, headers={"Authorization": f"token {token}"}, timeout=30)
    r.raise_for_status()
    name = r.json()["name"]
    ws = websocket.create_connection(f"{hub.user_url('ben').replace('http', 'ws', 1)}/terminals/websocket/{name}",
                                     header=[f"Authorization: token {token}"], timeout=5)
    try:
        # $((6*7)) and $(id -u) appear expanded only in the output, not in the echoed command line
        ws.send(json.dumps(["stdin", f"echo uid=$(id -u); cat {hub.state_dir / 'password'}; echo end-$((6*7))\r"]))
        seen = ""
        deadline = time.monotonic() + 30
        while "end-42" not in seen and time.monotonic() < deadline:
            try:
                kind, *data = json.loads(ws.recv())
            except websocket.WebSocketTimeoutException:
                continue
            if kind == "stdout":
                seen += data[0]
    finally:
        ws.close()
        requests.delete(f"{base}/{name}", headers={"Authorization": f"token {token}"}, timeout=30)
    assert f"uid={account_of(hub, 'ben').pw_uid}" in seen
    assert "Permission denied" in seen and hub.password("admin") not in seen


def test_stopping_a_server_leaves_no_process_of_its_account(hub):
    """Guards ``PDLLocalSpawner.stop`` killing whatever is left in the server's cgroup:
    ben starts a process that leaves his server's process tree (a double fork)."""
    token = hub.user_token("ben")
    Kernel(hub, "ben").execute_ok("import subprocess\nsubprocess.Popen(['setsid', 'sleep', '600'])")
    uid = account_of(hub, "ben").pw_uid
    from hub_harness import pids_of_uid

    assert any("sleep" in open(f"/proc/{p}/cmdline").read() for p in pids_of_uid(uid))
    assert hub.api("DELETE", "/users/ben/server", token=token).status_code in (202, 204)
    wait_until(lambda: "ben" not in hub.running_servers(), 60, what="ben's server to stop")
    wait_until(lambda: not pids_of_uid(uid), 15, what="every process of ben's account to end")
    assert "ben" not in hub.reservations().values()
