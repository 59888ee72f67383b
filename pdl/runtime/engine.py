"""Code that runs inside each ipyparallel engine.

The notebook side (:class:`pdl_magics.engines.Engines`) calls these functions by name through
``apply``. They never raise for user errors: :func:`run_cell` returns a plain dict
describing what happened, so the driver can pick the root cause across ranks and
decide whether the process group has to be torn down.
"""

from __future__ import annotations

import ast
import atexit
import datetime
import fcntl
import gc
import os
import shutil
import tempfile
import time
import traceback

from pdl.contract import ServerContract
from pdl.runtime import horovod_group as horovod_engine
from pdl.runtime.identity import describe  # noqa: F401 - called by name (pdl_server.world.call_engine)
from pdl.runtime.interrupts import CellInterrupts, report_stopped
from pdl.runtime.group_sockets import GroupSockets
from pdl.runtime.peer_routes import unreached_peers  # noqa: F401 - called by name, as describe
from pdl.netaddr import free_port  # noqa: F401 - called by name, as describe

#: Key of the process group this engine belongs to, or None. One group at a
#: time: a torch.distributed group or a Horovod world (``key[1]`` names which).
_group_key: tuple | None = None

#: The connections of this engine's process group, cut by :func:`abort_group`.
_group_sockets = GroupSockets()

#: Names the cell sees, set by :func:`init_torch` (and ``hvd`` by :func:`init_horovod`).
CELL_NAMES = ("rank", "world_size", "local_rank", "device")


def _shell():
    from IPython import get_ipython

    return get_ipython()


def preflight(step: str, *args):
    """Run ``pdl.runtime.preflight.<step>`` (``probe`` or ``all_reduce_smoke``) here: see :mod:`pdl.runtime.preflight`."""
    from pdl.runtime import preflight as checks

    if step not in checks.__all__:
        raise ValueError(f"unknown preflight step {step!r}")
    return getattr(checks, step)(*args)


#: Prefix of the folders that hold one-host groups' rendezvous files.
STORE_FOLDER_PREFIX = "pdl-torch-store-"
#: Seconds a new store folder is spared by the sweep (see :func:`new_store_file`)
#: before its group's members hold it.
STORE_GRACE_S = 60.0

#: The FileStore file of this engine's torch group (one host), or None.
_store_file: str | None = None
#: Store folders this engine holds: folder -> an open descriptor with a shared flock
#: on it, which the OS drops when this process dies, however it dies.
_held_folders: dict[str, int] = {}


def new_store_file() -> str:
    """The path of a rendezvous file for a new one-host torch group (not created yet).

    It is ``store`` in a new folder of mode 0700 owned by this user, under
    ``$PDL_CLUSTER_DIR`` when that folder exists here, else the system's temporary
    folder. The folder is removed when a member of the group leaves it
    (:func:`abort_group`) or exits; folders of groups whose members were all killed
    are removed by the next call here (no live process holds them, see
    :data:`STORE_GRACE_S`).
    """
    base = ServerContract.from_env().cluster_dir
    base = base if base and os.path.isdir(base) else tempfile.gettempdir()
    _sweep_store_folders(base)
    folder = tempfile.mkdtemp(prefix=STORE_FOLDER_PREFIX, dir=base)
    _hold_folder(folder)
    return os.path.join(folder, "store")


def sees_file_folder(path: str) -> bool:
    """Whether the folder of ``path`` exists for this engine (it shares the file system)."""
    return os.path.isdir(os.path.dirname(path))


def remove_store_file(path: str) -> None:
    """Remove a rendezvous file from :func:`new_store_file` with its folder (no error if gone)."""
    folder = os.path.dirname(path)
    fd = _held_folders.pop(folder, None)
    if fd is not None:
        os.close(fd)
    shutil.rmtree(folder, ignore_errors=True)


def group_store_file() -> str | None:
    """The FileStore file of this engine's torch group, or None (no group, or a
    TCPStore: a group across hosts)."""
    return _store_file


def _hold_folder(folder: str) -> None:
    if folder not in _held_folders:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(fd, fcntl.LOCK_SH)
        _held_folders[folder] = fd


def _sweep_store_folders(base: str) -> None:
    """Remove this user's store folders in ``base`` that no live process holds and
    that are older than :data:`STORE_GRACE_S`, and the ones this engine made for a
    group it never joined."""
    current = os.path.dirname(_store_file) if _store_file else None
    for folder in [f for f in _held_folders if f != current and os.path.dirname(f) == base]:
        remove_store_file(os.path.join(folder, "store"))
    try:
        names = [n for n in os.listdir(base) if n.startswith(STORE_FOLDER_PREFIX)]
    except OSError:
        return
    for name in names:
        folder = os.path.join(base, name)
        if folder in _held_folders:
            continue
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue  # gone, or not ours to enter
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or time.time() - st.st_mtime < STORE_GRACE_S:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            continue  # a live member holds it
        finally:
            os.close(fd)


