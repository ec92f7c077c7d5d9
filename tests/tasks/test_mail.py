import json
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis

from tasks.errors import BadInput, MailFailed, MailUnavailable, is_transient_failure
from tasks.mail import Email, FileOutbox, Receipt, SmtpMailer
from tests.fakes.smtp import Inbox, start_server

DIGEST = Email(to="team@example.com", subject="Your weekly digest (2026-w42)", body="Hello.\n")


@pytest.fixture
def inbox() -> Iterator[tuple[Inbox, str]]:
    handler = Inbox(refuse=frozenset({"nobody@example.com"}))
    controller = start_server(handler)
    yield handler, f"smtp://127.0.0.1:{controller.port}"
    controller.stop()


def reconnect(store: redis.Redis) -> redis.Redis:
    """A new client with its own connection pool; fakeredis keeps its state in the client."""
    if isinstance(store, fakeredis.FakeRedis):
        return store
    pool = store.connection_pool
    return redis.Redis(
        connection_pool=redis.ConnectionPool(
            connection_class=pool.connection_class, **pool.connection_kwargs
        )
    )


@pytest.fixture
def receipt_key(prefix: str) -> Callable[[str], str]:
    return lambda key: f"{prefix}:receipt:{key}"


def smtp_mailer(url: str, store: redis.Redis, receipt_key: Callable[[str], str]) -> SmtpMailer:
    return SmtpMailer(url, store, receipt_key, sender="digest@example.com", timeout=5)


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


def test_repeated_sends_deliver_one_message_with_a_stable_message_id(
    inbox: tuple[Inbox, str], store: redis.Redis, receipt_key: Callable[[str], str]
) -> None:
    handler, url = inbox
    mailer = smtp_mailer(url, store, receipt_key)
    receipts = [mailer.send("digest-2026-w42", DIGEST) for _ in range(5)]

    assert receipts == [Receipt("digest-2026-w42", True)] + [Receipt("digest-2026-w42", False)] * 4
    assert len(handler.messages) == 1
    message = handler.messages[0]
    assert message["Message-ID"] == "<digest-2026-w42@durable-digest>"
    assert message["Idempotency-Key"] == "digest-2026-w42"
    assert message["From"] == "digest@example.com"
    assert message["To"] == "team@example.com"
    assert message["Subject"] == "Your weekly digest (2026-w42)"
    assert message.get_content().replace("\r\n", "\n") == "Hello.\n"
    assert json.loads(store.get(receipt_key("digest-2026-w42")) or b"") == {
        "id": "digest-2026-w42",
        "sent": True,
    }


def test_a_fresh_mailer_on_the_same_redis_sends_nothing(
    inbox: tuple[Inbox, str], store: redis.Redis, receipt_key: Callable[[str], str]
) -> None:
    handler, url = inbox
    assert smtp_mailer(url, store, receipt_key).send("digest-2026-w42", DIGEST).sent is True

    # A new mailer and, on the real server, a new connection: nothing in memory carries over.
    fresh = reconnect(store)
    assert smtp_mailer(url, fresh, receipt_key).send("digest-2026-w42", DIGEST) == Receipt(
        "digest-2026-w42", False
    )
    assert len(handler.messages) == 1

    assert smtp_mailer(url, fresh, receipt_key).send("digest-2026-w43", DIGEST).sent is True
    assert [m["Message-ID"] for m in handler.messages] == [
        "<digest-2026-w42@durable-digest>",
        "<digest-2026-w43@durable-digest>",
    ]


@pytest.mark.slow
def test_a_second_process_with_the_same_redis_sends_nothing(
    inbox: tuple[Inbox, str],
    real_redis: redis.Redis,
    shared_redis_url: str,
    prefix: str,
    receipt_key: Callable[[str], str],
) -> None:
    handler, url = inbox
    assert smtp_mailer(url, real_redis, receipt_key).send("digest-2026-w42", DIGEST).sent is True
    script = (
        "import json, redis\n"
        "from tasks.mail import Email, SmtpMailer\n"
        f"store = redis.Redis.from_url({shared_redis_url!r})\n"
        f"mailer = SmtpMailer({url!r}, store, lambda k: {prefix!r} + ':receipt:' + k, "
        "'digest@example.com')\n"
        "receipt = mailer.send('digest-2026-w42', Email('team@example.com', 's', 'b'))\n"
        "print(json.dumps(receipt.to_json()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True
    )
    assert json.loads(done.stdout) == {"id": "digest-2026-w42", "sent": False}
    assert len(handler.messages) == 1


