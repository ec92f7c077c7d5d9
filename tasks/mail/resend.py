"""Sending the digest through Resend's HTTP API, once per idempotency key.

Resend closes the window the fenced effect leaves open (a holder that died after the email went
out, before its receipt was saved): a ``POST /emails`` that repeats an ``Idempotency-Key`` with
the same payload within 24 hours answers the first email's id and sends nothing. So a send that
*may* have happened is not an error to avoid but one to repeat, under the same key; that is what
``ResendMailer.deduplicates`` tells the caller.

What matters after a failed request is whether Resend may have acted on it, and the answer
decides whether the effect's claim is released:

================================================  ==========================  ================
answer                                            raised                      claim
================================================  ==========================  ================
connection refused, DNS or TLS failure, no        ``MailUnavailable``         released
connection in time (nothing left this process)
400, 401, 403, 404, 405, 422 (refused as such)    ``MailFailed``              released
409 ``invalid_idempotent_request``                ``MailFailed``              released
read or write timeout, connection dropped         ``MailUnavailable``         ambiguous
409 ``concurrent_idempotent_requests``, 429, 5xx  ``MailUnavailable``         ambiguous
2xx without an id, any other status               ``MailFailed``              ambiguous
================================================  ==========================  ================

An ambiguous claim (the failure came after ``effect.confirm()``, and the send did not release
it) is the conservative answer: the retry repeats the send under the same key, which Resend
answers with the first id if the email did go out.

The payload is a pure function of the key, the email and the sender (no date, nothing random):
Resend compares a repeat's payload with the first, and a different one is refused with 409
``invalid_idempotent_request`` instead of being deduplicated.

Rejected designs, where the next reader would try them:

- Retrying inside ``send`` (as the SDKs do): the journal's retry is the one retry loop; it
  re-claims the effect and re-confirms the lease, which a loop in here would not.
- One ``httpx2.Client`` per mailer: a client built before Celery's prefork would share its pool
  with every child, and a keep-alive connection idle for a week is a stale one. A weekly send
  pays for one new connection instead.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx2

from journal.logs import MASK, redact
from tasks.errors import BadInput, MailFailed, MailUnavailable
from tasks.mail.message import Email, Receipt
from tasks.mail.smtp import SendEffect, check_key, message_id, safe_token

DEFAULT_BASE_URL = "https://api.resend.com"
RESEND_TIMEOUT_S = 30.0
USER_AGENT = "durable-digest"

# Resend takes an Idempotency-Key of 1-256 characters; an HTTP header carries visible ASCII.
_HEADER_KEY = re.compile(r"[!-~]{1,256}")
_API_KEY = re.compile(r"[!-~]+")
# Answers in which Resend refused the request as such: it was not sent.
_REFUSED = frozenset({400, 401, 403, 404, 405, 422})
_KEY_REFUSED = frozenset({"missing_api_key", "invalid_api_key", "restricted_api_key"})
_QUOTA = frozenset({"daily_quota_exceeded", "monthly_quota_exceeded"})
# Resend's own words go into a one-line error; a longer body is not Resend's.
_MAX_WORDS = 300
_EXAMPLE = f"for example {DEFAULT_BASE_URL}"
_REPEAT = "the retry repeats it under the same Idempotency-Key, which Resend sends at most once"


@dataclass(frozen=True)
class _Failure:
    """A failed send: the error to raise, and whether Resend certainly sent nothing."""

    error: MailFailed
    sent_nothing: bool


class ResendMailer:
    """Delivery through Resend's ``POST /emails``, under the run's idempotency key.

    Attributes:
        timeout: seconds Resend has to connect, take the request and answer (each); also the
            effect's timeout, after which a later holder may repeat the send. A request still
            in flight then is harmless: the repeat gets 409 ``concurrent_idempotent_requests``
            (try later) or the first id.
        deduplicates: Resend drops a repeat of the same key, so a send that may have
            happened can be repeated under it.
        base_url: the API's root, without a trailing slash.
    """

    deduplicates = True

    def __init__(
        self,
        api_key: str,
        sender: str,
        base_url: str = DEFAULT_BASE_URL,
        timeout: float = RESEND_TIMEOUT_S,
    ) -> None:
        """Check the key and the URL at once, so a typo fails at start, not at the first send.

        Args:
            api_key: A Resend API key that may send (``re_...``); never shown anywhere.
            sender: The ``from`` address, on a domain verified in Resend.
            base_url: Resend's API, or a stand-in for it; ``http://`` only on loopback.
            timeout: See the class's attributes.

        Raises:
            BadInput: The key or the URL cannot be used.
        """
        if not api_key.strip():
            raise BadInput(
                "RESEND_API_KEY is empty; set it to an API key from the Resend dashboard"
            )
        if not _API_KEY.fullmatch(api_key):
            raise BadInput(
                "RESEND_API_KEY holds spaces, line breaks or non-ASCII characters; "
                "copy the key again from the Resend dashboard"
            )
        self._api_key = api_key
        self.base_url = _checked_base_url(base_url, api_key)
        self._sender = sender
        self.timeout = timeout

    def __repr__(self) -> str:
        return (
            f"ResendMailer(base_url={self.base_url!r}, sender={self._sender!r}, "
            f"timeout={self.timeout:g})"
        )

    def send(self, key: str, email: Email, effect: SendEffect | None = None) -> Receipt:
        """Send ``email`` unless an earlier holder saved a receipt for it.

        A repeat that Resend deduplicated answers like the first request, so ``sent`` is True
        for both; ``sent=False`` means the receipt came from ``effect.earlier``.

        Raises:
            MailUnavailable: Resend could not be reached, or may have sent the email and
                should be asked again later under the same key (timeout, 5xx, 429).
            MailFailed: Resend refused the email; the message says what to fix.
            LeaseLost: The run's lease or the effect's claim was lost before the request.
        """
        check_key(key)
        if effect is not None and effect.earlier is not None:
            return Receipt(id=Receipt.from_json(effect.earlier).id, sent=False)
        token = key if _HEADER_KEY.fullmatch(key) else safe_token(key)
        payload = {
            "from": self._sender,
            "to": [email.to],
            "subject": email.subject,
            "text": email.body,
            "headers": {"Message-ID": message_id(key)},
        }
        if effect is not None:
            effect.confirm()
        answer = self._post(token, payload, effect)
        outcome = self._read(answer) if isinstance(answer, httpx2.Response) else answer
        if isinstance(outcome, _Failure):
            if outcome.sent_nothing and effect is not None:
                effect.release()
            raise outcome.error
        receipt = Receipt(id=outcome, sent=True)
        if effect is not None:
            effect.accepted(receipt.to_json())
        return receipt

    def _post(
        self, token: str, payload: dict[str, Any], effect: SendEffect | None
    ) -> httpx2.Response | _Failure:
        """The one request; every transport error is translated here, and only here."""
        client = httpx2.Client(timeout=self.timeout, follow_redirects=False)
        try:
            if effect is not None:
                effect.last_moment()  # the next line sends
            return client.post(
                f"{self.base_url}/emails",
                json=payload,
                headers={
                    "Authorization": f"Bearer {self._api_key}",
                    "Idempotency-Key": token,
                    "User-Agent": USER_AGENT,
                },
            )
        except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout) as exc:
            # No connection was made, so no byte of the request left this process.
            return _Failure(
                MailUnavailable(
                    f"cannot reach Resend at {self.base_url} ({self._words(exc)}); nothing was "
                    "sent; check RESEND_BASE_URL and that this host can reach it"
                ),
                sent_nothing=True,
            )
        except httpx2.TimeoutException:
            return _Failure(
                MailUnavailable(
                    f"Resend at {self.base_url} did not answer within {self.timeout:g}s; the "
                    f"email may have been sent; {_REPEAT}"
                ),
                sent_nothing=False,
            )
        except httpx2.RequestError as exc:
            return _Failure(
                MailUnavailable(
                    f"Resend at {self.base_url}: the connection failed mid-request "
                    f"({self._words(exc)}); the email may have been sent; {_REPEAT}"
                ),
                sent_nothing=False,
            )
        finally:
            # The answer is in hand: failing to close the connection must not make a sent
            # email look failed.
            with contextlib.suppress(Exception):
                client.close()

    def _read(self, response: httpx2.Response) -> str | _Failure:
        """The email's id, or what Resend's answer means for this send."""
        status = response.status_code
        body = _json(response)
        if 200 <= status < 300:
            email_id = body.get("id")
            if isinstance(email_id, str) and email_id:
                return email_id
            return _Failure(
                MailFailed(
                    f"Resend at {self.base_url} answered {status} with no email id; the email "
                    f"may have been sent; check that RESEND_BASE_URL is Resend's API, {_EXAMPLE}"
                ),
                sent_nothing=False,
            )
        name = self._words(body.get("name") or "")
        said = self._said(status, name, body.get("message") or response.reason_phrase)
        if status in _REFUSED or (status == 409 and name == "invalid_idempotent_request"):
            return _Failure(
                MailFailed(
                    f"Resend at {self.base_url} refused the email: {said}; nothing was sent; "
                    f"{_fix(status, name)}"
                ),
                sent_nothing=True,
            )
        if status == 429:
            wait = _retry_after(response)
            advice = f"retry after {wait}" if wait else "Resend gave no retry-after"
            if name in _QUOTA:
                advice += "; the plan's sending quota is used up: wait for it to reset, or raise it"
            return _Failure(
                MailUnavailable(f"Resend at {self.base_url} answered {said}; {advice}; {_REPEAT}"),
                sent_nothing=False,
            )
        if status == 409 or status >= 500:
            return _Failure(
                MailUnavailable(
                    f"Resend at {self.base_url} answered {said}; the email may have been sent; "
                    f"{_REPEAT}"
                ),
                sent_nothing=False,
            )
        return _Failure(
            MailFailed(
                f"Resend at {self.base_url} answered {said}, unexpected for a send; the email "
                f"may have been sent; check that RESEND_BASE_URL is Resend's API, {_EXAMPLE}"
            ),
            sent_nothing=False,
        )

    def _said(self, status: int, name: str, message: object) -> str:
        words = self._words(message)
        return f"{status} {name} ({words})" if name else f"{status} ({words})"

    def _words(self, text: object) -> str:
        """``text`` as one short line, with no secret in it: it goes into an error message."""
        line = " ".join(str(text).split())[:_MAX_WORDS]
        return redact(line.replace(self._api_key, MASK))


def _fix(status: int, name: str) -> str:
    """What to do about a refusal, from its status and Resend's name for it."""
    if status == 401 or name in _KEY_REFUSED:
        return "check RESEND_API_KEY"
    if status == 403:
        return (
            "check that DIGEST_FROM is on a domain verified in Resend and that RESEND_API_KEY "
            "may send from it"
        )
    if status in (404, 405):
        return f"check that RESEND_BASE_URL is Resend's API, {_EXAMPLE}"
    if status == 409:
        return (
            "an earlier attempt under this key sent another email (DIGEST_FROM or the draft "
            "changed), which may have been delivered; check Resend's log before sending again"
        )
    return "check DIGEST_FROM and DIGEST_TO against what Resend names"


