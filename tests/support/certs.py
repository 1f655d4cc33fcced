"""Throw-away X.509 material for TLS tests, generated with ``cryptography`` (EC P-256).

``make_pki(folder)`` writes a CA, a server certificate for ``127.0.0.1``/``localhost`` signed by
that CA, a client certificate signed by the same CA, and a self-signed server certificate that no
CA vouches for. Every file is PEM; keys are unencrypted PKCS#8 (both nsqd and Python load them).
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

__all__ = ["Pki", "make_pki"]


@dataclass(frozen=True)
class Pki:
    """Paths of the generated PEM files."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    self_signed_cert: Path
    self_signed_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nsq_sync tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
    )


def _leaf(
    common_name: str,
    issuer_name: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey | None,
    usage: x509.ObjectIdentifier,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    subject = _name(common_name)
    signer = issuer_key if issuer_key is not None else key  # None: self-signed
    builder = _builder(
        subject, issuer_name if issuer_key is not None else subject, key.public_key()
    )
    builder = builder.add_extension(
        x509.BasicConstraints(ca=False, path_length=None), critical=True
    )
    builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    # Python 3.13's default context sets VERIFY_X509_STRICT, which wants both key identifiers.
    builder = builder.add_extension(
        x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
    )
    builder = builder.add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False
    )
    if usage == ExtendedKeyUsageOID.SERVER_AUTH:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
    return builder.sign(signer, hashes.SHA256()), key


def make_pki(folder: Path) -> Pki:
    """Generate the CA and certificates into ``folder`` (created if needed)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("nsq_sync test CA")
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    server_cert, server_key = _leaf("127.0.0.1", ca_name, ca_key, ExtendedKeyUsageOID.SERVER_AUTH)
    client_cert, client_key = _leaf(
        "nsq_sync test client", ca_name, ca_key, ExtendedKeyUsageOID.CLIENT_AUTH
    )
    self_cert, self_key = _leaf("127.0.0.1", ca_name, None, ExtendedKeyUsageOID.SERVER_AUTH)

    pki = Pki(
        ca_cert=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server-key.pem",
        client_cert=folder / "client.pem",
        client_key=folder / "client-key.pem",
        self_signed_cert=folder / "self-signed.pem",
        self_signed_key=folder / "self-signed-key.pem",
    )
    _write_cert(pki.ca_cert, ca_cert)
    _write_cert(pki.server_cert, server_cert)
    _write_key(pki.server_key, server_key)
    _write_cert(pki.client_cert, client_cert)
    _write_key(pki.client_key, client_key)
    _write_cert(pki.self_signed_cert, self_cert)
    _write_key(pki.self_signed_key, self_key)
    return pki
