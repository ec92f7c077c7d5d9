"""Throwaway certificates for TLS tests: a private CA (trustme) and a self-signed stranger.

Everything is generated in the test, in memory or in its tmp dir; nothing is trusted by the
machine. A client trusts the private CA only when the test points ``SSL_CERT_FILE`` (or a
redis-py ``ssl_ca_certs``) at ``PrivateCA.file``.
"""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


class PrivateCA:
    """A CA of the test's own, its certificate written to ``file`` (PEM)."""

    def __init__(self, directory: Path) -> None:
        self.ca = trustme.CA()
        directory.mkdir(parents=True, exist_ok=True)
        self.file = directory / "private-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.file))
        self._directory = directory

    def server_context(self, name: str) -> ssl.SSLContext:
        """A server's TLS context with a certificate for ``name`` signed by this CA."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert(name).configure_cert(context)
        return context

    def cert_files(self, name: str) -> tuple[Path, Path]:
        """A certificate for ``name`` signed by this CA and its key, as PEM files."""
        leaf = self.ca.issue_cert(name)
        cert, key = self._directory / f"{name}.crt", self._directory / f"{name}.key"
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
        return cert, key


def self_signed_context(name: str, directory: Path) -> ssl.SSLContext:
    """A server's TLS context with a self-signed certificate for ``name`` (its own issuer)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = directory / f"self-signed-{name}.crt", directory / f"{name}.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context
