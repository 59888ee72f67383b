"""A lab's own certificate authority for the tests (PyPI's ``cryptography``): a CA, and
certificates it signs for the hub's name and its wildcard, as PEM files."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    """A certificate's PEM file and its private key's (mode 0600)."""

    cert: Path
    key: Path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _write_key(key, path: Path) -> Path:
    path.touch(mode=0o600)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


class TestCA:
    """A CA whose certificate is ``folder/ca.pem``; :meth:`issue` signs a server's."""

    __test__ = False  # not a pytest class

    def __init__(self, folder: Path, name: str = "PDL test lab CA"):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(_now() - DAY).not_valid_after(_now() + 30 * DAY)
                     .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.pem = self.folder / "ca.pem"
        self.pem.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, names: list[str], stem: str = "hub", not_before: datetime.datetime | None = None,
              not_after: datetime.datetime | None = None) -> Issued:
        """A server certificate for the DNS ``names`` (its subject alternative names),
        valid from a day ago for 30 days unless told otherwise."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
                .issuer_name(self.cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(not_before or _now() - DAY).not_valid_after(not_after or _now() + 30 * DAY)
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .sign(self.key, hashes.SHA256()))
        cert_path = self.folder / f"{stem}.crt"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return Issued(cert=cert_path, key=_write_key(key, self.folder / f"{stem}.key"))
