"""A simulated Slurm cluster with one fake GPU per node, on this one machine.

:class:`SlurmSim` runs Debian's Slurm 22.05 (``scripts/slurm-up`` installs it) the way a
lab's cluster runs it: a controller ``ctl`` (slurmctld, 10.78.0.10) and compute nodes
``n1..n3`` (slurmd, 10.78.0.11-13), each in its own network namespace
(``pdl-sl-ctl``, ``pdl-sl-n1``...) and its own UTS namespace (its hostname is its node
name), on a bridge in a namespace of its own (``pdl-sl-br``). The veth ``pdl-sl-host``
gives the root namespace 10.78.0.1/24 on that bridge, so a hub in the root namespace
reaches the nodes (and a client command there reaches the controller). Nothing else is
routed.

Each node declares one GPU as a typed GRES, two kinds as labs have (:func:`gpu_type`:
``gpu:a100:1`` on n1 and n2, ``gpu:t4:1`` on n3): a character device made with mknod
(``<run dir>/dev/gpu-<node>``, the numbers of /dev/null) named by ``File=`` in
gres.conf; a task that is given it sees ``CUDA_VISIBLE_DEVICES=0``. A job that asks for
untyped GPUs (``--gpus-per-task=1``) gets either kind.

Everything lives under one run directory (``$PDL_SLURM_DIR``, default
``/var/lib/pdl-slurm``: not under /var/tmp, of which the servers on the login node see
their own): ``etc/`` (slurm.conf, gres.conf), the controller's state, the nodes' spools, pid files,
the daemons' logs (``log/``), the users' homes (``home/``) and the key and socket of a
MUNGE daemon of the cluster's own (``munge/``, ``AuthInfo=`` in slurm.conf), which every
namespace reaches through the file system, and each node's Epilog (quick, unless a test
makes it slow: :meth:`SlurmSim.slow_epilog`). Nothing is written to /etc/slurm or
/etc/munge: the daemons get ``-f``, and every client command runs with ``SLURM_CONF``
set to the run directory's slurm.conf (:meth:`SlurmSim.env`).

Two Unix users, ``pdl-sl-ann`` and ``pdl-sl-ben`` (:data:`TEST_USERS`), are made by
``up()`` and removed by ``down()``; :meth:`SlurmSim.run` runs a client command as one of
them in a namespace. ``down()`` cancels the jobs, shuts Slurm down (``scontrol
shutdown``), stops every process by recorded PID, then anything still running in the
namespaces, naming the run directory or owned by a test user, and deletes the
namespaces, veths and users. ``up()`` first cleans up what a crashed run left. A lock
file makes a second session wait instead of tearing down the first's.

Accounting is on, as a lab that sets limits per user has it: a MariaDB server
(``mariadbd``, its data in ``db/``) and slurmdbd run in the controller's namespaces, and
slurm.conf says ``AccountingStorageEnforce=associations,limits,qos``, so only users
with an association may submit. ``up()`` makes the Slurm account :data:`LAB_ACCOUNT`
with the two test users in it, and the QOS :data:`TWO_GPU_QOS` (at most 2 GPUs per
user, ``MaxTRESPerUser=gres/gpu=2``), which the account may use (its default QOS stays
``normal``, without limits). Partition limits (``MaxNodes=``, ``MaxTime=``) need no
accounting: pass ``partition=`` or ``extra_conf=`` to :class:`SlurmSim` (see
:func:`slurm_conf`).

Notes for tests, all Slurm's defaults as a lab would have them: a batch job starts
about 3 s after sbatch (the scheduler's pass), and a job that waits shows the reason
``None`` or ``Priority`` until then (then ``Resources``): wait for the state you assert.
More nodes than the partition has (``-N4``) are accepted and pend for good
(``PartitionNodeLimit``: ``EnforcePartLimits=NO``) unless ``--immediate``; more GPUs
than exist (``--gpus=4``) are refused at submission.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

from pdl.process import pid_alive
from sim_host import (Member, SimulatedCluster, bridged_namespaces, cmdline, netns_names, pids_naming,
                      remove_links, remove_namespaces, run, terminate, veth_names)
from waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
DEFAULT_RUN_DIR = "/var/lib/pdl-slurm"
ANN, BEN = "pdl-sl-ann", "pdl-sl-ben"
TEST_USERS = (ANN, BEN)
PARTITION = "gpu"
#: A second partition over the same nodes: at most 60 minutes and 2 nodes a job.
SHORT_PARTITION = "short"
CONTROLLER = "ctl"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROGRAMS = ("slurmctld", "slurmd", "slurmdbd", "sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol",
            "sacctmgr", "munged", "munge", "mariadbd", "mariadb-install-db", "mariadb")
#: The Slurm account of the test users (and of the accounts a test hub makes: PDL_SLURM_ACCOUNT).
LAB_ACCOUNT = "pdl-lab"
#: A QOS that the lab account may use: at most 2 GPUs per user (``MaxTRESPerUser``).
TWO_GPU_QOS = "pdl-two"
#: slurmdbd's port, on the controller's address.
DBD_PORT = 6819
#: MariaDB's port, on 127.0.0.1 in the controller's namespace (slurmdbd's database).
DB_PORT = 3306
# /proc/PID/comm prefixes of Slurm's programs (slurmctld, slurmd, slurmstepd and the clients)
_SLURM_COMMANDS = ("slurm", "srun", "sbatch", "salloc", "squeue", "scancel", "sinfo", "scontrol", "sacctmgr")

# Runs in a daemon's own network namespace (nsenter) and a new UTS namespace (unshare):
# set the node's hostname (slurmctld starts only where it equals SlurmctldHost), exec.
_WITH_HOSTNAME = 'hostname "$1"; shift; exec "$@"'


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _orphaned_slurm_zombies() -> list[int]:
    found = []
    for p in psutil.process_iter(["name", "ppid", "status"]):
        if p.info["name"].startswith("slurm") and p.info["ppid"] == 1 and p.info["status"] == psutil.STATUS_ZOMBIE:
            found.append(p.pid)
    return found


class SlurmUnavailable(RuntimeError):
    """This machine cannot run the simulated Slurm cluster (not root, no Slurm, ...)."""


def unavailable_reason() -> str | None:
    """Why this machine cannot run :class:`SlurmSim` (None: it can, as far as we can tell)."""
    if not sys.platform.startswith("linux"):
        return f"the simulated Slurm cluster needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the simulated Slurm cluster needs root (network namespaces, test users, the daemons)"
    for tool in ("ip", "nsenter", "unshare", "setpriv", "useradd", "userdel", "mknod"):
        if not shutil.which(tool, path=PATH):
            return f"the simulated Slurm cluster needs the `{tool}` command"
    missing = [p for p in PROGRAMS if not shutil.which(p, path=PATH)]
    if missing:
        return f"Slurm or MUNGE is not installed (no {', '.join(missing)}; scripts/slurm-up installs them)"
    if run("unshare", "--net", "--uts", "true", check=False).returncode != 0:
        return "this process may not create network namespaces (a container without CAP_SYS_ADMIN?)"
    return None


def gpu_type(node: str) -> str:
    """The GRES type of ``node``'s GPU: ``t4`` on n3 (and every third node), else ``a100``."""
    return "t4" if int(node[1:]) % 3 == 0 else "a100"


