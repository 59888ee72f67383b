"""The status file: what a notebook's distributed session is doing, for the Cluster panel.

A :class:`~pdl_magics.session.DistributedSession` (in the kernel) writes one JSON file,
``<status dir>/<kernel pid>.json``; the Jupyter server extension (:mod:`pdl_lab`)
reads the newest one whose kernel is alive. The status dir is ``$PDL_STATUS_DIR``,
else ``~/.pdl/status``. Contents (times are epoch seconds)::

    {"version": 1, "pid": 1234,            # the kernel's process id
     "cluster_file": "/path/cluster-pdl.json", "hub": false,
     "slots": ["cpu:0", "cpu:1"],          # the session's pool (hub: the reservation)
     "cell": 3, "running": true,           # cell counter; true while a cell runs
     "started": 1.7e9, "updated": 1.7e9,   # when the cell started; when this was written
     "world": [{"rank": 0, "engine_id": 0, "host": "h", "addr": "10.0.0.1", "slot": "cpu:0"}],
     "metrics": {"0": {"step": 12, "total": 40, "values": {"loss": 0.3},
                       "time": 1.7e9, "count": 12, "history": [[1, {"loss": 4.0}], ...]}}}

``metrics`` holds each rank's latest ``pdl.log`` snapshot (:mod:`pdl.metrics`), its
history thinned to at most :data:`HISTORY_POINTS` points. Writing never raises: a
status that cannot be written must not break a cell.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from pdl.process import pid_alive

VERSION = 1
#: Minimum seconds between two throttled writes from one process.
WRITE_EVERY_S = 0.5
#: Points of each rank's metric history kept in the file.
HISTORY_POINTS = 60

_last_write = 0.0
_started = 0.0


def status_dir() -> Path:
    return Path(os.environ.get("PDL_STATUS_DIR") or Path.home() / ".pdl" / "status")


def status_path(pid: int | None = None) -> Path:
    return status_dir() / f"{os.getpid() if pid is None else pid}.json"


def _thin(history: list, keep: int = HISTORY_POINTS) -> list:
    if len(history) <= keep:
        return list(history)
    stride = -(-len(history) // keep)  # ceil
    thinned = history[::stride]
    return thinned if thinned[-1] is history[-1] else [*thinned, history[-1]]


def _rank_dict(r) -> dict:
    return dataclasses.asdict(r) if dataclasses.is_dataclass(r) else dict(r)


def write_status(
    cluster_file: str | None,
    world: list,
    *,
    running: bool,
    metrics: dict | None = None,
    cell: int = 0,
    slots: list[str] | None = None,
    hub: bool = False,
    force: bool = False,
) -> Path | None:
    """Write this process's status file; returns its path, or None when skipped or failed.

    ``world`` is a list of :class:`~pdl_magics.session.Rank` (or dicts with the
    same keys); ``metrics`` maps rank -> ``pdl.log`` snapshot. Without ``force``
    the write is skipped if the last one was less than :data:`WRITE_EVERY_S` ago.
    A call with ``running=True`` and ``force=True`` marks the start of a cell.
    """
    global _last_write, _started
    now = time.monotonic()
    if not force and now - _last_write < WRITE_EVERY_S:
        return None
    if running and force:
        _started = time.time()
    status = {
        "version": VERSION,
        "pid": os.getpid(),
        "cluster_file": cluster_file,
        "hub": bool(hub),
        "slots": list(slots or []),
        "cell": cell,
        "running": bool(running),
        "started": _started or None,
        "updated": time.time(),
        "world": [_rank_dict(r) for r in world],
        "metrics": {
            str(rank): {**snap, "history": _thin(snap.get("history") or [])}
            for rank, snap in (metrics or {}).items() if snap
        },
    }
    path = status_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(status))
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):
        return None
    _last_write = now
    return path


def remove_status() -> None:
    """Remove this process's status file (when its session closes)."""
    try:
        status_path().unlink()
    except OSError:
        pass


def _same_file(a: str | None, b: str) -> bool:
    return a is not None and os.path.realpath(a) == os.path.realpath(b)


def read_status(cluster_file: str | None = None) -> dict | None:
    """The newest status whose kernel is alive (and, if given, uses ``cluster_file``).

    Files of kernels that have exited are removed. Returns None when there is none.
    """
    best = None
    try:
        paths = list(status_dir().glob("*.json"))
    except OSError:
        return None
    for path in paths:
        try:
            status = json.loads(path.read_text())
            pid = int(status["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not pid_alive(pid):
            try:
                path.unlink()
            except OSError:
                pass
            continue
        if cluster_file is not None and not _same_file(status.get("cluster_file"), cluster_file):
            continue
        if best is None or status.get("updated", 0) > best.get("updated", 0):
            best = status
    return best
