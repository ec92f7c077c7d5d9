"""The digest over real SMTP: a crash between delivery and record sends nothing more."""

from __future__ import annotations

import pytest

from tests.fakes.smtp import Inbox
from tests.support import RUN, Deployment, wait_until

pytestmark = pytest.mark.slow


def lease_free(deployment: Deployment) -> bool:
    return deployment.view(RUN).lease_holder is None


def test_a_crash_after_smtp_accepted_the_email_sends_nothing_more(
    deployment: Deployment, inbox: tuple[Inbox, str]
) -> None:
    handler, url = inbox
    deployment.env.update(DIGEST_SMTP_URL=url, DIGEST_LEASE_TTL="1")

    crashed = deployment.cli("run", RUN, env={"CRASH": "before-save:send"})
    assert crashed.returncode == 137
    assert len(handler.messages) == 1
    wait_until(lambda: lease_free(deployment), 10, "the crashed run's lease to expire")

    resumed = deployment.cli("run", RUN)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[-1] == (
        "sent: 8 items, 0 model calls in this attempt, "
        f"email already sent earlier, not resent (digest-{RUN})"
    )
    assert len(handler.messages) == 1
    message = handler.messages[0]
    assert message["Message-ID"] == f"<digest-{RUN}@durable-digest>"
    assert message["Idempotency-Key"] == f"digest-{RUN}"
    assert message["Subject"] == f"Your weekly digest ({RUN})"
    effects = deployment.runtime().journal.keys("digest", RUN).effects
    receipt = deployment.client().hget(effects, "send:receipt")  # saved, fenced, by fence 1
    assert receipt is not None and f"digest-{RUN}".encode() in receipt
    assert deployment.outbox() == []  # SMTP replaced the file outbox

    again = deployment.cli("run", RUN)
    assert again.stdout.strip() == (
        "already-done: ended earlier (sent: 8 items, email already sent earlier, not resent "
        f"(digest-{RUN})); nothing ran in this attempt"
    )
    assert len(handler.messages) == 1
