"""How the text of a hub variable becomes its value: each parser takes the variable's
text and its name, and returns the value or raises ValueError with one line that names
the variable and what is valid (the hub then stops with that line).

Pure functions, no side effects; the traits they feed validate again (``c.*`` settings
reach the traits without passing here).
"""

from __future__ import annotations

import ipaddress
from typing import NamedTuple
from urllib.parse import urlsplit

#: The ports a port range may name: no privileged port (below 1024).
LOWEST_PORT, HIGHEST_PORT = 1024, 65535


def _shown(text: str) -> str:
    return repr(str(text)[:40])


def text(value: str, name: str) -> str:
    """The text as it is, without surrounding blanks."""
    return str(value).strip()


def whole_number(value: str, name: str) -> int:
    """A whole number >= 0 (``"5"``)."""
    value = str(value).strip()
    if not value.isdigit():
        raise ValueError(f"{name} must be a whole number >= 0, got {_shown(value)}")
    return int(value)


def positive_number(value: str, name: str) -> int:
    """A whole number >= 1."""
    number = whole_number(value, name) if str(value).strip().isdigit() else -1
    if number < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {_shown(value)}")
    return number


def port(value: str, name: str) -> int:
    """A TCP port, 1-65535."""
    value = str(value).strip()
    if not (value.isdigit() and 1 <= int(value) <= HIGHEST_PORT):
        raise ValueError(f"{name} must be a TCP port, 1-{HIGHEST_PORT}, got {_shown(value)}")
    return int(value)


def seconds(value: str, name: str) -> float:
    """Seconds >= 0 (``"28800"``, ``"0.5"``)."""
    try:
        number = float(str(value).strip())
    except ValueError:
        number = -1.0
    if not 0 <= number < float("inf"):
        raise ValueError(f"{name} must be a number of seconds >= 0 (e.g. 28800 for 8 h; 0: off), got {_shown(value)}")
    return number


def flag(value: str, name: str) -> bool:
    """``1`` (True) or ``0`` (False)."""
    value = str(value).strip()
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 1 or 0, got {_shown(value)}")
    return value == "1"


def names(value: str, name: str) -> list[str]:
    """Comma-separated names, blanks and empty items dropped (``"gpu1, gpu2"``)."""
    return [item.strip() for item in str(value).split(",") if item.strip()]


def port_range(value: str, name: str = "PDL_PORT_RANGE") -> tuple[int, int]:
    """``"LOW-HIGH"`` (both included, e.g. ``"20000-32000"``) as ``(LOW, HIGH)``, with
    ``1024 <= LOW < HIGH <= 65535``."""
    low, dash, high = str(value).strip().partition("-")
    if dash and low.strip().isdigit() and high.strip().isdigit():
        bounds = int(low), int(high)
        if port_range_problem(bounds) is None:
            return bounds
    raise ValueError(f"{name} must be LOW-HIGH with {LOWEST_PORT} <= LOW < HIGH <= {HIGHEST_PORT} "
                     f"(e.g. 20000-32000), got {_shown(value)}")


def port_range_problem(bounds: tuple[int, int]) -> str | None:
    """Why ``(low, high)`` is not a range of the users' ports, or None: the one rule of
    every port range (the variable's and the ``port_range`` trait's)."""
    low, high = bounds
    if LOWEST_PORT <= low < high <= HIGHEST_PORT:
        return None
    return f"must be (LOW, HIGH) with {LOWEST_PORT} <= LOW < HIGH <= {HIGHEST_PORT}, got {tuple(bounds)}"


def lab_accounts(value: str, name: str) -> bool:
    """``lab`` (True: the lab's own accounts) or ``pdl`` (False: accounts PDL makes)."""
    return one_of("pdl", "lab")(value, name) == "lab"


def one_of(*choices: str):
    """A parser of one of ``choices``."""

    def parse(value: str, name: str) -> str:
        value = str(value).strip()
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}, got {_shown(value)}")
        return value

    parse.choices = choices
    return parse


class Directory(NamedTuple):
    """Where the lab's LDAP directory answers: ``host``, ``port`` and how the login
    protects the password (jupyterhub-ldapauthenticator's ``tls_strategy``)."""
    host: str
    port: int
    tls_strategy: str


def ldap_url(value: str, name: str) -> Directory:
    """``ldaps://HOST[:PORT]`` (TLS from the start, port 636) or ``ldap://HOST[:PORT]``
    (port 389, StartTLS before the password is sent; in plain only to a loopback
    address, where it never leaves the machine)."""
    value = str(value).strip()
    try:
        url = urlsplit(value)
        port_given = url.port
    except ValueError:
        url, port_given = None, None
    if url is None or url.scheme not in ("ldap", "ldaps") or not url.hostname or url.path not in ("", "/") \
            or url.query or url.username:
        raise ValueError(f"{name} must be ldaps://HOST[:PORT] or ldap://HOST[:PORT], got {_shown(value)}")
    if url.scheme == "ldaps":
        return Directory(url.hostname, port_given or 636, "on_connect")
    return Directory(url.hostname, port_given or 389, "insecure" if _loopback(url.hostname) else "before_bind")


def dn_template(value: str, name: str) -> list[str]:
    """A distinguished name with ``{username}`` where the login name goes
    (``uid={username},ou=people,dc=lab,dc=example``), as a list of one (the login binds
    with each DN of its list in turn)."""
    value = str(value).strip()
    if "{username}" not in value or "=" not in value:
        raise ValueError(f"{name} must be a DN with {{username}} for the login name, e.g. "
                         f"uid={{username}},ou=people,dc=lab,dc=example, got {_shown(value)}")
    return [value]


def oidc_issuer(value: str, name: str) -> str:
    """An OpenID Connect provider's issuer URL: ``https://...``, or ``http://`` only to a
    loopback address (a sign-in never crosses a network in plain)."""
    value = str(value).strip().rstrip("/")
    try:
        url = urlsplit(value)
        host = url.hostname or ""
    except ValueError:
        url, host = None, ""
    if url is None or not host or url.query or url.fragment or url.username or url.scheme not in ("https", "http"):
        raise ValueError(f"{name} must be the provider's issuer, https://HOST[/PATH], got {_shown(value)}")
    if url.scheme == "http" and not _loopback(host):
        raise ValueError(f"{name} must be https:// (http only to 127.0.0.1), got {_shown(value)}")
    return value


def address(value: str, name: str) -> str:
    """An IP address this machine listens on (``127.0.0.1``, ``10.0.0.5``, ``0.0.0.0``: every interface)."""
    value = str(value).strip()
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"{name} must be an IP address of this machine (127.0.0.1: this machine only; 0.0.0.0: "
                         f"every interface), got {_shown(value)}") from None


def addresses(value: str, name: str) -> list[str]:
    """Comma-separated IP addresses (``127.0.0.1,10.0.0.2``); none: empty."""
    found = []
    for part in (p.strip() for p in str(value).split(",") if p.strip()):
        try:
            found.append(str(ipaddress.ip_address(part)))
        except ValueError:
            raise ValueError(f"{name} must be comma-separated IP addresses (e.g. 127.0.0.1), got {_shown(part)}") \
                from None
    return found


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
