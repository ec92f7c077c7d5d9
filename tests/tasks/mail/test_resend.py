"""ResendMailer against a fake Resend API over real HTTP: what is sent, once, and what is said.

Every test counts both sides: the requests the fake received and the emails it delivered, since
the point of the idempotency key is "1 delivery for 2 requests". The effect is a recording
stand-in with the members a send calls, so each test also shows whether the claim was released
(nothing was sent) or left (the email may have gone out, and the repeat carries the same key).
"""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from journal.errors import LeaseLost
from tasks.errors import BadInput, MailFailed, MailUnavailable
from tasks.mail.message import Email, Receipt
from tasks.mail.resend import ResendMailer
from tests.fakes.resend_api import API_KEY, FakeResend
from tests.support import HeldPort

pytestmark = pytest.mark.timeout(15)

KEY = "digest-2026-w42"
SENDER = "Digest <digest@example.com>"
DIGEST = Email(to="team@example.com", subject="Your weekly digest (2026-w42)", body="Hello.\n")
WRONG_KEY = "re_wrong_8d1f0b6a"


class RecordingEffect:
    """The effect's members a send calls, recorded in order; ``fail`` makes one raise."""

    def __init__(self, earlier: Mapping[str, Any] | None = None, fail: str | None = None) -> None:
        self.earlier = earlier
        self.confirmed = False
        self.calls: list[str] = []
        self.receipts: list[Any] = []
        self._fail = fail

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self._fail:
            raise LeaseLost("digest:2026-w42", f"{name} failed in the test")

    def confirm(self) -> None:
        self._call("confirm")
        self.confirmed = True

    def last_moment(self) -> None:
        self._call("last_moment")

    def accepted(self, receipt: Any) -> None:
        self._call("accepted")
        self.receipts.append(receipt)

    def release(self) -> None:
        self._call("release")


SENT_NOTHING = ["confirm", "last_moment", "release"]
MAY_HAVE_SENT = ["confirm", "last_moment"]
SENT = ["confirm", "last_moment", "accepted"]


def mailer(api: FakeResend, *, api_key: str = API_KEY, timeout: float = 5.0) -> ResendMailer:
    return ResendMailer(api_key=api_key, sender=SENDER, base_url=api.url, timeout=timeout)


def one_line(error: BaseException, *, secrets: tuple[str, ...] = (API_KEY,)) -> str:
    """The error's message, checked: one line, no secret, and it survives pickling (Celery)."""
    message = str(error)
    assert message
    assert "\n" not in message
    for secret in secrets:
        assert secret not in message
        assert secret not in repr(error)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == message
    return message


@pytest.fixture
def fake_resend() -> Iterator[FakeResend]:
    """A started fake Resend API; stopping it lets held answers go."""
    with FakeResend() as api:
        yield api


