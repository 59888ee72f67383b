"""One Unix account per hub user, as The Littlest JupyterHub does (``jupyter-<name>`` there).

When the hub runs as root, a hub user's server, kernels, terminal, controller and
engines run under that user's own account, ``<prefix><name>`` (``pdl-ann`` for
``ann``), made on the first spawn with ``useradd``: its own group, a home of mode
0700 filled from a skeleton folder, no password (nobody logs in to it on the
machine; the hub is the way in). Isolation between users is then the operating
system's: files, processes (signals, ptrace, ``/proc/<pid>/environ``) and the
private sockets in each home.

PDL runs users only as accounts it made itself: :func:`ensure_account` refuses uid 0,
system accounts (uid below ``UID_MIN``) and any existing account that is not in the
hub's own record of the accounts it made (a file in its state folder, root's alone).
A prefix that maps a hub user onto ``root``, ``daemon`` or a lab member's own login,
or a second hub on the machine with the same prefix, is refused in one line instead of
running that user's code as someone else.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import stat
import subprocess
import threading
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


#: The lowest uid of an ordinary account where /etc/login.defs does not say (UID_MIN).
DEFAULT_UID_MIN = 1000
#: One hub's spawns make accounts one at a time (they run in worker threads).
_making = threading.Lock()


class ForeignAccount(RuntimeError):
    """An account PDL must not run a user as (root's, a system account, or one this hub
    did not make); its message is one line that says what the admin can do."""


def uid_min(login_defs: str | os.PathLike = "/etc/login.defs") -> int:
    """The lowest uid of an ordinary (non-system) account: ``UID_MIN`` of ``login_defs``,
    else :data:`DEFAULT_UID_MIN`."""
    try:
        text = Path(login_defs).read_text()
    except OSError:
        return DEFAULT_UID_MIN
    found = re.search(r"^\s*UID_MIN\s+(\d+)\s*$", text, re.M)
    return int(found.group(1)) if found else DEFAULT_UID_MIN


def accounts_made(record: str | os.PathLike) -> dict[str, int]:
    """The accounts the hub of ``record`` made: name -> uid (empty when there is no record).
    The record has one ``<name> <uid>`` line per account."""
    try:
        lines = Path(record).read_text().splitlines()
    except FileNotFoundError:
        return {}
    return {parts[0]: int(parts[1]) for parts in (line.split() for line in lines)
            if len(parts) == 2 and parts[1].isdigit()}


def foreign_account_problem(entry: pwd.struct_passwd, record: str | os.PathLike) -> str | None:
    """One line saying why PDL must not run a user as the existing account ``entry``;
    None when the hub of ``record`` made it (same name and uid) and it is ordinary."""
    name, uid = entry.pw_name, entry.pw_uid
    if uid == 0:
        return f"the Unix account {name} is root's (uid 0): PDL never runs a user as root; choose another PDL_ACCOUNT_PREFIX"
    if uid < uid_min():
        return (f"the Unix account {name} is a system account (uid {uid}, below UID_MIN {uid_min()}): "
                "PDL runs users only as accounts it made; choose another PDL_ACCOUNT_PREFIX")
    if accounts_made(record).get(name) != uid:
        return (f"the Unix account {name} exists but this hub did not make it (it is not in {record}): "
                f"PDL runs users only as accounts it made; remove the account, choose another "
                f"PDL_ACCOUNT_PREFIX, or, if this hub made it before it kept a record, add the line "
                f"'{name} {uid}' to {record}")
    return None


def ensure_account(name: str, home_root: str | os.PathLike, record: str | os.PathLike,
                   skeleton: str | os.PathLike | None = None, comment: str = "") -> pwd.struct_passwd:
    """The account ``name``, made if missing (home ``home_root/name``, mode 0700, filled
    from ``skeleton``, a uid of at least ``UID_MIN``) and written to ``record`` (mode 0600);
    its passwd entry. Needs root. :class:`ForeignAccount` (one line) for an account this
    hub did not make (:func:`foreign_account_problem`), RuntimeError with useradd's own
    message if it cannot be made."""
    with _making:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            entry = None
        if entry is not None:
            problem = foreign_account_problem(entry, record)
            if problem:
                raise ForeignAccount(problem)
            return entry
        home = Path(home_root) / name
        command = ["useradd", "--create-home", "--home-dir", str(home), "--user-group", "--shell", "/bin/bash",
                   "--comment", comment or f"PDL user {name}"]
        if skeleton is not None:
            command += ["--skel", str(skeleton)]
        done = subprocess.run([*command, name], capture_output=True, text=True)
        if done.returncode != 0:  # made meanwhile by something else than this hub: not ours
            if account_exists(name):
                raise ForeignAccount(foreign_account_problem(pwd.getpwnam(name), record)
                                     or f"the Unix account {name} was made by something else while PDL made it")
            raise RuntimeError(f"could not create the account {name}: {done.stderr.strip() or done.returncode}")
        entry = pwd.getpwnam(name)
        fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(f"{name} {entry.pw_uid}\n")
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


def lab_account(name: str, *, lowest_uid: int = 0, group: str = "") -> pwd.struct_passwd:
    """The lab's own Unix account ``name``, as the machine resolves it (NSS: /etc/passwd,
    or LDAP through sssd or nslcd), for a hub that runs its users as the accounts they
    already have: its passwd entry. :class:`ForeignAccount` (one line naming the rule)
    when there is no such account, when its uid is root's or below ``lowest_uid`` (0: the
    machine's ``UID_MIN``, :func:`uid_min`), or, with ``group``, when it is not a member
    of that group (its primary group counts)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ForeignAccount(f"there is no Unix account {name} on this machine: with lab accounts, each hub user "
                             f"runs as their own account of the same name") from None
    lowest = lowest_uid or uid_min()
    if entry.pw_uid == 0 or entry.pw_uid < lowest:
        raise ForeignAccount(f"the Unix account {name} has uid {entry.pw_uid}: lab accounts run only with a uid "
                             f"of at least {lowest} (PDL_ACCOUNT_UID_MIN), never root's or a system account's")
    if group:
        try:
            grp.getgrnam(group)
        except KeyError:
            raise ForeignAccount(f"there is no Unix group {group} (PDL_ALLOWED_GROUP) on this machine") from None
        if not in_group(name, group):
            raise ForeignAccount(f"the Unix account {name} is not in group {group}: only its members may run "
                                 f"here (PDL_ALLOWED_GROUP)")
    return entry


def in_group(name: str, group: str) -> bool:
    """Whether the Unix account ``name`` is a member of the Unix ``group``, as the machine
    resolves both (NSS), its primary group included; False when either is unknown."""
    try:
        found = grp.getgrnam(group)
        entry = pwd.getpwnam(name)
    except KeyError:
        return False
    return name in found.gr_mem or entry.pw_gid == found.gr_gid


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