def test_a_crash_before_the_receipt_is_saved_resends_once_with_the_same_message_id(
    inbox: tuple[Inbox, str],
    store: redis.Redis,
    receipt_key: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handler, url = inbox

    def lost(*args: object, **kwargs: object) -> None:
        raise redis.ConnectionError("connection lost")

    with monkeypatch.context() as patch:
        patch.setattr(store, "set", lost)
        with pytest.raises(redis.ConnectionError):
            smtp_mailer(url, store, receipt_key).send("digest-2026-w42", DIGEST)
    assert store.get(receipt_key("digest-2026-w42")) is None

    mailer = smtp_mailer(url, store, receipt_key)
    assert mailer.send("digest-2026-w42", DIGEST).sent is True
    assert mailer.send("digest-2026-w42", DIGEST).sent is False
    assert [m["Message-ID"] for m in handler.messages] == ["<digest-2026-w42@durable-digest>"] * 2


def test_an_unusual_key_gets_a_valid_distinct_message_id(
    inbox: tuple[Inbox, str], store: redis.Redis, receipt_key: Callable[[str], str]
) -> None:
    handler, url = inbox
    mailer = smtp_mailer(url, store, receipt_key)
    assert mailer.send("digest 2026/w42", DIGEST).sent is True
    assert mailer.send("digest_2026_w42", DIGEST).sent is True
    first, second = (m["Message-ID"] for m in handler.messages)
    assert first.startswith("<digest_2026_w42-")
    assert first.endswith("@durable-digest>")
    assert second == "<digest_2026_w42@durable-digest>"
    assert handler.messages[0]["Idempotency-Key"] == "digest 2026/w42"


def test_a_refused_recipient_is_one_line_and_stores_no_receipt(
    inbox: tuple[Inbox, str], store: redis.Redis, receipt_key: Callable[[str], str]
) -> None:
    handler, url = inbox
    mailer = smtp_mailer(url, store, receipt_key)
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
    assert store.get(receipt_key("digest-2026-w42")) is None
    # Once the address is fixed the same key still delivers: a failure is not a receipt.
    assert mailer.send("digest-2026-w42", DIGEST).sent is True
    assert len(handler.messages) == 1


def test_an_unreachable_server_is_one_line(
    store: redis.Redis, receipt_key: Callable[[str], str]
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(MailFailed) as caught:
        smtp_mailer(f"smtp://127.0.0.1:{port}", store, receipt_key).send("k", DIGEST)
    assert str(caught.value) == (
        f"cannot reach SMTP server 127.0.0.1:{port} (Connection refused); "
        "check DIGEST_SMTP_URL and that the server is running"
    )
    assert type(caught.value) is MailUnavailable  # the relay may be back later: retried
    assert is_transient_failure(caught.value)
    assert store.get(receipt_key("k")) is None


class TryLater(Inbox):
    """A relay that defers every email, as one does while its queue is full."""

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        return "451 4.3.0 try again later"


def test_a_temporary_refusal_is_transient_and_stores_no_receipt(
    store: redis.Redis, receipt_key: Callable[[str], str]
) -> None:
    controller = start_server(TryLater())
    try:
        mailer = smtp_mailer(f"smtp://127.0.0.1:{controller.port}", store, receipt_key)
        with pytest.raises(MailUnavailable) as caught:
            mailer.send("digest-2026-w42", DIGEST)
    finally:
        controller.stop()
    assert str(caught.value) == (
        f"SMTP 127.0.0.1:{controller.port} answered 451 4.3.0 try again later; check the "
        "server's log and relay rules, then retry the run"
    )
    assert is_transient_failure(caught.value)
    assert store.get(receipt_key("digest-2026-w42")) is None


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
        SmtpMailer(url, fakeredis.FakeRedis(), str, sender="digest@example.com")
    message = str(caught.value)
    assert message.startswith("DIGEST_SMTP_URL ")
    assert f": {problem}; for example smtp://localhost:1025" in message
    assert "hunter2" not in message
    assert "\n" not in message


def test_smtps_against_a_plain_server_fails_as_one_line(
    inbox: tuple[Inbox, str], store: redis.Redis, receipt_key: Callable[[str], str]
) -> None:
    handler, url = inbox
    port = url.rsplit(":", 1)[1]
    mailer = smtp_mailer(url.replace("smtp://", "smtps://"), store, receipt_key)
    with pytest.raises(MailFailed) as caught:
        mailer.send("k", DIGEST)
    message = str(caught.value)
    assert message.startswith(f"SMTP 127.0.0.1:{port}: TLS handshake failed (")
    assert message.endswith("or use smtp:// for STARTTLS (usually 587)")
    assert "\n" not in message
    assert type(caught.value) is MailFailed  # a TLS mismatch is a setting, not an outage
    assert handler.messages == []
