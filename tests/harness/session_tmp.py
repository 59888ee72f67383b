"""Each pytest session's own base temp folder, so that sessions side by side (the whole
suite in one shell, the quick tier in another) never remove each other's folders.

pytest's default base temp is ``<TMPDIR>/pytest-of-<user>/pytest-<n>``, one counter for
every session of the user, and each new session deletes all but the newest three: a
second session started during a long run deleted the run's folders (a hub's homes and
data sets), and its tests failed. Here each session (the xdist controller; its workers
get theirs below it) has ``<root>/<pid>-<random>/``, with its pid in a file; a new
session removes the folders of sessions that ended (their pid is gone), but the newest
:data:`KEPT_ENDED` for a look afterwards.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

#: Folders of ended sessions kept, the newest first.
KEPT_ENDED = 2


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (of any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid(folder: Path) -> int | None:
    try:
        return int((folder / "pid").read_text())
    except (OSError, ValueError):
        return None


def session_basetemp(root: Path, pid: int | None = None) -> Path:
    """A new base temp folder for the session ``pid`` (default: this process) under
    ``root`` (mode 0755, as the harness hands folders to the users' accounts); the
    folders of ended sessions are removed first, but the newest :data:`KEPT_ENDED`."""
    pid = os.getpid() if pid is None else pid
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    ended = [f for f in root.iterdir() if f.is_dir() and not (_pid(f) and alive(_pid(f)))]
    for folder in sorted(ended, key=lambda f: f.stat().st_mtime, reverse=True)[KEPT_ENDED:]:
        shutil.rmtree(folder, ignore_errors=True)
    mine = Path(tempfile.mkdtemp(prefix=f"{pid}-", dir=root))
    mine.chmod(0o755)
    (mine / "pid").write_text(str(pid))
    return mine / "tmp"
