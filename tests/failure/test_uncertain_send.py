"""A send whose outcome nobody knows is never taken for one that did not happen.

Real ``digest`` processes, a real SMTP server on loopback (or the fake Resend API), the
deployment's own Valkey:

- **A late answer to the end of the message.** The server takes the message and answers the
  end-of-data marker after ``DIGEST_SMTP_TIMEOUT`` (a content filter can: no fault needed).
  The old mailer settled that send as released: the run went retrying, its report offered
  ``digest release``, and release or cancel handed its 8 items to the next week, which emailed
  them again (2 emails). Now the send is ambiguous: the run waits for a decision, release and
  cancel refuse it in one line, the next two weeks say who holds the items and how to decide,
  and ``digest mark-sent`` finishes it: 1 email, each item once.
- **A store that refuses the receipt** (out of memory under ``noeviction``) after the server
  took the message: one line, no traceback, and no second email once the store is back.
- **Transports that drop repeats**: the Resend HTTP API frozen past the timeout (1 delivery
  for 2 requests), and an SMTP relay deduplicating on ``Resend-Idempotency-Key`` (1 delivery).
- **Plain SMTP told to resend** (``DIGEST_AMBIGUOUS_SEND=resend``): the unknown send is retried,
  not waited on, and sent again at the next start under the same Message-ID (2 copies).
"""

from __future__ import annotations

import re
import subprocess
import threading
import time

import pytest
import redis

from tests.failure.conftest import wait_for_status
from tests.fakes.resend_api import API_KEY, FakeResend
from tests.fakes.smtp import Inbox, start_server
from tests.support import BIN, ROOT, RUN, Deployment, wait_until

pytestmark = pytest.mark.slow

MESSAGE_ID = f"<digest-{RUN}@durable-digest>"
DECIDE = (
    f"check the recipient's mailbox, then `digest mark-sent {RUN}` (it arrived: the run "
    f"finishes) or `digest resend {RUN}` (it did not: sent again, same Message-ID)"
)


def test_a_late_answer_to_the_end_of_data_keeps_its_items_and_is_emailed_once(
    deployment: Deployment, inbox: tuple[Inbox, str]
) -> None:
    handler, url = inbox
    deployment.env.update(DIGEST_SMTP_URL=url, DIGEST_SMTP_TIMEOUT="2", DIGEST_OFFLINE="1")
    _, answer = handler.hold("DATA")  # taken, answered only after the client gave up

    first = deployment.cli("run", RUN)
    answer.set()
    where = url.removeprefix("smtp://")
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.splitlines()[-1] == (
        f"waiting: the email may have been sent (SMTP {where} did not answer the end of the "
        "message within 2s; it may have been delivered: check the recipient's mailbox, then "
        f"digest mark-sent RUN or digest resend RUN); {DECIDE}"
    )
    assert deployment.view(RUN).effects == {"send": "ambiguous"}

    for verb in ("release", "cancel"):
        refused = deployment.cli(verb, RUN)
        done = "released" if verb == "release" else "cancelled"
        assert (refused.returncode, refused.stdout, refused.stderr) == (
            2,
            "",
            f"digest: run digest:{RUN}: its email may have been sent; nothing was {done}: "
            f"{DECIDE}\n",
        )
    for week in ("2026-w43", "2026-w44"):
        later = deployment.cli("run", week)
        assert later.returncode == 0, later.stdout + later.stderr
        assert later.stdout.splitlines()[-1] == (
            "nothing-new: 0 new items, 0 model calls in this attempt; 8 are held by "
            f"digest:{RUN} (its email may have been sent); check the recipient's mailbox, then "
            f"digest mark-sent {RUN} or digest resend {RUN}"
        )
        assert "release" not in later.stdout
    shown = deployment.cli("show", RUN).stdout
    assert f"may have been sent (SMTP {where} did not answer" in shown
    listed = deployment.cli("runs").stdout
    assert "(its email may have been sent: digest mark-sent or digest resend decides)" in listed
    assert "waiting  for a decision on send: mark-sent or resend" in shown

    marked = deployment.cli("mark-sent", RUN)
    assert marked.returncode == 0, marked.stdout + marked.stderr
    assert marked.stdout.startswith(f"marked the email of digest:{RUN} as sent")
    finished = deployment.cli("run", RUN)
    assert finished.stdout.splitlines()[-1] == (
        f"sent: 8 items, 0 model calls in this attempt, email already sent earlier, not resent "
        f"(digest-{RUN})"
    )
    after = deployment.cli("run", "2026-w45")
    assert after.stdout.splitlines()[-1] == "nothing-new: 0 items, 0 model calls in this attempt"
    assert [m["Message-ID"] for m in handler.messages] == [MESSAGE_ID]
    print("late end-of-data answer: 1 email (the old mailer: 2), each of the 8 items once")


