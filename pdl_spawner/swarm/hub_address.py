"""Where the hub's proxy listens on a Swarm manager: an address JupyterHub can check.

JupyterHub checks that its proxy answers before it serves anyone, and for a proxy
listening on every interface (``0.0.0.0``, ``::``, ``""``) it checks at this host's
name. Many hosts' names do not resolve (the hub's container on ``--network host`` has
the node's name and no entry for it): the check then fails and the hub exits.
:func:`proxy_ip` picks an address that works, or says in one line what to set.
"""

from __future__ import annotations

import socket

#: Addresses that mean "every interface" to JupyterHub.
WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def resolves(name: str) -> bool:
    """Whether ``name`` resolves to an address here."""
    try:
        socket.getaddrinfo(name, None)
    except (OSError, UnicodeError):
        return False
    return True


def proxy_ip(wanted: str | None, connect_ip: str, hostname: str | None = None, resolve=resolves) -> str:
    """The address the proxy listens on: ``wanted`` (``PDL_HUB_IP``) when set; else every
    interface where this host's name resolves, and ``connect_ip`` (``PDL_HUB_CONNECT_IP``,
    the manager's address) where it does not.

    ValueError, one line naming what to set, for a wildcard ``wanted`` on a host whose
    name does not resolve. ``hostname`` (default: this host's) and ``resolve`` (a name ->
    bool) are the lookup, given by a test where a name must not resolve.
    """
    hostname = socket.gethostname() if hostname is None else hostname
    if wanted is None or wanted.strip() == "":
        return "0.0.0.0" if resolve(hostname) else connect_ip
    wanted = wanted.strip()
    if wanted in WILDCARDS and not resolve(hostname):
        raise ValueError(
            f"PDL_HUB_IP={wanted} listens on every interface, and JupyterHub then checks its proxy at this "
            f"host's name, {hostname!r}, which does not resolve here; set PDL_HUB_IP to an address of this "
            f"host (e.g. PDL_HUB_IP={connect_ip}, the PDL_HUB_CONNECT_IP), or make the name resolve")
    return wanted
