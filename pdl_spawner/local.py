"""The embedded-default spawner: the user's server and engines as local processes.

Contract, on top of JupyterHub's :class:`~jupyterhub.spawner.LocalProcessSpawner`:

- ``start()`` first checks ``user_options``: ``workers`` is the only key a user may
  set; any other (``image``, ``volumes``, ``env``, ...) fails with HTTP 400 naming
  the valid option. It then reserves ``workers`` slots from
  :attr:`PDLLocalSpawner.pool` in the :class:`~pdl_spawner.reservations.SlotLedger`
  before anything is launched. If they are not free it fails at once (no process
  started, nothing reserved) with a one-line message saying what is free. It then
  runs ``pdl-singleuser`` with ``PDL_SLOTS``, which starts the server (on a port from
  :attr:`PDLLocalSpawner.port_range`) and one pinned engine per slot.
- A spawn with ``user_options["queue"]`` (the form's "wait in the queue") that finds
  the slots busy waits instead, first come first served (:mod:`~pdl_spawner.wait_queue`),
  showing its position on the spawn page; cancelling the spawn leaves the queue. A
  direct spawn is refused while anyone waits.
- ``stop()`` stops that process tree and releases the slots; so does a ``poll()``
  that finds the server gone (``clear_state``).
- The reservation is in the spawner state and in the ledger file, so it survives
  hub restarts (with ``JupyterHub.cleanup_servers = False`` the servers do too).
"""

from __future__ import annotations

import os
import pwd
import random
import socket
import sys
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner
from tornado import web
from traitlets import Bool, Integer, List, Tuple, Unicode, default, validate

from pdl.slots import DEFAULT_CPU_SLOTS, default_pool, parse_slot
from pdl import engine_lease

from . import form
from .idle_engines import IdleEngines
from .queueing import NotFreeYet, QueueingSpawner
from .reservations import NotEnoughSlots, SlotLedger

