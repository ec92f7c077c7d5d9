"""Sending the digest, once per idempotency key.

The ``send`` step is a fenced effect (``journal._effects``): claimed before it starts, its
lease confirmed right before the last step that can be undone (``effect.confirm()``: before the
outbox's link, before SMTP's DATA), the claim's timeout checked again at the instant before
the irreversible write (``effect.last_moment()``: before SMTP's end-of-data marker), its
receipt saved right after (``effect.accepted``). A receipt saved by an earlier holder comes
back as ``effect.earlier``, and the mailer sends nothing and answers ``sent=False``.

A failure after the confirmation that the mailer cannot prove happened before the write
leaves the send *ambiguous*: it may have been delivered. A mailer that ``deduplicates`` (the
outbox, one file per key; an HTTP API or relay that drops a repeat of the key) repeats it
under the same key; plain SMTP cannot, so the run waits for an operator's ``digest
mark-sent`` or ``digest resend`` (or repeats it with the same ``Message-ID`` when
``DIGEST_AMBIGUOUS_SEND=resend``).
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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email import policy as email_policy
from email.message import EmailMessage
from email.utils import formatdate, getaddresses, parseaddr
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from journal.logs import redact
from tasks.errors import BadInput, MailFailed, MailUnavailable
from tasks.mail.message import Email, Receipt

log = logging.getLogger(__name__)

MESSAGE_ID_DOMAIN = "durable-digest"
SMTP_TIMEOUT_S = 30.0

# A key that is already a safe file name and a valid Message-ID left part is used as is.
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9_-]+")
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,75}")
_LEADING_DOT = re.compile(rb"^\.", re.MULTILINE)


class SendEffect(Protocol):
    """What a mailer calls on its send's fenced effect; ``journal.Effect`` is one.

    Attributes:
        earlier: the receipt an earlier holder saved (the email went out), or None.
        confirmed: ``confirm`` passed: from here on the email may be delivered.
    """

    earlier: Any
    confirmed: bool

    def confirm(self) -> None:
        """Prove the lease right before the last step that can still be undone."""
        ...

    def last_moment(self) -> None:
        """At the instant before the write that delivers: the claim's timeout, no I/O."""
        ...

    def accepted(self, receipt: Any) -> None:
        """Save the receipt right after delivery."""
        ...

    def release(self) -> None:
        """The email was certainly not delivered."""
        ...


