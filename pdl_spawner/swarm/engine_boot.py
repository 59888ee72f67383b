"""``pdl-engine``: one ipyparallel engine in a Docker Swarm task, on the GPU Swarm gave it.

``PDLSwarmSpawner`` runs ``pdl-engine [ipyparallel engine args...]`` as the command of
each engine service, with this environment (no secrets in it; the engine contract, :mod:`pdl.engine_contract`):

- ``PDL_ENGINE_CONNECTION``: path of the engine connection file, a Docker secret
  under /run/secrets (JSON from :func:`pdl.connection.engine_file`: the controller's
  address and ports, its CurveZMQ public key and the HMAC key);
- ``PDL_GPU_RESOURCE``: the Swarm generic resource reserved for the task (default
  ``NVIDIA-GPU``). Swarm puts the GPU it assigned in ``DOCKER_RESOURCE_<resource>``,
  a name with a hyphen, so it is read here rather than in a shell;
- ``PDL_ENGINE_HOST``: the node's host name (the ``{{.Node.Hostname}}`` template).

It then forbids privilege gain, pins itself to its slot (:func:`gpu_slot_env`,
:func:`pdl.slots.engine_env`; thread counts the admin set are kept, :func:`admin_threads`), records the address peers reach it at
(``PDL_ENGINE_ADDR``, the interface collectives use), and runs the engine in this
process.
"""

from __future__ import annotations

import os
import sys

from pdl.engine_contract import EngineContract
from pdl.netaddr import collective_iface_env, route_addr
from pdl.slots import engine_env

#: The engine secret's file, unless the engine contract names another.
DEFAULT_CONNECTION = "/run/secrets/pdl-engine.json"
#: Default generic resource name for GPUs (as in the nodes' daemon.json).
DEFAULT_GPU_RESOURCE = "NVIDIA-GPU"
#: Seconds an engine waits for the controller to answer its registration.
#: Generous: the engine may start before the notebook's controller listens.
REGISTRATION_TIMEOUT_S = 120


def gpu_slot_env(assigned: str | None, n_cpus: int) -> dict[str, str]:
    """Slot environment for the GPU Swarm assigned (``DOCKER_RESOURCE_<resource>``).

    - nothing assigned: slot ``cpu:0``, no GPU visible;
    - an index (``"2"``, nodes that declare GPUs by index): slot ``gpu:2`` and
      ``CUDA_VISIBLE_DEVICES=2``;
    - a UUID (``"GPU-8f2c..."``, as NVIDIA recommends declaring them): slot ``gpu:0``
      (the only GPU this process sees) and ``CUDA_VISIBLE_DEVICES=<UUID>``, which
      selects that GPU whether or not the NVIDIA runtime already hid the others.

    The task gets all ``n_cpus`` cores; ``PDL_GPU`` keeps the assigned name.
    """
    assigned = (assigned or "").strip()
    if not assigned:
        return {**engine_env("cpu:0", ["cpu:0"], range(n_cpus)), **EngineContract(gpu="").env()}
    slot = f"gpu:{int(assigned)}" if assigned.isdigit() else "gpu:0"
    return {**engine_env(slot, [slot], range(n_cpus)), "CUDA_VISIBLE_DEVICES": assigned, **EngineContract(gpu=assigned).env()}


#: Thread counts an admin may set for every engine (``Spawner.environment``); kept over
#: the default of one thread per core of the node.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def admin_threads(environ) -> dict[str, str]:
    """The thread counts of :data:`THREAD_VARIABLES` set in ``environ`` (the service's
    environment, the admin's), to keep over :func:`gpu_slot_env`'s."""
    return {name: environ[name] for name in THREAD_VARIABLES if environ.get(name)}


def main(argv: list[str] | None = None) -> None:
    from pdl.connection import read_secret
    from pdl.process import no_new_privileges
    from pdl.runtime.boot import keep_freed_memory, pin_cpus

    argv = list(sys.argv[1:] if argv is None else argv)
    no_new_privileges()
    os.umask(0o077)  # what the engine writes is the user's alone (see pdl.runtime.boot)
    given = EngineContract.from_env()
    path = given.connection or DEFAULT_CONNECTION
    controller = read_secret(path)["location"]
    resource = given.gpu_resource or DEFAULT_GPU_RESOURCE
    env = {**gpu_slot_env(os.environ.get(f"DOCKER_RESOURCE_{resource}"), os.cpu_count() or 1),
           **admin_threads(os.environ)}
    addr = given.addr or route_addr(controller)
    env.update(EngineContract(addr=addr).env(), **collective_iface_env(addr, os.environ))
    os.environ.update(env)
    pin_cpus()
    keep_freed_memory()
    me = EngineContract.from_env()
    print(f"pdl-engine: slot {me.slot} (GPU {me.gpu or 'none'}), controller {controller}", file=sys.stderr, flush=True)
    from ipyparallel.engine.app import IPEngine

    class PDLEngine(IPEngine):
        def abort(self):
            # ipyparallel's abort blocks forever sending an unregistration request
            # when the controller refused the CurveZMQ handshake (wrong keys); exit,
            # and leave it to Swarm's restart policy.
            self.log.critical("Registration timed out after %.1f s: the controller is not "
                              "reachable or refused this engine's keys", self.timeout)
            os._exit(255)

    if not any(a.startswith("--IPEngine.timeout") for a in argv):
        argv.append(f"--IPEngine.timeout={REGISTRATION_TIMEOUT_S}")
    PDLEngine.launch_instance(argv=[f"--file={path}", *argv])


if __name__ == "__main__":
    main()
