"""Entry point for PDL's engine and controller processes.

``python -m pdl.runtime.boot engine|controller [ipyparallel args...]``

Before handing over to ipyparallel it
- sets the umask to 077, so the connection files and keys it writes (and any file
  a cell writes) are private to the user from the moment they exist;
- asks the kernel to SIGKILL this process (and what it forks) when its parent
  dies, so engines and controllers never outlive the kernel or user server that
  started them (even after ``kill -9``);
- for an engine, joins its slot's cgroups where the hub keeps them
  (``$PDL_ENGINE_CGROUPS``, :func:`join_slot_cgroups`), then pins the process to the
  cores in ``$PDL_CPUS`` (both set by :func:`pdl.slots.engine_env`);
- for an engine, has malloc keep freed memory for reuse (:func:`keep_freed_memory`), so
  that a training step's tensors do not page-fault anew every step;
- for a controller whose engines run elsewhere (Docker Swarm), reads its CurveZMQ
  keypair from the secret file named by ``$PDL_CONTROLLER_SECRET`` (see
  :mod:`pdl.connection`), so the secret key never appears in a command line or
  environment.
"""

from __future__ import annotations

import ctypes
import os
import sys

from pdl.engine_contract import ENGINE_TIMEOUT_S
from pdl.process import die_with_parent

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: Blocks up to this many bytes come from malloc's heap, not a fresh mmap (glibc's most).
MMAP_THRESHOLD_BYTES = 32 << 20
#: Free memory at the top of the heap kept, not handed back to the kernel, up to this.
TRIM_THRESHOLD_BYTES = 256 << 20
#: Variables by which an admin sets malloc's thresholds; any of them leaves malloc alone.
MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def join_slot_cgroups() -> None:
    """Join the cgroups of this engine's slot that the engine contract names
    (``$PDL_ENGINE_CGROUPS``; the hub keeps the engine on its slot's cores there, and
    ends it there when it takes the slot back). One that cannot be joined is said on
    stderr in one line; the engine goes on, bounded as its server's processes are."""
    from pdl.engine_contract import EngineContract

    for folder in EngineContract.from_env().cgroups:
        try:
            with open(os.path.join(folder, "cgroup.procs"), "w") as procs:
                procs.write("0")
        except OSError as e:
            print(f"pdl engine: not in its slot's cgroup {folder}: {e.strerror}", file=sys.stderr)


def pin_cpus() -> None:
    """Apply the engine contract's ``cpus`` (``$PDL_CPUS``) as this process's affinity."""
    from pdl.engine_contract import EngineContract

    cpus = EngineContract.from_env().cpus
    if cpus and hasattr(os, "sched_setaffinity"):
        wanted = set(cpus)
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, (wanted & allowed) or allowed)


def keep_freed_memory() -> bool:
    """glibc only: serve blocks up to :data:`MMAP_THRESHOLD_BYTES` from the heap and keep up
    to :data:`TRIM_THRESHOLD_BYTES` of freed heap, so that the tensors of a step of
    a few MiB reuse the last step's pages instead of faulting in zeroed ones each step
    (with glibc's adaptive defaults a CPU engine spent about a third of some steps
    in the kernel, in some runs and not others). True if set; False (no change) off
    glibc or where the admin set malloc's thresholds (:data:`MALLOC_VARIABLES`, or
    ``glibc.malloc.`` tunables in ``GLIBC_TUNABLES``)."""
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    if any(os.environ.get(name) for name in MALLOC_VARIABLES) or "glibc.malloc." in os.environ.get(
            "GLIBC_TUNABLES", ""):
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


def controller_kwargs() -> dict:
    """Launch kwargs for the controller: its keypair when ``$PDL_CONTROLLER_SECRET`` is set."""
    from pdl.contract import ServerContract

    path = ServerContract.from_env().controller_secret
    if not path:
        return {}
    from pdl.connection import controller_config, read_secret

    return {"config": controller_config(read_secret(path))}


def run_engine(args: list[str]) -> None:
    """Be an engine with ipyparallel's arguments ``args``: join the slot's cgroups, pin
    the slot's cores, keep freed memory, then run ipyparallel's engine (returns when it
    ends), which waits up to :data:`~pdl.engine_contract.ENGINE_TIMEOUT_S` for its
    controller to answer its registration. Shared by a cold engine (:func:`main`) and a forked one
    (:mod:`pdl.runtime.warm_parent`)."""
    join_slot_cgroups()
    pin_cpus()
    keep_freed_memory()
    from ipyparallel.engine.app import main as run

    sys.argv = ["pdl-engine", f"--IPEngine.timeout={ENGINE_TIMEOUT_S}", *args]  # later arguments win
    run()


def main() -> None:
    role, args = sys.argv[1], sys.argv[2:]
    os.umask(0o077)
    die_with_parent()
    if role == "engine":
        run_engine(args)
    elif role == "controller":
        from ipyparallel.controller.app import main as run

        sys.argv = ["pdl-controller", *args]
        run(**controller_kwargs())
    else:
        sys.exit(f"pdl.runtime.boot: unknown role {role!r}; use 'engine' or 'controller'")


if __name__ == "__main__":
    main()
