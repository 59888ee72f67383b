"""Each server's own ``/tmp``, ``/var/tmp`` and ``/dev/shm``, as systemd's ``PrivateTmp=`` does it.

Tools create files under the machine's shared temporary places with names anyone can
guess (torch's compile cache is ``/tmp/torchinductor_<account>``, made without checking
who owns it): a user who creates another's folder first runs code as them. So every
process of a server (the server, its kernels, terminals, controller and engines) runs
in a mount namespace of its own, made in the forked child as root before it gives root
up (:meth:`PrivateTmp.enter`), where:

- ``/tmp`` and ``/var/tmp`` are the server's own folders, ``<root>/<name>/tmp`` and
  ``<root>/<name>/var-tmp`` (mode 1777 as the shared ones, inside ``<root>/<name>``,
  mode 0700 root: no other account can reach them by their path, and the user's own
  processes see them only through the mounts);
- ``/dev/shm`` is a tmpfs of its own (the collectives' shared memory between the
  server's engines);
- every mount is ``nosuid,nodev``, and the namespace is a slave of the machine's, so
  mounts the admin makes later still show, and nothing mounted inside leaks out.

The hub makes the folders before the start (:meth:`PrivateTmp.prepare`, as root, never
following a link) and removes them with the server's cgroup when it stops
(:meth:`PrivateTmp.remove`). A server whose namespace cannot be made does not start: the
preexec raises and the spawn fails with the reason.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
from pathlib import Path

from pdl_spawner.host.device_cgroup import cgroup_name

#: Where the servers' own folders are kept (root's, mode 0700).
DEFAULT_ROOT = "/var/lib/pdl/private-tmp"

#: Mount point -> its folder's name under ``<root>/<name>`` (None: a tmpfs of its own).
PLACES: dict[str, str | None] = {"/tmp": "tmp", "/var/tmp": "var-tmp", "/dev/shm": None}


def hiding_place(path: str | os.PathLike) -> str | None:
    """The place of :data:`PLACES` that a server's own replaces over ``path`` (so its
    processes cannot see what is there, e.g. PDL installed under /tmp), or None."""
    resolved = os.path.realpath(path)
    return next((place for place in PLACES if resolved == place or resolved.startswith(place + "/")), None)


_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_SLAVE = 0x2, 0x4, 0x20, 0x1000, 0x4000, 0x80000

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                       ctypes.c_ulong(flags), data.encode() if data else None), f"mount {target}")


class PrivateTmp:
    """The temporary places of server owner ``owner`` (``"pdl-ann"``, ``"pdl-ann/named"``):
    ``<root>/<cgroup_name(owner)>``. Constructing it touches nothing; every method needs
    root."""

    def __init__(self, owner: str, root: str | os.PathLike = DEFAULT_ROOT):
        self.owner = owner
        self.root = Path(root)
        self.path = self.root / cgroup_name(owner)

    def __repr__(self) -> str:
        return f"PrivateTmp({self.owner!r}, root={str(self.root)!r})"

    def prepare(self) -> None:
        """Make ``<root>`` (0700 root, its parents 0755 where missing) and this owner's
        folders, empty: what a server of the owner left there before is removed. Raises
        RuntimeError (one line) where ``<root>`` or the owner's folder is not a plain
        folder of root's that only root can open (a link, another account's, or wider)."""
        self.root.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        _private_folder(self.root)
        self.remove()
        self.path.mkdir(mode=0o700)
        for folder in filter(None, PLACES.values()):
            os.mkdir(self.path / folder, 0o700)
            os.chmod(self.path / folder, 0o1777)  # as the shared ones: any of the server's accounts' files

    def enter(self) -> None:
        """In the forked child, as root, before it gives root up: a mount namespace of its
        own with this owner's places mounted (see the module docstring). OSError when the
        kernel refuses (the child must not go on)."""
        _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _mount(None, "/", None, _MS_REC | _MS_SLAVE)
        for target, folder in PLACES.items():
            if folder is None:
                _mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
            else:
                _mount(str(self.path / folder), target, None, _MS_BIND)
                _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV)

    def remove(self) -> None:
        """Remove this owner's folders and everything in them (nothing if gone); links
        inside are removed, never followed."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(self.path)
        else:
            os.unlink(self.path)


def _private_folder(path: Path) -> None:
    """Make ``path`` (0700 root) if missing; RuntimeError unless it is then a folder of
    root's that only root can open (not a link)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o077:
        raise RuntimeError(f"{path} must be a folder of root's that only root can open "
                           f"(mode {stat.filemode(st.st_mode)}, uid {st.st_uid}): the servers' own /tmp are kept there")
