"""One Unix account per hub user, as The Littlest JupyterHub does (``jupyter-<name>`` there).

When the hub runs as root, a hub user's server, kernels, terminal, controller and
engines run under that user's own account, ``<prefix><name>`` (``pdl-ann`` for
``ann``), made on the first spawn with ``useradd``: its own group, a home of mode
0700 filled from a skeleton folder, no password (nobody logs in to it on the
machine; the hub is the way in). Isolation between users is then the operating
system's: files, processes (signals, ptrace, ``/proc/<pid>/environ``) and the
private sockets in each home.
"""

from __future__ import annotations

import os
import pwd
import re
import stat
import subprocess
from pathlib import Path

#: Hub user names that map to an account: a lowercase letter, then lowercase letters,
#: digits, ``_`` or ``-``, at most 20 characters in all (Unix names are at most 32).
NAME_PATTERN = r"[a-z][a-z0-9_-]{0,19}"


def account_name(prefix: str, username: str) -> str:
    """The Unix account of hub user ``username``; ValueError (one line) for a name
    that is not :data:`NAME_PATTERN`."""
    if not re.fullmatch(NAME_PATTERN, username):
        raise ValueError(f"user name {username!r} cannot have an account: it must be a lowercase letter "
                         "followed by at most 19 lowercase letters, digits, '_' or '-'")
    return f"{prefix}{username}"


def ensure_account(name: str, home_root: str | os.PathLike, skeleton: str | os.PathLike | None = None,
                   comment: str = "") -> pwd.struct_passwd:
    """The account ``name``, created if missing (home ``home_root/name``, mode 0700,
    filled from ``skeleton``); its passwd entry. Needs root. RuntimeError with
    useradd's own message if it cannot be created."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    home = Path(home_root) / name
    command = ["useradd", "--create-home", "--home-dir", str(home), "--user-group", "--shell", "/bin/bash",
               "--comment", comment or f"PDL user {name}"]
    if skeleton is not None:
        command += ["--skel", str(skeleton)]
    done = subprocess.run([*command, name], capture_output=True, text=True)
    if done.returncode != 0 and not account_exists(name):  # another spawn may have made it meanwhile
        raise RuntimeError(f"could not create the account {name}: {done.stderr.strip() or done.returncode}")
    entry = pwd.getpwnam(name)
    os.chmod(entry.pw_dir, 0o700)
    return entry


def ensure_runtime_dir(entry: pwd.struct_passwd, root: str | os.PathLike = "/run/user") -> Path:
    """``root/<uid>``, the account's private runtime folder (``$XDG_RUNTIME_DIR``, as
    systemd-logind makes it): owned by the account, mode 0700; made if missing. Jupyter
    keeps its kernels' IPC sockets there, whose paths must stay under the kernel's limit
    of 107 bytes (a home can be deeper). RuntimeError if something else is there: the
    folder ``root`` is root's, so only root could have put it there. ``root`` and the
    folders above it that are missing are made with mode 0755 whatever the process's
    umask (the hub's 0077 made a missing ``/run/user`` 0700: no account could reach its
    own folder in it, on machines without systemd-logind)."""
    path = Path(root) / str(entry.pw_uid)
    for folder in reversed([f for f in (Path(root), *Path(root).parents) if not f.exists()]):
        try:
            folder.mkdir()
            folder.chmod(0o755)
        except FileExistsError:
            pass
    try:
        os.mkdir(path, 0o700)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != entry.pw_uid or stat.S_IMODE(st.st_mode) != 0o700:
        raise RuntimeError(f"{path} is not a folder of {entry.pw_name}'s alone (mode 0700)")
    return path


def account_exists(name: str) -> bool:
    """Whether the Unix account ``name`` exists on this machine."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def unreachable_by_others(path: str | os.PathLike) -> Path | None:
    """The first folder on the way to ``path`` (itself included) that other accounts
    cannot enter or read, or None when every user can run what is there (e.g. PDL's
    Python: a checkout under /root is not usable by the users' accounts)."""
    path = Path(path).resolve()
    for part in [*reversed(path.parents), path]:
        mode = part.stat().st_mode
        need = stat.S_IXOTH | (stat.S_IROTH if part == path and not part.is_dir() else 0)
        if mode & need != need:
            return part
    return None
