"""Checkpoint and resume: one call saves training state, one call restores it.

Training code saves at a point it can continue from (e.g. the end of an epoch)::

    pdl.save_checkpoint(path, model=model, optimizer=optimizer, epoch=epoch + 1)

and, when the cell is run again after an interrupt or an engine's death,
continues from there::

    state = pdl.load_checkpoint(path, model=model, optimizer=optimizer)
    first_epoch = state["epoch"] if state is not None else 0

The file is replaced atomically: a reader sees the previous complete checkpoint
or the new complete one, never a mix, even if the writer is killed mid-write.
It is read with ``torch.load(weights_only=True)``, so a checkpoint can hold
tensors and plain data but nothing that runs code when loaded.

In a torch.distributed group or a Horovod world of more than one rank, every
rank calls the same function: rank 0 alone reads and writes the file, and the
state travels to the other ranks over the group. The file therefore lives on
rank 0's filesystem (use shared storage if rank 0 may move to another machine).
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import socket
import sys
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pdl.atomic_file import write_atomic
from pdl.process import pid_alive

__all__ = ["CheckpointError", "save", "load", "read", "restore"]

#: Marks a file written by :func:`save`; other files are refused by :func:`read`.
FORMAT = "pdl.checkpoint/1"

#: Temp files are ``.<target name>.<host>.<pid>.<random>`` + this suffix, next to the target.
TEMP_SUFFIX = ".tmp"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, read or restored; the message is one line naming the file."""


def save(path: str | os.PathLike, /, **state: Any) -> Path | None:
    """Write ``state`` to ``path`` atomically; returns ``path`` on the rank that wrote it, else None.

    Each value is one of: an object with ``state_dict()`` (``nn.Module``,
    optimizer, LR scheduler, ...), stored as its state dict; a
    ``torch.Generator``, stored as its state; or data that ``weights_only``
    loading accepts: tensors, None, bool, int, float, complex, str, bytes,
    ``torch.dtype``/``device``/``Size``, and lists, tuples, sets and dicts of
    these. Anything else (a lambda, an instance of your own class, a NumPy
    array) raises TypeError naming the entry, before the file is touched.

    The write: remove temp files that killed writers left next to ``path``, write
    a new temp file (mode 0600) in the same folder, flush and fsync it, rename it
    over ``path`` and fsync the folder. Missing parent folders are created.

    Distributed (torch.distributed or Horovod, world > 1): call it on every rank.
    Only rank 0 builds the state and writes; the call synchronises, returning on
    every rank once the file is in place, and raises CheckpointError on every
    rank if rank 0's write failed.
    """
    path = Path(path).expanduser()
    rank, broadcast = _group()
    failure = None
    if rank == 0:
        try:
            _write_atomic(path, {"format": FORMAT, "state": _to_saveable(state)})
        except Exception as e:  # noqa: BLE001 - reported to every rank, then raised
            failure = e
    error = None if failure is None else f"cannot write checkpoint {path}: {_one_line(failure)}"
    if broadcast is not None:
        error = broadcast(error)
    if isinstance(failure, TypeError):
        raise failure  # an entry that cannot be stored: the caller's mistake, shown as such
    if error is not None:
        raise CheckpointError(error) from failure
    return path if rank == 0 else None


def load(path: str | os.PathLike, /, **objects: Any) -> dict[str, Any] | None:
    """Restore ``objects`` from the checkpoint at ``path``; None if there is none.

    Each keyword names an entry of the checkpoint and gives the object to restore
    in place: ``load_state_dict()`` for modules, optimizers and the like (which
    moves tensors to the object's device and dtype), ``set_state()`` for a
    ``torch.Generator``. Returns the other entries (tensors on the CPU).

    The same as ``restore(read(path), **objects)`` when there is a checkpoint:
    see :func:`read` for the distributed behaviour and the errors.
    """
    state = read(path)
    if state is None:
        return None
    try:
        return restore(state, **objects)
    except CheckpointError as e:
        raise CheckpointError(f"checkpoint {path}: {e}") from None


def read(path: str | os.PathLike, /) -> dict[str, Any] | None:
    """Every entry of the checkpoint at ``path``, objects' entries as their state dicts
    (tensors on the CPU); None if no file is there.

    Loads with ``torch.load(weights_only=True)``. A file that is not a complete
    checkpoint raises CheckpointError naming it (nothing starts over silently).
    Distributed (world > 1): call it on every rank; rank 0 reads the file and
    broadcasts the entries (or the absence, or the error), so every rank gets
    the same answer without needing to see rank 0's files.
    """
    path = Path(path).expanduser()
    rank, broadcast = _group()
    outcome: tuple[str, Any] | None = None
    if rank == 0:
        try:
            outcome = ("ok", _read_file(path))
        except CheckpointError as e:
            outcome = ("error", str(e))
    if broadcast is not None:
        outcome = broadcast(outcome)
    kind, value = outcome
    if kind == "error":
        raise CheckpointError(value)
    return value