class PDLLocalSpawner(QueueingSpawner, IdleEngines, LocalProcessSpawner):
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
        return proposal.value

    cpu_slots = Integer(
        DEFAULT_CPU_SLOTS,
        config=True,
        help="Number of CPU slots in the default pool of a machine without GPUs. "
        "The machine's cores are split evenly between them.",
    )

    default_workers = Integer(1, config=True, help="Workers pre-filled in the spawn form.")

    max_workers = Integer(
        0, config=True, help="Most workers one user may reserve; 0 means the whole pool."
    )

    reservations_db = Unicode(
        "pdl-reservations.sqlite",
        config=True,
        help="SQLite file of slot reservations (relative to the hub's working directory). "
        "Every spawner of one hub must use the same file.",
    )

    system_users = Bool(
        False,
        config=True,
        help="""Run each server as the Unix user named like the hub user (needs root and
        existing users). False runs every server as the hub's own Unix user, each
        with its own home from `home_dir_template`: right for one person's
        machine, no isolation between users.""",
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
        chose it could be taken by another user's cluster before the server binds it.""",
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

    @default("cmd")
    def _default_cmd(self):
        return [sys.executable, "-m", "pdl_magics.singleuser"]

    @default("options_form")
    def _default_options_form(self):
        return self._render_options_form

    # -- reservations ----------------------------------------------------------

    @property
    def ledger(self) -> SlotLedger:
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

    async def describe_free(self) -> tuple[int, int, dict[str, int]]:
        free, holders = self._free_and_holders()
        return free, len(self.pool), holders

    @property
    def workers_limit(self) -> int:
        return min(self.max_workers or len(self.pool), len(self.pool))

    def _free_and_holders(self) -> tuple[int, dict[str, int]]:
        holders: dict[str, int] = {}
        for h in self.ledger.holdings():
            if h.slot in self.pool and h.owner != self.owner:
                user = h.owner.split("/", 1)[0]
                holders[user] = holders.get(user, 0) + 1
        return len(self.pool) - sum(holders.values()), holders

    def _render_options_form(self, spawner) -> str:
        free, holders = self._free_and_holders()
        return form.render_form(
            waiting=self.waiting(),
            kind=parse_slot(self.pool[0])[0] if self.pool else "cpu",
            pool_size=len(self.pool),
            free=free,
            holders=holders,
            default=self.default_workers,
            maximum=self.workers_limit,
            show_names=bool(self.user.admin),
        )

    def options_from_form(self, formdata):
        try:
            options = {"workers": form.parse_workers(formdata, maximum=self.workers_limit)}
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None
        if form.wants_queue(formdata):
            options["queue"] = True
        return options

    def _requested_workers(self) -> int:
        """``workers`` from the user options, or HTTPError(400) naming the valid option."""
        try:
            return form.requested_workers(self.user_options, default=self.default_workers,
                                          maximum=self.workers_limit)
        except ValueError as e:
            raise web.HTTPError(400, str(e), reason=str(e)) from None

    def reserve(self, n: int | None = None, *, spawning: bool = True) -> list[str]:
        """Reserve ``n`` slots (default: what the spawn asked for), or raise HTTPError(409)
        saying what is free.

        Refused too while others wait in the queue: they come first. ``spawning``: for
        a spawn (else for engines a cell asks back), which the refusal's advice fits.
        """
        n = self._requested_workers() if n is None else n
        self.refuse_while_others_wait(spawning=spawning)
        try:
            return self.ledger.reserve(self.owner, n, self.pool)
        except NotEnoughSlots as e:
            message = form.not_enough_message(
                e.wanted, e.free, len(self.pool), e.holders, show_names=bool(self.user.admin)
            )
            raise web.HTTPError(409, message, reason=message) from None

    async def wait_and_reserve(self) -> list[str]:
        """Wait in the queue (:meth:`QueueingSpawner.wait_in_queue`) for the slots, then reserve them."""
        n = self._requested_workers()

        async def take() -> list[str]:
            try:
                return self.ledger.reserve(self.owner, n, self.pool)
            except NotEnoughSlots:
                raise NotFreeYet() from None

        return await self.wait_in_queue(n, take)

    def release(self) -> None:
        PDLLocalSpawner._ports.pop(self.owner, None)
        released = self.ledger.release(self.owner)
        if released:
            self.log.info("Released %s for %s", ",".join(released), self.owner)

    # -- process -------------------------------------------------------------

    def make_preexec_fn(self, name):
        if self.system_users:
            return super().make_preexec_fn(name)
        home = self.home_dir

        def preexec():
            os.makedirs(home, 0o700, exist_ok=True)
            os.chdir(home)

        return preexec

    @property
    def home_dir(self) -> str:
        return os.path.expanduser(self.home_dir_template.format(username=self.user.name))

    def user_env(self, env):
        if self.system_users:
            return super().user_env(env)
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
        raise web.HTTPError(503, f"no free port for the server in port_range {low}-{high}")

    @property
    def cluster_dir(self) -> Path:
        """Where the user's server keeps its cluster (and the engine lease files)."""
        home = pwd.getpwnam(self.user.name).pw_dir if self.system_users else self.home_dir
        return Path(home) / ".pdl" / "cluster"

    def get_env(self):
        env = super().get_env()
        env["PDL_SLOTS"] = ",".join(self.slots)
        env["PDL_CLUSTER_DIR"] = str(self.cluster_dir)
        if self.engine_idle_timeout:
            env["PDL_ENGINE_IDLE_TIMEOUT"] = str(self.engine_idle_timeout)
        return env

    # -- idle engines ----------------------------------------------------------

    async def tend_lease(self) -> None:
        """One look at the lease files: reclaim released slots, grant or refuse a request."""
        directory = self.cluster_dir
        released = engine_lease.read(directory, engine_lease.RELEASED)
        if released is None:
            return
        if self.ledger.held_by(self.owner):
            slots = self.ledger.reclaim(self.owner, released.get("reason", "engines idle"))
            self.log.info("Reclaimed %s from %s: %s", ",".join(slots), self.owner, released.get("reason"))
        want = engine_lease.read(directory, engine_lease.WANT)
        if want is None or engine_lease.read(directory, engine_lease.GRANT) is not None:
            return
        try:
            self.slots = self.reserve(int(want["workers"]), spawning=False)
            answer = {"slots": self.slots}
            self.log.info("Granted %s to %s again", ",".join(self.slots), self.owner)
        except web.HTTPError as e:
            answer = {"refused": e.reason or str(e)}
        owner = None
        if self.system_users:
            entry = pwd.getpwnam(self.user.name)
            owner = (entry.pw_uid, entry.pw_gid)
        engine_lease.write(directory, engine_lease.GRANT, answer, owner=owner)

    def get_args(self):
        args = super().get_args()
        if not self.system_users and os.geteuid() == 0:
            args.append("--allow-root")  # servers run as the hub's user, here root
        return args

    def move_certs(self, paths):
        return paths if not self.system_users else super().move_certs(paths)

    async def start(self):
        self.slots = await self.wait_and_reserve() if self.wants_queue else self.reserve()
        self.log.info("Reserved %s for %s", ",".join(self.slots), self.owner)
        try:
            self.port = self.pick_port()
            url = await super().start()
            self.watch_lease()
            return url
        except BaseException:
            self.release()
            self.slots = []
            raise

    async def poll(self):
        status = await super().poll()
        if status is None:
            self.watch_lease()  # also after a hub restart
        return status

    async def stop(self, now=False):
        self.unwatch_lease()
        try:
            await super().stop(now=now)
        finally:
            self.release()

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
        super().clear_state()
        if self.slots:
            self.release()
        self.slots = []


def _can_bind(ip: str, port: int) -> bool:
    """True if nothing holds ``ip:port`` (TCP) right now."""
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as sock:
        try:
            sock.bind((ip, port))
        except OSError:
            return False
    return True