# The line of effect_settle.lua whose write the store refuses, as the server names it.
SETTLE_WRITE = next(
    number
    for number, line in enumerate(
        (ROOT / "journal" / "lua" / "effect_settle.lua").read_text().splitlines(), start=1
    )
    if line.startswith("redis.call('HSET', KEYS[2], ARGV[2], fence")
)
REFUSALS = {
    # Full under noeviction: every write that grows memory is refused.
    "full": (
        ("maxmemory", 1),
        ("maxmemory", 0),
        "OutOfMemoryError: command not allowed when used memory > 'maxmemory'. script: on "
        f"@user_script:{SETTLE_WRITE}.",
    ),
    # Demoted to a replica (a failover's old primary): every write is refused.
    "read-only": (
        ("replicaof", "127.0.0.1 1"),
        ("replicaof", "no one"),
        "ReadOnlyError: You can't write against a read only replica. script: on "
        f"@user_script:{SETTLE_WRITE}.",
    ),
}


def refuse_writes(store: redis.Redis, how: tuple[str, object]) -> None:
    verb, value = how
    if verb == "maxmemory":
        store.config_set("maxmemory", value)  # type: ignore[arg-type]
    else:
        store.replicaof(*str(value).split())


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_a_store_that_refuses_the_receipt_is_one_line_and_never_a_second_email(
    deployment: Deployment, inbox: tuple[Inbox, str], refusal: str
) -> None:
    refuse, restore, said = REFUSALS[refusal]
    handler, url = inbox
    deployment.env.update(DIGEST_SMTP_URL=url, DIGEST_OFFLINE="1")
    store = deployment.client()
    assert store.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
    reached, answer = handler.hold("DATA")
    running = subprocess.Popen(
        [str(BIN / "digest"), "run", RUN],
        cwd=ROOT,
        env=deployment.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert reached.wait(30)
        refuse_writes(store, refuse)
    finally:
        answer.set()
        out, err = running.communicate(timeout=60)
    refuse_writes(store, restore)

    assert running.returncode == 1, out + err
    assert "Traceback" not in err, err
    [*_, line] = err.splitlines()  # after the offline summarizer's note
    assert line == (
        f"failed: run digest:{RUN}: its email was delivered, but the store refused to record it "
        f"({said}); it will not be sent again: once the store takes writes, `digest run "
        f"{RUN}` asks, and `digest mark-sent {RUN}` finishes it"
    )
    assert len(handler.messages) == 1

    again = deployment.cli("run", RUN)  # the holder is gone: at once; it may have sent
    assert again.stdout.splitlines()[-1].startswith("waiting: the email may have been sent")
    assert deployment.cli("mark-sent", RUN).returncode == 0
    finished = deployment.cli("run", RUN)
    assert finished.stdout.splitlines()[-1].endswith(
        f"email already sent earlier, not resent (digest-{RUN})"
    )
    assert [m["Message-ID"] for m in handler.messages] == [MESSAGE_ID]
    print(f"receipt refused by a {refusal} store: 1 email (the old code: 2)")


def test_a_worker_whose_receipt_the_store_refuses_sends_once_and_goes_on(
    deployment: Deployment, inbox: tuple[Inbox, str]
) -> None:
    handler, url = inbox
    deployment.env.update(DIGEST_SMTP_URL=url, DIGEST_SMTP_TIMEOUT="2", DIGEST_OFFLINE="1")
    store = deployment.client()
    reached, answer = handler.hold("DATA")
    worker = deployment.worker("a", concurrency=1)
    deployment.beat()  # the sweep delivers the run again once its lease has lapsed
    assert deployment.cli("enqueue", RUN).returncode == 0
    try:
        assert reached.wait(30), worker.text()
        store.config_set("maxmemory", 1)
    finally:
        answer.set()
    refusal = f"run digest:{RUN}: effect 'send' happened, but the store refused its receipt"
    wait_until(lambda: refusal in worker.text(), 30, "the refusal")
    store.config_set("maxmemory", 0)

    wait_for_status(deployment, "waiting", 60)  # swept, the holder gone: it may have sent
    assert deployment.view(RUN).effects == {"send": "ambiguous"}
    assert deployment.cli("mark-sent", RUN).returncode == 0  # enqueued to the worker
    wait_for_status(deployment, "done", 60)
    assert worker.process.poll() is None, "the worker must outlive a refused receipt"
    # Celery's result backend, on the same full store, logs its own failure to save the
    # task's result; no frame of ours is in any traceback.
    assert not re.search(r'File "[^"]*/(journal|tasks)/', worker.text())
    assert [m["Message-ID"] for m in handler.messages] == [MESSAGE_ID]
    print("a worker's receipt refused by the store: 1 email (the old code: 2 within 2 s)")


def test_the_resend_api_frozen_past_the_timeout_delivers_once_for_two_requests(
    deployment: Deployment,
) -> None:
    with FakeResend().start() as api:
        deployment.env.update(
            DIGEST_MAIL_URL="resend://",
            RESEND_API_KEY=API_KEY,
            RESEND_BASE_URL=api.url,
            DIGEST_SMTP_TIMEOUT="1",
            DIGEST_OFFLINE="1",
        )
        api.freeze(3)  # delivered, then no answer within the timeout
        first = deployment.cli("run", RUN)
        assert first.returncode == 1, first.stdout + first.stderr
        assert deployment.view(RUN).effects == {"send": "ambiguous"}
        again = deployment.cli("run", RUN)  # repeated under the same key: Resend drops it
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.splitlines()[-1].startswith("sent: 8 items")
        assert (len(api.deliveries), len(api.requests)) == (1, 2)
        assert {r.idempotency_key for r in api.requests} == {f"digest-{RUN}"}
    print("Resend frozen past the timeout: 1 delivery for 2 requests")


def test_a_relay_that_drops_repeats_of_its_header_delivers_once(deployment: Deployment) -> None:
    handler = Inbox(dedup_header="Resend-Idempotency-Key")
    controller = start_server(handler)
    try:
        deployment.env.update(
            DIGEST_SMTP_URL=f"smtp://127.0.0.1:{controller.port}",
            DIGEST_SMTP_IDEMPOTENCY_HEADER="Resend-Idempotency-Key",
            DIGEST_SMTP_TIMEOUT="1",
            DIGEST_OFFLINE="1",
        )
        _, answer = handler.hold("DATA")
        first = deployment.cli("run", RUN)
        answer.set()
        assert first.returncode == 1, first.stdout + first.stderr
        again = deployment.cli("run", RUN)
        assert again.returncode == 0, again.stdout + again.stderr
        assert [m["Message-ID"] for m in handler.messages] == [MESSAGE_ID]
        assert [m["Resend-Idempotency-Key"] for m in handler.dropped] == [f"digest-{RUN}"]
    finally:
        handler.release_all()
        controller.stop()
    print("deduplicating relay: 1 delivery for 2 sends")


def sending_unknown_then_resending(
    deployment: Deployment, inbox: tuple[Inbox, str], **env: str
) -> tuple[Inbox, threading.Event]:
    """Plain SMTP told to resend, whose next end of message is answered after the timeout.

    Returns:
        The inbox, and the event that lets the held answer go.
    """
    handler, url = inbox
    deployment.env.update(
        DIGEST_SMTP_URL=url,
        DIGEST_SMTP_TIMEOUT="1",
        DIGEST_AMBIGUOUS_SEND="resend",
        DIGEST_OFFLINE="1",
        **env,
    )
    _, answer = handler.hold("DATA")
    return handler, answer


def test_a_failed_run_whose_email_may_be_out_is_never_purged_from_under_its_items(
    deployment: Deployment, inbox: tuple[Inbox, str]
) -> None:
    handler, answer = sending_unknown_then_resending(deployment, inbox, DIGEST_GIVE_UP_AFTER="0")
    failed = deployment.cli("run", RUN)  # repeated, not waited on: the run can fail for good
    answer.set()
    assert failed.returncode == 1, failed.stdout + failed.stderr
    view = deployment.view(RUN)
    assert (view.status, view.effects) == ("failed", {"send": "ambiguous"})

    time.sleep(1.1)  # older than the purge's cutoff
    purged = deployment.cli("purge", "--older-than", "1s")
    assert purged.returncode == 0, purged.stdout + purged.stderr
    assert f"digest:{RUN}" not in purged.stdout
    assert deployment.view(RUN).status == "failed"  # kept, with its claims and its send

    later = deployment.cli("run", "2026-w43")
    assert later.stdout.splitlines()[-1].startswith("nothing-new: 0 new items")
    assert [m["Message-ID"] for m in handler.messages] == [MESSAGE_ID]
    print("a failed run whose email may be out, purged: kept; 1 email (the old code: 2)")


def test_with_ambiguous_send_resend_a_send_nobody_can_know_is_sent_again_at_the_next_start(
    deployment: Deployment, inbox: tuple[Inbox, str]
) -> None:
    handler, answer = sending_unknown_then_resending(deployment, inbox)
    first = deployment.cli("run", RUN)
    answer.set()
    assert first.returncode == 1, first.stdout + first.stderr
    refusal = first.stderr.splitlines()[-1]
    assert refusal.startswith(f"failed: run digest:{RUN} failed (MailUnavailable: "), refusal
    assert "the due sweep retries it" in refusal  # a retry, not a wait for an operator
    assert deployment.view(RUN).effects == {"send": "ambiguous"}

    again = deployment.cli("run", RUN)
    assert again.returncode == 0, again.stdout + again.stderr
    assert deployment.view(RUN).status == "done"
    # Sent again, not waited on: two copies, both under the run's one Message-ID.
    assert [m["Message-ID"] for m in handler.messages] == [MESSAGE_ID, MESSAGE_ID]