def slurm_conf(run_dir: Path, controller: tuple[str, str], nodes: list[tuple[str, str]], cpus: int,
               partition: str = "", extra_conf: str = "") -> str:
    """slurm.conf for a controller ``(name, address)`` and ``nodes`` ``[(name, address)]``
    with ``cpus`` CPUs and one GPU each, every path under ``run_dir``, accounting through
    the slurmdbd at the controller's address (:func:`slurmdbd_conf`).

    ``partition``: more settings for the one partition ``gpu`` (e.g. ``MaxNodes=2
    MaxTime=60``); ``extra_conf``: more lines (e.g. ``SchedulerParameters=...``).
    """
    r = run_dir
    lines = [
        "# The simulated Slurm cluster of PDL's tests (tests/harness/slurm_harness.py). Written by up().",
        "ClusterName=pdl-sim",
        f"SlurmctldHost={controller[0]}({controller[1]})",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={r}/munge/munge.socket",  # the cluster's own munged (auth and credentials)
        "SlurmUser=root",
        f"StateSaveLocation={r}/state",
        f"SlurmdSpoolDir={r}/spool/%n",
        f"SlurmctldPidFile={r}/run/slurmctld.pid",
        f"SlurmdPidFile={r}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={r}/log/slurmctld.log",
        f"SlurmdLogFile={r}/log/slurmd-%n.log",
        f"PlugStackConfig={r}/etc/plugstack.conf",  # empty: no SPANK plugins from /etc/slurm
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "ReturnToService=2",
        "MpiDefault=none",  # (its plugins still log that libpmix is missing: harmless)
        "MailProg=/bin/true",
        "JobCompType=jobcomp/none",
        "JobAcctGatherType=jobacct_gather/none",
        # accounting: associations (who may submit), limits and QOS, GPUs counted as TRES
        "AccountingStorageType=accounting_storage/slurmdbd",
        f"AccountingStorageHost={controller[1]}",
        f"AccountingStoragePort={DBD_PORT}",
        f"AccountingStoragePass={r}/munge/munge.socket",  # the munged of slurmdbd's connections
        "AccountingStorageTRES=gres/gpu",
        "AccountingStorageEnforce=associations,limits,qos",
        # each job's own /tmp and /dev/shm on each node, shared by its steps, gone when it
        # ends (job_container.conf: :func:`job_container_conf`), as docs/admin.md asks sites to
        "JobContainerType=job_container/tmpfs",
        "PrologFlags=contain",
        # the site's epilog, run on each node as a job ends (the job holds its GPUs until
        # it is done): quick, or slow while a test says so (:meth:`SlurmSim.slow_epilog`)
        f"Epilog={r}/etc/epilog",
    ]
    if extra_conf:
        lines.append(extra_conf.strip())
    for name, addr in nodes:
        lines.append(f"NodeName={name} NodeAddr={addr} CPUs={cpus} RealMemory=1000 Gres=gpu:{gpu_type(name)}:1 "
                     f"State=UNKNOWN")
    names = ",".join(name for name, _ in nodes)
    lines.append(f"PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE State=UP {partition}".rstrip())
    # a second partition over the same nodes, as labs have for short, small jobs
    lines.append(f"PartitionName={SHORT_PARTITION} Nodes={names} Default=NO MaxTime=60 MaxNodes=2 State=UP")
    return "\n".join(lines) + "\n"


