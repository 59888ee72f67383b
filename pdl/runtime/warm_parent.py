"""The warm parent of a server's engines: imports torch, ipyparallel's engine and PDL's
runtime once, then forks each engine from there (the zygote pattern), so an engine is
ready in a fraction of a second and a few hundredths of a CPU-second instead of the
seconds each cold engine spends importing.

``python -m pdl.runtime.warm_parent <fd>``: ``<fd>`` is this process's end of a
``SOCK_SEQPACKET`` socket pair whose other end only the process that started it holds
(:mod:`pdl_server.warm_engines`): no name in the file system or the network, so nobody
else can ask it for anything. Each request is one message, JSON
``{"argv": [...], "env": {...}, "cwd": "..."}`` with two descriptors (the engine's
stdin and its output file); the answer is ``{"pid": N}`` (the engine, a child of this
process) or ``{"refused": "<one line>"}`` (the caller then starts the engine cold).
An engine is forked only for :data:`pdl.engine_contract.ENGINE_COMMAND` (PDL's own engine), and never once
CUDA is initialised here (it never is: nothing runs here but imports).

It first executes itself again with room in its memory for its engines' command lines
and environments (:data:`ROOM_VARIABLE`, :data:`ROOM_ARGUMENT`). Before it serves, it sets the umask to 077 and dies with its parent (and so its engines
with it, :func:`pdl.process.die_with_parent`); it imports with OpenBLAS on one thread,
so that no thread but the main one exists at a fork. It ends when the other end of the
socket closes. Each forked engine, before ipyparallel's engine runs
(:func:`become_engine`), takes the request's environment whole (the parent's is
dropped), working folder and descriptors, leads a session of its own, shows the
engine's command line and environment (``ps``, ``/proc/<pid>/cmdline`` and
``/proc/<pid>/environ``: :func:`show_as`), reseeds what was seeded at
import (NumPy's global generator; Python's ``random`` reseeds itself at a fork), sets
its thread counts from its own ``OMP_NUM_THREADS`` (torch's OpenMP and MKL, and the
BLAS: they read the parent's at import, here), then joins its slot's cgroups and pins
its cores as a cold engine does (:mod:`pdl.runtime.boot`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

from pdl.engine_contract import ENGINE_COMMAND
from pdl.process import die_with_parent, reap_exited_children

#: What the warm parent imports once for all its engines: what every engine imports
#: before or at its first cell.
WARM_MODULES = ("torch", "torch.distributed", "numpy", "ipyparallel", "ipyparallel.engine.app",
                "pdl.runtime.engine", "pdl.runtime.boot", "pdl.metrics", "pdl.balance.plan")
#: A variable of the warm parent's environment that only makes room, in its memory, for
#: an engine's environment (:func:`show_as`); its value is this many bytes.
ROOM_VARIABLE, ROOM_BYTES = "PDL_WARM_ROOM", 32 << 10
#: The warm parent's last argument, which makes room for an engine's command line the same way.
ROOM_ARGUMENT = "." * (4 << 10)
#: Largest request accepted, in bytes (an environment of a few dozen KiB is usual).
MAX_REQUEST_BYTES = 1 << 20


def import_warm_modules() -> None:
    """Import :data:`WARM_MODULES`, OpenBLAS kept to its main thread while it loads
    (a thread of the BLAS would be lost at each fork; each engine sets its own count)."""
    import importlib

    saved = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        for name in WARM_MODULES:
            importlib.import_module(name)
    finally:
        if saved is None:
            del os.environ["OPENBLAS_NUM_THREADS"]
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = saved


def refusal(argv) -> str | None:
    """Why the engine of ``argv`` cannot be forked here (one line), or None if it can."""
    if not isinstance(argv, list) or tuple(argv[:len(ENGINE_COMMAND)]) != ENGINE_COMMAND:
        return f"only PDL's engine ({' '.join(ENGINE_COMMAND)}) is forked here"
    if not all(isinstance(arg, str) for arg in argv):
        return "the engine's arguments must be strings"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in the warm parent; a fork would share its context"
    return None


def serve(sock: socket.socket) -> dict | None:
    """Answer requests until the other end closes (returns None, in this process), or
    return the request a forked child is to become (in that child)."""
    signal.signal(signal.SIGCHLD, lambda signum, frame: reap_exited_children())  # no engine lingers a zombie
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST_BYTES, 2)
        except ConnectionError:
            return None
        if not data:
            return None
        try:
            request = json.loads(data)
            argv, env, cwd = request["argv"], request["env"], request["cwd"]
            why = refusal(argv) if len(fds) == 2 else "a request carries the engine's stdin and output"
        except (ValueError, KeyError, TypeError):
            why, request = "a request is JSON with argv, env and cwd", None
        if why is None:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                request["fds"] = fds
                request["sock"] = sock
                return request
            answer = {"pid": pid}
        else:
            answer = {"refused": why}
        for fd in fds:
            os.close(fd)
        try:
            sock.send(json.dumps(answer).encode())
        except OSError:
            return None


def _set_thread_counts(env: dict[str, str]) -> None:
    """This engine's intra-op threads as its environment says (torch read the warm
    parent's at import), and the BLAS's as OpenMP's where ``threadpoolctl`` is there."""
    import torch

    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            return
        threadpool_limits(limits=int(threads), user_api="blas")