def _forget_store_file() -> None:
    global _store_file
    if _store_file is not None:
        remove_store_file(_store_file)
        _store_file = None


@atexit.register
def _remove_held_store_folders() -> None:
    for folder in list(_held_folders):
        remove_store_file(os.path.join(folder, "store"))


def init_torch(
    key: tuple,
    rank: int,
    world_size: int,
    local_rank: int,
    rendezvous: str,
    timeout_s: float,
) -> dict:
    """Join the torch.distributed group named by ``key`` (no-op if already in it).

    ``rendezvous`` is where the ranks meet: ``file://<path>``, a FileStore on a
    file from :func:`new_store_file` (every rank on one host: no port to connect
    to, the file in a 0700 folder, removed when the group is left), or
    ``tcp://<addr>:<port>``, a TCPStore that rank 0 serves (ranks across hosts).
    Uses NCCL when this engine sees a GPU, else gloo. Defines ``rank``,
    ``world_size``, ``local_rank`` and ``device`` in the engine's namespace.
    All ranks of the group must call this concurrently.
    """
    import torch.distributed as dist

    device = _device(local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)

    def form():
        global _store_file
        if rendezvous.startswith("file://"):
            _store_file = rendezvous[len("file://"):]  # removed by abort_group, even if forming fails
            _hold_folder(os.path.dirname(_store_file))
            store = dist.FileStore(_store_file, world_size)
            store.set_timeout(timeout)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        else:
            dist.init_process_group(backend, init_method=rendezvous, rank=rank, world_size=world_size,
                                    timeout=timeout)

    _join(key, dist.is_initialized(), form)
    _shell().user_ns.update(
        rank=rank, world_size=world_size, local_rank=local_rank, device=device
    )
    return {"backend": backend, "device": str(device)}


def init_horovod(key: tuple, env: dict[str, str], local_rank: int, iface_addr: str) -> dict:
    """Join the Horovod world named by ``key`` (no-op if already in it).

    ``env`` is this rank's ``HOROVOD_*`` environment from the notebook kernel,
    which runs the rendezvous; ``iface_addr`` is the address gloo listens on.
    Defines ``hvd`` (``horovod.torch``), ``rank``, ``world_size``,
    ``local_rank`` and ``device`` in the engine's namespace. All ranks of the
    world must call this concurrently.
    """
    device = _device(local_rank)
    _join(key, horovod_engine.is_running(), lambda: horovod_engine.start(env, iface_addr))
    import horovod.torch as hvd

    _shell().user_ns.update(
        hvd=hvd, rank=hvd.rank(), world_size=hvd.size(), local_rank=hvd.local_rank(), device=device
    )
    return {"backend": "horovod", "device": str(device), "nccl": bool(hvd.nccl_built())}


def _join(key: tuple, running: bool, form) -> None:
    """Make this engine a member of the group named by ``key``: unless it already is
    (and the group is ``running``), leave the current one and call ``form()``,
    recording the sockets it opens so that :func:`abort_group` can cut them."""
    global _group_key
    if _group_key == key and running:
        return
    abort_group()
    _group_sockets.before()
    form()
    _group_sockets.after()
    _group_key = key


def horovod_problem(across_hosts: bool = False) -> str | None:
    """Why this engine cannot use Horovod (one line), or None if it can.

    ``across_hosts``: the world spans machines, which needs a Horovod built with
    PDL's process-set interface fix (:func:`pdl.runtime.horovod_group.fixed_for_hosts`).
    """
    try:
        import horovod.torch  # noqa: F401
    except ImportError as e:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    if across_hosts and not horovod_engine.fixed_for_hosts():
        return (f"horovod {horovod_engine.installed_version()} lacks the process-set interface fix "
                "that ranks on several hosts need")
    return None


