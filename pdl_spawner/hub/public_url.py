"""The hub's public URL, under which each user's server is a web origin of its own.

Every user's server runs code its user controls (their kernel can even replace the
server on its port), so a page served there must not be able to act as whoever opens
it. JupyterHub's ``subdomain_host`` puts each server at its own host name,
``<name>.<host>``, beside the hub at ``<host>``: the browser then keeps the hub's
cookies, and the pages that show its tokens, out of reach of a user's page (another
origin), where one shared origin let a page read ``/hub/token`` and mint a token of its
visitor's.

On one machine, ``http://localhost:8000`` works with no DNS: browsers send
``localhost`` and every ``*.localhost`` to this machine (RFC 6761). A lab's hub needs a
name with a wildcard DNS entry (``hub.lab.example`` and ``*.hub.lab.example``), and for
https a certificate for both (docs/admin.md, "One origin per user").
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

#: The schemes a public URL may have.
SCHEMES = ("http", "https")


def default_public_url(port: int) -> str:
    """The embedded default: this machine's ``localhost`` at the hub's ``port``."""
    return f"http://localhost:{port}"


def public_url_problem(url: str) -> str | None:
    """None when ``url`` can be the hub's public URL, ``scheme://name[:port]`` with a host
    name (not an address: users' servers live at its subdomains) and no path; else one
    line saying what is valid, quoting at most 60 characters of ``url``."""
    shown = repr(url[:60] + ("..." if len(url) > 60 else ""))
    valid = ("PDL_PUBLIC_URL must be http(s)://NAME[:PORT], a host name whose subdomains also reach the hub "
             f"(e.g. http://localhost:8000, or https://hub.lab.example with DNS for *.hub.lab.example); got {shown}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        return valid
    host = parts.hostname or ""
    if parts.scheme not in SCHEMES or not host or parts.path not in ("", "/") or parts.query or parts.fragment \
            or parts.username or parts.password or _is_address(host) or not _is_dns_name(host):
        return valid
    return None


def _is_dns_name(host: str) -> bool:
    """At most 200 characters (users' names go before it, within DNS's 253), labels of 1
    to 63 letters, digits and hyphens."""
    labels = host.rstrip(".").split(".")
    return len(host) <= 200 and all(0 < len(label) <= 63 and label.replace("-", "").isalnum() and label.isascii()
                                    for label in labels)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