class Mailer(Protocol):
    """Anything that delivers an email under an idempotency key, as a fenced effect.

    Attributes:
        timeout: seconds after its claim within which a send may still pass
            ``effect.last_moment()``; a later holder waits this long (and a margin) for a
            claimant that may be alive.
        deduplicates: the receiver drops a repeat of the key, so a send that may have
            happened is repeated under it rather than left to an operator.
    """

    timeout: float
    deduplicates: bool

    def send(self, key: str, email: Email, effect: SendEffect | None = None) -> Receipt:
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
    deduplicates = True  # one file per key: a repeat finds it

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def path_for(self, key: str) -> Path:
        """The file that records ``key``'s email."""
        return self.directory / f"{safe_token(key)}.json"

    def send(self, key: str, email: Email, effect: SendEffect | None = None) -> Receipt:
        """Write the email unless a file for ``key`` exists.

        Raises:
            MailFailed: The outbox cannot be written, or holds a damaged record for ``key``.
        """
        check_key(key)
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
                effect.confirm()
                effect.last_moment()  # the link below delivers
            try:
                os.link(temp, final)
            except FileExistsError:
                receipt = self._earlier(key, final)
            else:
                _fsync_directory(self.directory)
                receipt = Receipt(id=key, sent=True)
        except OSError as exc:
            raise self._unwritable(exc) from None
        finally:
            os.unlink(temp)
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
    The content is written by this class, and right before the end-of-data marker (the
    moment the server takes responsibility) ``effect.last_moment()`` checks the claim's
    timeout with no I/O: past it, the connection is dropped without the marker, and the server
    discards the transaction. Once the marker is answered the receipt is saved with
    ``effect.accepted``; a later holder that finds it sends nothing.

    Once the marker is written, any failure (no answer in time, a reset, a 4xx or 5xx some
    servers send after queueing) leaves the send ambiguous, never released: the email may be
    in the recipient's mailbox. So does a process that dies or freezes then. A relay that
    drops a repeat of ``idempotency_header`` (Resend's relay: ``Resend-Idempotency-Key``)
    makes the mailer ``deduplicates``, and the send is repeated under the same key; without
    one, the run waits for an operator. Every copy carries the same ``Message-ID`` and
    ``Idempotency-Key`` (a label: no relay we know acts on it).

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
        idempotency_header: str | None = None,
    ) -> None:
        """Check the URL at once, so a typo fails at start rather than at the first send.

        Args:
            url: ``smtp://[user:pass@]host[:port]`` (STARTTLS when offered) or ``smtps://...``
                (implicit TLS).
            sender: The ``From`` address.
            timeout: Seconds to wait for the server on each operation; also the effect's
                timeout, within which a claimed send must reach DATA.
            require_tls: Refuse a server that offers no TLS, even without credentials.
            idempotency_header: A header the relay deduplicates on, set to the key; the mailer
                then ``deduplicates``.

        Raises:
            BadInput: The URL is not a usable SMTP URL, or the header not a header name.
        """
        self._server = _SmtpServer.parse(url)
        self._sender = sender
        self.timeout = timeout
        self._require_tls = require_tls
        if idempotency_header is not None and not _HEADER_NAME.fullmatch(idempotency_header):
            raise BadInput(
                f"DIGEST_SMTP_IDEMPOTENCY_HEADER={idempotency_header!r}: not a header name; "
                "use letters, digits and dashes, such as Resend-Idempotency-Key"
            )
        self._idempotency_header = idempotency_header
        self.deduplicates = idempotency_header is not None

    def send(self, key: str, email: Email, effect: SendEffect | None = None) -> Receipt:
        """Send ``email`` unless an earlier holder saved a receipt for it.

        Raises:
            MailUnavailable: The server could not be reached, or refused for now (4xx).
            MailFailed: The server could not be verified, or refused the email for good.
            LeaseLost: The run's lease was lost before the end of DATA; nothing was delivered.
        """
        check_key(key)
        if effect is not None and effect.earlier is not None:
            return Receipt(id=Receipt.from_json(effect.earlier).id, sent=False)
        message = _message(key, email, self._sender)
        if self._idempotency_header is not None:
            message[self._idempotency_header] = key
        self._deliver(message, effect)
        receipt = Receipt(id=key, sent=True)
        if effect is not None:
            effect.accepted(receipt.to_json())
        return receipt

    def _deliver(self, message: EmailMessage, effect: SendEffect | None) -> None:
        server = self._server
        envelope = _Envelope.of(message)
        progress = _Progress()
        try:
            client = server.open(self.timeout, require_tls=self._require_tls)
            try:
                refused = envelope.announce(client)
                # Between RCPT and DATA: the last point at which the email can still be held
                # back by a command; from here it may be delivered.
                if effect is not None:
                    effect.confirm()
                envelope.transmit(client, effect, progress)
            finally:
                progress.close(client)
        except (smtplib.SMTPException, OSError) as exc:
            if progress.marker_written:
                raise MailUnavailable(_unanswered(server.where, exc, self.timeout)) from None
            if effect is not None and effect.confirmed:
                effect.release()  # the marker never left: the server keeps nothing
            raise _refusal(server.where, exc) from None
        if refused:
            log.warning(
                "SMTP %s refused some recipients of %s: %s",
                server.where,
                message["Message-ID"],
                ", ".join(sorted(refused)),
            )


@dataclass
class _Progress:
    """How far one SMTP transaction went: what a failure means depends on it.

    Attributes:
        in_data: DATA was answered 354: only the end-of-data marker (or a dropped connection,
            which discards the transaction) ends this phase.
        marker_written: the end-of-data marker was sent: the email may be delivered.
        answered: the server answered the marker 250: the email is delivered.
    """

    in_data: bool = False
    marker_written: bool = False
    answered: bool = False

    def close(self, client: smtplib.SMTP) -> None:
        """End the session: QUIT, or a bare close wherever a reply is still owed.

        In the middle of DATA a close discards the transaction; after an unanswered marker a
        QUIT would only wait as long again for a server that has not answered.
        """
        if self.in_data and not self.answered:
            client.close()
            return
        # A failing QUIT must not make a delivered email look failed: the retry would send it.
        with contextlib.suppress(smtplib.SMTPException, OSError):
            client.quit()
        client.close()


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

    def transmit(
        self, client: smtplib.SMTP, effect: SendEffect | None, progress: _Progress
    ) -> None:
        """DATA, the content, then the end-of-data marker, which the server answers 250.

        The 250 says the server has taken responsibility for the email.

        Written here rather than by ``smtplib.SMTP.data``, so the claim's timeout is checked
        between the content and the marker: the one write that delivers.

        Raises:
            smtplib.SMTPDataError: The server refused DATA, or the content.
            EffectLate: The claim ran out before the marker; the session must be dropped.
        """
        code, reply = client.docmd("DATA")
        if code != 354:
            raise smtplib.SMTPDataError(code, reply)
        progress.in_data = True
        client.send(_dot_stuffed(self.content))
        if effect is not None:
            effect.last_moment()
        progress.marker_written = True
        client.send(b".\r\n")
        code, reply = client.getreply()
        if code != 250:
            raise smtplib.SMTPDataError(code, reply)
        progress.answered = True


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
    message["Message-ID"] = message_id(key)
    message["Idempotency-Key"] = key
    message.set_content(email.body)
    return message