def _device(local_rank: int):
    """This rank's torch device: its GPU (made current) if it sees one, else the CPU."""
    import torch

    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def abort_group() -> bool:
    """Tear down this engine's process group or Horovod world, releasing blocked peers.

    Returns True if there was one. Peers waiting on this rank fail at once
    with a connection error (Horovod: ``HorovodInternalError``) instead of
    hanging until the group's timeout, even while objects such as a DDP
    wrapper still reference the old group.
    """
    global _group_key
    import torch.distributed as dist

    _group_key = None
    _forget_store_file()  # its peers have left or are leaving too; a late store call gets ENOENT
    if horovod_engine.is_running():
        # the ranks agree on the shutdown; connections are cut only if a peer is frozen
        horovod_engine.stop(on_stall=_group_sockets.cut)
        gc.collect()
        return True
    if not dist.is_initialized():
        _group_sockets.cut()
        return False
    try:
        if dist.get_backend() == "nccl":
            from torch.distributed.distributed_c10d import _abort_process_group

            _abort_process_group()
    except Exception:
        pass  # a group that is already broken may refuse to abort; destroy it anyway
    _group_sockets.cut()  # releases the peers: see pdl.runtime.group_sockets
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    gc.collect()  # free what no longer references the group now, not at some later cell
    return True


def _is_comm_error(exc: BaseException) -> bool:
    """True for errors caused by a peer failing, not by this rank's code."""
    try:
        import torch.distributed as dist

        if isinstance(exc, (dist.DistBackendError, dist.DistNetworkError)):
            return True
    except ImportError:
        pass
    if horovod_engine.is_peer_failure(exc):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "Connection closed by peer" in text
        or "Connection reset by peer" in text
        or "Default process group has not been initialized" in text
    )


def _compile_cell(shell, code: str, cell_number: int):
    """Compile a cell the way IPython does: magics allowed, source kept for tracebacks.

    Returns (body, last_expr) code objects; last_expr is None unless the cell
    ends in an expression, whose value is returned to the notebook.
    """
    source = shell.transform_cell(code)
    filename = shell.compile.cache(source, cell_number, raw_code=code)
    tree = ast.parse(source, filename=filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
        last = compile(last, filename, "eval")
    return compile(tree, filename, "exec"), last


def run_cell(code: str, cell_number: int, balance: str = "auto") -> dict:
    """Run one notebook cell in this engine's namespace, with ``balance`` the cell's mode
    of balanced batches (:func:`pdl.balance.plan.set_mode`).

    Returns ``{"status": "ok", "value": repr-or-None}`` or, for any exception
    (KeyboardInterrupt included), ``{"status": "error" | "interrupted", "ename",
    "evalue", "traceback": [ANSI lines], "comm_error": bool, "time": epoch s}``.
    The traceback starts at the user's cell, not at PDL's frames. ``pdl.log``
    calls made by the cell are published to the notebook (:mod:`pdl.metrics`), and
    so is the rank's stack when the notebook asks for it (:mod:`pdl.runtime.stacks`).
    """
    from ipyparallel.datapub import publish_data

    from pdl import metrics
    from pdl.balance.plan import set_mode
    from pdl.runtime import stacks

    # an interrupt reaches the user's code only, never PDL's own steps around it
    with CellInterrupts() as interrupts:
        set_mode(balance)
        stacks.install()  # the hang watchdog can then ask for this rank's stack
        metrics.begin_cell(publish_data)
        try:
            return _run_cell(code, cell_number, interrupts, publish_data)
        finally:
            metrics.end_cell()


def _run_cell(code: str, cell_number: int, interrupts: CellInterrupts, publish) -> dict:
    shell = _shell()
    try:
        body, last = _compile_cell(shell, code, cell_number)
        with interrupts.delivered():
            exec(body, shell.user_ns)
            value = eval(last, shell.user_ns) if last is not None else None
        return {"status": "ok", "value": None if value is None else repr(value)}
    except BaseException as exc:  # noqa: BLE001 - every failure goes back as data
        if isinstance(exc, KeyboardInterrupt):
            report_stopped(publish)  # before the wind-down, which can take seconds
        failure = _describe_failure(shell, exc)
        traceback.clear_frames(exc.__traceback__)  # a failed collective's frames hold its Work
        del exc
        if failure["status"] == "interrupted":
            # Ranks interrupted at different collectives can't share the group any
            # more; leaving it now releases any peer still blocked on this rank.
            abort_group()
        return failure


def _describe_failure(shell, exc: BaseException) -> dict:
    failed_at = time.time()
    tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # skip _run_cell
    lines = shell.InteractiveTB.structured_traceback(type(exc), exc, tb)  # SIGINT held: see run_cell
    return {
        "status": "interrupted" if isinstance(exc, KeyboardInterrupt) else "error",
        "ename": type(exc).__name__,
        "evalue": str(exc),
        "traceback": lines,
        "comm_error": _is_comm_error(exc),
        "time": failed_at,
    }
