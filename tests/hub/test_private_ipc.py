"""pdl_spawner/host/private_ipc.py on its own, as root: a forked child's IPC namespace and
abstract Unix sockets are its own (the hub-level attacks are in test_hub_neighbours.py)."""

from __future__ import annotations

import ctypes
import os
import socket

import pytest

from pdl_spawner.host import private_ipc

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="an IPC namespace needs root")


def in_child(work) -> int:
    """Run ``work()`` (it returns 0 for what the test expects) in a forked child; its exit code."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(work())
        except BaseException:
            os._exit(99)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_support_says_in_one_line_what_servers_get():
    found = private_ipc.support()
    assert "System V IPC" in found.reason and "\n" not in found.reason
    assert bool(found) == (private_ipc.landlock_abi() >= private_ipc.SCOPES_ABI)


def test_a_child_that_entered_sees_no_segment_of_the_machine_and_reaches_no_outside_abstract_socket():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_ssize_t
    outside = libc.shmget(0, 4096, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    assert outside >= 0
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(f"\0pdl-private-ipc-test-{os.getpid()}")
    listener.listen()
    scoped = bool(private_ipc.support())

    def work() -> int:
        private_ipc.enter(scoped)
        if libc.shmat(outside, None, 0) != -1:
            return 1  # attached to the machine's segment
        inside = socket.socket(socket.AF_UNIX)
        inside.bind(f"\0pdl-private-ipc-own-{os.getpid()}")
        inside.listen()
        own = socket.socket(socket.AF_UNIX)
        own.connect(inside.getsockname())  # its own: reachable
        try:
            socket.socket(socket.AF_UNIX).connect(listener.getsockname())
        except PermissionError:
            return 0
        return 0 if not scoped else 2

    try:
        assert in_child(work) == 0
    finally:
        listener.close()
        libc.shmctl(outside, 0, None)  # IPC_RMID