def _areas() -> tuple[tuple[int, int], tuple[int, int]]:
    """The (start, end) addresses of this process's command line and environment, as
    the kernel shows them in ``/proc/<pid>/cmdline`` and ``/proc/<pid>/environ``."""
    with open("/proc/self/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    arg_start, arg_end, env_start, env_end = (int(field) for field in fields[45:49])  # fields 48-51
    return (arg_start, arg_end), (env_start, env_end)


def _overwrite(area: tuple[int, int], items: list[bytes]) -> bool:
    """Write ``items``, each ending in NUL, over ``area`` (the rest NULs); False (and
    nothing written) where they do not fit."""
    import ctypes

    start, end = area
    data = b"".join(item + b"\0" for item in items)
    if len(data) > end - start:
        return False
    ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)
    return True


def show_as(argv: list[str], env) -> None:
    """Make ``/proc/<pid>/cmdline`` and ``/proc/<pid>/environ`` (what ``ps`` and an
    admin's tools read) show this engine's own command and environment, written over
    the memory the warm parent's were in (:data:`ROOM_VARIABLE` and
    :data:`ROOM_ARGUMENT` made room). One that does not fit is left as it was. Linux
    only; call it once nothing points into that memory any more (the environment
    cleared)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        commands, environment = _areas()
    except (OSError, ValueError, IndexError):
        return
    _overwrite(commands, [os.fsencode(arg) for arg in argv])
    _overwrite(environment, [os.fsencode(f"{k}={v}") for k, v in env.items()])


def become_engine(request: dict) -> None:
    """Turn this freshly forked child into the engine ``request`` asks for (see the
    module docstring); returns when the engine ends."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    request["sock"].close()
    os.setsid()
    stdin, output = request["fds"]
    os.dup2(stdin, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(stdin)
    os.close(output)
    argv = request["argv"]
    os.environ.clear()  # no pointer into the process's first environment is left
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})
    show_as(argv, os.environ)
    os.chdir(request["cwd"])
    import numpy

    numpy.random.seed()
    _set_thread_counts(os.environ)
    from pdl.runtime import boot

    boot.run_engine(argv[len(ENGINE_COMMAND):])


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if ROOM_VARIABLE not in os.environ:  # once, at once: make room for the engines' own (show_as)
        os.execve(sys.executable, [*ENGINE_COMMAND[:2], "pdl.runtime.warm_parent", argv[0], ROOM_ARGUMENT],
                  {**os.environ, ROOM_VARIABLE: "." * ROOM_BYTES})
    os.umask(0o077)
    die_with_parent()
    sock = socket.socket(fileno=int(argv[0]))
    import_warm_modules()
    request = serve(sock)
    if request is not None:
        become_engine(request)


if __name__ == "__main__":
    main()