def job_container_conf(run_dir: Path) -> str:
    """job_container.conf: each job's temporary places under ``<run_dir>/containers/<node>``
    (Slurm 22.05 makes /tmp and /dev/shm; ``Dirs=`` for more came with 23.02)."""
    return f"BasePath={run_dir}/containers\n"


def epilog_script(run_dir: Path) -> str:
    """The nodes' Epilog: sleeps the seconds ``<run_dir>/slow-epilog`` holds, if any (as
    a site's GPU health check can take), else returns at once."""
    flag = run_dir / "slow-epilog"
    return f"#!/bin/sh\nif [ -r {flag} ]; then sleep \"$(cat {flag})\"; fi\nexit 0\n"


def slurmdbd_conf(run_dir: Path, controller: tuple[str, str], db_port: int, db_password: str) -> str:
    """slurmdbd.conf: slurmdbd on the controller ``(name, address)``, its database the
    MariaDB server at 127.0.0.1:``db_port`` in the controller's namespace."""
    r = run_dir
    return "\n".join([
        "# The simulated Slurm cluster's accounting daemon (tests/harness/slurm_harness.py). Written by up().",
        "AuthType=auth/munge",
        f"AuthInfo=socket={r}/munge/munge.socket",
        f"DbdHost={controller[0]}",
        f"DbdAddr={controller[1]}",
        f"DbdPort={DBD_PORT}",
        "SlurmUser=root",
        f"PidFile={r}/run/slurmdbd.pid",
        f"LogFile={r}/log/slurmdbd.log",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={db_port}",
        "StorageUser=slurm",
        f"StoragePass={db_password}",
        "StorageLoc=slurm_acct_db",
    ]) + "\n"


def gres_conf(nodes: list[str], device) -> str:
    """gres.conf: one GPU per node, of :func:`gpu_type`, ``device(node)`` its device file
    (``Count=`` alone registers no GPU and the node goes INVAL)."""
    return "".join(f"NodeName={name} Name=gpu Type={gpu_type(name)} File={device(name)}\n" for name in nodes)


