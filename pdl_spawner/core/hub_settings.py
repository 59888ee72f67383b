"""The hub's own settings that ``jupyterhub_config.py`` reads besides traitlets: the
users' servers' port range, times in seconds, and whether the admin's local config file
is safe to run.

- :func:`seconds`: a time setting such as ``PDL_SESSION_LIMIT_S`` as a number >= 0.
- :func:`port_range`: ``PDL_PORT_RANGE``'s ``LOW-HIGH`` as the ``(low, high)`` that
  ``port_range`` traits take (inclusive TCP ports).
- :func:`local_config_problem`: why a local config file (``PDL_LOCAL_CONFIG``) must not
  be loaded, or None. The hub runs as root and runs that file as its own code, so a file
  that anyone but root (or the hub's own user) could write or replace would let them run
  code as root.

Both are pure checks: one-line messages naming what is valid, no side effects.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: The ports ``PDL_PORT_RANGE`` may name: no privileged port (below 1024).
LOWEST_PORT, HIGHEST_PORT = 1024, 65535


def port_range(text: str, name: str = "PDL_PORT_RANGE") -> tuple[int, int]:
    """``"LOW-HIGH"`` (e.g. ``"20000-32000"``, both ends included) as ``(LOW, HIGH)``;
    ValueError, one line naming what is valid, unless ``1024 <= LOW < HIGH <= 65535``.
    ``name`` is the setting the message names."""
    low, dash, high = str(text).strip().partition("-")
    if dash and low.strip().isdigit() and high.strip().isdigit():
        low_port, high_port = int(low), int(high)
        if LOWEST_PORT <= low_port < high_port <= HIGHEST_PORT:
            return low_port, high_port
    raise ValueError(f"{name} must be LOW-HIGH with {LOWEST_PORT} <= LOW < HIGH <= {HIGHEST_PORT} "
                     f"(e.g. 20000-32000), got {str(text)[:40]!r}")


def seconds(text: str, name: str) -> float:
    """``text`` (e.g. ``"28800"``, ``"0.5"``) as seconds >= 0; ValueError, one line naming
    the setting (``name``) and what is valid, otherwise."""
    try:
        value = float(str(text).strip())
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ValueError(f"{name} must be a number of seconds >= 0 (e.g. 28800 for 8 h; 0: off), "
                         f"got {str(text)[:40]!r}")
    return value


def _trusted_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _folder_problem(folder: Path, st: os.stat_result) -> str | None:
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder"
    if not _trusted_owner(st.st_uid):
        return f"its folder {folder} belongs to uid {st.st_uid}, not to root or the hub's user"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return (f"its folder {folder} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}) "
                "without the sticky bit, so another user could replace the file: chmod go-w it")
    return None


def local_config_problem(path: str | os.PathLike) -> str | None:
    """None when ``path`` is safe to load as the hub's own configuration, else one line
    saying why not. Safe: a regular file (not a symlink) owned by root or by the hub's
    effective user, writable by its owner alone, in folders up to ``/`` (as written and as
    resolved) each owned by root or the hub's user and not writable by group or others
    unless sticky (like ``/tmp``)."""
    path = Path(os.path.abspath(path))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as e:
        return f"{path} cannot be read: {e.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link: name the file itself"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if not _trusted_owner(st.st_uid):
        return f"{path} belongs to uid {st.st_uid}, not to root or the hub's user: chown root it"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): chmod go-w it"
    # the folders as written (a link among them is judged by its folder, which holds it)
    # and as resolved (where the links lead)
    folders = {*path.parents, *Path(os.path.realpath(path.parent)).parents, Path(os.path.realpath(path.parent))}
    for folder in sorted(folders, key=lambda f: len(f.parts)):
        try:
            folder_st = os.lstat(folder)
            if stat.S_ISLNK(folder_st.st_mode):
                continue
        except OSError as e:
            return f"its folder {folder} cannot be read: {e.strerror}"
        problem = _folder_problem(folder, folder_st)
        if problem:
            return f"{path}: {problem}"
    return None
