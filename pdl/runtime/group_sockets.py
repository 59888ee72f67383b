"""The sockets a process group opened, so that they can be cut on demand.

gloo keeps its TCP connections open for as long as anything references the
group: a DDP wrapper, a pending Work, a traceback frame. Neither
``destroy_process_group()`` nor ``ProcessGroupGloo.abort()`` closes them, so a
peer blocked in a collective on this rank waits until the group's timeout
(minutes). Shutting the sockets down (``shutdown(2)``, not ``close``: the
descriptors still belong to gloo) makes every peer's pending collective fail
at once with "Connection closed by peer", and the same for this rank's own
blocked collective if another thread cuts them.
"""

from __future__ import annotations

import os
import socket
import stat


def open_sockets() -> dict[int, int]:
    """This process's socket descriptors, as {fd: inode}."""
    fd_dir = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    found = {}
    for name in os.listdir(fd_dir):
        try:
            fd = int(name)
            st = os.fstat(fd)
        except (ValueError, OSError):
            continue
        if stat.S_ISSOCK(st.st_mode):
            found[fd] = st.st_ino
    return found


class GroupSockets:
    """The TCP sockets that appeared while a process group was being formed.

    Call :meth:`before` just before ``init_process_group`` and :meth:`after` just
    after; :meth:`cut` then shuts those sockets down. Each descriptor is matched
    by inode too, so a number that was closed and reused by someone else (the
    engine's ZMQ sockets) is never touched.
    """

    def __init__(self) -> None:
        self._before: dict[int, int] = {}
        self.owned: dict[int, int] = {}

    def before(self) -> None:
        self._before = open_sockets()
        self.owned = {}

    def after(self) -> None:
        self.owned = {
            fd: ino
            for fd, ino in open_sockets().items()
            if self._before.get(fd) != ino and _is_tcp_connection(fd)
        }

    def cut(self) -> int:
        """Shut down every owned socket that is still the same socket; return how many."""
        cut = 0
        for fd, ino in self.owned.items():
            try:
                if os.fstat(fd).st_ino != ino:
                    continue
                dup = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            try:
                dup.shutdown(socket.SHUT_RDWR)
                cut += 1
            except OSError:
                pass  # already shut down by the peer
            finally:
                dup.close()  # closes only the duplicate; gloo's descriptor stays
        self.owned = {}
        return cut


def _is_tcp_connection(fd: int) -> bool:
    """True for a TCP stream socket that is not a listener."""
    try:
        dup = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        return (
            dup.family in (socket.AF_INET, socket.AF_INET6)
            and dup.type == socket.SOCK_STREAM
            and not dup.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        )
    except OSError:
        return False
    finally:
        dup.close()