class SlurmSim(SimulatedCluster):
    """The simulated Slurm cluster: controller ``ctl``, compute nodes ``n1..n<nodes>``.
    ``up()``, ``down()`` (``purge=True`` also deletes the run directory) and the lock
    come from :class:`sim_host.SimulatedCluster`."""

    unavailable = SlurmUnavailable

    SUBNET = "10.78.0"

    def __init__(self, run_dir: str | os.PathLike | None = None, nodes: int = 3, prefix: str = "pdl-sl-",
                 partition: str = "", extra_conf: str = ""):
        super().__init__(Path(run_dir or os.environ.get("PDL_SLURM_DIR") or DEFAULT_RUN_DIR).resolve())
        self.node_names = [f"n{i}" for i in range(1, nodes + 1)]
        self.prefix = prefix
        self.partition = partition
        self.extra_conf = extra_conf
        self.bridge_ns = f"{prefix}br"
        self.host_if = f"{prefix}host"
        self.host_addr = f"{self.SUBNET}.1"
        self.conf_path = self.run_dir / "etc" / "slurm.conf"
        self.users = TEST_USERS
        self._procs: list[subprocess.Popen] = []  # our daemons, reaped in down()

    # -- names, addresses, paths ---------------------------------------------------------

    @property
    def hosts(self) -> list[str]:
        """The controller, then the compute nodes."""
        return [CONTROLLER, *self.node_names]

    def netns(self, host: str) -> str:
        """The network namespace of ``host`` (``ctl``, ``n1``...)."""
        return f"{self.prefix}{host}"

    def netns_path(self, host: str) -> str:
        """For ``nsenter --net=...`` (not ``ip netns exec``: that remounts /sys, and slurmd
        then finds no cgroups)."""
        return f"/run/netns/{self.netns(host)}"

    def addr(self, host: str) -> str:
        return f"{self.SUBNET}.10" if host == CONTROLLER else f"{self.SUBNET}.{10 + int(host[1:])}"

    def gpu_device(self, node: str) -> Path:
        return self.run_dir / "dev" / f"gpu-{node}"

    def home(self, user: str) -> Path:
        return self.run_dir / "home" / user

    @property
    def daemons(self) -> list[str]:
        return ["munged", "mariadb", "slurmdbd", "slurmctld", *(f"slurmd-{n}" for n in self.node_names)]

    def log_path(self, daemon: str) -> Path:
        """The log of ``munged`` (its stderr: in the foreground it logs there), ``mariadb``,
        ``slurmdbd``, ``slurmctld`` or ``slurmd-<node>``."""
        if daemon == "mariadb":  # in its own folder: it runs as mysql
            return self.run_dir / "db" / "mariadb.log"
        return self._out_path(daemon) if daemon == "munged" else self.run_dir / "log" / f"{daemon}.log"

    def _out_path(self, daemon: str) -> Path:
        """The daemon's stdout and stderr (Slurm's daemons write there what they log, and
        what goes wrong before their log file is open)."""
        return self.run_dir / "log" / f"{daemon}.out"

    def _launch_pid_path(self, daemon: str) -> Path:
        return self.run_dir / "run" / f"{daemon}.launch.pid"

    @property
    def munge_socket(self) -> Path:
        return self.run_dir / "munge" / "munge.socket"

    def env(self, user: str | None = None) -> dict[str, str]:
        """The environment of a client command run as ``user`` (None: root)."""
        home = str(self.home(user)) if user else "/root"
        return {"PATH": PATH, "LANG": "C.UTF-8", "SLURM_CONF": str(self.conf_path), "HOME": home,
                "USER": user or "root", "LOGNAME": user or "root"}

    # -- client commands -------------------------------------------------------------------

    def run(self, *cmd: str, user: str | None = None, netns: str | None = CONTROLLER, check: bool = False,
            timeout: float = 60, input: str | None = None, home: str | None = None) -> subprocess.CompletedProcess:
        """Run a command (sbatch, srun, squeue, scancel, sinfo, scontrol...) as ``user``
        (a Unix user, e.g. :data:`ANN`; None: root) in the network namespace of ``netns``
        (``ctl``, ``n1``...; None: the root namespace, as a hub there would), from the
        user's home (``home``: for an account that is not a test user's), with
        ``SLURM_CONF`` set. Returns the CompletedProcess (text); with
        ``check``, a non-zero exit raises RuntimeError with its stderr."""
        argv = list(cmd)
        if user:
            argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--", *argv]
        if netns:
            argv = ["nsenter", f"--net={self.netns_path(netns)}", *argv]
        env = self.env(user) if home is None else {**self.env(user), "HOME": home}
        return run(*argv, check=check, env=env, cwd=home or (self.home(user) if user else self.run_dir),
                   timeout=timeout, input=input)

    def sbatch(self, *args: str, user: str) -> int:
        """Submit a batch job as ``user`` (``sbatch --parsable ARGS``); return its job id."""
        return int(self.run("sbatch", "--parsable", *args, user=user, check=True).stdout.strip().split(";")[0])

    def nodes(self) -> dict[str, dict[str, str]]:
        """Node -> {"state": "idle"/"mix"/"alloc"/..., "gres": "gpu:a100:1", "cpus": "2"} (sinfo)."""
        out = self.run("sinfo", "-N", "-h", "-o", "%N|%t|%G|%c", check=True).stdout
        found = {}
        for line in out.splitlines():
            name, state, gres, cpus = line.split("|")
            found[name] = {"state": state, "gres": gres, "cpus": cpus}
        return found

    def jobs(self) -> list[dict[str, str]]:
        """The jobs in the queue (squeue: pending, running, completing), each as
        {"id", "user", "name", "state" (PENDING, RUNNING...), "reason" (Resources, None...),
        "nodes" (the count), "nodelist", "gres"}."""
        out = self.run("squeue", "-a", "-h", "-o", "%i|%u|%j|%T|%r|%D|%N|%b", check=True).stdout
        keys = ("id", "user", "name", "state", "reason", "nodes", "nodelist", "gres")
        return [dict(zip(keys, line.split("|"))) for line in out.splitlines()]

    def job(self, job_id: int) -> dict[str, str] | None:
        """Job ``job_id`` as in :meth:`jobs` (None once it has left the queue)."""
        return next((j for j in self.jobs() if j["id"] == str(job_id)), None)

    @contextlib.contextmanager
    def slow_epilog(self, seconds: float):
        """While in the block, each node's Epilog takes ``seconds``: an ending job stays
        COMPLETING, holding its GPUs, that long (as a site's GPU health check can make it)."""
        flag = self.run_dir / "slow-epilog"
        flag.write_text(f"{seconds:g}\n")
        try:
            yield
        finally:
            flag.unlink(missing_ok=True)

    def reset(self, timeout: float = 60) -> None:
        """Cancel every job and wait until every node is idle again (between tests)."""
        ids = [j["id"] for j in self.jobs()]
        if ids:
            self.run("scancel", *ids, check=True)

        def settled():
            states = {n["state"] for n in self.nodes().values()}
            return not self.jobs() and states == {"idle"}

        wait_until(settled, timeout, interval=0.2,
                   what=lambda: f"an empty queue and idle nodes: {self.jobs()} {self.nodes()}")

    # -- lifecycle: up() and down() (sim_host.SimulatedCluster) -----------------------------

    def unavailable_reason(self) -> str | None:
        return unavailable_reason()

    def _stages(self):
        return [("files", self._write_files), ("users", self._users_up), ("munge", self._munge_up),
                ("network", self._net_up), ("database", self._database_up), ("slurmdbd", self._slurmdbd_up),
                ("slurmctld", self._controller_up), ("accounts", self._accounts_up), ("nodes", self._nodes_up)]

    def _net_up(self) -> None:
        members = [Member(self.netns(h), f"{self.addr(h)}/24", f"{self.prefix}e-{h}", f"{self.prefix}b-{h}")
                   for h in self.hosts]
        bridged_namespaces(self.bridge_ns, members, self.host_if, f"{self.prefix}hb", f"{self.host_addr}/24")

    # -- files ---------------------------------------------------------------------------

    def _write_files(self) -> None:
        r = self.run_dir
        for sub in ("state", "spool", "run", "home", "dev", "munge", "log", "db", "containers"):  # a fresh cluster every run
            shutil.rmtree(r / sub, ignore_errors=True)
        for sub in ("etc", "state", "run", "log", "home", "dev", *(f"spool/{n}" for n in self.node_names),
                    *(f"containers/{n}" for n in self.node_names)):
            (r / sub).mkdir(parents=True, exist_ok=True)
        for d in (r, r / "home", r / "etc", r / "log"):  # the test users read the config, reach their homes
            d.chmod(0o755)
        for node in self.node_names:
            run("mknod", "-m", "0666", str(self.gpu_device(node)), "c", "1", "3")
        controller = (CONTROLLER, self.addr(CONTROLLER))
        nodes = [(n, self.addr(n)) for n in self.node_names]
        self.conf_path.write_text(slurm_conf(r, controller, nodes, os.cpu_count() or 1, self.partition,
                                             self.extra_conf))
        (r / "etc" / "gres.conf").write_text(gres_conf(self.node_names, self.gpu_device))
        (r / "etc" / "plugstack.conf").write_text("")
        (r / "etc" / "job_container.conf").write_text(job_container_conf(r))
        (r / "slow-epilog").unlink(missing_ok=True)
        epilog = r / "etc" / "epilog"
        epilog.write_text(epilog_script(r))
        epilog.chmod(0o755)
        self._db_password = os.urandom(12).hex()
        dbd_conf = r / "etc" / "slurmdbd.conf"  # slurmdbd wants it private: it holds the database's password
        dbd_conf.touch(mode=0o600)
        dbd_conf.write_text(slurmdbd_conf(r, controller, DB_PORT, self._db_password))

    def _users_up(self) -> None:
        for user in self.users:
            run("useradd", "--system", "--user-group", "--no-create-home", "--home-dir", str(self.home(user)),
                "--shell", "/usr/sbin/nologin", user)
            self.home(user).mkdir(mode=0o700)
            shutil.chown(self.home(user), user, user)

    # -- daemons -------------------------------------------------------------------------

    def _start(self, daemon: str, argv: list[str], host: str | None = None) -> subprocess.Popen:
        """Start ``argv`` in its own session (it outlives a pytest that crashes; down()
        or the next up() stops it), in ``host``'s namespaces with its hostname, and
        record its PID. nsenter, unshare, sh and setpriv all exec: the PID is the daemon's."""
        if host:
            argv = ["nsenter", f"--net={self.netns_path(host)}", "unshare", "--uts",
                    "sh", "-c", _WITH_HOSTNAME, "slurm-sim", host, *argv]
        with open(self._out_path(daemon), "ab") as out:
            out.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
            out.flush()
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 env=self.env(), cwd=self.run_dir, start_new_session=True)
        self._launch_pid_path(daemon).write_text(f"{p.pid}\n")
        self._procs.append(p)
        return p

    def _check_running(self, daemon: str, p: subprocess.Popen) -> None:
        if p.poll() is not None:
            raise RuntimeError(f"{daemon} exited ({p.returncode}):\n{self._tail(self._out_path(daemon), 20)}")

    def _munge_up(self) -> None:
        d = self.run_dir / "munge"
        d.mkdir(mode=0o755)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for path in (d, key):
            shutil.chown(path, "munge", "munge")
        p = self._start("munged", [
            "setpriv", "--reuid=munge", "--regid=munge", "--clear-groups", "--",
            "munged", "--foreground", f"--socket={self.munge_socket}", f"--key-file={key}",
            f"--pid-file={d / 'munged.pid'}", f"--seed-file={d / 'munged.seed'}"])

        def answers():
            self._check_running("munged", p)
            return self.munge_socket.exists() and run(
                "munge", "--no-input", f"--socket={self.munge_socket}", check=False).returncode == 0

        wait_until(answers, 20, interval=0.05, what="munged")

    def _database_up(self) -> None:
        """MariaDB in the controller's namespace, its data under ``db/`` (owned by
        ``mysql``), on 127.0.0.1:DB_PORT there; the database user ``slurm`` for slurmdbd."""
        db = self.run_dir / "db"
        db.mkdir(mode=0o750)
        shutil.chown(db, "mysql", "mysql")
        small = ("--innodb-log-file-size=8M", "--innodb-buffer-pool-size=16M")  # a test's few rows, not 192 MB
        run("mariadb-install-db", "--no-defaults", "--user=mysql", f"--datadir={db}/data", "--skip-test-db",
            "--auth-root-authentication-method=socket", *small, env={"PATH": PATH, "LANG": "C.UTF-8"})
        socket = db / "mysqld.sock"
        p = self._start("mariadb", [
            "mariadbd", "--no-defaults", "--user=mysql", f"--datadir={db}/data", f"--socket={socket}",
            f"--pid-file={db}/mariadbd.pid", "--bind-address=127.0.0.1", f"--port={DB_PORT}",
            "--skip-name-resolve", f"--log-error={self.log_path('mariadb')}", *small],
            host=CONTROLLER)
        sql = (f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{self._db_password}'; "
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")

        def answers():
            self._check_running("mariadb", p)
            return socket.exists() and run("mariadb", "--no-defaults", f"--socket={socket}", "-u", "root",
                                           "-e", "SELECT 1", check=False).returncode == 0

        wait_until(answers, 60, interval=0.1, what="MariaDB answering on its socket")
        run("mariadb", "--no-defaults", f"--socket={socket}", "-u", "root", "-e", sql)

    def _slurmdbd_up(self) -> None:
        dbd = self._start("slurmdbd", ["slurmdbd", "-D"], host=CONTROLLER)
        said = []

        def answers():
            self._check_running("slurmdbd", dbd)
            done = self.run("sacctmgr", "--noheader", "list", "cluster", timeout=20)
            said[:] = [done.stderr.strip()]
            return done.returncode == 0

        wait_until(answers, 60, interval=0.1, what=lambda: f"slurmdbd answering `sacctmgr list cluster`: {said}")
        self.run("sacctmgr", "--immediate", "add", "cluster", "pdl-sim", check=True)

    def _accounts_up(self) -> None:
        """The lab's account with the test users, and the QOS :data:`TWO_GPU_QOS` it may use."""
        self.run("sacctmgr", "--immediate", "add", "qos", TWO_GPU_QOS, "MaxTRESPerUser=gres/gpu=2", check=True)
        self.run("sacctmgr", "--immediate", "add", "account", LAB_ACCOUNT, "Description=pdl-tests",
                 "Organization=pdl", f"QOS=normal,{TWO_GPU_QOS}", "DefaultQOS=normal", check=True)
        self.run("sacctmgr", "--immediate", "add", "user", ",".join(self.users), f"Account={LAB_ACCOUNT}",
                 check=True)

    def _controller_up(self) -> None:
        ctl = self._start("slurmctld", ["slurmctld", "-D", "-f", str(self.conf_path)], host=CONTROLLER)

        def answers():
            self._check_running("slurmctld", ctl)
            return "is UP" in self.run("scontrol", "ping", timeout=20).stdout

        wait_until(answers, 60, interval=0.1, what="slurmctld answering `scontrol ping`")

    def _nodes_up(self) -> None:
        procs = {n: self._start(f"slurmd-{n}", ["slurmd", "-D", "-f", str(self.conf_path), "-N", n], host=n)
                 for n in self.node_names}

        def all_idle():
            for n, p in procs.items():
                self._check_running(f"slurmd-{n}", p)
            nodes = self.nodes()
            return sorted(nodes) == sorted(self.node_names) and all(v["state"] == "idle" for v in nodes.values())

        wait_until(all_idle, 60, interval=0.1, what=lambda: f"{len(procs)} idle nodes: {self.nodes()}")

    # -- cleanup -------------------------------------------------------------------------

    def _recorded_pids(self, *commands: str) -> list[int]:
        """The live PIDs recorded under run/ whose program is one of ``commands``
        (a PID counts only while it is still ours: PIDs get reused)."""
        pids = {p.pid for p in self._procs if p.poll() is None}
        for path in (self.run_dir / "run").glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                pids.add(int(path.read_text().strip()))
        return [p for p in pids if pid_alive(p) and _comm(p) in commands and self._names_run_dir(p)]

    def _names_run_dir(self, pid: int) -> bool:
        """Whether ``pid``'s command line, or its SLURM_CONF (slurmdbd takes no config
        path), names our run directory."""
        if str(self.run_dir) + "/" in cmdline(pid):
            return True
        try:
            return f"SLURM_CONF={self.conf_path}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False

    def _user_pids(self) -> list[int]:
        uids = set()
        for user in self.users:
            with contextlib.suppress(KeyError):
                uids.add(pwd.getpwnam(user).pw_uid)
        return [p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real in uids]

    def _our_netns(self) -> list[str]:
        ours = {self.bridge_ns, *(self.netns(h) for h in self.hosts)}
        return [name for name in netns_names() if name in ours]

    def _our_links(self) -> list[str]:
        ours = {self.host_if, f"{self.prefix}hb", *(f"{self.prefix}{side}-{h}" for h in self.hosts for side in "eb")}
        return [name for name in veth_names() if name in ours]

    def _our_users(self) -> list[str]:
        return [u for u in self.users if run("getent", "passwd", u, check=False).returncode == 0]

    def _cleanup_leftovers(self) -> None:
        """Cancel the jobs and shut Slurm down if it answers; stop our daemons (recorded
        PIDs first), anything else naming the run directory, running in our namespaces
        or as a test user; stop munged last; delete the namespaces, veths and users."""
        slurm = self._recorded_pids("slurmctld", "slurmd")
        if slurm:
            with contextlib.suppress(Exception):
                jobs = [j["id"] for j in self.jobs()]
                if jobs:
                    self.run("scancel", *jobs, timeout=10)
                    wait_until(lambda: not self.jobs(), 15, interval=0.2, what="the jobs cancelled")
            with contextlib.suppress(Exception):
                self.run("scontrol", "shutdown", timeout=10)
                wait_until(lambda: not any(pid_alive(p) for p in slurm), 15, interval=0.1,
                           what="slurmctld and slurmd to shut down")
        terminate(self._recorded_pids("slurmctld", "slurmd", "slurmdbd"), timeout=15)
        terminate(self._recorded_pids("mariadbd") + pids_naming(str(self.run_dir) + "/", ("mariadbd",)), timeout=30)
        remove_namespaces(self._our_netns())
        terminate(pids_naming(str(self.run_dir) + "/", _SLURM_COMMANDS))
        terminate(self._user_pids(), timeout=10)
        terminate(self._recorded_pids("munged") + pids_naming(str(self.run_dir) + "/", ("munged",)), timeout=10)
        for p in self._procs:  # reap them
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        self._procs = [p for p in self._procs if p.returncode is None]
        remove_links(self._our_links())
        for user in self._our_users():
            run("userdel", user, check=False)
        for mount in self._our_mounts():  # a job's temporary places its stepd left behind
            run("umount", "-l", mount, check=False)
        for sub in ("run", "home", "dev", "db", "containers"):
            shutil.rmtree(self.run_dir / sub, ignore_errors=True)
        with contextlib.suppress(OSError):
            (self.run_dir / "munge" / "munge.key").unlink()
        # slurmstepd daemonizes (PID 1 is its parent), and once its job has ended it stays a
        # zombie until PID 1 reaps it: on these VMs up to 2 s later. Wait for that, so that
        # nothing of Slurm's is listed once down() returns.
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: not _orphaned_slurm_zombies(), 10, interval=0.1)

    def _our_mounts(self) -> list[str]:
        """Mounts under the run directory's ``containers`` (the jobs' /tmp and /dev/shm), deepest first."""
        base = str(self.run_dir / "containers") + "/"
        with open("/proc/self/mounts") as mounts:
            found = [line.split()[1] for line in mounts if line.split()[1].startswith(base)]
        return sorted(found, key=len, reverse=True)

    def leftovers(self) -> dict[str, list]:
        """What of ours is still there (all empty after ``down()``)."""
        return {
            "processes": sorted(set(self._recorded_pids("slurmctld", "slurmd", "slurmdbd", "mariadbd", "munged")
                                    + self._user_pids()
                                    + pids_naming(str(self.run_dir) + "/", (*_SLURM_COMMANDS, "munged", "mariadbd")))),
            "netns": self._our_netns(),
            "mounts": self._our_mounts(),
            "veths": self._our_links(),
            "users": self._our_users(),
        }

    # -- diagnostics -----------------------------------------------------------------------

    @staticmethod
    def _tail(path: Path, lines: int) -> str:
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def logs(self, tail: int = 40) -> str:
        """The last ``tail`` lines of each daemon's log, with where the full logs are."""
        parts = [(f"Slurm daemon logs (full: {self.run_dir}/log/; the mpi/pmix errors at start are "
                  "harmless: libpmix is not installed, and no job uses PMIx)")]
        for daemon in self.daemons:
            path = self.log_path(daemon)
            if not path.exists():  # it never opened its log: what it said before that
                path = self._out_path(daemon)
            parts.append(f"---- {daemon}: {path}\n{self._tail(path, tail)}")
        return "\n".join(parts) + "\n"

    def failure_sections(self) -> list[tuple[str, str]]:
        """What a failing test's report shows of the cluster (tests/conftest.py), as (title, text)."""
        return [("Slurm daemons", self.logs(tail=40)), ("Slurm queue", self._queue_now())]

    def _queue_now(self) -> str:
        try:
            return (self.run("sinfo", "-N", "-o", "%N %t %G %E", timeout=10).stdout
                    + self.run("squeue", "-a", "-o", "%i %u %j %T %r %D %N %b", timeout=10).stdout)
        except Exception as e:  # noqa: BLE001 - the controller may be what failed
            return f"could not ask the controller: {type(e).__name__}: {e}"


