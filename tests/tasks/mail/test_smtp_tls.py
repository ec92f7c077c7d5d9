"""SMTP over real TLS on loopback: the server is verified before any credential is sent.

Each test generates its own certificates: a private CA (trusted only when ``SSL_CERT_FILE``
names it, as an operator would) and a self-signed stranger. The server records every login it
sees after decryption, so "the password was never sent" is checked where it would arrive.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tasks.errors import MailFailed
from tasks.mail.message import Email
from tasks.mail.smtp import SmtpMailer
from tests.fakes.smtp import Inbox, LoopbackController, start_server
from tests.fakes.tls import PrivateCA, self_signed_context

DIGEST = Email(to="team@example.com", subject="Your weekly digest (2026-w42)", body="Hello.\n")
USER, PASSWORD = b"digest", b"p@ss:w0rd-tls"
CREDENTIALS = "digest:p%40ss%3Aw0rd-tls@"


@pytest.fixture
def ca(tmp_path: Path) -> PrivateCA:
    return PrivateCA(tmp_path / "ca")


@pytest.fixture
def trust(ca: PrivateCA, monkeypatch: pytest.MonkeyPatch) -> PrivateCA:
    """The private CA, trusted the way an operator would: ``SSL_CERT_FILE``."""
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.file))
    return ca


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[Inbox, int]]]:
    controllers: list[LoopbackController] = []

    def start(**options: object) -> tuple[Inbox, int]:
        inbox = Inbox(login=(USER, PASSWORD))
        controller = start_server(inbox, authenticator=inbox.authenticator, **options)
        controllers.append(controller)
        return inbox, controller.port

    yield start
    for controller in controllers:
        controller.stop()


def send(url: str, *, require_tls: bool = False) -> bool:
    mailer = SmtpMailer(
        url,
        sender="digest@example.com",
        timeout=5,
        require_tls=require_tls,
    )
    return mailer.send("digest-2026-w42", DIGEST).sent


def refused(url: str, **options: bool) -> str:
    with pytest.raises(MailFailed) as caught:
        send(url, **options)
    message = str(caught.value)
    assert "\n" not in message
    assert "w0rd" not in message
    return message


# smtps:// (implicit TLS)


def test_smtps_refuses_a_self_signed_certificate_for_another_name_and_sends_no_password(
    serve: Callable[..., tuple[Inbox, int]], tmp_path: Path
) -> None:
    inbox, port = serve(
        ssl_context=self_signed_context("mail.other.example", tmp_path), auth_require_tls=False
    )
    message = refused(f"smtps://{CREDENTIALS}localhost:{port}")
    assert message == (
        f"SMTP localhost:{port}: certificate not trusted (self-signed certificate); nothing "
        "was sent; check the host in DIGEST_SMTP_URL is the name on its certificate, or point "
        "SSL_CERT_FILE at the CA that signed it"
    )
    assert inbox.logins == []
    assert inbox.messages == []


def test_smtps_refuses_a_trusted_ca_certificate_for_another_name(
    serve: Callable[..., tuple[Inbox, int]], trust: PrivateCA
) -> None:
    inbox, port = serve(
        ssl_context=trust.server_context("mail.other.example"), auth_require_tls=False
    )
    message = refused(f"smtps://{CREDENTIALS}localhost:{port}")
    assert message.startswith(
        f"SMTP localhost:{port}: certificate not trusted (Hostname mismatch, certificate is "
        "not valid for 'localhost'.); nothing was sent"
    )
    assert inbox.logins == []


def test_smtps_accepts_a_private_ca_named_in_ssl_cert_file_for_the_right_name(
    serve: Callable[..., tuple[Inbox, int]], ca: PrivateCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox, port = serve(ssl_context=ca.server_context("localhost"), auth_require_tls=False)
    url = f"smtps://{CREDENTIALS}localhost:{port}"

    # Not yet trusted: the system store does not know a CA made a moment ago.
    assert "unable to get local issuer certificate" in refused(url)
    assert inbox.logins == []

    monkeypatch.setenv("SSL_CERT_FILE", str(ca.file))
    assert send(url) is True
    assert inbox.logins == [(USER, PASSWORD)]
    assert inbox.over_tls == [True]
    assert inbox.messages[0]["Message-ID"] == "<digest-2026-w42@durable-digest>"


# smtp:// (STARTTLS when offered)


def test_smtp_upgrades_with_starttls_when_offered_and_logs_in_over_it(
    serve: Callable[..., tuple[Inbox, int]], trust: PrivateCA
) -> None:
    # auth_require_tls (aiosmtpd's default): the server takes AUTH only after STARTTLS.
    inbox, port = serve(tls_context=trust.server_context("localhost"))
    assert send(f"smtp://{CREDENTIALS}localhost:{port}") is True
    assert inbox.logins == [(USER, PASSWORD)]
    assert inbox.over_tls == [True]


def test_starttls_without_credentials_is_still_used_and_verified(
    serve: Callable[..., tuple[Inbox, int]], trust: PrivateCA
) -> None:
    inbox, port = serve(tls_context=trust.server_context("localhost"))
    assert send(f"smtp://localhost:{port}") is True
    assert inbox.over_tls == [True]


def test_starttls_with_an_untrusted_certificate_never_falls_back_to_plaintext(
    serve: Callable[..., tuple[Inbox, int]], tmp_path: Path
) -> None:
    inbox, port = serve(tls_context=self_signed_context("mail.other.example", tmp_path))
    message = refused(f"smtp://{CREDENTIALS}localhost:{port}")
    assert message.startswith(
        f"SMTP localhost:{port}: certificate not trusted (self-signed certificate)"
    )
    assert inbox.logins == []
    assert inbox.messages == []


def test_credentials_are_never_sent_to_a_server_without_starttls(
    serve: Callable[..., tuple[Inbox, int]],
) -> None:
    # This server would even take AUTH in clear; the client must not offer it.
    inbox, port = serve(auth_require_tls=False)
    message = refused(f"smtp://{CREDENTIALS}127.0.0.1:{port}")
    assert message == (
        f"SMTP 127.0.0.1:{port} does not offer STARTTLS and the password in DIGEST_SMTP_URL "
        "is never sent in clear; nothing was sent; use smtps:// or enable STARTTLS on the server"
    )
    assert inbox.logins == []
    assert inbox.messages == []


def test_require_tls_refuses_plaintext_even_without_credentials(
    serve: Callable[..., tuple[Inbox, int]],
) -> None:
    inbox, port = serve()
    message = refused(f"smtp://127.0.0.1:{port}", require_tls=True)
    assert message == (
        f"SMTP 127.0.0.1:{port} does not offer STARTTLS and DIGEST_SMTP_REQUIRE_TLS=1 refuses "
        "plaintext; nothing was sent; use smtps:// or enable STARTTLS on the server"
    )
    assert inbox.messages == []
    # Without the setting, a server with no TLS and no login still gets the email.
    assert send(f"smtp://127.0.0.1:{port}") is True
    assert inbox.over_tls == [False]


def test_a_wrong_password_over_tls_is_named_without_echoing_it(
    serve: Callable[..., tuple[Inbox, int]], trust: PrivateCA
) -> None:
    inbox, port = serve(tls_context=trust.server_context("localhost"))
    message = refused(f"smtp://digest:wrong-w0rd@localhost:{port}")
    assert message.startswith(f"SMTP localhost:{port} rejected the login (535 ")
    assert message.endswith("check the user and password in DIGEST_SMTP_URL")
    # smtplib tries each mechanism the server offers (PLAIN, then LOGIN), all over TLS.
    assert set(inbox.logins) == {(USER, b"wrong-w0rd")}
    assert inbox.messages == []
