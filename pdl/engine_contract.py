"""The engine contract: what an engine process is told about its place in the
reservation, as environment variables. One builder (:meth:`EngineContract.env`) and
one parser (:meth:`EngineContract.from_env`); whoever starts an engine (the server's
engine hosts, the Swarm engine service, the Slurm and Swarm boot scripts) writes it,
and the engine (its identity, CPU pinning, preflight) reads it, through here only.
Beside it, :mod:`pdl.contract` is the server's.

========================= ================ ==========================================
variable                  field            meaning
========================= ================ ==========================================
``PDL_SLOT``              ``slot``         the slot the engine works in (``gpu:0``,
                                           ``cpu:3``): its worker of the reservation
``PDL_CPUS``              ``cpus``         the cores it is pinned to (``0,1``);
                                           unset: not pinned (Slurm binds them)
``PDL_GPU``               ``gpu``          the GPU its scheduler reserved for it, as
                                           the scheduler names it ("": none; unset:
                                           not known)
``PDL_ENGINE_HOST``       ``host``         its node's name, where it is not this
                                           machine's host name (a Swarm task)
``PDL_ENGINE_ADDR``       ``addr``         the address the other ranks reach it at
``PDL_ENGINE_CONNECTION`` ``connection``   the engine secret's file (Swarm)
``PDL_GPU_RESOURCE``      ``gpu_resource`` the Swarm generic resource that is a GPU
``PDL_ENGINE_CGROUPS``    ``cgroups``      the hub's cgroups of its slot, which it
                                           joins as it starts (``:``-separated
                                           folders; the embedded default as root)
========================= ================ ==========================================

The engine's own command is :data:`ENGINE_COMMAND` (ipyparallel's arguments follow it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

#: The command of PDL's engine, before ipyparallel's engine arguments: a cold start runs
#: it (:mod:`pdl.runtime.boot`), a warm parent forks it (:mod:`pdl.runtime.warm_parent`).
ENGINE_COMMAND = (sys.executable, "-m", "pdl.runtime.boot", "engine")
#: Seconds an engine waits for its controller's answer to its registration, and a cell
#: for engines to register: a controller slowed by a busy machine answers late, and an
#: engine that gave up after ipyparallel's 5 s exited unregistered (forked engines ask
#: at once, as the controller starts).
ENGINE_TIMEOUT_S = 60

#: Field name -> environment variable, in the table's order.
VARIABLES = {
    "slot": "PDL_SLOT",
    "cpus": "PDL_CPUS",
    "gpu": "PDL_GPU",
    "host": "PDL_ENGINE_HOST",
    "addr": "PDL_ENGINE_ADDR",
    "connection": "PDL_ENGINE_CONNECTION",
    "gpu_resource": "PDL_GPU_RESOURCE",
    "cgroups": "PDL_ENGINE_CGROUPS",
}


@dataclass(frozen=True)
class EngineContract:
    """What an engine is told. Empty values are left out of :meth:`env`, except a
    ``gpu`` of "" (none reserved), which differs from None (not known)."""

    slot: str = ""
    #: core ids; (): not pinned
    cpus: tuple[int, ...] = ()
    gpu: str | None = None
    host: str = ""
    addr: str = ""
    connection: str = ""
    gpu_resource: str = ""
    #: the cgroup folders of its slot it joins; (): none
    cgroups: tuple[str, ...] = ()

    def env(self) -> dict[str, str]:
        """The environment variables that carry this contract."""
        values = {
            "slot": self.slot,
            "cpus": ",".join(map(str, self.cpus)),
            "host": self.host,
            "addr": self.addr,
            "connection": self.connection,
            "gpu_resource": self.gpu_resource,
            "cgroups": os.pathsep.join(self.cgroups),
        }
        env = {VARIABLES[name]: value for name, value in values.items() if value}
        if self.gpu is not None:
            env[VARIABLES["gpu"]] = self.gpu
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EngineContract:
        """The contract in ``env`` (default: this process's environment).

        ValueError, naming the variable and what is valid, for a malformed value.
        """
        env = os.environ if env is None else env
        cpus_text = env.get(VARIABLES["cpus"], "")
        try:
            cpus = tuple(int(c) for c in cpus_text.split(",") if c.strip())
        except ValueError:
            raise ValueError(f"{VARIABLES['cpus']}={cpus_text!r} is not valid: expected core ids such as 0,1") from None
        return cls(
            slot=env.get(VARIABLES["slot"], ""),
            cpus=cpus,
            gpu=env.get(VARIABLES["gpu"]),
            host=env.get(VARIABLES["host"], ""),
            addr=env.get(VARIABLES["addr"], ""),
            connection=env.get(VARIABLES["connection"], ""),
            gpu_resource=env.get(VARIABLES["gpu_resource"], ""),
            cgroups=tuple(f for f in env.get(VARIABLES["cgroups"], "").split(os.pathsep) if f),
        )