@pytest.fixture(autouse=True)
def no_key_in_output(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> Iterator[None]:
    """Whatever a test does, neither API key reaches a log record (any level) or the terminal."""
    caplog.set_level(logging.DEBUG)
    yield
    out, err = capsys.readouterr()
    for secret in (API_KEY, WRONG_KEY):
        assert secret not in caplog.text
        assert secret not in out
        assert secret not in err


# Sending


def test_a_send_delivers_once_under_its_idempotency_key(fake_resend: FakeResend) -> None:
    effect = RecordingEffect()
    receipt = mailer(fake_resend).send(KEY, DIGEST, effect)
    [delivery] = fake_resend.deliveries
    [request] = fake_resend.requests
    assert receipt == Receipt(id=delivery.id, sent=True)
    assert request.path == "/emails"
    assert request.idempotency_key == KEY
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert request.headers["user-agent"] == "durable-digest"
    assert request.body == {
        "from": SENDER,
        "to": ["team@example.com"],
        "subject": "Your weekly digest (2026-w42)",
        "text": "Hello.\n",
        "headers": {"Message-ID": f"<{KEY}@durable-digest>"},
    }
    assert effect.calls == SENT
    assert effect.receipts == [{"id": delivery.id, "sent": True}]


def test_the_same_key_twice_is_one_delivery_for_two_requests(fake_resend: FakeResend) -> None:
    resend = mailer(fake_resend)
    first = resend.send(KEY, DIGEST, RecordingEffect())
    second = resend.send(KEY, DIGEST, RecordingEffect())
    assert first.id == second.id == fake_resend.deliveries[0].id
    assert len(fake_resend.deliveries) == 1
    assert len(fake_resend.requests) == 2
    assert [r.idempotency_key for r in fake_resend.requests] == [KEY, KEY]
    assert fake_resend.requests[0].body == fake_resend.requests[1].body


def test_other_keys_are_other_emails(fake_resend: FakeResend) -> None:
    resend = mailer(fake_resend)
    first = resend.send("digest-2026-w42", DIGEST)
    second = resend.send("digest-2026-w43", DIGEST)
    assert first.id != second.id
    assert [d.key for d in fake_resend.deliveries] == ["digest-2026-w42", "digest-2026-w43"]


def test_a_key_unfit_for_a_header_is_sent_in_a_stable_safe_form(fake_resend: FakeResend) -> None:
    key = "digest-ünïcode-" + "x" * 300
    resend = mailer(fake_resend)
    first = resend.send(key, DIGEST)
    second = resend.send(key, DIGEST)
    assert first.id == second.id
    assert len(fake_resend.deliveries) == 1
    sent = [r.idempotency_key or "" for r in fake_resend.requests]
    assert sent[0] == sent[1]
    assert sent[0].isascii() and 1 <= len(sent[0]) <= 256
    message_id = fake_resend.requests[0].body["headers"]["Message-ID"]
    assert message_id == f"<{sent[0]}@durable-digest>"


def test_a_receipt_saved_earlier_sends_nothing(fake_resend: FakeResend) -> None:
    effect = RecordingEffect(earlier={"id": "4ef9a417-earlier", "sent": True})
    receipt = mailer(fake_resend).send(KEY, DIGEST, effect)
    assert receipt == Receipt(id="4ef9a417-earlier", sent=False)
    assert fake_resend.requests == []
    assert fake_resend.deliveries == []
    assert effect.calls == []


@pytest.mark.parametrize(
    ("failing", "calls"), [("confirm", ["confirm"]), ("last_moment", ["confirm", "last_moment"])]
)
def test_a_lost_lease_before_the_request_sends_nothing(
    fake_resend: FakeResend, failing: str, calls: list[str]
) -> None:
    effect = RecordingEffect(fail=failing)
    with pytest.raises(LeaseLost):
        mailer(fake_resend).send(KEY, DIGEST, effect)
    assert fake_resend.requests == []
    assert effect.calls == calls


# The email may have gone out: no release, and the repeat under the same key sends nothing new


def test_a_frozen_answer_is_one_delivery_for_two_requests(fake_resend: FakeResend) -> None:
    fake_resend.freeze(10)  # let go when the fake stops
    effect = RecordingEffect()
    with pytest.raises(MailUnavailable) as caught:
        mailer(fake_resend, timeout=0.5).send(KEY, DIGEST, effect)
    message = one_line(caught.value)
    assert "may have been sent" in message
    assert effect.calls == MAY_HAVE_SENT
    assert len(fake_resend.deliveries) == 1
    first_id = fake_resend.deliveries[0].id

    repeat = RecordingEffect()
    receipt = mailer(fake_resend).send(KEY, DIGEST, repeat)
    assert receipt == Receipt(id=first_id, sent=True)
    assert repeat.calls == SENT
    assert repeat.receipts == [{"id": first_id, "sent": True}]
    assert len(fake_resend.deliveries) == 1
    assert len(fake_resend.requests) == 2


def test_a_connection_dropped_after_delivery_is_repeated_without_a_second_email(
    fake_resend: FakeResend,
) -> None:
    fake_resend.drop_next()
    effect = RecordingEffect()
    with pytest.raises(MailUnavailable) as caught:
        mailer(fake_resend).send(KEY, DIGEST, effect)
    assert "may have been sent" in one_line(caught.value)
    assert effect.calls == MAY_HAVE_SENT
    receipt = mailer(fake_resend).send(KEY, DIGEST, RecordingEffect())
    assert receipt.id == fake_resend.deliveries[0].id
    assert len(fake_resend.deliveries) == 1
    assert len(fake_resend.requests) == 2


def test_a_request_under_a_key_still_in_progress_is_left_for_later(
    fake_resend: FakeResend,
) -> None:
    fake_resend.stall_next(10)  # the first request stays in progress until the fake stops
    first_failed: list[BaseException] = []

    def first() -> None:
        try:
            mailer(fake_resend, timeout=1.0).send(KEY, DIGEST, RecordingEffect())
        except MailUnavailable as error:
            first_failed.append(error)

    thread = threading.Thread(target=first)
    thread.start()
    fake_resend.wait_for_requests(1)
    effect = RecordingEffect()
    with pytest.raises(MailUnavailable) as caught:
        mailer(fake_resend).send(KEY, DIGEST, effect)
    message = one_line(caught.value)
    assert "409" in message
    assert "concurrent_idempotent_requests" in message
    assert effect.calls == MAY_HAVE_SENT
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert len(first_failed) == 1
    assert fake_resend.deliveries == []
    assert len(fake_resend.requests) == 2


def test_a_rate_limit_names_its_retry_after(fake_resend: FakeResend) -> None:
    fake_resend.fail_next(
        429,
        "rate_limit_exceeded",
        "Too many requests. Please limit the number of requests per second.",
        retry_after=7,
    )
    effect = RecordingEffect()
    with pytest.raises(MailUnavailable) as caught:
        mailer(fake_resend).send(KEY, DIGEST, effect)
    message = one_line(caught.value)
    assert "429" in message
    assert "rate_limit_exceeded" in message
    assert "retry after 7s" in message
    assert effect.calls == MAY_HAVE_SENT
    assert fake_resend.deliveries == []
    assert len(fake_resend.requests) == 1


def test_a_server_error_is_unavailable_and_the_claim_stays(fake_resend: FakeResend) -> None:
    fake_resend.fail_next(500, "internal_server_error", "An unexpected error occurred.")
    effect = RecordingEffect()
    with pytest.raises(MailUnavailable) as caught:
        mailer(fake_resend).send(KEY, DIGEST, effect)
    message = one_line(caught.value)
    assert "500" in message
    assert "An unexpected error occurred." in message
    assert effect.calls == MAY_HAVE_SENT
    assert fake_resend.deliveries == []
    assert len(fake_resend.requests) == 1


def test_an_accepted_answer_without_an_id_is_not_taken_for_a_refusal(
    fake_resend: FakeResend,
) -> None:
    fake_resend.fail_next(200, "ok", "not an email id")
    effect = RecordingEffect()
    with pytest.raises(MailFailed) as caught:
        mailer(fake_resend).send(KEY, DIGEST, effect)
    assert type(caught.value) is MailFailed
    message = one_line(caught.value)
    assert "RESEND_BASE_URL" in message
    assert effect.calls == MAY_HAVE_SENT
    assert len(fake_resend.requests) == 1


# Refused: nothing was sent, the claim is released, and the message says what to fix


def test_a_wrong_api_key_fails_naming_the_variable_not_the_key(fake_resend: FakeResend) -> None:
    effect = RecordingEffect()
    with pytest.raises(MailFailed) as caught:
        mailer(fake_resend, api_key=WRONG_KEY).send(KEY, DIGEST, effect)
    assert type(caught.value) is MailFailed
    message = one_line(caught.value, secrets=(API_KEY, WRONG_KEY))
    assert "401" in message
    assert "API key is invalid" in message
    assert "nothing was sent" in message
    assert "check RESEND_API_KEY" in message
    assert effect.calls == SENT_NOTHING
    assert fake_resend.deliveries == []
    assert len(fake_resend.requests) == 1


def test_a_missing_field_fails_with_resends_words(fake_resend: FakeResend) -> None:
    effect = RecordingEffect()
    untitled = Email(to="team@example.com", subject="", body="Hello.\n")
    with pytest.raises(MailFailed) as caught:
        mailer(fake_resend).send(KEY, untitled, effect)
    assert type(caught.value) is MailFailed
    message = one_line(caught.value)
    assert "422" in message
    assert "missing_required_field" in message
    assert "Missing `subject` field." in message
    assert "nothing was sent" in message
    assert effect.calls == SENT_NOTHING
    assert fake_resend.deliveries == []
    assert len(fake_resend.requests) == 1


def test_the_same_key_with_another_email_is_refused(fake_resend: FakeResend) -> None:
    resend = mailer(fake_resend)
    resend.send(KEY, DIGEST, RecordingEffect())
    changed = Email(to=DIGEST.to, subject=DIGEST.subject, body="Hello again.\n")
    effect = RecordingEffect()
    with pytest.raises(MailFailed) as caught:
        resend.send(KEY, changed, effect)
    assert type(caught.value) is MailFailed
    message = one_line(caught.value)
    assert "409" in message
    assert "invalid_idempotent_request" in message
    assert effect.calls == SENT_NOTHING
    assert len(fake_resend.deliveries) == 1
    assert len(fake_resend.requests) == 2


def test_an_unreachable_api_is_unavailable_and_nothing_was_sent() -> None:
    held = HeldPort()  # bound, not listening: connecting is refused
    try:
        url = f"http://127.0.0.1:{held.port}"
        resend = ResendMailer(api_key=API_KEY, sender=SENDER, base_url=url, timeout=2.0)
        effect = RecordingEffect()
        with pytest.raises(MailUnavailable) as caught:
            resend.send(KEY, DIGEST, effect)
    finally:
        held.close()
    message = one_line(caught.value)
    assert url in message
    assert "nothing was sent" in message
    assert "RESEND_BASE_URL" in message
    assert effect.calls == SENT_NOTHING


# Configuration


def test_the_mailer_is_a_deduplicating_one_with_its_timeout() -> None:
    resend = ResendMailer(api_key=API_KEY, sender=SENDER, timeout=12.5)
    assert ResendMailer.deduplicates is True
    assert resend.deduplicates is True
    assert resend.timeout == 12.5
    assert ResendMailer(api_key=API_KEY, sender=SENDER).timeout == 30.0


def test_the_api_key_is_never_in_repr(fake_resend: FakeResend) -> None:
    resend = mailer(fake_resend)
    assert API_KEY not in repr(resend)
    assert API_KEY not in str(resend)
    assert fake_resend.url in repr(resend)


@pytest.mark.parametrize(
    "url",
    [
        "api.resend.com",
        "ftp://api.resend.com",
        "https://",
        "https://api.resend.com:99999",
        "https://api.resend.com/?region=eu",
        "http://api.resend.com",
        f"https://user:{API_KEY}@api.resend.com",
    ],
)
def test_a_bad_base_url_is_refused_at_once(url: str) -> None:
    with pytest.raises(BadInput) as caught:
        ResendMailer(api_key=API_KEY, sender=SENDER, base_url=url)
    message = one_line(caught.value)
    assert message.startswith("RESEND_BASE_URL ")
    assert "https://api.resend.com" in message  # the example of a good one


@pytest.mark.parametrize("url", ["http://127.0.0.1:8025", "http://localhost:8025/", "https://x.io"])
def test_good_base_urls_are_taken(url: str) -> None:
    resend = ResendMailer(api_key=API_KEY, sender=SENDER, base_url=url)
    assert url.rstrip("/") in repr(resend)


@pytest.mark.parametrize("api_key", ["", "  ", f"{API_KEY}\n", f"{API_KEY} x", "re_ünï_1234"])
def test_an_unusable_api_key_is_refused_at_once_without_showing_it(api_key: str) -> None:
    with pytest.raises(BadInput) as caught:
        ResendMailer(api_key=api_key, sender=SENDER)
    message = one_line(caught.value, secrets=tuple(s for s in (api_key.strip(),) if s))
    assert message.startswith("RESEND_API_KEY ")
