"""The hub over HTTPS: how it is reached from the lab, checked before it starts.

A lab's hub is at ``https://NAME`` and each user's server at ``https://<user>.NAME``
(:mod:`pdl_spawner.hub.public_url`). Either the hub serves TLS itself (``PDL_TLS_CERT``
and ``PDL_TLS_KEY``: its proxy then answers on the public port, and redirects plain
HTTP from ``PDL_HTTP_PORT``), or a reverse proxy in front of it does (``PDL_TLS_PROXY``,
the proxy's addresses: the hub serves plain HTTP behind it and skips the proxy's entry
of ``X-Forwarded-For`` when it reads a client's address). :func:`access_problem` refuses,
in one line naming what is valid, every combination that cannot work;
:func:`certificate_problem` a certificate and key the hub cannot serve that name with.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from dataclasses import dataclass

#: The port browsers open for ``https://NAME`` and ``http://NAME``.
HTTPS_PORT, HTTP_PORT = 443, 80


@dataclass(frozen=True)
class Access:
    """How the lab reaches the hub: ``scheme`` (of ``PDL_PUBLIC_URL``), ``cert`` and
    ``key`` (PEM files; "" without), ``proxies`` (the addresses of a reverse proxy that
    terminates TLS in front), ``http_port`` (None: the default), ``hsts_s`` (seconds)."""

    scheme: str
    cert: str = ""
    key: str = ""
    proxies: Sequence[str] = ()
    http_port: int | None = None
    hsts_s: float = 0.0

    @property
    def serves_tls(self) -> bool:
        """The hub's own proxy serves HTTPS."""
        return bool(self.cert)

    def redirect_port(self) -> int:
        """The port whose plain HTTP is redirected to HTTPS (0: none)."""
        if not self.serves_tls:
            return 0
        return HTTP_PORT if self.http_port is None else self.http_port


def access_problem(access: Access) -> str | None:
    """One line when ``access`` cannot work, else None: a certificate without its key,
    both ways of TLS at once, an https URL served as plain HTTP with no proxy in front,
    an http URL with TLS, or a redirect or HSTS without TLS."""
    https = access.scheme == "https"
    if bool(access.cert) != bool(access.key):
        return "PDL_TLS_CERT and PDL_TLS_KEY go together: set both (the certificate and its private key, PEM) or neither"
    if access.cert and access.proxies:
        return ("set PDL_TLS_CERT/PDL_TLS_KEY (the hub serves TLS) or PDL_TLS_PROXY (a reverse proxy in front "
                "serves it), not both")
    if https and not access.cert and not access.proxies:
        return ("PDL_PUBLIC_URL is https, but nothing serves TLS: set PDL_TLS_CERT and PDL_TLS_KEY (the hub serves "
                "it), or PDL_TLS_PROXY to the address of the reverse proxy in front that does")
    if not https and (access.cert or access.proxies):
        which = "PDL_TLS_CERT" if access.cert else "PDL_TLS_PROXY"
        return f"{which} is for a hub reached over TLS: PDL_PUBLIC_URL must be https://NAME"
    if access.http_port and not access.serves_tls:
        return ("PDL_HTTP_PORT redirects plain HTTP to the hub's own HTTPS: it needs PDL_TLS_CERT and PDL_TLS_KEY "
                "(behind PDL_TLS_PROXY, the proxy redirects)")
    if access.hsts_s and not https:
        return "PDL_HSTS_S tells browsers to use https only: it needs PDL_PUBLIC_URL=https://NAME"
    return None


def certificate_problem(cert_path: str, key_path: str, host: str,
                        now: datetime.datetime | None = None) -> str | None:
    """One line when the hub cannot serve ``https://host`` and its users' servers at
    ``https://<user>.host`` with the PEM certificate ``cert_path`` and its private key
    ``key_path``, else None: either file unreadable, not PEM, the key open to group or
    others, the key not the certificate's, the certificate not yet or no longer valid at
    ``now`` (default: the current time), or not naming both ``host`` and ``*.host``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        cert_pem = _read(cert_path, "PDL_TLS_CERT")
        key_pem = _read(key_path, "PDL_TLS_KEY")
    except _Unreadable as e:
        return str(e)
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return f"PDL_TLS_CERT: {cert_path} is not a PEM certificate (-----BEGIN CERTIFICATE-----)"
    mode = os.stat(key_path).st_mode
    if mode & 0o077:
        return f"PDL_TLS_KEY: {key_path} is open to group or others (mode {mode & 0o777:o}): chmod 600 it"
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return f"PDL_TLS_KEY: {key_path} is not an unencrypted PEM private key (-----BEGIN PRIVATE KEY-----)"
    raw = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, raw) != \
            cert.public_key().public_bytes(serialization.Encoding.DER, raw):
        return f"PDL_TLS_KEY: {key_path} is not the private key of the certificate {cert_path}"
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if now < cert.not_valid_before_utc:
        return f"PDL_TLS_CERT: {cert_path} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
    if now > cert.not_valid_after_utc:
        return f"PDL_TLS_CERT: {cert_path} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: renew it"
    names = _dns_names(cert)
    wanted = [host.lower().rstrip("."), f"*.{host.lower().rstrip('.')}"]
    missing = [name for name in wanted if name not in names]
    if missing:
        shown = ", ".join(sorted(names)[:6]) or "no DNS name"
        return (f"PDL_TLS_CERT: {cert_path} names {shown}; a hub at https://{wanted[0]} needs both {wanted[0]} and "
                f"{wanted[1]} (each user's server is at <name>.{wanted[0]}) in its subject alternative names")
    return None


class _Unreadable(Exception):
    pass


def _read(path: str, variable: str) -> bytes:
    """The file's first MiB; :class:`_Unreadable` (one line naming ``variable``) when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)
    except OSError as e:
        raise _Unreadable(f"{variable}: {path} cannot be read ({e.strerror})") from None


def _dns_names(cert) -> set[str]:
    from cryptography import x509

    try:
        extension = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return set()
    return {name.lower().rstrip(".") for name in extension.value.get_values_for_type(x509.DNSName)}
