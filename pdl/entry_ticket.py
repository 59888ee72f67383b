"""Entry tickets: the hub's word that a browser may begin a login at a user's server.

A user's server answers a request that carries no credentials it accepts exactly as the
hub answers for a server that is not running (:mod:`pdl_server.entry_gate`), so that an
anonymous visitor cannot tell who is working now. A browser whose owner logged in to the
hub must still be able to begin the server's own login (OAuth): the hub, when it sends a
logged-in user on to a running server they may use, adds a ticket to the address
(:data:`PARAM`), and the server begins its login for a request with a valid one.

A ticket is ``<expiry>.<signature>``: an Ed25519 signature by the hub over the server's
user name and the ticket's expiry (epoch seconds, :data:`LIFETIME_S` after it was made).
The hub's signing key is derived from its cookie secret (:func:`signing_key`); a server
is told only the public key (``PDL_ENTRY_KEY``, :mod:`pdl.contract`), which is no secret,
so no kind needs a private channel for it. A ticket opens nothing by itself: past it the
server's own OAuth login decides who may use the server.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import time

#: The query argument that carries a ticket.
PARAM = "pdl_entry"
#: Seconds a ticket is good for after the hub made it.
LIFETIME_S = 60
#: Longest ticket text read (an expiry and a 64-byte signature in base64 are about 100).
MAX_TICKET_CHARS = 200


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _message(name: str, expiry: int) -> bytes:
    return f"pdl-entry\0{name}\0{expiry}".encode()


@functools.lru_cache(maxsize=4)
def signing_key(cookie_secret: bytes):
    """The hub's Ed25519 signing key (``cryptography``'s), derived from its cookie secret:
    the same in every hub process, and new when the admin changes the secret."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    seed = hmac.new(cookie_secret, b"pdl-entry-ticket-key", hashlib.sha256).digest()
    return Ed25519PrivateKey.from_private_bytes(seed)


@functools.lru_cache(maxsize=4)
def public_key(cookie_secret: bytes) -> str:
    """The public key servers check tickets with, as ``PDL_ENTRY_KEY`` carries it (base64url)."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = signing_key(cookie_secret).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return _b64(raw)


def issue(cookie_secret: bytes, name: str, now: float | None = None) -> str:
    """A ticket for the server of user ``name``, good for :data:`LIFETIME_S` from ``now``."""
    expiry = int(time.time() if now is None else now) + LIFETIME_S
    return f"{expiry}.{_b64(signing_key(cookie_secret).sign(_message(name, expiry)))}"


def valid(key: str, name: str, ticket: str, now: float | None = None) -> bool:
    """Whether ``ticket`` is the hub's (public ``key``) for ``name``'s server and not
    expired at ``now``. Any malformed ticket or key is simply not valid."""
    if not key or not ticket or len(ticket) > MAX_TICKET_CHARS or "." not in ticket:
        return False
    expiry_text, _, signature = ticket.partition(".")
    now = time.time() if now is None else now
    if not expiry_text.isdigit() or not now <= int(expiry_text) <= now + LIFETIME_S + 5:
        return False
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(_unb64(key)).verify(_unb64(signature), _message(name, int(expiry_text)))
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True
