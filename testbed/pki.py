"""A temporary certificate authority for tests, made with `cryptography`.

One CA signs every certificate a test needs: the kube-apiserver's serving certificate
(testbed/kube_apiserver.py), a Prometheus API's serving and client certificates
(tests/promtls.py) and a renewal of either. Certificates are one-day, ECDSA P-256; a serving
certificate is for 127.0.0.1 and localhost unless given other names.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVER_AUTH = ExtendedKeyUsageOID.SERVER_AUTH
CLIENT_AUTH = ExtendedKeyUsageOID.CLIENT_AUTH


def loopback_names() -> list[x509.GeneralName]:
    """localhost and 127.0.0.1: where every test server listens."""
    return [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The private key as unencrypted PKCS#8 PEM."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _build(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    *,
    issuer: x509.Name | None,
    names: list[x509.GeneralName] | None,
    usage: x509.ObjectIdentifier | None,
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder


@dataclass(frozen=True)
class CertificateAuthority:
    """A self-signed CA and its key, kept in memory; `write` puts them on disk."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, subject: str = "fleetwatch-test-ca") -> CertificateAuthority:
        """A new CA."""
        key = ec.generate_private_key(ec.SECP256R1())
        builder = _build(subject, key, issuer=None, names=None, usage=None)
        return cls(certificate=builder.sign(key, hashes.SHA256()), key=key)

    @classmethod
    def load(cls, cert: Path, key: Path) -> CertificateAuthority:
        """The CA `write` put at `cert` and `key`."""
        loaded = serialization.load_pem_private_key(key.read_bytes(), None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{key}: not an EC private key")
        return cls(certificate=x509.load_pem_x509_certificate(cert.read_bytes()), key=loaded)

    def write(self, cert: Path, key: Path | None = None) -> None:
        """The CA certificate (PEM) at `cert`, and its key at `key` when given."""
        cert.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))
        if key is not None:
            key.write_bytes(pem_key(self.key))

    def issue(
        self,
        subject: str,
        *,
        names: list[x509.GeneralName] | None = None,
        usage: x509.ObjectIdentifier | None = SERVER_AUTH,
    ) -> tuple[bytes, bytes]:
        """A new key and a certificate for it signed by this CA, both PEM; a serving
        certificate (the default usage) is for the loopback names unless `names` says."""
        key = ec.generate_private_key(ec.SECP256R1())
        if names is None and usage == SERVER_AUTH:
            names = loopback_names()
        builder = _build(subject, key, issuer=self.certificate.subject, names=names, usage=usage)
        cert = builder.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), pem_key(key)

    def issue_to(
        self,
        cert: Path,
        key: Path,
        subject: str,
        *,
        names: list[x509.GeneralName] | None = None,
        usage: x509.ObjectIdentifier | None = SERVER_AUTH,
    ) -> None:
        """`issue`, written to `cert` and `key`."""
        cert_pem, key_pem = self.issue(subject, names=names, usage=usage)
        cert.write_bytes(cert_pem)
        key.write_bytes(key_pem)
