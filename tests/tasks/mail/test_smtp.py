import json
import threading
from pathlib import Path
from typing import Any

import pytest

from journal import Effect, Journal, Run
from journal.errors import EffectLate, LeaseLost
from journal.ops import actions as control
from tasks.errors import BadInput, MailFailed, MailUnavailable, is_transient_failure
from tasks.mail.message import Email, Receipt
from tasks.mail.smtp import FileOutbox, SmtpMailer
from tests.conftest import MakeJournal
from tests.fakes.smtp import Inbox, start_server
from tests.support import HeldPort, execute

DIGEST = Email(to="team@example.com", subject="Your weekly digest (2026-w42)", body="Hello.\n")


def smtp_mailer(url: str) -> SmtpMailer:
    return SmtpMailer(url, sender="digest@example.com", timeout=5)


def json_files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


# FileOutbox


def test_the_outbox_delivers_once_per_key(tmp_path: Path) -> None:
    outbox = FileOutbox(tmp_path / "outbox")
    assert outbox.send("digest-2026-w42", DIGEST) == Receipt(id="digest-2026-w42", sent=True)
    for _ in range(3):
        assert outbox.send("digest-2026-w42", DIGEST) == Receipt(id="digest-2026-w42", sent=False)
    assert json_files(tmp_path / "outbox") == ["digest-2026-w42.json"]
    record = json.loads((tmp_path / "outbox" / "digest-2026-w42.json").read_text())
    assert {k: record[k] for k in ("key", "to", "subject", "body")} == {
        "key": "digest-2026-w42",
        "to": "team@example.com",
        "subject": "Your weekly digest (2026-w42)",
        "body": "Hello.\n",
    }


