"""A worker frozen inside the send: it delivers nothing more, whatever phase it froze in.

Worker A's pool child is stopped with SIGSTOP while a real SMTP server on loopback holds its
reply at one phase of A's session; A's lease (2 s) expires. Worker B gets a second delivery
and takes the lease (fence 2). A is then resumed:

- frozen at EHLO (connected, session not started) or after RCPT (recipient taken, no DATA):
  A has not confirmed, so it holds no claim (the confirmation takes it): B sends at once,
  with nothing to wait for. A re-confirms its lease before DATA, finds it gone and quits (or
  its socket times out as it wakes, and the failure is reported as the lease loss it is):
  exactly one message;
- frozen after its confirmation, its DATA command not yet answered: A's claim is confirmed.
  A being alive (stopped, not gone), B waits until that claim's timeout
  (``DIGEST_SMTP_TIMEOUT``, 8 s here) has passed, finds the send ambiguous and waits for a
  decision. A wakes,
  writes the content, finds its claim's timeout passed at the instant before the end-of-data
  marker, drops the session (the server discards it) and says it never sent: the run goes on
  and B sends. Exactly one message, where the old mailer sent two;
- frozen after the marker (the server took the message, A not yet told): B finds the send
  ambiguous and waits; A wakes to the server's 250 and saves its receipt under its own claim,
  lease or not. The run finishes without sending again: one message, where it was two.

A run that waits for a decision is due again once its claimant settles; the test enqueues it
then, as beat's sweep would.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.failure.conftest import JOURNAL, RUN, fences, wait_for_status
from tests.fakes.smtp import Inbox
from tests.support import Deployment, as_text, item_ordered, wait_until

pytestmark = pytest.mark.slow

CLAIM_TIMEOUT = 8.0  # more than B's start and A's lease: B must wait for A's claim


@pytest.mark.parametrize("phase", ["EHLO", "RCPT", "DATA-COMMAND", "DATA"])
def test_a_worker_frozen_inside_the_send_delivers_nothing_more(
    phase: str, deployment: Deployment, inbox: tuple[Inbox, str]
) -> None:
    handler, url = inbox
    deployment.env.update(
        DIGEST_SMTP_URL=url, DIGEST_SMTP_TIMEOUT=str(CLAIM_TIMEOUT), DIGEST_OFFLINE="1"
    )
    reached, release = handler.hold(phase)
    a = deployment.worker("a", concurrency=1)
    assert deployment.cli("enqueue", RUN).returncode == 0
    assert reached.wait(30), a.text()
    b = deployment.worker("b", concurrency=1)  # A is held by the server meanwhile, lease kept
    [zombie] = a.children()
    os.kill(zombie, signal.SIGSTOP)
    effects = deployment.runtime().journal.keys("digest", RUN).effects
    claim = deployment.client().hget(effects, "send")
    confirmed = phase in ("DATA-COMMAND", "DATA")
    deadline = "0"
    if confirmed:
        fence, deadline, state = as_text(claim).split(":")
        assert (fence, state) == ("1", "confirmed")
    else:
        assert claim is None  # unconfirmed: no claim, and nothing for B to wait for
    try:
        frozen = time.monotonic()
        assert deployment.cli("enqueue", RUN).returncode == 0  # A's only slot is taken
        # B waits out A's confirmed claim, which may have been sent, then waits for a
        # decision, which A gives itself when it wakes.
        wait_for_status(deployment, "waiting" if confirmed else "done", 40)
        took = time.monotonic() - frozen
    finally:
        release.set()
        # The server's held answer reaches A's socket before A wakes: A's read, past its own
        # timeout, then still finds it (a restarted poll looks once) rather than timing out.
        time.sleep(0.5)
        os.kill(zombie, signal.SIGCONT)
    wait_until(lambda: "'status': 'lease-lost'" in a.text(), 20, "the frozen worker to give up")
    if confirmed:
        settled = "1:0:done" if phase == "DATA" else "1:0:released"
        wait_until(
            lambda: as_text(deployment.client().hget(effects, "send")) == settled,
            20,
            f"A to say what it did: {as_text(deployment.client().hget(effects, 'send'))}",
        )
        assert deployment.cli("enqueue", RUN).returncode == 0  # as beat's sweep would
        wait_for_status(deployment, "done", 40)

    ids = [message["Message-ID"] for message in handler.messages]
    assert ids == [f"<digest-{RUN}@durable-digest>"]
    if phase != "EHLO":  # A's session reached RCPT before B's
        recipients = 1 if phase == "DATA" else 2  # after A's 250, nobody sends again
        assert handler.recipients == ["team@example.com"] * recipients
    view = deployment.view(RUN)
    assert item_ordered(view.steps) == JOURNAL
    send = view.step("send")
    assert send is not None
    if phase == "DATA":  # A's own receipt, handed over: nothing sent again
        assert send.result == {"id": f"digest-{RUN}", "sent": False}
        assert deployment.client().hget(effects, "send") == b"1:0:done"
    else:
        assert send.result == {"id": f"digest-{RUN}", "sent": True}
        assert fences(deployment)["send"] >= 2
        assert as_text(deployment.client().hget(effects, "send")).endswith(":0:done")
    if confirmed:  # B waited out A's claim: until its deadline, A might still have acted
        assert "for its timeout" in b.text()
        assert send.finished_at >= int(deadline)
    else:  # A could not have acted before its confirmation: B waited for its lease alone
        assert "for its timeout" not in b.text()
    print(f"frozen at {phase}: {len(ids)} message(s); B waited {took:.1f}s after the freeze")
