"""The server contract: everything a spawner tells a user's server, and the server
its kernels, as environment variables. One builder (:meth:`ServerContract.env`) and
one parser (:meth:`ServerContract.from_env`); every spawner writes it, and the server
supervisor (:mod:`pdl_server.singleuser`), the kernels (:mod:`pdl_server.clusters`)
and the engines read it, through here only.

=========================== ====================== =====================================
variable                    field                  meaning
=========================== ====================== =====================================
``PDL_KIND``                ``kind``               the cluster kind that started the
                                                   server (its plug-in, registered under
                                                   :data:`KINDS_GROUP`, names the
                                                   server's engine host)
``PDL_SLOTS``               ``slots``              the slots reserved on this machine
                                                   (``gpu:0,gpu:1`` or ``cpu:0``; local
                                                   spawner), one engine each
``PDL_WORKERS``             ``workers``            how many workers the hub reserved
                                                   for this server, one engine each
``PDL_CLUSTER_DIR``         ``cluster_dir``        the folder of the server's cluster
                                                   and engine lease (default
                                                   ``~/.pdl/cluster``)
``PDL_CONTROLLER_SECRET``   ``controller_secret``  the notebook secret's file (Swarm:
                                                   controller only, engines elsewhere)
``PDL_ENGINE_IDLE_TIMEOUT`` ``idle_timeout_s``     seconds without a task before the
                                                   engines give their GPUs back (0: never)
``PDL_CLUSTER_FILE``        ``cluster_file``       set by the server for its kernels:
                                                   the ipyparallel cluster file
``PDL_JOB``                 ``job``                the scheduler's job holding the
                                                   workers (Slurm: the engines are its
                                                   steps, ``srun``)
``PDL_CONTROLLER_IP``       ``controller_ip``      where the controller listens for
                                                   engines on other nodes (Slurm)
``PDL_CONTROLLER_PORTS``    ``controller_ports``   the ports (``,``-separated) the
                                                   controller binds, given by the hub
                                                   with the server's own (local
                                                   spawner, Slurm); none: ipyparallel
                                                   picks them
``PDL_WORKERS_LIMIT``       ``workers_limit``      the most workers this user may hold
                                                   (the admin's limit within the
                                                   scheduler's; 0: not told)
``PDL_LIMITS_NOTE``         ``limits_note``        the scheduler's own limits on the
                                                   user, one line (Slurm: the QOS)
``PDL_SESSION_WARN_S``      ``session_warn_s``     seconds before the session's end that
                                                   the user is warned (0: the default)
``PDL_SESSION_LIMIT_S``     ``session_limit_s``    the hub's session limit in seconds
                                                   (embedded, Swarm; 0: none)
``PDL_SESSION_ENDS_AT``     ``session_ends_at``    when the spawn's session ends (epoch
                                                   seconds; 0: no limit)
``PDL_SESSION_EXTENDABLE``  ``session_extendable`` ``1`` where the user may ask the hub
                                                   for more time (the panel's Extend)
``PDL_GPU_TYPE``            ``gpu_type``           the type of the GPUs reserved ("":
                                                   any)
``PDL_NVIDIA_SMI``          ``nvidia_smi``         the nvidia-smi the hub reads the
                                                   machine's GPUs with (local spawner)
``PDL_POOL``                ``pool``               the hub's whole pool on this machine,
                                                   which the cores are split over (local
                                                   spawner)
``PDL_SLOT_CGROUPS``        ``slot_cgroups``       folders (``:``-separated) holding a
                                                   cgroup per slot, which each engine
                                                   joins (local spawner, as root)
``PDL_ENTRY_KEY``           ``entry_key``          the hub's public key for entry
                                                   tickets (:mod:`pdl.entry_ticket`):
                                                   who may begin a login at the server
``PDL_RELAY_MARK``          ``relay_mark``         the hub's mark of a request relayed
                                                   to it (:mod:`pdl.hub_relay`)
=========================== ====================== =====================================

The hub writes these into the server's environment; nothing a user writes reaches
the hub through them (the hub reads none of them back).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pdl.slots import parse_slot_list

#: The entry-point group of the cluster kinds' plug-ins (:mod:`pdl_spawner.kinds`): the hub
#: and the user's server find a kind there by its name.
KINDS_GROUP = "pdl.kinds"

#: The cluster folder, relative to the user's home, when ``PDL_CLUSTER_DIR`` is not set.
CLUSTER_DIR_IN_HOME = ".pdl/cluster"

#: Field name -> environment variable, in the table's order.
VARIABLES = {
    "kind": "PDL_KIND",
    "slots": "PDL_SLOTS",
    "workers": "PDL_WORKERS",
    "cluster_dir": "PDL_CLUSTER_DIR",
    "controller_secret": "PDL_CONTROLLER_SECRET",
    "idle_timeout_s": "PDL_ENGINE_IDLE_TIMEOUT",
    "cluster_file": "PDL_CLUSTER_FILE",
    "job": "PDL_JOB",
    "controller_ip": "PDL_CONTROLLER_IP",
    "controller_ports": "PDL_CONTROLLER_PORTS",
    "workers_limit": "PDL_WORKERS_LIMIT",
    "limits_note": "PDL_LIMITS_NOTE",
    "session_warn_s": "PDL_SESSION_WARN_S",
    "session_limit_s": "PDL_SESSION_LIMIT_S",
    "session_ends_at": "PDL_SESSION_ENDS_AT",
    "session_extendable": "PDL_SESSION_EXTENDABLE",
    "gpu_type": "PDL_GPU_TYPE",
    "nvidia_smi": "PDL_NVIDIA_SMI",
    "pool": "PDL_POOL",
    "slot_cgroups": "PDL_SLOT_CGROUPS",
    "entry_key": "PDL_ENTRY_KEY",
    "relay_mark": "PDL_RELAY_MARK",
}


def cluster_dir_in(home: str | os.PathLike) -> str:
    """The cluster folder of a user whose home is ``home``."""
    return str(Path(home) / CLUSTER_DIR_IN_HOME)


@dataclass(frozen=True)
class ServerContract:
    """What a user's server is told. Empty values are left out of :meth:`env`."""

    #: the cluster kind that started the server ("local", "swarm", ...); "": not told
    kind: str = ""
    #: local slots reserved for this server (one engine each)
    slots: tuple[str, ...] = field(default=())
    #: workers the hub reserved for this server (one engine each, wherever they run); 0: unknown
    workers: int = 0
    #: the server's cluster folder ("" : ``~/.pdl/cluster``)
    cluster_dir: str = ""
    #: the file of the notebook secret (Docker Swarm); "": engines run here
    controller_secret: str = ""
    #: seconds without a task before idle engines give their GPUs back; 0: never
    idle_timeout_s: float = 0.0
    #: the ipyparallel cluster file (set by the server for its kernels)
    cluster_file: str = ""
    #: the Slurm job whose steps the engines are (Slurm); 0: none
    job: int = 0
    #: the address the controller listens on for engines on other nodes ("" : 127.0.0.1)
    controller_ip: str = ""
    #: the ports the controller binds, from the hub's port range (:data:`pdl.connection.CONTROLLER_PORTS`
    #: of them, only this server's processes may bind them); (): ipyparallel picks free ones
    controller_ports: tuple[int, ...] = field(default=())
    #: the most workers this user may hold (the admin's limit within the scheduler's); 0: not told
    workers_limit: int = 0
    #: the scheduler's own limits on the user, one line ("" : none told)
    limits_note: str = ""
    #: seconds before the session's end that the user is warned; 0: the server's default
    session_warn_s: float = 0.0
    #: the hub's longest session, seconds (embedded default, Swarm); 0: none
    session_limit_s: float = 0.0
    #: when the spawn's session ends, epoch seconds (a grant again tells its own); 0: no limit
    session_ends_at: float = 0.0
    #: True where the user may ask the hub for more time (the panel's Extend)
    session_extendable: bool = False
    #: the type of the GPUs reserved (Slurm's GRES type, nvidia-smi's name on one machine); "": any
    gpu_type: str = ""
    #: the nvidia-smi the hub reads this machine's GPUs with (embedded default); "": the one on PATH
    nvidia_smi: str = ""
    #: the hub's whole pool on this machine, every user's slots, which the machine's cores
    #: are split over (:func:`pdl.slots.cpus_for_slot`; embedded default); (): not told
    pool: tuple[str, ...] = field(default=())
    #: folders holding a cgroup per slot (:mod:`pdl_spawner.host.cpu_limits`), which each
    #: engine joins (:func:`pdl.slots.engine_env`); (): none
    slot_cgroups: tuple[str, ...] = field(default=())
    #: the hub's public key for entry tickets (:mod:`pdl.entry_ticket`); "": not told
    entry_key: str = ""
    #: the hub's mark of a request relayed to it (:mod:`pdl.hub_relay`); "": not told
    relay_mark: str = ""

    def env(self) -> dict[str, str]:
        """The environment variables that carry this contract (empty fields left out)."""
        values = {
            "kind": self.kind,
            "slots": ",".join(self.slots),
            "workers": str(self.workers) if self.workers else "",
            "cluster_dir": self.cluster_dir,
            "controller_secret": self.controller_secret,
            "idle_timeout_s": f"{self.idle_timeout_s:g}" if self.idle_timeout_s else "",
            "cluster_file": self.cluster_file,
            "job": str(self.job) if self.job else "",
            "controller_ip": self.controller_ip,
            "controller_ports": ",".join(map(str, self.controller_ports)),
            "workers_limit": str(self.workers_limit) if self.workers_limit else "",
            "limits_note": self.limits_note,
            "session_warn_s": f"{self.session_warn_s:g}" if self.session_warn_s else "",
            "session_limit_s": f"{self.session_limit_s:g}" if self.session_limit_s else "",
            "session_ends_at": f"{self.session_ends_at:.3f}" if self.session_ends_at else "",
            "session_extendable": "1" if self.session_extendable else "",
            "gpu_type": self.gpu_type,
            "nvidia_smi": self.nvidia_smi,
            "pool": ",".join(self.pool),
            "slot_cgroups": os.pathsep.join(self.slot_cgroups),
            "entry_key": self.entry_key,
            "relay_mark": self.relay_mark,
        }
        return {VARIABLES[name]: value for name, value in values.items() if value}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ServerContract:
        """The contract in ``env`` (default: this process's environment).

        ValueError, naming the variable and what is valid, for a malformed value.
        """
        env = os.environ if env is None else env

        def number(name: str, kind):
            text = env.get(VARIABLES[name]) or "0"
            try:
                value = kind(text)
            except ValueError:
                value = -1
            if not 0 <= value < float("inf"):
                raise ValueError(f"{VARIABLES[name]}={text!r} is not valid: expected a number >= 0")
            return value

        return cls(
            kind=env.get(VARIABLES["kind"], ""),
            slots=tuple(parse_slot_list(env.get(VARIABLES["slots"], ""))),
            workers=number("workers", int),
            cluster_dir=env.get(VARIABLES["cluster_dir"], ""),
            controller_secret=env.get(VARIABLES["controller_secret"], ""),
            idle_timeout_s=number("idle_timeout_s", float),
            cluster_file=env.get(VARIABLES["cluster_file"], ""),
            job=number("job", int),
            controller_ip=env.get(VARIABLES["controller_ip"], ""),
            controller_ports=_ports(env.get(VARIABLES["controller_ports"], "")),
            workers_limit=number("workers_limit", int),
            limits_note=env.get(VARIABLES["limits_note"], ""),
            session_warn_s=number("session_warn_s", float),
            session_limit_s=number("session_limit_s", float),
            session_ends_at=number("session_ends_at", float),
            session_extendable=number("session_extendable", int) > 0,
            gpu_type=env.get(VARIABLES["gpu_type"], ""),
            nvidia_smi=env.get(VARIABLES["nvidia_smi"], ""),
            pool=tuple(parse_slot_list(env.get(VARIABLES["pool"], ""))),
            slot_cgroups=tuple(f for f in env.get(VARIABLES["slot_cgroups"], "").split(os.pathsep) if f),
            entry_key=env.get(VARIABLES["entry_key"], ""),
            relay_mark=env.get(VARIABLES["relay_mark"], ""),
        )

    @property
    def cluster_path(self) -> Path:
        """The cluster folder: ``cluster_dir``, else ``~/.pdl/cluster``."""
        return Path(self.cluster_dir) if self.cluster_dir else Path(cluster_dir_in(Path.home()))


def _ports(text: str) -> tuple[int, ...]:
    """The ports of a ``,``-separated list (``""``: none); ValueError naming the variable
    and what is valid for anything else."""
    ports = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        if not (item.isdigit() and 1 <= int(item) <= 65535):
            raise ValueError(f"{VARIABLES['controller_ports']}={text!r} is not valid: "
                             "expected ports 1-65535, separated by commas")
        ports.append(int(item))
    return tuple(ports)