def restore(state: dict[str, Any], /, **objects: Any) -> dict[str, Any]:
    """Restore each of ``objects`` in place from the entry of ``state`` (from :func:`read`)
    with the same name; returns the entries not named.

    Raises CheckpointError if an entry is missing, and TypeError for an object
    that has neither ``load_state_dict()`` nor is a ``torch.Generator``.
    """
    missing = [name for name in objects if name not in state]
    if missing:
        raise CheckpointError(
            f"no entry {', '.join(map(repr, missing))} (entries: {', '.join(map(repr, state)) or 'none'})"
        )
    for name, obj in objects.items():
        if isinstance(obj, torch.Generator):
            obj.set_state(state[name])
        elif callable(getattr(obj, "load_state_dict", None)):
            obj.load_state_dict(state[name])
        else:
            raise TypeError(f"cannot restore {name!r}: a {type(obj).__name__} has no load_state_dict()")
    return {name: value for name, value in state.items() if name not in objects}


# -- writing --------------------------------------------------------------------------


def _to_saveable(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with objects replaced by their state, checked to be weights_only-loadable."""
    out = {}
    for name, value in state.items():
        if isinstance(value, torch.Generator):
            value = value.get_state()
        elif not isinstance(value, torch.Tensor) and callable(getattr(value, "state_dict", None)):
            value = value.state_dict()
        _check_loadable(value, name)
        out[name] = value
    return out


_ATOMS = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.dtype, torch.device, torch.Size)
_CONTAINERS = (list, tuple, set, frozenset, dict, OrderedDict, Counter)


def _check_loadable(value: Any, where: str) -> None:
    """Raise TypeError unless ``torch.load(weights_only=True)`` can rebuild ``value``."""
    kind = type(value)
    if kind in _ATOMS or kind in (torch.Tensor, torch.nn.Parameter):
        return
    if kind in _CONTAINERS:
        if isinstance(value, dict):
            for key, item in value.items():
                _check_loadable(key, f"{where} (a key)")
                _check_loadable(item, f"{where}[{key!r}]")
        else:
            for i, item in enumerate(value):
                _check_loadable(item, f"{where}[{i}]")
        return
    raise TypeError(
        f"checkpoint entry {where} is a {kind.__module__}.{kind.__qualname__}, which loading with "
        "weights_only refuses; store tensors, numbers, strings and lists/dicts of them"
    )


def _write_atomic(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(path)
    write_atomic(path, lambda f: torch.save(payload, f), prefix=f"{_host()}.{os.getpid()}.", suffix=TEMP_SUFFIX)


def _remove_stale_temps(path: Path) -> None:
    """Remove temp files of ``path`` whose writer (on this host) is no longer running."""
    prefix = f".{path.name}.{_host()}."
    for temp in path.parent.glob(f"{glob.escape(prefix)}*{TEMP_SUFFIX}"):
        pid = temp.name[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()


def _host() -> str:
    return socket.gethostname().replace(os.sep, "_") or "localhost"


# -- reading --------------------------------------------------------------------------


def _read_file(path: Path) -> dict | None:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001 - truncated, corrupt, or holding code: all refused the same way
        raise CheckpointError(f"cannot load checkpoint {path}: {_one_line(e)}") from None
    if not (isinstance(data, dict) and data.get("format") == FORMAT and isinstance(data.get("state"), dict)):
        raise CheckpointError(f"cannot load checkpoint {path}: not written by pdl.checkpoint.save")
    return data["state"]


def _one_line(e: BaseException) -> str:
    """``Type: first line of the message``; for a weights_only refusal, the refused global."""
    text = str(e).strip()
    refused = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if refused:
        return f"it holds a {refused.group(1)}, which loading with weights_only refuses"
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


# -- the group ------------------------------------------------------------------------


def _group() -> tuple[int, Callable[[Any], Any] | None]:
    """``(rank, broadcast)``: this rank in the running group and a function that returns
    rank 0's argument on every rank; ``(0, None)`` outside a group of more than one."""
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized() and hvd.size() > 1:
        return hvd.rank(), lambda obj: hvd.broadcast_object(obj, root_rank=0, name="pdl.checkpoint")
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:

        def broadcast(obj):
            box = [obj]
            dist.broadcast_object_list(box, src=0)
            return box[0]

        return dist.get_rank(), broadcast
    return 0, None
