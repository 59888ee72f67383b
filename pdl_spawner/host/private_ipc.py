"""Each server's own System V IPC and abstract Unix sockets, as systemd's ``PrivateIPC=``
and ``RestrictAddressFamilies=`` keep a service's apart.

Two channels between processes have no file permissions of their own:

- **System V IPC** (shared memory, semaphores, message queues) is one namespace per
  machine: ``ipcs`` lists every user's segments, and one that a tool creates with mode
  0666 is open to everyone.
- **Abstract Unix sockets** (a name starting with a NUL byte, ``@name`` in ``ss``) are
  named in the network namespace, which the users share with the machine: any process
  can connect to any listener, and a neighbour's listener can pose as a tool's.

So every process of a server (the server, its kernels, terminals, controller and
engines) runs, from the forked child on (:func:`enter`, as root, before it gives root
up), in

- an IPC namespace of its own (``CLONE_NEWIPC``): its segments, semaphores and queues
  are seen by that server's processes alone, and it sees no one else's; and
- a Landlock domain of its own that is scoped to abstract Unix sockets
  (``LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET``, Linux 6.12 and later): it may connect (or
  send a datagram) only to abstract sockets that processes of the same domain created,
  that is that server's own processes. What collectives need between a user's engines
  on one machine (NCCL's and gloo's sockets, shared memory in the server's own
  ``/dev/shm``) stays inside the server and keeps working. Sockets with a path, whose
  files have permissions (the machine's services: munge, nslcd), are not affected.

The hub itself and what it starts for itself are in no domain. Where the kernel has no
Landlock scopes (:func:`support` says so, one line in the hub's log at start), abstract
sockets stay shared and the server still starts; where the IPC namespace cannot be made,
the preexec raises and the server does not start.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

_CLONE_NEWIPC = 0x08000000
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_RESTRICT_SELF = 444, 446  # the same on every Linux architecture
_LANDLOCK_CREATE_RULESET_VERSION = 1
#: The Landlock ABI from which a domain can be scoped to abstract Unix sockets.
SCOPES_ABI = 6
_LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0

_libc = ctypes.CDLL(None, use_errno=True)


class _RulesetAttr(ctypes.Structure):
    """``struct landlock_ruleset_attr`` (uapi/linux/landlock.h, ABI 6)."""

    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers (0: none, or Landlock is off)."""
    version = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                            ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return max(version, 0)


@dataclass(frozen=True)
class Support:
    """Whether servers' abstract Unix sockets can be kept apart here (``scoped``), and one
    line for the hub's log that says what each server gets."""

    scoped: bool
    reason: str

    def __bool__(self) -> bool:
        return self.scoped


def support() -> Support:
    """What :func:`enter` gives each server on this kernel (its IPC namespace always)."""
    abi = landlock_abi()
    if abi >= SCOPES_ABI:
        return Support(True, f"each server has its own System V IPC and abstract Unix sockets (Landlock ABI {abi})")
    why = "Landlock is off" if abi == 0 else f"Landlock ABI {abi}, scopes need {SCOPES_ABI}"
    return Support(False, f"each server has its own System V IPC; abstract Unix sockets stay shared between "
                          f"users ({why}: Linux 6.12 or later with landlock among its LSMs keeps them apart)")


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def scope_abstract_sockets() -> None:
    """The calling thread, and whatever it starts from now on, in a new Landlock domain
    that may reach only the abstract Unix sockets made inside it. Needs root (or
    ``no_new_privs``) and :data:`SCOPES_ABI`; OSError where the kernel refuses."""
    attr = _RulesetAttr(0, 0, _LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET)
    ruleset = _check(_libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr),
                                   ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0)),
                     "landlock_create_ruleset")
    try:
        _check(_libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def enter(scoped: bool) -> None:
    """In the forked child of a server, as root, before it gives root up: its own IPC
    namespace, and with ``scoped`` (:func:`support`'s answer, looked up in the hub) its own
    abstract Unix sockets. OSError when the kernel refuses (the child must not go on)."""
    _check(_libc.unshare(_CLONE_NEWIPC), "unshare(CLONE_NEWIPC)")
    if scoped:
        scope_abstract_sockets()
