"""Write a file so that readers see the old content or the new, never a part.

:func:`write_atomic` writes a temp file (mode 0600) in the same folder, flushes and
fsyncs it, renames it over the target and fsyncs the folder, so the rename survives a
crash too. A writer killed at any point leaves the old file (or none) plus, at worst,
its temp file, whose name starts with ``.<target name>.`` and ends with ``suffix``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], object], *, prefix: str = "",
                 suffix: str = "") -> Path:
    """Replace ``path`` with what ``write(f)`` writes to a binary file; returns ``path``.

    ``prefix`` is put after ``.<name>.`` in the temp file's name (e.g. host and pid,
    for finding a dead writer's temp files), ``suffix`` at its end. Raises what writing
    raises; the temp file is then removed.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{prefix}", suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    return path


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
