"""Whether the admin's local config file is safe to load as the hub's own code.

:func:`local_config_problem`: why a local config file (``PDL_LOCAL_CONFIG``) must not
be loaded, or None. The hub runs as root and runs that file as its own code, so a file
that anyone but root (or the hub's own user) could write or replace would let them run
code as root. A pure check: one-line messages naming what is valid, no side effects.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


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