def _refusal(where: str, exc: smtplib.SMTPException | OSError) -> MailFailed:
    """A failure before the end-of-data marker, as the one-line error the operator reads."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return MailFailed(
            f"SMTP {where}: certificate not trusted ({exc.verify_message}); nothing "
            "was sent; check the host in DIGEST_SMTP_URL is the name on its certificate, "
            "or point SSL_CERT_FILE at the CA that signed it"
        )
    if isinstance(exc, ssl.SSLError):
        return MailFailed(
            f"SMTP {where}: TLS handshake failed ({exc.reason or exc}); check that "
            "the port speaks TLS at once for smtps:// (usually 465), or use smtp:// for "
            "STARTTLS (usually 587)"
        )
    if isinstance(exc, smtplib.SMTPException):
        failure = MailUnavailable if _temporary(exc) else MailFailed
        return failure(_smtp_problem(where, exc))
    return MailUnavailable(
        f"cannot reach SMTP server {where} ({exc.strerror or exc}); "
        "check DIGEST_SMTP_URL and that the server is running"
    )


def _unanswered(where: str, exc: smtplib.SMTPException | OSError, timeout: float) -> str:
    """A failure after the end-of-data marker: the email may have been delivered."""
    # smtplib reports a reply that timed out as a disconnection caused by the timeout.
    if isinstance(exc, TimeoutError) or isinstance(exc.__context__, TimeoutError):
        what = f"did not answer the end of the message within {timeout:g}s"
    elif isinstance(exc, smtplib.SMTPResponseException):
        what = f"answered the end of the message {exc.smtp_code} {_one_line(exc.smtp_error)}"
    else:
        what = f"dropped the connection at the end of the message ({_one_line(str(exc))})"
    return (
        f"SMTP {where} {what}; it may have been delivered: check the recipient's mailbox, "
        "then digest mark-sent RUN or digest resend RUN"
    )


def _dot_stuffed(content: bytes) -> bytes:
    """The content as DATA carries it: a leading dot doubled, ending in CRLF (RFC 5321 4.5.2)."""
    stuffed = _LEADING_DOT.sub(b"..", content)
    return stuffed if stuffed.endswith(b"\r\n") else stuffed + b"\r\n"


def _temporary(exc: smtplib.SMTPException) -> bool:
    """Whether the server may accept the same email later: a dropped connection, or 4xx."""
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        return True
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        return all(400 <= code < 500 for code, _ in exc.recipients.values())
    return isinstance(exc, smtplib.SMTPResponseException) and 400 <= exc.smtp_code < 500


# What a server's refusal means, by its kind: the first kind the refusal is wins. ``{reply}``
# is its code and text; ``{exc.sender}`` the sender it refused.
_ANSWERS: tuple[tuple[type[smtplib.SMTPResponseException], str], ...] = (
    (
        smtplib.SMTPAuthenticationError,
        "rejected the login ({reply}); check the user and password in DIGEST_SMTP_URL",
    ),
    (
        smtplib.SMTPSenderRefused,
        "refused the sender {exc.sender} ({reply}); use a sender the server accepts",
    ),
    (
        smtplib.SMTPResponseException,
        "answered {reply}; check the server's log and relay rules, then retry the run",
    ),
)


def _smtp_problem(where: str, exc: smtplib.SMTPException) -> str:
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        address, (code, text) = next(iter(exc.recipients.items()))
        return (
            f"SMTP {where} refused the recipient {address} ({code} {_one_line(text)}); "
            "check DIGEST_TO"
        )
    for kind, template in _ANSWERS:
        if isinstance(exc, kind):
            reply = f"{exc.smtp_code} {_one_line(exc.smtp_error)}"
            return f"SMTP {where} " + template.format(reply=reply, exc=exc)
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


def check_key(key: str) -> None:
    """Refuse a key that cannot travel in a mail header or name a file.

    Raises:
        ValueError: the key is empty or not one printable line.
    """
    if not key or _CONTROL_CHARS.search(key):
        raise ValueError(f"idempotency key must be a non-empty printable line, got {key!r}")


def message_id(key: str) -> str:
    """The ``Message-ID`` of the email sent under ``key``: every copy of it carries the same."""
    return f"<{safe_token(key)}@{MESSAGE_ID_DOMAIN}>"


def safe_token(key: str) -> str:
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
