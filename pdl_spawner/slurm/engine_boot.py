"""One ipyparallel engine as a step of the user's Slurm job, on the GPU Slurm bound.

The user's server starts each engine with ``srun --jobid=<job> ... python -m
pdl_spawner.slurm.engine_boot [ipyparallel engine args...]`` (:func:`pdl_spawner.slurm.engine_host.srun_engine_cmd`);
srun passes the server's environment on. Slurm has already chosen the node, bound the
GPU (``CUDA_VISIBLE_DEVICES``, ``SLURM_STEP_GPUS``) and the cores of the task. This
records what PDL's ranks report (:func:`slurm_engine_env`: the slot, the node's name,
the address peers reach it at, the interface collectives use) and runs the engine
through :mod:`pdl.runtime.boot` (private umask, no privilege gain).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pdl.contract import ServerContract
from pdl.engine_contract import VARIABLES, EngineContract
from pdl.netaddr import collective_iface_env, route_addr


def slurm_engine_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What an engine in a Slurm step sets (the engine contract, :mod:`pdl.engine_contract`,
    and thread counts), from Slurm's variables:

    - ``PDL_SLOT``: the worker of the reservation the server started this engine for
      (``PDL_SLOT`` as srun passed it on), else ``gpu:<index>`` of the first GPU Slurm
      bound on this node (``SLURM_STEP_GPUS``), ``cpu:0`` without one; ``PDL_GPU``:
      Slurm's list of the GPUs bound on this node;
    - ``PDL_ENGINE_HOST``: the node's Slurm name (``SLURMD_NODENAME``);
    - ``PDL_ENGINE_ADDR``: this node's address on the route to the controller
      (``PDL_CONTROLLER_IP``), where the other ranks reach it, and
      ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` for it (the admin's values kept);
    - the thread counts, from the task's cores (``SLURM_CPUS_PER_TASK``).

    ``CUDA_VISIBLE_DEVICES`` stays as Slurm set it.
    """
    given = EngineContract.from_env(environ)
    gpus = environ.get("SLURM_STEP_GPUS") or environ.get("SLURM_JOB_GPUS") or ""
    first = gpus.split(",")[0].strip()
    controller = ServerContract.from_env(environ).controller_ip
    addr = (given.addr or route_addr(controller)) if controller else ""
    contract = EngineContract(slot=given.slot or (f"gpu:{int(first)}" if first.isdigit() else "cpu:0"),
                              gpu=gpus or None, host=environ.get("SLURMD_NODENAME", ""), addr=addr)
    threads = environ.get("SLURM_CPUS_PER_TASK", "1")
    return {**contract.env(), "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
            **(collective_iface_env(addr, environ) if addr else {})}


def main(argv: list[str] | None = None) -> None:
    from pdl.runtime import boot

    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.pop(VARIABLES["cpus"], None)  # Slurm bound the task's cores
    os.environ.update(slurm_engine_env(os.environ))
    sys.argv = [sys.argv[0], "engine", *argv]
    boot.main()


if __name__ == "__main__":
    main()
