"""A user's server as a process tree on the hub's machine, run as the user's own Unix account.

:class:`HostServer` is the server part that the embedded default
(:class:`~pdl_spawner.local.PDLLocalSpawner`) and Slurm
(:class:`~pdl_spawner.slurm.PDLSlurmSpawner`, whose servers run on the login node or
as a step ``srun`` started here) share, over JupyterHub's
:class:`~jupyterhub.spawner.LocalProcessSpawner`. A kind composes it with
:class:`~pdl_spawner.core.spawner.SpawnerCore` and that spawner; where its workers come
from is its :class:`~pdl_spawner.host.workers.HostWorkers` (``self.workers``).

- **Accounts.** When the hub runs as root (:attr:`HostServer.system_users`), each hub
  user's server, kernels, terminal, controller and engines run under that user's own
  Unix account (:mod:`~pdl_spawner.accounts.unix_accounts`, made on the first spawn), in a
  home of mode 0700, inside a device cgroup of their own
  (:mod:`~pdl_spawner.host.device_cgroup`, which also tracks every process of the
  server) and in a cgroup v2 whose bind filter lets them take, of ``port_range``, only
  their own server's ports (:mod:`~pdl_spawner.host.port_filter`), in a mount namespace
  with a /tmp, /var/tmp and /dev/shm of the server's own (:mod:`~pdl_spawner.host.private_tmp`),
  with System V IPC and abstract Unix sockets of its own (:mod:`~pdl_spawner.host.private_ipc`),
  in cgroups of their account that bound their processes and memory
  (:mod:`~pdl_spawner.host.account_limits`), and in a cgroup of the server that bounds its
  CPU (JupyterHub's ``cpu_limit``) while each engine is kept on its slot's cores
  (:mod:`~pdl_spawner.host.cpu_limits`); on a host with cgroup v2 only, the limits are
  those of one cgroup v2 folder per server and its leaves (:mod:`~pdl_spawner.host.cgroup_v2`,
  :attr:`HostServer.tree`). Nothing of a user runs as root. Without root,
  every server runs as the hub's own user: one person's machine.
- **Start.** The kind claims the workers, then the account is made (once: a kind
  whose claim is made as the user makes it during the claim, :meth:`HostServer.ensure_account`);
  then a block of :data:`PORTS_A_SERVER` ports of ``port_range`` that no other server
  of the hub was given (the server's, then its ipyparallel controller's: told in the
  server contract, so the controller never picks a port that another user's
  controller may take before it binds), the bind filter, the process, and the engine
  lease's watch; ``start`` returns once the server listens on its port
  (:mod:`~pdl_spawner.host.listening`), so the hub's first check finds it. A failure
  releases what was claimed.
- **Stop.** The process tree, then whatever is left in the server's cgroup, then the
  workers (the source's ``release``). ``clear_state`` (the server found gone) frees the
  workers by owner on the database thread (the source's ``release_blocking``).
- ``slots`` (the engines' slots, ``PDL_SLOTS``) is spawner state.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import random
import socket
import sys
from pathlib import Path

from jupyterhub.spawner import set_user_setuid
from jupyterhub.traitlets import ByteSpecification
from tornado import web
from traitlets import Bool, Integer, List, Unicode, default
from traitlets.config import LoggingConfigurable

from pdl.connection import CONTROLLER_PORTS
from pdl.contract import ServerContract, cluster_dir_in
from pdl_spawner.accounts import unix_accounts
from pdl_spawner.host import (account_limits, cgroup_v2, cpu_limits, device_cgroup, listening, port_filter,
                              private_ipc, private_tmp)
from pdl_spawner.hub import metrics
from pdl_spawner.hub.db_thread import submit

#: Seconds stop() waits for the processes left in a server's cgroup to die.
KILL_WAIT_S = 10.0
#: Ports of ``port_range`` each server takes, in a row: its own (:attr:`HostServer.port`),
#: then its controller's (:attr:`HostServer.controller_ports`).
PORTS_A_SERVER = 1 + CONTROLLER_PORTS


class HostServer(LoggingConfigurable):
    """Mixin: the user's server as a local process tree, as their own Unix account (see
    the module docstring). First in a kind's bases, before
    :class:`~pdl_spawner.core.spawner.SpawnerCore` and JupyterHub's
    ``LocalProcessSpawner``: ``class PDLLocalSpawner(HostServer, SpawnerCore,
    LocalProcessSpawner)``. Its settings are configured as ``c.HostServer.<name>`` for
    every kind that has it."""

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

    lab_accounts = Bool(
        False, config=True,
        help="""Run each hub user as the lab's existing Unix account of the same name (as
        the machine resolves it: /etc/passwd, or LDAP through sssd or nslcd), in its own
        home, instead of an account PDL makes (`account_prefix` + name). Only with a login
        that proves that account (PDL_AUTH=pam); never root's or a system account
        (`lab_uid_min`), and only members of `lab_group` where it is set.""",
    )

    lab_uid_min = Integer(
        0, config=True,
        help="With lab_accounts: the lowest uid a user's account may have; 0: the machine's UID_MIN.",
    )

    lab_group = Unicode(
        "", config=True,
        help="With lab_accounts: the Unix group whose members may run here; empty: any ordinary account.",
    )

    accounts_record = Unicode(
        "", config=True,
        help="""File where the hub records the Unix accounts it made (mode 0600; one
        `<name> <uid>` line each). PDL runs users only as accounts in it. Default: the
        kind's (`accounts` beside the local spawner's `reservations_db`, else in the hub's
        working directory). Every spawner of one hub must use the same file; two hubs on
        one machine must not.""",
    )

    @property
    def accounts_record_path(self) -> Path:
        """:attr:`accounts_record`, or the kind's default (:meth:`default_accounts_record`)."""
        return Path(self.accounts_record) if self.accounts_record else self.default_accounts_record()

    def default_accounts_record(self) -> Path:
        """Where the accounts are recorded when :attr:`accounts_record` is not set:
        ``accounts`` in the hub's working directory."""
        return Path("accounts")

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

    private_tmp_root = Unicode(
        private_tmp.DEFAULT_ROOT, config=True,
        help="""Folder (root's, mode 0700) where each server's own /tmp and /var/tmp are kept
        while it runs, when the hub runs as root: every server sees its own /tmp, /var/tmp
        and /dev/shm, never another user's (pdl_spawner.host.private_tmp).""",
    )

    memory_kept_for_hub = ByteSpecification(
        "1G", config=True,
        help="""Memory that the users' processes, all together, never take, when the hub runs
        as root: it stays for the hub, the proxy and the admin view (every user's account is
        in one memory cgroup limited to the machine's memory less this). Each user's own
        limit is JupyterHub's `mem_limit` (default: none of their own).""",
    )

    home_dir_template = Unicode(
        "~/.pdl/home/{username}",
        config=True,
        help="Home of each user's server when `system_users` is False; "
        "{username} is the hub user's name, ~ the hub user's home.",
    )

    slots = List(Unicode(), help="The engines' slots of this server (spawner state).")

    #: Ports given to this hub's servers, which may not listen yet: owner -> the server's
    #: port, the first of its :data:`PORTS_A_SERVER`.
    _ports: dict[str, int] = {}
    #: How this machine isolates GPU devices (:func:`device_cgroup.support`), once known.
    _isolation: device_cgroup.Support | None = None

    #: Whether this start has made the account (:meth:`ensure_account`), so it is made once.
    _account_ready = False

    @default("cmd")
    def _default_cmd(self):
        return [sys.executable, "-m", "pdl_server.singleuser"]

    @property
    def owner(self) -> str:
        """The server's key: the user name, plus ``/server`` for named servers."""
        return f"{self.user.name}/{self.name}" if self.name else self.user.name

    def forget_port(self) -> None:
        """The server's ports may be given to another server again."""
        HostServer._ports.pop(self.owner, None)

    @property
    def controller_ports(self) -> tuple[int, ...]:
        """The ports of the server's controller: the :data:`PORTS_A_SERVER` ports from
        :attr:`port` on, less :attr:`port` (() before a port is picked)."""
        return tuple(range(self.port + 1, self.port + PORTS_A_SERVER)) if self.port else ()

    # -- process ---------------------------------------------------------------------

    @property
    def account(self) -> str:
        """The Unix account this server runs as (with :attr:`system_users`): the user's own
        name with :attr:`lab_accounts`, else :attr:`account_prefix` + name."""
        try:
            return unix_accounts.account_name("" if self.lab_accounts else self.account_prefix, self.user.name)
        except ValueError as e:
            raise web.HTTPError(400, str(e), reason=str(e)) from None

    @property
    def cgroup(self) -> device_cgroup.DeviceCgroup | None:
        """This server's device cgroup, named by its account (unique to the machine);
        None without :attr:`system_users`, or where the machine has no device cgroup
        (the hub logs why once)."""
        if not self.system_users:
            return None
        if HostServer._isolation is None:  # looked up once per hub process, and logged
            HostServer._isolation = isolation = device_cgroup.support()
            (self.log.info if isolation else self.log.warning)("%s", isolation.reason)
        if not HostServer._isolation:
            return None
        return device_cgroup.DeviceCgroup(self.cgroup_owner, isolation=HostServer._isolation)

    @property
    def private_tmp(self) -> private_tmp.PrivateTmp | None:
        """This server's own temporary places (:mod:`~pdl_spawner.host.private_tmp`); None
        without :attr:`system_users`."""
        if not self.system_users:
            return None
        return private_tmp.PrivateTmp(self.cgroup_owner, self.private_tmp_root)

    #: private_ipc.support()'s answer, looked up (and logged) once per hub process
    _ipc_support: private_ipc.Support | None = None

    @property
    def abstract_sockets_scoped(self) -> bool:
        """Whether this kernel keeps each server's abstract Unix sockets to itself
        (:func:`~pdl_spawner.host.private_ipc.support`; the first call of a hub process logs
        what servers get)."""
        if HostServer._ipc_support is None:
            HostServer._ipc_support = found = private_ipc.support()
            (self.log.info if found else self.log.warning)("%s", found.reason)
        return HostServer._ipc_support.scoped

    #: cgroup_v2.support()'s answer, looked up (and the users' memory limited) once per hub process
    _tree_support: tuple[Path | None, str] | None = None

    @property
    def tree(self) -> cgroup_v2.ServerTree | None:
        """This server's cgroup v2 folder and leaves, which bound its processes, memory and
        CPU where the machine has those controllers on cgroup v2 only
        (:mod:`~pdl_spawner.host.cgroup_v2`; then :attr:`account_limits` and
        :attr:`cpu_limits` are None); None without :attr:`system_users`, or where the v1
        controllers are used. The first call of a hub process logs which, and limits the
        memory of all users together."""
        if not self.system_users:
            return None
        if HostServer._tree_support is None:
            HostServer._tree_support = found = cgroup_v2.support()
            if found[0] is not None:
                every_user = cgroup_v2.limit_all_users(found[0], self.memory_kept_for_hub)
                self.log.info("Limits: cgroup v2 at %s; the users' processes take at most %.1f GiB together",
                              found[0], every_user / 2**30)
                self.log.info("%s", account_limits.hub_protection())
        root = HostServer._tree_support[0]
        return cgroup_v2.ServerTree(self.cgroup_owner, root) if root is not None else None

    @property
    def cgroup_owner(self) -> str:
        """The name of this server's cgroups of the device, bind and v2 limits: its
        account, with the server's name if it has one (unique to the machine)."""
        return f"{self.account}/{self.name}" if self.name else self.account

    #: account_limits.support()'s answer, looked up (and the users' memory limited) once per hub process
    _limits_support: account_limits.Support | None = None

    @property
    def account_limits(self) -> account_limits.AccountLimits | None:
        """The cgroups that bound this server's account (:mod:`~pdl_spawner.host.account_limits`);
        None without :attr:`system_users`. The first call of a hub process logs what this
        machine cannot limit, and limits the memory of all users together."""
        if not self.system_users or self.tree is not None:
            return None
        if HostServer._limits_support is None:
            HostServer._limits_support = found = account_limits.support()
            for problem in found.missing:
                self.log.warning("%s", problem)
            every_user = account_limits.limit_all_users(found.mounts, self.memory_kept_for_hub)
            if every_user is not None:
                self.log.info("Memory: the users' processes take at most %.1f GiB together", every_user / 2**30)
            self.log.info("%s", account_limits.hub_protection())
        return account_limits.AccountLimits(self.account, HostServer._limits_support.mounts)

    def machine_limits_note(self) -> str:
        """One line for the spawn form and the panel: what this machine enforces on the
        user's processes (JupyterHub's ``cpu_limit`` and ``mem_limit``, the process
        limit), "" where it enforces none of them."""
        limits, tree = self.account_limits, self.tree
        mounts = HostServer._limits_support.mounts if limits is not None else (
            dict.fromkeys(("memory", "pids")) if tree is not None else {})
        cores = f"{self.cpu_limit:g} cores for your server and kernels" if (
            self.cpu_limit and (self.cpu_limits is not None or tree is not None)) else ""
        whole = [f"{self.mem_limit / 2**30:.3g} GiB of memory" if self.mem_limit and "memory" in mounts else "",
                 f"{self.process_limit:,} processes" if self.process_limit and "pids" in mounts else ""]
        whole = " and ".join(filter(None, whole))
        said = ", ".join(filter(None, [cores, f"{whole} in all" if whole else ""]))
        return f"This machine's limits on you: {said}." if said else ""

    #: cpu_limits.support()'s answer, looked up (and logged where short) once per hub process
    _cpu_support: cpu_limits.Support | None = None

    @property
    def cpu_limits(self) -> cpu_limits.CpuLimits | None:
        """The cgroups that bound this server's CPU and keep its engines on their slots'
        cores (:mod:`~pdl_spawner.host.cpu_limits`); None without :attr:`system_users`, or
        where this machine lacks the controllers (the first call of a hub process logs why)."""
        if not self.system_users or self.tree is not None:
            return None
        if HostServer._cpu_support is None:
            HostServer._cpu_support = found = cpu_limits.support()
            for problem in found.missing:
                self.log.warning("%s", problem)
        if not HostServer._cpu_support:
            return None
        return cpu_limits.CpuLimits(HostServer._cpu_support, hub=self.account_prefix)

    @property
    def port_cgroup(self) -> port_filter.PortCgroup | None:
        """This server's bind filter's cgroup (:mod:`~pdl_spawner.host.port_filter`); None
        without :attr:`system_users`, or where the machine cannot filter binds (the hub
        logs why once)."""
        if not self.system_users:
            return None
        if HostServer._port_isolation is None:
            HostServer._port_isolation = problem = port_filter.support() or ""
            if problem:
                self.log.warning("%s: a user's processes can bind the ports of port_range", problem)
            else:
                self.log.info("Port isolation: each server binds only its own port of port_range %s-%s",
                              *self.port_range)
        if HostServer._port_isolation:
            return None
        return port_filter.PortCgroup(self.cgroup_owner)

    #: port_filter.support()'s answer, looked up once per hub process ("" when it works)
    _port_isolation: str | None = None

    def restrict_ports(self) -> None:
        """Let this server's processes bind, of :attr:`port_range`, only its own ports
        (:attr:`port` and :attr:`controller_ports`). Blocks."""
        cgroup = self.port_cgroup
        if cgroup is not None:
            cgroup.restrict(*self.port_range, self.port, self.port + PORTS_A_SERVER - 1)

    def _check_runnable(self) -> None:
        """HTTP 500, one line, when the users' accounts cannot run PDL's Python: it is
        under a place each server has its own of (/tmp: theirs hides the machine's), or
        closed to other users."""
        hidden = private_tmp.hiding_place(self.cmd[0]) if self.private_tmp is not None else None
        if hidden:
            message = (f"the users' servers cannot run {self.cmd[0]}: each server has its own {hidden}, which "
                       f"hides the machine's; install PDL elsewhere (e.g. /opt/pdl)")
            raise web.HTTPError(500, message, reason=message)
        blocked = unix_accounts.unreachable_by_others(self.cmd[0])
        if blocked is not None:
            message = (f"the users' accounts cannot run {self.cmd[0]}: {blocked} is closed to other users; "
                       f"install PDL where every user can read it (e.g. chmod o+rx {blocked})")
            raise web.HTTPError(500, message, reason=message)

    def prepare_account(self) -> None:
        """Make this user's account (once; with :attr:`lab_accounts`, check the lab's
        own) and their device cgroup, with no process left
        in it from a server the hub lost track of (a crash mid-spawn). Blocks: the
        spawner runs it in a worker thread, between the reservation and the launch."""
        self._check_runnable()
        if self.lab_accounts:  # the lab's own account, as it is: a refusal is the user's (403)
            try:
                entry = unix_accounts.lab_account(self.account, lowest_uid=self.lab_uid_min, group=self.lab_group)
            except unix_accounts.ForeignAccount as e:
                raise web.HTTPError(403, str(e), reason=str(e)) from None
        else:
            try:
                entry = unix_accounts.ensure_account(self.account, self.homes_root, self.accounts_record_path,
                                                     self._skeleton(), comment=f"PDL hub user {self.user.name}")
            except unix_accounts.ForeignAccount as e:
                raise web.HTTPError(500, str(e), reason=str(e)) from None
        unix_accounts.ensure_runtime_dir(entry, self.runtime_dir_root)
        cgroup, tree = self.cgroup, self.tree
        if cgroup is not None:
            cgroup.create()
        if cgroup is not None or tree is not None:
            leftover = (tree or cgroup).kill_all(KILL_WAIT_S)
            if leftover:
                raise RuntimeError(f"processes {leftover} of {self.owner} do not die")
        if tree is not None:
            tree.make(processes=self.process_limit, memory_bytes=self.mem_limit or 0, cpu_limit=self.cpu_limit)
        self.private_tmp.prepare()
        limits = self.account_limits
        if limits is not None:
            limits.apply(processes=self.process_limit, memory_bytes=self.mem_limit or 0)
        cpu = self.cpu_limits
        if cpu is not None:
            cpu.limit_server(self.owner, self.cpu_limit)

    def end_processes(self) -> None:
        """Kill whatever is left of this server (a process that left its tree) and
        remove its cgroup. Blocks up to :data:`KILL_WAIT_S`."""
        cgroup, tree = self.cgroup, self.tree
        if cgroup is None and tree is None:
            return
        left = (tree or cgroup).kill_all(KILL_WAIT_S)
        if left:
            self.log.error("processes %s of %s survived SIGKILL", left, self.owner)
        else:
            if tree is not None:
                tree.remove()  # its leaves, then the folder the device and bind filters have too
            if cgroup is not None:
                cgroup.remove()
            self.private_tmp.remove()
            limits = self.account_limits
            if limits is not None:
                limits.remove()  # kept while another server of the account runs
            cpu = self.cpu_limits
            if cpu is not None:
                cpu.remove_server(self.owner)
            ports = self.port_cgroup
            if ports is not None:
                try:
                    ports.remove()
                except OSError as e:  # the next start of this server uses it again, with its own filter
                    self.log.warning("could not remove the port cgroup of %s: %s", self.owner, e)

    def place_servers(self) -> None:
        """Keep every server off the cores of other users' slots
        (:meth:`~pdl_spawner.host.cpu_limits.CpuLimits.place_servers`; nothing without
        CPU limits)."""
        cpu, tree = self.cpu_limits, self.tree
        if cpu is not None:
            cpu.place_servers()
        elif tree is not None:
            cgroup_v2.place_servers(tree.root)

    def _skeleton(self) -> str | None:
        return self.skeleton_dir or None

    def make_preexec_fn(self, name):
        if self.system_users:
            tree = self.tree
            if tree is not None:  # one cgroup on cgroup v2: the server's main leaf, below its filters'
                joined = [tree.procs_file]
            else:
                joined = [c.procs_file for c in (self.cgroup, self.port_cgroup) if c is not None]
                joined += self.account_limits.procs_files
                cpu = self.cpu_limits
                joined += cpu.server_procs_files(self.owner) if cpu is not None else []
            own_tmp = self.private_tmp
            scoped = self.abstract_sockets_scoped
            hubs_namespace = account_limits.mount_namespace()
            become_user = set_user_setuid(self.account)

            def preexec():
                for procs in joined:  # as root, before giving root up (one folder on cgroup v2 hosts)
                    device_cgroup.join(procs)
                own_tmp.enter()
                account_limits.mark_user_process()  # the OOM killer picks it before the hub
                account_limits.hold_oom_score(hubs_namespace)  # and never lower: its /proc is read-only
                private_ipc.enter(scoped)  # its own System V IPC and abstract Unix sockets
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
        """The server's port: the first of :data:`PORTS_A_SERVER` ports of :attr:`port_range`
        in a row (one of the range's blocks of that size, from its low end) that no other
        server of this hub was given and that all bind now. HTTP 503, naming who holds
        the range, when there is none."""
        low, high = self.port_range
        given = {port + i for owner, port in HostServer._ports.items() if owner != self.owner
                 for i in range(PORTS_A_SERVER)}
        starts = [start for start in range(low, high - PORTS_A_SERVER + 2, PORTS_A_SERVER)
                  if given.isdisjoint(range(start, start + PORTS_A_SERVER))]
        for start in random.sample(starts, min(len(starts), 200)):
            if all(_can_bind(self.ip or "127.0.0.1", port) for port in range(start, start + PORTS_A_SERVER)):
                HostServer._ports[self.owner] = start
                return start
        message = (f"no free ports for the server in port_range {low}-{high} (each server takes "
                   f"{PORTS_A_SERVER} in a row, its own and its controller's): {self._port_holders(given)}")
        raise web.HTTPError(503, message, reason=message)

    def _port_holders(self, given: set[int]) -> str:
        """Who holds the ports of :attr:`port_range`, in a few words: the servers of this
        hub (``given``: their ports), the accounts listening on the rest, and how many
        other sockets are bound there."""
        low, high = self.port_range
        counts: dict[str, int] = {}
        servers = sorted({owner for owner, port in HostServer._ports.items() if port in given})
        if servers:
            counts[f"the servers of {', '.join(servers[:5])}{' and more' if len(servers) > 5 else ''}"] = len(given)
        holders = port_filter.port_holders(low, high)
        for port, account in holders.items():
            if port not in given:
                counts[account] = counts.get(account, 0) + 1
        bound = sum(1 for port in range(low, high + 1)
                    if port not in given and port not in holders and not _can_bind(self.ip or "127.0.0.1", port))
        if bound:
            counts["other sockets (bound, not listening)"] = bound
        return "; ".join(f"{who} {'hold' if who.startswith(('the servers', 'other')) else 'holds'} {n}"
                         for who, n in sorted(counts.items(), key=lambda item: -item[1]))

    @property
    def cluster_dir(self) -> Path:
        """Where the user's server keeps its cluster (and the engine lease files); the
        hub never reads or writes there."""
        return Path(cluster_dir_in(self.home_dir))

    def server_contract(self) -> ServerContract:
        """What the user's server is told (:mod:`pdl.contract`): its slots and workers, its
        cluster folder, the idle timeout, the user's limits; a kind adds its own fields to it."""
        return ServerContract(slots=tuple(self.slots), workers=len(self.slots), cluster_dir=str(self.cluster_dir),
                              controller_ports=self.controller_ports, **self.told_contract())

    def get_env(self):
        env = super().get_env()
        env.update(self.server_contract().env())
        return env

    # -- where the hub reaches the server ------------------------------------------------

    @property
    def server_address(self) -> str:
        """Where the hub reaches this server: its ``ip`` (default 127.0.0.1)."""
        return self.ip or "127.0.0.1"

    def move_certs(self, paths):
        return paths if not self.system_users else super().move_certs(paths)

    async def start(self):
        if os.geteuid() == 0 and not self.system_users:
            message = f"{type(self).__name__}.system_users is off while the hub runs as root: no user's server runs as root"
            raise web.HTTPError(500, message, reason=message)
        self._account_ready = False
        try:
            self.slots = await self.claim_workers()
        except BaseException:  # refused or cancelled: no cgroup left behind
            if self._account_ready:
                await asyncio.shield(asyncio.to_thread(self.end_processes))
            raise
        self.log.info("Reserved %s for %s", ",".join(self.slots), self.owner)
        try:
            await self.ensure_account()
            self.port = self.pick_port()
            if self.system_users:
                await asyncio.to_thread(self.restrict_ports)
            url = await self.launch_server()
            if self.system_users:
                await asyncio.to_thread(self.place_servers)
            self.watch_lease()
            # return once it listens: the hub's own backoff would see it seconds later
            await listening.wait_until_listening(*url, timeout_s=self.http_timeout, ended=self.server_ended)
            return url
        except BaseException:
            await asyncio.shield(self.workers.release())
            self.slots = []
            raise

    async def ensure_account(self) -> None:
        """:meth:`prepare_account` (with :attr:`system_users`), once per start, off the
        event loop: after the claim, or during it where the kind claims as the user."""
        if self.system_users and not self._account_ready:
            await asyncio.to_thread(self.prepare_account)
            self._account_ready = True

    def server_ended(self) -> bool:
        """Whether the process :meth:`launch_server` started has exited."""
        return self.proc is None or self.proc.poll() is not None

    async def launch_server(self):
        """Start the server's process (JupyterHub's LocalProcessSpawner.start, with this
        spawner's environment, account and port): its ``(ip, port)``. A kind that runs
        the server elsewhere wraps it."""
        return await super().start()

    async def poll(self):
        status = await super().poll()
        if status is None:
            self.watch_lease()  # also after a hub restart
        return status

    async def stop(self, now=False):
        self.unwatch_lease()
        if self.slots:  # its workers count up to now (a refused spawn holds none)
            await metrics.count_until_now()
        try:
            await super().stop(now=now)
            await asyncio.to_thread(self.end_processes)
        finally:
            await self.workers.release()

    # -- state -----------------------------------------------------------------------

    def get_state(self):
        state = super().get_state()
        if self.slots:
            state["slots"] = list(self.slots)
        return state

    def load_state(self, state):
        super().load_state(state)
        self.slots = list(state.get("slots", []))

    def clear_state(self):
        """Forget the server, and free whatever the cluster holds for it (by owner, on the
        database thread: done before any later call)."""
        super().clear_state()
        self.forget_port()
        submit(self.workers.release_blocking)
        self.slots = []


def _can_bind(ip: str, port: int) -> bool:
    """True if nothing holds ``ip:port`` (TCP) right now."""
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as sock:
        try:
            sock.bind((ip, port))
        except OSError:
            return False
    return True
