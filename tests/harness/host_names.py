"""Host names as a browser, and a lab's wildcard DNS, resolve them, for the tests' own clients.

A hub gives each user's server its own origin, ``<name>.<host>`` (JupyterHub's
``subdomain_host``). Browsers send ``localhost`` and every ``*.localhost`` to the
loopback address with no DNS (RFC 6761); Python's resolver (glibc) knows only
``localhost``. :func:`install`, called once by tests/conftest.py, makes this process's
``socket.getaddrinfo`` do as browsers do, and resolve a name a test registers
(:func:`register`: a hub in a network namespace, as a lab's wildcard DNS entry would),
so a test's requests, websockets and Chromium (:func:`chromium_rules`) all reach the
same hub under its real public names. Nothing is sent to a DNS server.
"""

from __future__ import annotations

import socket

#: name -> IPv4 address, for the name and all its subdomains.
_REGISTERED: dict[str, str] = {}
_system_getaddrinfo = socket.getaddrinfo


def register(name: str, address: str) -> None:
    """``name`` and every ``*.name`` resolve to ``address`` in this process (and in
    the tests' Chromium) until :func:`unregister`."""
    _REGISTERED[name.lower()] = address


def unregister(name: str) -> None:
    _REGISTERED.pop(name.lower(), None)


def address_of(host: str) -> str | None:
    """The loopback address for ``localhost`` and ``*.localhost``, a registered name's address for it and
    its subdomains, else None (the system's resolver answers)."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):  # the hubs listen on 127.0.0.1, not ::1
        return "127.0.0.1"
    for name, address in _REGISTERED.items():
        if host == name or host.endswith("." + name):
            return address
    return None


def _getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):  # noqa: A002 - socket's own names
    address = address_of(host) if isinstance(host, str) else None
    return _system_getaddrinfo(address or host, port, family, type, proto, flags)


def install() -> None:
    """Resolve as :func:`address_of` says in this process (idempotent)."""
    socket.getaddrinfo = _getaddrinfo


def chromium_rules() -> list[str]:
    """Chromium's ``--host-resolver-rules`` for the registered names (it knows
    ``*.localhost`` itself)."""
    rules = ", ".join(f"MAP {pattern} {address}" for name, address in _REGISTERED.items()
                      for pattern in (name, f"*.{name}"))
    return [f"--host-resolver-rules={rules}"] if rules else []
