"""Sending the digest, once per idempotency key.

The ``send`` step is a fenced effect (``journal.effects``): claimed before it starts, its
lease confirmed right before the irreversible moment (``effect.confirm()``: before the
outbox's link, before SMTP's DATA), its receipt saved through a fenced script right after
(``effect.accepted``). A receipt saved by an earlier holder comes back as ``effect.earlier``,
and the mailer sends nothing and answers ``sent=False``.

Every mailer takes an idempotency key derived from the run (never random) for the one window
the effect leaves (a holder died after the irreversible moment, before its receipt):
``FileOutbox`` delivers once per key, like a provider that honours one; ``SmtpMailer`` sends
again with the same ``Message-ID`` and ``Idempotency-Key``, which lets receivers drop it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import smtplib
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email import policy as email_policy
from email.message import EmailMessage
from email.utils import formatdate, getaddresses, parseaddr
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from journal import Effect
from journal.redact import redact
from tasks.errors import BadInput, MailFailed, MailUnavailable

log = logging.getLogger(__name__)

MESSAGE_ID_DOMAIN = "durable-digest"
SMTP_TIMEOUT_S = 30.0

# A key that is already a safe file name and a valid Message-ID left part is used as is.
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9_-]+")
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Email:
    """One message to deliver."""

    to: str
    subject: str
    body: str


@dataclass(frozen=True)
class Receipt:
    """What a send returns; ``sent`` is False when the key was delivered earlier."""

    id: str
    sent: bool

    def to_json(self) -> dict[str, Any]:
        """The form the ``send`` step records."""
        return {"id": self.id, "sent": self.sent}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Receipt:
        """Rebuild a receipt from a recorded step or a stored receipt."""
        return cls(id=data["id"], sent=data["sent"])


class Mailer(Protocol):
    """Anything that delivers an email under an idempotency key, as a fenced effect.

    Attributes:
        timeout: seconds after its claim within which a send may still pass
            ``effect.confirm()``; a later holder waits this long for a claimant that may be alive.
    """

    timeout: float

    def send(self, key: str, email: Email, effect: Effect | None = None) -> Receipt:
        """Deliver ``email``: confirm ``effect`` right before, report the receipt right after."""
        ...


class FileOutbox:
    """A directory standing in for an email provider: one JSON file per idempotency key.

    The file is written under a temporary name, flushed to disk, then hard-linked to its final
    name. ``os.link`` fails if the name exists, so among concurrent senders of one key exactly
    one wins, and a reader never sees a half-written file: a crash mid-write leaves only a
    temporary file, which does not count as sent.
    """

    # A link on a local disk: a holder that claimed the send acts within milliseconds.
    timeout = 10.0

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def path_for(self, key: str) -> Path:
        """The file that records ``key``'s email."""
        return self.directory / f"{_safe_token(key)}.json"

    def send(self, key: str, email: Email, effect: Effect | None = None) -> Receipt:
        """Write the email unless a file for ``key`` exists.

        Raises:
            MailFailed: The outbox cannot be written, or holds a damaged record for ``key``.
        """
        _check_key(key)
        if effect is not None and effect.earlier is not None:
            return Receipt(id=Receipt.from_json(effect.earlier).id, sent=False)
        final = self.path_for(key)
        record = {
            "key": key,
            "to": email.to,
            "subject": email.subject,
            "body": email.body,
            "at": datetime.now(UTC).isoformat(),
        }
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=self.directory, prefix=".", suffix=".tmp")
        except OSError as exc:
            raise self._unwritable(exc) from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(record, handle, indent=2, ensure_ascii=False)
                handle.flush()
                os.fsync(handle.fileno())
            if effect is not None:
                effect.confirm()  # the link below delivers
            try:
                os.link(temp, final)
            except FileExistsError:
                return self._earlier(key, final)
            _fsync_directory(self.directory)
        except OSError as exc:
            raise self._unwritable(exc) from None
        finally:
            os.unlink(temp)
        receipt = Receipt(id=key, sent=True)
        if effect is not None:
            effect.accepted(receipt.to_json())
        return receipt

    def _unwritable(self, exc: OSError) -> MailFailed:
        return MailFailed(
            f"outbox {self.directory}: cannot write ({exc.strerror}); "
            "check that the directory is writable and has space"
        )

    def _earlier(self, key: str, final: Path) -> Receipt:
        # The name appears only after the whole file was written, so a record that does not
        # parse was changed by hand; sending again could be a duplicate, so stop instead.
        try:
            stored = json.loads(final.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise MailFailed(
                f"{final}: not a readable outbox record ({exc}); "
                "restore it, or delete it to send this email again"
            ) from None
        if not isinstance(stored, dict) or stored.get("key") != key:
            raise MailFailed(
                f"{final}: records another key than {key!r}; "
                "restore it, or delete it to send this email again"
            )
        return Receipt(id=key, sent=False)


class SmtpMailer:
    """Delivery through an SMTP server, as a fenced effect.

    The session goes as far as RCPT, then ``effect.confirm()`` re-confirms the run's lease: a
    holder that lost it (paused, taken over) quits without DATA, so nothing is delivered.
    Once DATA is answered the receipt is saved with ``effect.accepted``; a later holder that
    finds it sends nothing.

    The honest window: if the process dies (or Redis fails, or the connection drops before the
    server's answer arrives) after the server accepted the email but before the receipt was
    saved, the next holder sends it once more. Both copies carry the same ``Message-ID`` and
    ``Idempotency-Key`` headers, derived from the key, so a receiver or relay that
    deduplicates on them drops the repeat. Marking the email sent before DATA would close the
    window the other way, by losing the email after such a crash; a digest is better twice
    than never.

    Transport security: ``smtps://`` speaks TLS from the first byte; ``smtp://`` upgrades with
    STARTTLS whenever the server offers it. Either way the certificate is verified against the
    system's trust store (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` add a private CA) and must name
    the host in the URL, and a failed check ends the attempt: it never falls back to plaintext.
    A server that offers no STARTTLS gets plaintext only when the URL has no credentials and
    ``require_tls`` is off; credentials are never sent in clear.
    """

    def __init__(
        self,
        url: str,
        sender: str,
        timeout: float = SMTP_TIMEOUT_S,
        *,
        require_tls: bool = False,
    ) -> None:
        """Check the URL at once, so a typo fails at start rather than at the first send.

        Args:
            url: ``smtp://[user:pass@]host[:port]`` (STARTTLS when offered) or ``smtps://...``
                (implicit TLS).
            sender: The ``From`` address.
            timeout: Seconds to wait for the server on each operation; also the effect's
                timeout, within which a claimed send must reach DATA.
            require_tls: Refuse a server that offers no TLS, even without credentials.

        Raises:
            BadInput: The URL is not a usable SMTP URL.
        """
        self._server = _SmtpServer.parse(url)
        self._sender = sender
        self.timeout = timeout
        self._require_tls = require_tls

    def send(self, key: str, email: Email, effect: Effect | None = None) -> Receipt:
        """Send ``email`` unless an earlier holder saved a receipt for it.

        Raises:
            MailUnavailable: The server could not be reached, or refused for now (4xx).
            MailFailed: The server could not be verified, or refused the email for good.
            LeaseLost: The run's lease was lost before DATA; nothing was delivered.
        """
        _check_key(key)
        if effect is not None and effect.earlier is not None:
            return Receipt(id=Receipt.from_json(effect.earlier).id, sent=False)
        self._deliver(_message(key, email, self._sender), effect)
        receipt = Receipt(id=key, sent=True)
        if effect is not None:
            effect.accepted(receipt.to_json())
        return receipt

    def _deliver(self, message: EmailMessage, effect: Effect | None) -> None:
        server = self._server
        envelope = _Envelope.of(message)
        try:
            client = server.open(self.timeout, require_tls=self._require_tls)
            try:
                refused = envelope.announce(client)
                # Between RCPT and DATA: the last point at which the email can still be held
                # back; once DATA is answered it is delivered.
                if effect is not None:
                    effect.confirm()
                envelope.transmit(client)
            finally:
                # The email is accepted once DATA is answered; a failing QUIT must not make a
                # delivered email look failed, or the retry would send it again.
                with contextlib.suppress(smtplib.SMTPException, OSError):
                    client.quit()
                client.close()
        except ssl.SSLCertVerificationError as exc:
            raise MailFailed(
                f"SMTP {server.where}: certificate not trusted ({exc.verify_message}); nothing "
                "was sent; check the host in DIGEST_SMTP_URL is the name on its certificate, "
                "or point SSL_CERT_FILE at the CA that signed it"
            ) from None
        except ssl.SSLError as exc:
            raise MailFailed(
                f"SMTP {server.where}: TLS handshake failed ({exc.reason or exc}); check that "
                "the port speaks TLS at once for smtps:// (usually 465), or use smtp:// for "
                "STARTTLS (usually 587)"
            ) from None
        except smtplib.SMTPException as exc:
            failure = MailUnavailable if _temporary(exc) else MailFailed
            raise failure(_smtp_problem(server.where, exc)) from None
        except OSError as exc:
            raise MailUnavailable(
                f"cannot reach SMTP server {server.where} ({exc.strerror or exc}); "
                "check DIGEST_SMTP_URL and that the server is running"
            ) from None
        if refused:
            log.warning(
                "SMTP %s refused some recipients of %s: %s",
                server.where,
                message["Message-ID"],
                ", ".join(sorted(refused)),
            )


@dataclass(frozen=True)
class _Envelope:
    """One message as SMTP transmits it: MAIL FROM and RCPT TO first, then DATA.

    ``smtplib.send_message`` does all three in one call; they are apart here so a delivery can
    decide, after the server accepted the recipients, whether to send the content at all.
    """

    sender: str
    recipients: tuple[str, ...]
    content: bytes
    international: bool

    @classmethod
    def of(cls, message: EmailMessage) -> _Envelope:
        sender = parseaddr(str(message["From"]))[1]
        recipients = tuple(address for _, address in getaddresses([str(message["To"])]))
        international = not all(address.isascii() for address in (sender, *recipients))
        # As smtplib.send_message flattens it: CRLF line ends, UTF-8 headers only if needed.
        policy = email_policy.SMTPUTF8 if international else email_policy.SMTP
        return cls(sender, recipients, message.as_bytes(policy=policy), international)

    def announce(self, client: smtplib.SMTP) -> dict[str, tuple[int, bytes]]:
        """MAIL FROM and RCPT TO; returns the recipients refused while others were accepted.

        Raises:
            smtplib.SMTPException: The sender, or every recipient, was refused.
        """
        options: list[str] = []
        if self.international:
            if not client.has_extn("smtputf8"):
                raise smtplib.SMTPNotSupportedError(
                    "a non-ASCII address needs SMTPUTF8, which the server does not offer"
                )
            options = ["SMTPUTF8", "BODY=8BITMIME"]
        code, reply = client.mail(self.sender, options)
        if code != 250:
            raise smtplib.SMTPSenderRefused(code, reply, self.sender)
        refused: dict[str, tuple[int, bytes]] = {}
        for address in self.recipients:
            code, reply = client.rcpt(address)
            if code not in (250, 251):
                refused[address] = (code, reply)
        if len(refused) == len(self.recipients):
            raise smtplib.SMTPRecipientsRefused(refused)
        return refused

    def transmit(self, client: smtplib.SMTP) -> None:
        """DATA: the server answers 250 once it has taken responsibility for the email.

        Raises:
            smtplib.SMTPDataError: The server refused the content.
        """
        code, reply = client.data(self.content)
        if code != 250:
            raise smtplib.SMTPDataError(code, reply)


@dataclass(frozen=True)
class _SmtpServer:
    host: str
    port: int
    tls: bool
    user: str | None
    password: str | None = field(repr=False)

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, url: str) -> _SmtpServer:
        parts = urlsplit(url)
        shown = redact(url)
        example = "for example smtp://localhost:1025 or smtps://user:pass@smtp.example.com"
        if parts.scheme not in ("smtp", "smtps"):
            raise BadInput(f"DIGEST_SMTP_URL {shown!r}: scheme must be smtp or smtps; {example}")
        if not parts.hostname:
            raise BadInput(f"DIGEST_SMTP_URL {shown!r}: names no host; {example}")
        try:
            port = parts.port
        except ValueError:
            raise BadInput(
                f"DIGEST_SMTP_URL {shown!r}: the port must be a number from 1 to 65535; {example}"
            ) from None
        tls = parts.scheme == "smtps"
        return cls(
            host=parts.hostname,
            port=port or (465 if tls else 25),
            tls=tls,
            user=None if parts.username is None else unquote(parts.username),
            password=None if parts.password is None else unquote(parts.password),
        )

    def open(self, timeout: float, *, require_tls: bool) -> smtplib.SMTP:
        """A session that is connected, verified and logged in, in that order.

        Raises:
            ssl.SSLError: TLS failed, the certificate check included; nothing was sent.
            MailFailed: The server offers no STARTTLS and plaintext is not allowed.
            smtplib.SMTPException, OSError: The server refused or could not be reached.
        """
        # The system's trust store; OpenSSL adds SSL_CERT_FILE / SSL_CERT_DIR when set. Built
        # per session, so a CA file changed on disk is read by the next send.
        context = ssl.create_default_context()
        if self.tls:
            client: smtplib.SMTP = smtplib.SMTP_SSL(
                self.host, self.port, timeout=timeout, context=context
            )
        else:
            client = smtplib.SMTP(self.host, self.port, timeout=timeout)
        try:
            if not self.tls:
                client.ehlo()
                if client.has_extn("starttls"):
                    client.starttls(context=context)
                    client.ehlo()  # the capabilities before TLS are not to be trusted
                elif self.user is not None or require_tls:
                    raise MailFailed(self._plaintext_refused(require_tls))
            if self.user is not None:
                client.login(self.user, self.password or "")
        except BaseException:
            client.close()
            raise
        return client

    def _plaintext_refused(self, require_tls: bool) -> str:
        why = (
            "DIGEST_SMTP_REQUIRE_TLS=1 refuses plaintext"
            if require_tls
            else "the password in DIGEST_SMTP_URL is never sent in clear"
        )
        return (
            f"SMTP {self.where} does not offer STARTTLS and {why}; nothing was sent; use "
            "smtps:// or enable STARTTLS on the server"
        )