def test_twenty_threads_sending_one_key_deliver_exactly_once(tmp_path: Path) -> None:
    outbox = FileOutbox(tmp_path)
    barrier = threading.Barrier(20)
    receipts: list[Receipt] = []
    lock = threading.Lock()

    def send(n: int) -> None:
        barrier.wait()
        receipt = outbox.send("digest-2026-w42", Email("team@example.com", "s", f"writer {n}"))
        with lock:
            receipts.append(receipt)

    threads = [threading.Thread(target=send, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(receipts) == 20
    assert sum(receipt.sent for receipt in receipts) == 1
    assert {receipt.id for receipt in receipts} == {"digest-2026-w42"}
    # Exactly one file, no temporary file left behind, and it is one writer's whole record.
    assert json_files(tmp_path) == ["digest-2026-w42.json"]
    body = json.loads((tmp_path / "digest-2026-w42.json").read_text())["body"]
    assert body.startswith("writer ")


def test_a_temporary_file_left_by_a_crashed_writer_does_not_count_as_sent(tmp_path: Path) -> None:
    (tmp_path / ".digest-2026-w42.tmp").write_text('{"key": "digest-2026-w42", "to": "te')
    assert FileOutbox(tmp_path).send("digest-2026-w42", DIGEST).sent is True
    assert FileOutbox(tmp_path).send("digest-2026-w42", DIGEST).sent is False


def test_distinct_keys_get_distinct_files_inside_the_outbox(tmp_path: Path) -> None:
    outbox = FileOutbox(tmp_path / "outbox")
    keys = ["a_b", "a/b", "a b", "../a_b", "..", "x" * 200]
    assert [outbox.send(key, DIGEST).sent for key in keys] == [True] * len(keys)
    assert [outbox.send(key, DIGEST).sent for key in keys] == [False] * len(keys)
    names = json_files(tmp_path / "outbox")
    assert len(names) == len(keys)
    assert json_files(tmp_path) == ["outbox"]
    assert all(len(name) <= 128 + len(".json") for name in names)
    assert not any(name.startswith(".") for name in names)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not a readable outbox record ("),
        ('{"key": "digest-2026-w41"}', "records another key than 'digest-2026-w42'; "),
        ("[]", "records another key than 'digest-2026-w42'; "),
    ],
)
def test_a_damaged_record_stops_the_send_instead_of_guessing(
    tmp_path: Path, content: str, problem: str
) -> None:
    outbox = FileOutbox(tmp_path)
    outbox.send("digest-2026-w42", DIGEST)
    path = outbox.path_for("digest-2026-w42")
    path.write_text(content)
    with pytest.raises(MailFailed) as caught:
        outbox.send("digest-2026-w42", DIGEST)
    message = str(caught.value)
    assert message.startswith(f"{path}: {problem}")
    assert message.endswith("restore it, or delete it to send this email again")
    assert "\n" not in message
    assert json_files(tmp_path) == ["digest-2026-w42.json"]


def test_an_outbox_that_cannot_be_created_is_one_clear_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(MailFailed) as caught:
        FileOutbox(blocker / "outbox").send("k", DIGEST)
    assert str(caught.value) == (
        f"outbox {blocker / 'outbox'}: cannot write (Not a directory); "
        "check that the directory is writable and has space"
    )


@pytest.mark.parametrize("key", ["", "two\nlines", "nul\x00"])
def test_a_key_that_is_not_one_printable_line_is_a_bug(tmp_path: Path, key: str) -> None:
    with pytest.raises(ValueError, match="idempotency key must be a non-empty printable line"):
        FileOutbox(tmp_path).send(key, DIGEST)
    assert json_files(tmp_path) == []


def test_receipts_round_trip_through_json() -> None:
    receipt = Receipt(id="digest-2026-w42", sent=False)
    assert Receipt.from_json(json.loads(json.dumps(receipt.to_json()))) == receipt
    assert receipt.to_json() == {"id": "digest-2026-w42", "sent": False}


# SmtpMailer, against a real SMTP server on loopback


def send_in_run(
    journal: Journal, mailer: SmtpMailer, run_id: str = "2026-w42", *, then: Any = None
) -> dict[str, Any]:
    """The send as the digest makes it: a fenced effect of run ``run_id``."""

    def body(run: Run) -> Any:
        def act(effect: Effect) -> Any:
            receipt = mailer.send(run.idempotency_key(), DIGEST, effect).to_json()
            if then is not None:
                then(effect)
            return receipt

        return run.effect("send", act, timeout=5)

    receipt: dict[str, Any] = execute(journal, "digest", run_id, body).result
    return receipt


class Died(Exception):
    """The process died at this point (the run fails; its next start resumes)."""


def die_once(effect: Effect) -> None:
    if effect.earlier is None:
        raise Died()


def test_a_delivered_email_is_never_sent_again_by_a_later_holder(
    inbox: tuple[Inbox, str], make_journal: MakeJournal
) -> None:
    handler, url = inbox
    journal = make_journal()
    with pytest.raises(Died):  # delivered, receipt saved, then died before the record
        send_in_run(journal, smtp_mailer(url), then=die_once)
    # A new mailer and a new journal client: only the fenced receipt carries over.
    resumed = send_in_run(make_journal(), smtp_mailer(url), then=die_once)

    assert resumed == {"id": "digest-2026-w42", "sent": False}
    assert len(handler.messages) == 1
    message = handler.messages[0]
    assert message["Message-ID"] == "<digest-2026-w42@durable-digest>"
    assert message["Idempotency-Key"] == "digest-2026-w42"
    assert message["From"] == "digest@example.com"
    assert message["To"] == "team@example.com"
    assert message["Subject"] == "Your weekly digest (2026-w42)"
    assert message.get_content().replace("\r\n", "\n") == "Hello.\n"
    assert send_in_run(journal, smtp_mailer(url), "2026-w43")["sent"] is True
    assert [m["Message-ID"] for m in handler.messages] == [
        "<digest-2026-w42@durable-digest>",
        "<digest-2026-w43@durable-digest>",
    ]


def test_a_holder_that_lost_its_lease_quits_before_data_and_delivers_nothing(
    inbox: tuple[Inbox, str], make_journal: MakeJournal
) -> None:
    handler, url = inbox
    journal = make_journal(lease_ttl=5.0)
    keys = journal.keys("digest", "2026-w42")

    def body(run: Run) -> Any:
        def act(effect: Effect) -> Any:
            journal.client.delete(keys.lease)  # expired while this holder was paused
            return mailer.send(run.idempotency_key(), DIGEST, effect)

        return run.effect("send", act, timeout=5)

    mailer = smtp_mailer(url)
    with pytest.raises(LeaseLost):
        execute(journal, "digest", "2026-w42", body)
    assert handler.messages == []
    assert handler.recipients == ["team@example.com"]  # it got as far as RCPT


class ReceiptLost:
    """The send's effect, whose receipt never reaches the store: the process died there."""

    def __init__(self, effect: Effect) -> None:
        self.effect = effect
        self.earlier = effect.earlier
        self.confirmed = False

    def confirm(self) -> None:
        self.effect.confirm()
        self.confirmed = True

    def last_moment(self) -> None:
        self.effect.last_moment()

    def accepted(self, receipt: Any) -> None:
        raise Died()

    def release(self) -> None:
        self.effect.release()


def body_dying_before_the_receipt(mailer: SmtpMailer) -> Any:
    """The digest's send, whose first holder dies after delivery, before its receipt."""

    def body(run: Run) -> Any:
        def act(effect: Effect) -> Any:
            sending = effect if effect.resumed else ReceiptLost(effect)
            return mailer.send(run.idempotency_key(), DIGEST, sending).to_json()

        return run.effect("send", act, timeout=5)

    return body


@pytest.mark.parametrize("happened", [True, False])
def test_a_send_that_may_have_happened_waits_for_a_decision_and_follows_it(
    inbox: tuple[Inbox, str], make_journal: MakeJournal, happened: bool
) -> None:
    handler, url = inbox
    journal = make_journal()
    body = body_dying_before_the_receipt(smtp_mailer(url))
    waiting = execute(journal, "digest", "2026-w42", body)
    assert (waiting.status, waiting.wait and waiting.wait.kind) == ("waiting", "decision")
    assert journal.effect_states(journal.keys("digest", "2026-w42")) == {"send": "ambiguous"}
    assert execute(journal, "digest", "2026-w42", body).status == "waiting"  # never unasked
    assert len(handler.messages) == 1

    marked = Receipt(id="digest-2026-w42", sent=True).to_json()
    control.decide(journal, "digest", "2026-w42", "send", happened=happened, receipt=marked)
    finished = execute(journal, "digest", "2026-w42", body)
    assert finished.status == "done"
    if happened:
        assert finished.result == {"id": "digest-2026-w42", "sent": False}  # not sent again
        assert len(handler.messages) == 1
    else:  # resent as asked: the same Message-ID, which receivers can drop
        assert finished.result["sent"] is True
        assert [m["Message-ID"] for m in handler.messages] == [
            "<digest-2026-w42@durable-digest>"
        ] * 2


def test_a_relay_that_drops_repeats_of_its_header_delivers_once(
    make_journal: MakeJournal,
) -> None:
    handler = Inbox(dedup_header="Resend-Idempotency-Key")
    controller = start_server(handler)
    try:
        url = f"smtp://127.0.0.1:{controller.port}"
        mailer = SmtpMailer(
            url, "digest@example.com", timeout=5, idempotency_header="Resend-Idempotency-Key"
        )
        assert mailer.deduplicates
        journal = make_journal()

        def body(run: Run) -> Any:
            def act(effect: Effect) -> Any:
                sending = effect if effect.resumed else ReceiptLost(effect)
                return mailer.send(run.idempotency_key(), DIGEST, sending).to_json()

            return run.effect("send", act, timeout=5, repeatable=mailer.deduplicates)

        with pytest.raises(Died):  # delivered, died before the receipt: may have happened
            execute(journal, "digest", "2026-w42", body)
        assert execute(journal, "digest", "2026-w42", body).result["sent"] is True  # repeated
        assert len(handler.messages) == 1
        assert [m["Resend-Idempotency-Key"] for m in handler.dropped] == ["digest-2026-w42"]
    finally:
        controller.stop()


def test_an_unanswered_end_of_data_is_ambiguous_never_released(
    inbox: tuple[Inbox, str], make_journal: MakeJournal
) -> None:
    handler, url = inbox
    handler.hold("DATA")  # taken, then no answer within the timeout (a slow content filter)
    journal = make_journal()
    mailer = SmtpMailer(url, sender="digest@example.com", timeout=1)

    def body(run: Run) -> Any:
        return run.effect(
            "send",
            lambda effect: mailer.send(run.idempotency_key(), DIGEST, effect).to_json(),
            timeout=5,
        )

    waiting = execute(journal, "digest", "2026-w42", body)
    assert waiting.wait is not None and waiting.wait.kind == "decision"
    assert waiting.wait.reason == (
        f"SMTP {url.removeprefix('smtp://')} did not answer the end of the message within 1s; "
        "it may have been delivered: check the recipient's mailbox, then digest mark-sent RUN "
        "or digest resend RUN"
    )
    assert len(handler.messages) == 1


def test_a_claim_that_ran_out_before_the_marker_drops_the_session_and_delivers_nothing(
    inbox: tuple[Inbox, str], make_journal: MakeJournal
) -> None:
    handler, url = inbox
    journal = make_journal()
    mailer = smtp_mailer(url)

    class Late(ReceiptLost):
        def last_moment(self) -> None:
            raise EffectLate("digest:2026-w42", "past its timeout in the test")

    def body(run: Run) -> Any:
        return run.effect(
            "send",
            lambda effect: mailer.send(run.idempotency_key(), DIGEST, Late(effect)),
            timeout=5,
        )

    with pytest.raises(EffectLate):
        execute(journal, "digest", "2026-w42", body)
    assert handler.messages == []
    assert handler.recipients == ["team@example.com"]  # DATA was under way, then dropped
    assert journal.effect_states(journal.keys("digest", "2026-w42")) == {"send": "released"}


def test_an_unusual_key_gets_a_valid_distinct_message_id(inbox: tuple[Inbox, str]) -> None:
    handler, url = inbox
    mailer = smtp_mailer(url)
    assert mailer.send("digest 2026/w42", DIGEST).sent is True
    assert mailer.send("digest_2026_w42", DIGEST).sent is True
    first, second = (m["Message-ID"] for m in handler.messages)
    assert first.startswith("<digest_2026_w42-")
    assert first.endswith("@durable-digest>")
    assert second == "<digest_2026_w42@durable-digest>"
    assert handler.messages[0]["Idempotency-Key"] == "digest 2026/w42"


def test_a_refused_recipient_is_one_line_and_a_failure_is_not_a_receipt(
    inbox: tuple[Inbox, str],
) -> None:
    handler, url = inbox
    mailer = smtp_mailer(url)
    bad = Email(to="nobody@example.com", subject="s", body="b")
    with pytest.raises(MailFailed) as caught:
        mailer.send("digest-2026-w42", bad)
    port = url.rsplit(":", 1)[1]
    assert str(caught.value) == (
        f"SMTP 127.0.0.1:{port} refused the recipient nobody@example.com "
        "(550 5.1.1 no such user); check DIGEST_TO"
    )
    assert type(caught.value) is MailFailed  # a 5xx: sending again unchanged cannot help
    assert not is_transient_failure(caught.value)
    assert handler.messages == []
    # Once the address is fixed the same key still delivers: a failure is not a receipt.
    assert mailer.send("digest-2026-w42", DIGEST).sent is True
    assert len(handler.messages) == 1


def test_an_unreachable_server_is_one_line() -> None:
    held = HeldPort()  # nothing listens on it, and nothing else can take it meanwhile
    try:
        port = held.port
        with pytest.raises(MailFailed) as caught:
            smtp_mailer(f"smtp://127.0.0.1:{port}").send("k", DIGEST)
    finally:
        held.close()
    assert str(caught.value) == (
        f"cannot reach SMTP server 127.0.0.1:{port} (Connection refused); "
        "check DIGEST_SMTP_URL and that the server is running"
    )
    assert type(caught.value) is MailUnavailable  # the relay may be back later: retried
    assert is_transient_failure(caught.value)


class TryLater(Inbox):
    """A relay that defers every email, as one does while its queue is full."""

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        return "451 4.3.0 try again later"


def test_a_temporary_refusal_is_transient() -> None:
    controller = start_server(TryLater())
    try:
        mailer = smtp_mailer(f"smtp://127.0.0.1:{controller.port}")
        with pytest.raises(MailUnavailable) as caught:
            mailer.send("digest-2026-w42", DIGEST)
    finally:
        controller.stop()
    # An answer to the end-of-data marker: some relays queue first and refuse after, so the
    # email may be out; the run's effect settles ambiguous (see the run-level tests).
    assert str(caught.value) == (
        f"SMTP 127.0.0.1:{controller.port} answered the end of the message 451 4.3.0 try again "
        "later; it may have been delivered: check the recipient's mailbox, then digest "
        "mark-sent RUN or digest resend RUN"
    )
    assert is_transient_failure(caught.value)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://localhost:25", "scheme must be smtp or smtps"),
        ("localhost:25", "scheme must be smtp or smtps"),
        ("smtp://", "names no host"),
        ("smtp://localhost:99999", "the port must be a number from 1 to 65535"),
        ("smtp://user:hunter2@localhost:port", "the port must be a number from 1 to 65535"),
    ],
)
def test_a_bad_url_is_refused_at_construction_without_echoing_a_password(
    url: str, problem: str
) -> None:
    with pytest.raises(BadInput) as caught:
        SmtpMailer(url, sender="digest@example.com")
    message = str(caught.value)
    assert message.startswith("DIGEST_SMTP_URL ")
    assert f": {problem}; for example smtp://localhost:1025" in message
    assert "hunter2" not in message
    assert "\n" not in message


def test_smtps_against_a_plain_server_fails_as_one_line(inbox: tuple[Inbox, str]) -> None:
    handler, url = inbox
    port = url.rsplit(":", 1)[1]
    mailer = smtp_mailer(url.replace("smtp://", "smtps://"))
    with pytest.raises(MailFailed) as caught:
        mailer.send("k", DIGEST)
    message = str(caught.value)
    assert message.startswith(f"SMTP 127.0.0.1:{port}: TLS handshake failed (")
    assert message.endswith("or use smtp:// for STARTTLS (usually 587)")
    assert "\n" not in message
    assert type(caught.value) is MailFailed  # a TLS mismatch is a setting, not an outage
    assert handler.messages == []
