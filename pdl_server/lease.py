"""Idle engines give their slots back; the next distributed cell asks for them again.

Three parties share a user's cluster directory (``$PDL_CLUSTER_DIR``), each writing
its own file atomically, so nobody overwrites another's:

- ``pdl-singleuser`` (the user's server) stops the engines after
  ``$PDL_ENGINE_IDLE_TIMEOUT`` seconds without a running task and writes
  :data:`RELEASED` (``{"at": epoch s, "reason": one line}``);
- the hub's spawner reads it through the server's lease API (``/pdl/api/lease``,
  :mod:`pdl_lab.handlers`; the hub never touches these files), frees the slots in
  its ledger and logs the reclaim;
- a kernel that needs engines again writes :data:`WANT` (``{"workers": n, "at"}``);
  the spawner checks the count, reserves slots (or refuses, when none are free) and
  answers through the same API, which writes :data:`GRANT` (``{"slots": [...]}`` or
  ``{"refused": one line}``);
- ``pdl-singleuser`` starts engines on granted slots, records them in :data:`SLOTS`
  and removes the other three files.

The slots a server holds are :func:`current_slots`: :data:`SLOTS` once engines came
back on other slots, else ``$PDL_SLOTS`` from the spawn.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pdl.atomic_file import write_atomic
from pdl.contract import ServerContract

RELEASED = "engines-released.json"
WANT = "engines-wanted.json"
GRANT = "engines-granted.json"
SLOTS = "engines-slots.json"


def lease_dir() -> Path | None:
    """The user's cluster directory, where the files live (None outside a hub server)."""
    path = ServerContract.from_env().cluster_dir
    return Path(path) if path else None


def write(directory: Path, name: str, data: dict) -> None:
    """Write ``data`` as ``directory/name`` atomically (mode 0600)."""
    body = json.dumps({**data, "written": time.time()}).encode()
    write_atomic(directory / name, lambda f: f.write(body))


def read(directory: Path, name: str) -> dict | None:
    """The content of ``directory/name``, or None if it is not there (or not complete)."""
    try:
        return json.loads((directory / name).read_text())
    except (OSError, ValueError):
        return None


def remove(directory: Path, *names: str) -> None:
    for name in names:
        (directory / name).unlink(missing_ok=True)


def current_slots(directory: Path | None, spawned: list[str]) -> list[str]:
    """The slots this server's engines have now: those they came back on, else ``spawned``."""
    if directory is not None:
        data = read(directory, SLOTS)
        if data is not None:
            return list(data["slots"])
    return spawned