# -- pytest support (used by tests/slurm/conftest.py) -----------------------------------------


def slurm_session():
    """Generator behind the ``slurm`` fixture: Slurm installed (scripts/slurm-up, when
    something is missing and we are root on Linux), the cluster up; down at the end.
    Skips where the cluster cannot run, except with $CI set, where that fails."""
    import pytest

    def cannot_run(reason: str):
        if os.environ.get("CI"):
            pytest.fail(f"slurm tests cannot run: {reason} (CI is set: failing instead of skipping)")
        pytest.skip(reason)

    t0 = time.monotonic()
    reason = unavailable_reason()
    if reason and sys.platform.startswith("linux") and os.geteuid() == 0:
        install = run("bash", str(REPO / "scripts" / "slurm-up"), check=False)
        if install.returncode != 0:
            cannot_run(f"scripts/slurm-up failed: {(install.stderr or install.stdout).strip()[-500:]}")
        reason = unavailable_reason()
    if reason:
        cannot_run(reason)
    t1 = time.monotonic()
    try:
        sim = SlurmSim().up()
    except SlurmUnavailable as e:
        cannot_run(str(e))
    sim.timings["install"] = t1 - t0
    try:
        yield sim
    finally:
        sim.down()
    left = sim.leftovers()
    if any(left.values()):
        raise RuntimeError(f"the simulated Slurm cluster's down() left {left}")