def _message(key: str, email: Email, sender: str) -> EmailMessage:
    message = EmailMessage()
    message["From"] = sender
    message["To"] = email.to
    message["Subject"] = email.subject
    message["Date"] = formatdate(usegmt=True)
    message["Message-ID"] = f"<{_safe_token(key)}@{MESSAGE_ID_DOMAIN}>"
    message["Idempotency-Key"] = key
    message.set_content(email.body)
    return message


def _temporary(exc: smtplib.SMTPException) -> bool:
    """Whether the server may accept the same email later: a dropped connection, or 4xx."""
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        return True
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        return all(400 <= code < 500 for code, _ in exc.recipients.values())
    return isinstance(exc, smtplib.SMTPResponseException) and 400 <= exc.smtp_code < 500


def _smtp_problem(where: str, exc: smtplib.SMTPException) -> str:
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        address, (code, text) = next(iter(exc.recipients.items()))
        return (
            f"SMTP {where} refused the recipient {address} ({code} {_one_line(text)}); "
            "check DIGEST_TO"
        )
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        return (
            f"SMTP {where} rejected the login ({exc.smtp_code} {_one_line(exc.smtp_error)}); "
            "check the user and password in DIGEST_SMTP_URL"
        )
    if isinstance(exc, smtplib.SMTPSenderRefused):
        return (
            f"SMTP {where} refused the sender {exc.sender} "
            f"({exc.smtp_code} {_one_line(exc.smtp_error)}); use a sender the server accepts"
        )
    if isinstance(exc, smtplib.SMTPResponseException):
        return (
            f"SMTP {where} answered {exc.smtp_code} {_one_line(exc.smtp_error)}; "
            "check the server's log and relay rules, then retry the run"
        )
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        return (
            f"SMTP {where} closed the connection ({_one_line(str(exc))}); "
            "check that it speaks SMTP on that port (smtps:// for implicit TLS) and retry"
        )
    return f"SMTP {where} failed ({_one_line(str(exc))}); check DIGEST_SMTP_URL and retry"


def _one_line(text: bytes | str) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return " ".join(text.split())


def _check_key(key: str) -> None:
    # The key travels in a mail header and names a file: it must be one printable line.
    if not key or _CONTROL_CHARS.search(key):
        raise ValueError(f"idempotency key must be a non-empty printable line, got {key!r}")


def _safe_token(key: str) -> str:
    """The key as a file name and Message-ID part; distinct keys stay distinct."""
    if len(key) <= 128 and _PLAIN_KEY.fullmatch(key):
        return key
    readable = _UNSAFE_CHARS.sub("_", key)[:96]
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{readable}-{digest}"


def _fsync_directory(directory: Path) -> None:
    # The new name is durable only once the directory entry is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
