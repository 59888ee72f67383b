"""Which ports of the hub's range a server's processes may bind: their own server's only.

The local spawner gives each server ports of ``port_range`` in a row (its own and its
controller's). Any process can bind any free port above 1023, so a user's kernel could
take every free port of the range and no other user's server could start ("no free
ports"), or take the ports another user's controller was given. Each server's processes therefore
run in a cgroup v2 of their own (:class:`PortCgroup`,
``<cgroup2 mount>/pdl/<cgroup_name(owner)>``: on a cgroup v2 host the same folder as
the server's device cgroup), whose ``BPF_CGROUP_INET4_BIND`` and ``INET6_BIND``
programs refuse (EPERM) a bind to a port of the range other than the server's own, as
systemd's ``SocketBindDeny=`` does. Ports outside the range and port 0 (the kernel's
choice, from Linux's ephemeral range, above the range by default) are not affected.
:func:`port_holders` says who holds the ports of a range, for the hub's refusal when
none is free.
"""

from __future__ import annotations

import os
import pwd
from functools import lru_cache
from pathlib import Path

from pdl_spawner.host import bpf
from pdl_spawner.host.device_cgroup import DEFAULT_PARENT, cgroup2_mount, cgroup_name


def cgroup2_root() -> Path | None:
    """The cgroup v2 mount this process can write to (None: none, or not root)."""
    if os.geteuid() != 0:
        return None
    found = cgroup2_mount()
    return found if found is not None and os.access(found, os.W_OK) else None


def _bind_filter(low: int, high: int, own_low: int, own_high: int) -> bytes:
    """The program: 0 (EPERM) for a bind to a port of ``low..high`` outside
    ``own_low..own_high``, 1 (allow) for anything else. Its context is ``struct
    bpf_sock_addr``, whose ``user_port`` (offset 24) holds the port in network byte order."""
    ldx_w, to_be, jlt_k, jgt_k, mov_k, exit_ = 0x61, 0xDC, 0xA5, 0x25, 0xB7, 0x95
    insn = bpf.insn
    return b"".join([
        insn(ldx_w, dst=2, src=1, off=24),  # r2 = ctx->user_port
        insn(to_be, dst=2, imm=16),  # r2 = the port, host order
        insn(jlt_k, dst=2, off=3, imm=low),  # below the range: allow
        insn(jgt_k, dst=2, off=2, imm=high),  # above: allow
        insn(jlt_k, dst=2, off=3, imm=own_low),  # in the range, below its own: refuse
        insn(jgt_k, dst=2, off=2, imm=own_high),  # above its own: refuse
        insn(mov_k, dst=0, imm=1),
        insn(exit_),
        insn(mov_k, dst=0, imm=0),
        insn(exit_),
    ])


def _load(low: int, high: int, own_low: int, own_high: int, attach_type: int) -> int:
    return bpf.load(bpf.PROG_TYPE_CGROUP_SOCK_ADDR, _bind_filter(low, high, own_low, own_high), b"pdl_ports",
                    "port filter", expected_attach_type=attach_type)


@lru_cache(maxsize=1)
def support() -> str | None:
    """None when this machine can filter binds per cgroup; else why not (one line)."""
    if cgroup2_root() is None:
        return "port isolation is off: no writable cgroup2 mount" + (" (not root)" if os.geteuid() else "")
    try:
        os.close(_load(1024, 1024, 1024, 1024, bpf.ATTACH_CGROUP_INET4_BIND))
    except OSError as e:
        return f"port isolation is off: cannot load a cgroup bind eBPF program ({e.strerror or e})"
    return None


class PortCgroup:
    """The cgroup v2 of one server owner in which its bind filter applies. Constructing it
    touches nothing; RuntimeError from every method where :func:`support` says no."""

    def __init__(self, owner: str, parent: str = DEFAULT_PARENT):
        self.owner = owner
        self.name = cgroup_name(owner)
        self.parent = parent

    @property
    def path(self) -> Path:
        problem = support()
        if problem:
            raise RuntimeError(problem)
        return cgroup2_root() / self.parent / self.name

    @property
    def procs_file(self) -> Path:
        """The file :func:`~pdl_spawner.host.device_cgroup.join` writes to."""
        return self.path / "cgroup.procs"

    def create(self) -> None:
        """Make the cgroup (and the parent) if missing. Idempotent."""
        for directory in (self.path.parent, self.path):
            directory.mkdir(exist_ok=True)

    def restrict(self, low: int, high: int, own_low: int, own_high: int) -> None:
        """From now on, processes in the cgroup may bind, of ports ``low..high``, only
        ``own_low..own_high`` (both included; IPv4 and IPv6); replaces an earlier call's
        rule. Creates the cgroup."""
        self.create()
        for attach_type in (bpf.ATTACH_CGROUP_INET4_BIND, bpf.ATTACH_CGROUP_INET6_BIND):
            program = _load(low, high, own_low, own_high, attach_type)
            try:
                bpf.attach_replacing(self.path, attach_type, program)
            finally:
                os.close(program)

    def remove(self) -> None:
        """Remove the cgroup (not its parent); nothing if it is gone. OSError EBUSY while
        processes are in it."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            pass


def port_holders(low: int, high: int) -> dict[int, str]:
    """Ports of ``low..high`` that a TCP socket listens on (IPv4 or IPv6), and the account
    of its owner (a uid without an account: ``uid N``), from ``/proc/net/tcp*``."""
    holders = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or fields[3] != "0A":  # 0A: LISTEN
                continue
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if low <= port <= high:
                uid = int(fields[7])
                try:
                    holders[port] = pwd.getpwuid(uid).pw_name
                except KeyError:
                    holders[port] = f"uid {uid}"
    return holders
