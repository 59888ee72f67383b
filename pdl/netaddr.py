"""Which of this machine's addresses and interfaces peers on other machines reach."""

from __future__ import annotations

import socket


def route_addr(dest: str) -> str:
    """This machine's IPv4 address on the route to ``dest`` (127.0.0.1 for a local one).

    Uses a UDP ``connect``, which only picks a route and sends nothing.
    """
    if dest.startswith("127.") or dest in ("localhost", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((dest, 9))
        return s.getsockname()[0]


def iface_for(addr: str) -> str:
    """The name of the network interface that holds IPv4 ``addr`` ("lo" for loopback)."""
    if addr.startswith("127."):
        return "lo"
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == addr for a in addrs):
            return name
    raise RuntimeError(f"no network interface of this host has address {addr}")


def host_addr() -> str:
    """This host's address as peers on other hosts would reach it (the address its
    host name resolves to; 127.0.0.1 when it does not resolve)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def free_port(addr: str = "") -> int:
    """A TCP port that is free on ``addr`` (default: every interface) of this host now."""
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def collective_iface_env(addr: str, environ) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``: the interface holding ``addr``, so
    torch.distributed listens where peers on other nodes reach it (the node's host name
    need not resolve in a container). Values the admin set are kept."""
    iface = iface_for(addr)
    return {name: environ.get(name) or iface for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