def _json(response: httpx2.Response) -> dict[str, Any]:
    """The answer's JSON object, or an empty one: a proxy's HTML page is not Resend's."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _retry_after(response: httpx2.Response) -> str:
    """Resend's ``retry-after`` as ``7s``, or "" when it gave none in seconds."""
    raw = response.headers.get("retry-after", "").strip()
    try:
        seconds = float(raw)
    except ValueError:
        return ""
    return f"{seconds:g}s" if 0 <= seconds < 1e9 else ""


def _checked_base_url(url: str, api_key: str) -> str:
    """``url`` without its trailing slash, if it can carry the API key safely.

    Raises:
        BadInput: Not an http(s) URL with a host, or one that would leak the key.
    """
    shown = redact(url).replace(api_key, MASK)
    refuse = f"RESEND_BASE_URL {shown!r}"
    if re.search(r"\s", url):
        raise BadInput(f"{refuse}: contains spaces or line breaks; {_EXAMPLE}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a malformed address, or a port that is no number below 65536
        parts, port = None, 0
    if parts is None or port == 0:
        raise BadInput(
            f"{refuse}: not a URL, or its port is not a number from 1 to 65535; {_EXAMPLE}"
        )
    if parts.scheme not in ("https", "http"):
        raise BadInput(f"{refuse}: the scheme must be https; {_EXAMPLE}")
    if not parts.hostname:
        raise BadInput(f"{refuse}: names no host; {_EXAMPLE}")
    if parts.username is not None or parts.password is not None:
        raise BadInput(
            f"{refuse}: must carry no user or password (the key goes in RESEND_API_KEY); {_EXAMPLE}"
        )
    if parts.query or parts.fragment:
        raise BadInput(f"{refuse}: must have no query or fragment; {_EXAMPLE}")
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise BadInput(
            f"{refuse}: http would send RESEND_API_KEY in clear; use https (http is for a "
            f"stand-in on this host only), {_EXAMPLE}"
        )
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
