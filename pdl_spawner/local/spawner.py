"""The embedded-default spawner: the user's server and engines as local processes.

Contract, on top of JupyterHub's :class:`~jupyterhub.spawner.LocalProcessSpawner`:

- ``start()`` first checks ``user_options``: ``workers`` is the only key a user may
  set; any other (``image``, ``volumes``, ``env``, ...) fails with HTTP 400 naming
  the valid option. It then reserves ``workers`` slots from
  :attr:`PDLLocalSpawner.pool` in the :class:`~pdl_spawner.core.reservations.SlotLedger`
  before anything is launched. If they are not free it fails at once (no process
  started, nothing reserved) with a one-line message saying what is free. It then
  runs ``pdl-singleuser`` with ``PDL_SLOTS``, which starts the server (on a port from
  :attr:`PDLLocalSpawner.port_range`) and one pinned engine per slot.
- A spawn with ``user_options["queue"]`` (the form's "wait in the queue") that finds
  the slots busy waits instead, first come first served (:mod:`~pdl_spawner.core.wait_queue`),
  showing its position on the spawn page; cancelling the spawn leaves the queue. A
  direct spawn is refused while anyone waits.
- ``stop()`` stops that process tree and releases the slots; so does a ``poll()``
  that finds the server gone (``clear_state``, which frees whatever the ledger holds
  for the server, so a reservation made just before a hub crash, before JupyterHub
  saved the spawner's state, is freed when the restarted hub finds no server).
- The reservation is in the spawner state and in the ledger file, so it survives
  hub restarts (with ``JupyterHub.cleanup_servers = False`` the servers do too).
- **Accounts.** When the hub runs as root (:attr:`PDLLocalSpawner.system_users`), each
  hub user's server, kernels, terminal, controller and engines run under that user's
  own Unix account (:mod:`~pdl_spawner.core.unix_accounts`, made on the first spawn), in a
  home of mode 0700, inside a device cgroup of their own
  (:mod:`~pdl_spawner.core.device_cgroup`) that lets them open only the GPU device nodes
  of their reservation (and frees a GPU only when none of them holds it open), and
  in a cgroup v2 whose bind filter lets them take, of ``port_range``, only their own
  server's port (:mod:`~pdl_spawner.core.port_filter`); nothing of a user runs as root.
  Without root, every server runs as the hub's own user: one person's machine.
- The ledger and the queue are SQLite files: every call is made off the event loop
  (:mod:`~pdl_spawner.core.db_thread`), so a lock held elsewhere never freezes the hub.
- Idle engines give their slots back through the server's HTTP lease API
  (:mod:`~pdl_spawner.core.idle_engines`); nothing the user can write decides which slots
  are theirs or how many they get.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import random
import socket
import sys
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid
from jupyterhub.utils import url_path_join
from tornado import web
from traitlets import Bool, Integer, List, Tuple, Unicode, default, validate

from pdl.slots import cpu_count, default_pool, parse_slot
from pdl_server.contract import ServerContract, cluster_dir_in

from pdl_spawner.core import device_cgroup, port_filter, unix_accounts
from pdl_spawner.core.db_thread import off_loop, submit
from pdl_spawner.core.spawner import SpawnerCore
from pdl_spawner.core.idle_engines import idle_reason
from pdl_spawner.core.reservations import NotEnoughSlots, SlotLedger
from pdl_spawner.core.usage import NotEnoughWorkers, WorkerUsage

#: Seconds stop() waits for the processes left in a server's cgroup to die.
KILL_WAIT_S = 10.0

class PDLLocalSpawner(SpawnerCore, LocalProcessSpawner):
    """Spawn a user's server plus one ipyparallel engine per reserved GPU or CPU slot."""

    pool = List(
        Unicode(),
        config=True,
        help="""Slots users can reserve, e.g. ["gpu:0", "gpu:1"] or ["cpu:0", "cpu:1"].

        Default: every GPU nvidia-smi reports, else `cpu_slots` CPU slots.
        """,
    )

    @default("pool")
    def _default_pool(self):
        return default_pool(self.cpu_slots)

    @validate("pool")
    def _validate_pool(self, proposal):
        for slot in proposal.value:
            parse_slot(slot)
        if len(set(proposal.value)) != len(proposal.value):
            raise ValueError(f"pool lists a slot twice: {proposal.value}")
        cpu_slots = sum(1 for slot in proposal.value if slot.startswith("cpu:"))
        if cpu_slots > cpu_count():
            self.log.warning("pool has %d CPU slots on %d cores: engines will share cores and each "
                             "train slower than one per core would", cpu_slots, cpu_count())
        return proposal.value

    cpu_slots = Integer(
        None,
        allow_none=True,
        config=True,
        help="Number of CPU slots in the default pool of a machine without GPUs; "
        "default (None): one per core, so that no two engines share a core. "
        "The machine's cores are split evenly between them.",
    )

    reservations_db = Unicode(
        "pdl-reservations.sqlite",
        config=True,
        help="SQLite file of slot reservations (relative to the hub's working directory). "
        "Every spawner of one hub must use the same file.",
    )

    system_users = Bool(
        config=True,
        help="""Run each hub user's server and engines as their own Unix account
        (`account_prefix` + name, created on the first spawn). Default: True when the
        hub runs as root, and then it cannot be turned off (no user's code runs as
        root). False (the default without root) runs every server as the hub's own
        Unix user, each with its own home from `home_dir_template`: right for one
        person's machine, no isolation between users.""",
    )

    @default("system_users")
    def _default_system_users(self):
        return os.geteuid() == 0

    account_prefix = Unicode(
        "pdl-", config=True,
        help="Prefix of the users' Unix accounts: hub user ann runs as pdl-ann.",
    )

    accounts_record = Unicode(
        "", config=True,
        help="""File where the hub records the Unix accounts it made (mode 0600; one
        `<name> <uid>` line each). PDL runs users only as accounts in it. Default:
        `accounts` beside `reservations_db`. Every spawner of one hub must use the same
        file; two hubs on one machine must not.""",
    )

    @property
    def accounts_record_path(self) -> Path:
        """:attr:`accounts_record`, or its default beside the reservations database."""
        return Path(self.accounts_record) if self.accounts_record else Path(self.reservations_db).parent / "accounts"

    homes_root = Unicode(
        "/home", config=True,
        help="Folder the users' accounts get their homes in (mode 0700 each), e.g. /home/pdl-ann.",
    )

    runtime_dir_root = Unicode(
        "/run/user", config=True,
        help="""Folder of the accounts' private runtime folders, <root>/<uid> (mode 0700,
        $XDG_RUNTIME_DIR): the kernels' IPC sockets live there.""",
    )

    skeleton_dir = Unicode(
        "", config=True,
        help="""Folder whose files every new account's home starts with (useradd --skel);
        empty: the system's /etc/skel.""",
    )

    gpu_device_template = Unicode(
        "/dev/nvidia{index}", config=True,
        help="""Device node of GPU slot gpu:{index}. A user's processes may open only the
        nodes of their own reservation (device cgroup), when the hub runs as root.""",
    )

    home_dir_template = Unicode(
        "~/.pdl/home/{username}",
        config=True,
        help="Home of each user's server when `system_users` is False; "
        "{username} is the hub user's name, ~ the hub user's home.",
    )

    port_range = Tuple(
        Integer(), Integer(), default_value=(20000, 32000), config=True,
        help="""Ports (inclusive) the hub picks each server's port from. Below Linux's
        ephemeral range (32768+), where the users' ipyparallel controllers and engines
        get their ZeroMQ ports: picked from there, a port that was free when the hub
        chose it could be taken by another user's cluster before the server binds it.
        As root, a server's processes may bind only their own server's port of the
        range (:mod:`~pdl_spawner.core.port_filter`).""",
    )

    @validate("port_range")
    def _validate_port_range(self, proposal):
        low, high = proposal.value
        if not 1024 <= low <= high <= 65535:
            raise ValueError(f"port_range must be (low, high), 1024 <= low <= high <= 65535: {proposal.value}")
        return proposal.value

    slots = List(Unicode(), help="The slots reserved for this server (spawner state).")

    #: Ports given to this hub's servers, which may not listen yet: owner -> port.
    _ports: dict[str, int] = {}
    #: How this machine isolates GPU devices (:func:`device_cgroup.support`), once known.
    _isolation: device_cgroup.Support | None = None

    @default("cmd")
    def _default_cmd(self):
        return [sys.executable, "-m", "pdl_server.singleuser"]

    # -- reservations ----------------------------------------------------------

    @property
    def ledger(self) -> SlotLedger:
        """The slot ledger; its calls block: make them with :func:`off_loop`."""
        return SlotLedger(self.reservations_db)

    @property
    def owner(self) -> str:
        """Ledger key of this server: the user name, plus ``/server`` for named servers."""
        return f"{self.user.name}/{self.name}" if self.name else self.user.name

    @property
    def owner_key(self) -> str:
        return self.owner

    @property
    def queue_db(self) -> str:
        """The queue lives next to the ledger."""
        return self.reservations_db

    def ready_to_start(self) -> bool:
        return bool(self.slots)

    @property
    def worker_kind(self) -> str:
        return parse_slot(self.pool[0])[0] if self.pool else "cpu"

    @property
    def worker_capacity(self) -> int:
        return len(self.pool)

    async def worker_usage(self) -> WorkerUsage:
        return await off_loop(self._usage)

    def _usage(self) -> WorkerUsage:
        """The pool, and the users holding its slots other than this server; blocks on the ledger."""
        holders: dict[str, int] = {}
        for h in self.ledger.holdings():
            if h.slot in self.pool and h.owner != self.owner:
                user = h.owner.split("/", 1)[0]
                holders[user] = holders.get(user, 0) + 1
        return WorkerUsage(total=len(self.pool), holders=holders)

    async def take_workers(self, n: int) -> list[str]:
        """``n`` free slots of the pool from the ledger (all or nothing)."""
        try:
            return await off_loop(self.ledger.reserve, self.owner, n, self.pool)
        except NotEnoughSlots as e:
            raise NotEnoughWorkers(e.wanted, WorkerUsage(total=len(self.pool), holders=e.holders)) from None

    def release_blocking(self) -> list[str]:
        """Free every slot the ledger holds for this server (blocks on the ledger)."""
        released = self.ledger.release(self.owner)
        if released:
            self.log.info("Released %s for %s", ",".join(released), self.owner)
        return released

    def forget_port(self) -> None:
        """The server's port may be given to another server again."""
        PDLLocalSpawner._ports.pop(self.owner, None)

    async def release(self) -> None:
        self.forget_port()
        await off_loop(self.release_blocking)

    # -- process -------------------------------------------------------------

    @property
    def account(self) -> str:
        """The Unix account this server runs as (with :attr:`system_users`)."""
        try:
            return unix_accounts.account_name(self.account_prefix, self.user.name)
        except ValueError as e:
            raise web.HTTPError(400, str(e), reason=str(e)) from None

    @property
    def cgroup(self) -> device_cgroup.DeviceCgroup | None:
        """This server's device cgroup, named by its account (unique to the machine);
        None without :attr:`system_users`, or where the machine has no device cgroup
        (the hub logs why once)."""
        if not self.system_users:
            return None
        if PDLLocalSpawner._isolation is None:  # looked up once per hub process, and logged
            PDLLocalSpawner._isolation = isolation = device_cgroup.support()
            (self.log.info if isolation else self.log.warning)("%s", isolation.reason)
        if not PDLLocalSpawner._isolation:
            return None
        return device_cgroup.DeviceCgroup(f"{self.account}/{self.name}" if self.name else self.account,
                                          isolation=PDLLocalSpawner._isolation)

    @property
    def port_cgroup(self) -> port_filter.PortCgroup | None:
        """This server's bind filter's cgroup (:mod:`~pdl_spawner.core.port_filter`); None
        without :attr:`system_users`, or where the machine cannot filter binds (the hub
        logs why once)."""
        if not self.system_users:
            return None
        if PDLLocalSpawner._port_isolation is None:
            PDLLocalSpawner._port_isolation = problem = port_filter.support() or ""
            if problem:
                self.log.warning("%s: a user's processes can bind the ports of port_range", problem)
            else:
                self.log.info("Port isolation: each server binds only its own port of port_range %s-%s",
                              *self.port_range)
        if PDLLocalSpawner._port_isolation:
            return None
        return port_filter.PortCgroup(f"{self.account}/{self.name}" if self.name else self.account)

    #: port_filter.support()'s answer, looked up once per hub process ("" when it works)
    _port_isolation: str | None = None

    def restrict_ports(self) -> None:
        """Let this server's processes bind, of :attr:`port_range`, only :attr:`port`. Blocks."""
        cgroup = self.port_cgroup
        if cgroup is not None:
            cgroup.restrict(*self.port_range, self.port)

    def gpu_nodes(self, slots: list[str]) -> list[Path]:
        """Device nodes of the GPU slots among ``slots``."""
        nodes = []
        for slot in slots:
            kind, index = parse_slot(slot)
            if kind == "gpu":
                nodes.append(Path(self.gpu_device_template.format(index=index)))
        return nodes

    def restrict_devices(self, slots: list[str]) -> None:
        """Let this server's processes open the GPU nodes of ``slots`` and no other of the pool."""
        cgroup = self.cgroup
        if cgroup is not None:
            all_nodes = [n for n in self.gpu_nodes(self.pool) if n.exists()]
            cgroup.restrict([n for n in self.gpu_nodes(slots) if n.exists()], all_nodes)

    def _check_runnable(self) -> None:
        """HTTP 500, one line, when the users' accounts cannot run PDL's Python."""
        blocked = unix_accounts.unreachable_by_others(self.cmd[0])
        if blocked is not None:
            message = (f"the users' accounts cannot run {self.cmd[0]}: {blocked} is closed to other users; "
                       f"install PDL where every user can read it (e.g. chmod o+rx {blocked})")
            raise web.HTTPError(500, message, reason=message)

    def prepare_account(self) -> None:
        """Make this user's account (once) and their device cgroup, with no process left
        in it from a server the hub lost track of (a crash mid-spawn). Blocks: the
        spawner runs it in a worker thread, between the reservation and the launch."""
        self._check_runnable()
        try:
            entry = unix_accounts.ensure_account(self.account, self.homes_root, self.accounts_record_path,
                                                 self._skeleton(), comment=f"PDL hub user {self.user.name}")
        except unix_accounts.ForeignAccount as e:
            raise web.HTTPError(500, str(e), reason=str(e)) from None
        unix_accounts.ensure_runtime_dir(entry, self.runtime_dir_root)
        cgroup = self.cgroup
        if cgroup is not None:
            cgroup.create()
            leftover = cgroup.kill_all(KILL_WAIT_S)
            if leftover:
                raise RuntimeError(f"processes {leftover} of {self.owner} do not die")
            self.restrict_devices(self.slots)

    def end_processes(self) -> None:
        """Kill whatever is left of this server (a process that left its tree) and
        remove its cgroup. Blocks up to :data:`KILL_WAIT_S`."""
        cgroup = self.cgroup
        if cgroup is None:
            return
        left = cgroup.kill_all(KILL_WAIT_S)
        if left:
            self.log.error("processes %s of %s survived SIGKILL", left, self.owner)
        else:
            cgroup.remove()
            ports = self.port_cgroup
            if ports is not None:
                try:
                    ports.remove()
                except OSError as e:  # the next start of this server uses it again, with its own filter
                    self.log.warning("could not remove the port cgroup of %s: %s", self.owner, e)

    def _skeleton(self) -> str | None:
        return self.skeleton_dir or None

    def make_preexec_fn(self, name):
        if self.system_users:
            joined = [c.procs_file for c in (self.cgroup, self.port_cgroup) if c is not None]
            become_user = set_user_setuid(self.account)

            def preexec():
                for procs in joined:  # as root, before giving root up (one folder on cgroup v2 hosts)
                    device_cgroup.join(procs)
                become_user()

            return preexec
        home = self.home_dir

        def preexec():
            os.makedirs(home, 0o700, exist_ok=True)
            os.chdir(home)

        return preexec

    @property
    def home_dir(self) -> str:
        if self.system_users:
            return pwd.getpwnam(self.account).pw_dir
        return os.path.expanduser(self.home_dir_template.format(username=self.user.name))

    def user_env(self, env):
        if self.system_users:
            entry = pwd.getpwnam(self.account)
            runtime = Path(self.runtime_dir_root) / str(entry.pw_uid)
            env.update(USER=entry.pw_name, LOGNAME=entry.pw_name, HOME=entry.pw_dir, SHELL=entry.pw_shell,
                       XDG_RUNTIME_DIR=str(runtime), JUPYTER_RUNTIME_DIR=str(runtime / "jupyter"))
            return env
        env.update(USER=self.user.name, HOME=self.home_dir, SHELL="/bin/bash")
        return env

    def pick_port(self) -> int:
        """A port of :attr:`port_range` that no server of this hub was given and nothing listens on."""
        low, high = self.port_range
        given = {port for owner, port in PDLLocalSpawner._ports.items() if owner != self.owner}
        candidates = [p for p in range(low, high + 1) if p not in given]
        for port in random.sample(candidates, min(len(candidates), 200)):
            if _can_bind(self.ip or "127.0.0.1", port):
                PDLLocalSpawner._ports[self.owner] = port
                return port
        message = f"no free port for the server in port_range {low}-{high}: {self._port_holders(given)}"
        raise web.HTTPError(503, message, reason=message)

    def _port_holders(self, given: set[int]) -> str:
        """Who holds the ports of :attr:`port_range`, in a few words: the servers of this
        hub, and the accounts listening on the rest."""
        low, high = self.port_range
        counts: dict[str, int] = {}
        servers = sorted({owner for owner, port in PDLLocalSpawner._ports.items() if port in given})
        if servers:
            counts[f"the servers of {', '.join(servers[:5])}{' and more' if len(servers) > 5 else ''}"] = len(given)
        for port, account in port_filter.port_holders(low, high).items():
            if port not in given:
                counts[account] = counts.get(account, 0) + 1
        held = sum(counts.values())
        if high - low + 1 > held:
            counts["other sockets (bound, not listening)"] = high - low + 1 - held
        return "; ".join(f"{who} {'hold' if who.startswith(('the servers', 'other')) else 'holds'} {n}"
                         for who, n in sorted(counts.items(), key=lambda item: -item[1]))

    @property
    def cluster_dir(self) -> Path:
        """Where the user's server keeps its cluster (and the engine lease files); the
        hub never reads or writes there."""
        return Path(cluster_dir_in(self.home_dir))

    def get_env(self):
        env = super().get_env()
        env.update(ServerContract(slots=tuple(self.slots), cluster_dir=str(self.cluster_dir),
                                  idle_timeout_s=self.engine_idle_timeout).env())
        return env

    # -- idle engines ----------------------------------------------------------

    @property
    def server_address(self) -> str:
        """Where the hub reaches this server: its ``ip`` (default 127.0.0.1)."""
        return self.ip or "127.0.0.1"

    def lease_url(self) -> str | None:
        if self.server is None or not self.port:
            return None
        return f"http://{self.server_address}:{self.port}{url_path_join(self.server.base_url, 'pdl/api/lease')}"

    def lease_token(self) -> str | None:
        return self.api_token

    async def reclaim_idle_workers(self) -> list[str] | None:
        """Free this server's slots in the ledger (logged as a reclaim); its device cgroup
        then opens no GPU. Only when no process of the user holds one of its GPUs open
        (a handle opened before, which the cgroup cannot take back): the user's processes
        are looked at, and when none holds one, looked at again after the cgroup stopped
        new opens. While one does, every slot stays reserved (the GPUs stay open to them)
        and this returns None (the next look tries again). The lease is the user's to
        write, so "released" alone never frees a GPU that is in use."""
        held = await off_loop(self.ledger.held_by, self.owner)
        if not held:
            return []
        holders = await off_loop(self.gpu_holders, held)
        if not holders:  # look again once no new open can succeed: one opened meanwhile shows now
            self.restrict_devices([])
            holders = await off_loop(self.gpu_holders, held)
            if holders:
                self.restrict_devices(held)
        if holders:
            kept = ", ".join(f"pid {pid} has {' '.join(nodes)}" for pid, nodes in sorted(holders.items()))
            if kept != self._kept_for:
                self.log.info("Kept %s for %s, whose lease says released: %s open; freed once none is",
                              ",".join(held), self.owner, kept)
            self._kept_for = kept
            return None
        self._kept_for = ""
        return await off_loop(self.ledger.reclaim, self.owner, idle_reason(self.engine_idle_timeout))

    #: The holders last logged by :meth:`reclaim_idle_workers` ("" none): logged once, not every look.
    _kept_for = ""

    def gpu_holders(self, slots: list[str]) -> dict[int, list[str]]:
        """Processes of this server's cgroup or account with a GPU node of ``slots`` open:
        pid -> nodes (empty without :attr:`system_users`: one person's machine). Blocks."""
        if not self.system_users:
            return {}
        nodes = [n for n in self.gpu_nodes(slots) if n.exists()]
        if not nodes:
            return {}
        cgroup = self.cgroup
        pids = set(cgroup.pids()) if cgroup is not None else set()
        with contextlib.suppress(KeyError):
            pids |= set(device_cgroup.processes_of_uid(pwd.getpwnam(self.account).pw_uid))
        return device_cgroup.processes_holding(nodes, pids)

    async def grant_workers_again(self, n: int) -> dict:
        """Slots from the ledger again (the device cgroup follows them): ``{"slots": [...]}``."""
        self.slots = await self.reserve_workers(n, spawning=False)
        self.restrict_devices(self.slots)
        self.log.info("Granted %s to %s again", ",".join(self.slots), self.owner)
        return {"slots": self.slots}

    def move_certs(self, paths):
        return paths if not self.system_users else super().move_certs(paths)

    async def start(self):
        if os.geteuid() == 0 and not self.system_users:
            message = "PDLLocalSpawner.system_users is off while the hub runs as root: no user's server runs as root"
            raise web.HTTPError(500, message, reason=message)
        self.slots = await self.claim_workers()
        self.log.info("Reserved %s for %s", ",".join(self.slots), self.owner)
        try:
            if self.system_users:
                await asyncio.to_thread(self.prepare_account)
            self.port = self.pick_port()
            if self.system_users:
                await asyncio.to_thread(self.restrict_ports)
            url = await self.launch_server()
            self.watch_lease()
            return url
        except BaseException:
            await asyncio.shield(self.release())
            self.slots = []
            raise

    async def launch_server(self):
        """Start the server's process (JupyterHub's LocalProcessSpawner.start, with this
        spawner's environment, account and port): its ``(ip, port)``. A subclass that
        runs the server elsewhere wraps it."""
        return await super().start()

    async def poll(self):
        status = await super().poll()
        if status is None:
            self.watch_lease()  # also after a hub restart
        return status

    async def stop(self, now=False):
        self.unwatch_lease()
        try:
            await super().stop(now=now)
            await asyncio.to_thread(self.end_processes)
        finally:
            await self.release()

    # -- state ---------------------------------------------------------------

    def get_state(self):
        state = super().get_state()
        if self.slots:
            state["slots"] = list(self.slots)
        return state

    def load_state(self, state):
        super().load_state(state)
        self.slots = list(state.get("slots", []))

    def clear_state(self):
        """Forget the server, and free whatever the ledger holds for it (the slots of
        the state, or of a reservation made just before a hub crash that the state
        never recorded). Queued on the database thread: done before any later call."""
        super().clear_state()
        self.forget_port()
        submit(self.release_blocking)
        self.slots = []


def _can_bind(ip: str, port: int) -> bool:
    """True if nothing holds ``ip:port`` (TCP) right now."""
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as sock:
        try:
            sock.bind((ip, port))
        except OSError:
            return False
    return True
