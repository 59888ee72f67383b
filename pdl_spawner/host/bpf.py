"""eBPF programs on cgroups (v2), by the bpf() syscall alone, as runc and systemd attach them.

PDL writes its few programs as raw instructions (:func:`insn`); this module loads one
(:func:`load`) and puts it on a cgroup in place of the programs of the same attach type
it attached before (:func:`attach_replacing`). Used by :mod:`~pdl_spawner.host.device_cgroup`
(which GPU device nodes a server may open) and :mod:`~pdl_spawner.host.port_filter` (which
ports of the hub's range it may bind). Needs root (CAP_BPF and CAP_SYS_ADMIN).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from pathlib import Path

_SYSCALL = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280}
_PROG_LOAD, _PROG_ATTACH, _PROG_DETACH = 5, 8, 9
_PROG_GET_FD_BY_ID, _PROG_QUERY = 13, 16
_F_ALLOW_MULTI = 2
#: The most programs of one attach type one cgroup can hold (the kernel's BPF_CGROUP_MAX_PROGS).
_MAX_PROGS = 64

#: Program types and attach types (linux/bpf.h).
PROG_TYPE_CGROUP_DEVICE, ATTACH_CGROUP_DEVICE = 15, 6
PROG_TYPE_CGROUP_SOCK_ADDR, ATTACH_CGROUP_INET4_BIND, ATTACH_CGROUP_INET6_BIND = 18, 8, 9

_libc = ctypes.CDLL(None, use_errno=True)


def syscall(command: int, attr: bytearray) -> int:
    """The bpf() syscall with ``attr`` (updated in place); OSError when it fails."""
    number = _SYSCALL.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"bpf() syscall number unknown on {platform.machine()}")
    buffer = (ctypes.c_char * len(attr)).from_buffer(attr)
    result = _libc.syscall(ctypes.c_long(number), ctypes.c_int(command), buffer, ctypes.c_uint(len(attr)))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"bpf({command}): {os.strerror(code)}")
    return result


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One eBPF instruction (8 bytes)."""
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def load(prog_type: int, program: bytes, name: bytes, what: str, expected_attach_type: int = 0) -> int:
    """Load ``program`` (instructions) as a GPL program of ``prog_type`` named ``name``
    (at most 15 bytes); its fd. OSError naming ``what`` and the verifier's last line
    when the kernel refuses it (loaded again with the verifier's log, for the message)."""
    code = ctypes.create_string_buffer(program, len(program))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(1 << 16)
    for log_level in (0, 1):
        attr = bytearray(128)
        struct.pack_into("<IIQQIIQ", attr, 0, prog_type, len(program) // 8, ctypes.addressof(code),
                         ctypes.addressof(license_), log_level, len(log) if log_level else 0,
                         ctypes.addressof(log) if log_level else 0)
        attr[48:48 + len(name[:15])] = name[:15]  # prog_name
        struct.pack_into("<I", attr, 68, expected_attach_type)
        try:
            return syscall(_PROG_LOAD, attr)
        except OSError as e:
            failure = e
    last = log.value.decode(errors="replace").strip().splitlines()[-1:]
    raise OSError(failure.errno, f"the kernel refused PDL's {what}: {failure.strerror} {' '.join(last)}".strip())


def attached(cgroup_fd: int, attach_type: int) -> list[int]:
    """Ids of the programs of ``attach_type`` attached to this cgroup itself."""
    ids = (ctypes.c_uint32 * _MAX_PROGS)()
    attr = bytearray(64)
    struct.pack_into("<IIIIQI", attr, 0, cgroup_fd, attach_type, 0, 0, ctypes.addressof(ids), _MAX_PROGS)
    syscall(_PROG_QUERY, attr)
    (count,) = struct.unpack_from("<I", attr, 24)
    return list(ids[:count])


def attach_replacing(cgroup: Path, attach_type: int, program_fd: int) -> None:
    """Attach the loaded program ``program_fd`` to ``cgroup`` for ``attach_type``, then
    detach the programs of that type attached there before (while both are attached, an
    operation must pass both: never looser than either). Programs of ancestor cgroups
    still apply (``BPF_F_ALLOW_MULTI``)."""
    cgroup_fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        old = attached(cgroup_fd, attach_type)
        attr = bytearray(32)
        struct.pack_into("<IIII", attr, 0, cgroup_fd, program_fd, attach_type, _F_ALLOW_MULTI)
        syscall(_PROG_ATTACH, attr)
        for prog_id in old:
            attr = bytearray(16)
            struct.pack_into("<I", attr, 0, prog_id)
            old_fd = syscall(_PROG_GET_FD_BY_ID, attr)
            try:
                attr = bytearray(32)
                struct.pack_into("<III", attr, 0, cgroup_fd, old_fd, attach_type)
                syscall(_PROG_DETACH, attr)
            finally:
                os.close(old_fd)
    finally:
        os.close(cgroup_fd)
