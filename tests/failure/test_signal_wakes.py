"""A signal wakes its run at once: approve to email with a worker and no beat.

The approval is stored, and the Celery integration enqueues the run in the same command; the
due index keeps it as the safety net. No beat runs here, so no sweep could have woken it.
"""

from __future__ import annotations

import time

import pytest

from tests.failure.conftest import RUN, wait_until
from tests.support import Deployment

pytestmark = pytest.mark.slow

# Only a wake at once sends the email within this: the sweep runs once an hour here, and no
# beat runs it at all. How long it takes is a figure, printed, not a bound a loaded machine
# can miss.
SENT_WITHIN_S = 30.0


def test_approve_to_email_with_a_worker_and_no_beat(deployment: Deployment) -> None:
    deployment.env.update(DIGEST_OFFLINE="1", DIGEST_SWEEP_INTERVAL="3600")
    waiting = deployment.cli("run", RUN, "--approval")
    assert "waiting: signal approval" in waiting.stdout, waiting.stdout + waiting.stderr
    deployment.worker("a", concurrency=1)

    started = time.monotonic()
    approved = deployment.cli("approve", RUN)
    wait_until(deployment.outbox, SENT_WITHIN_S, "the approved digest to be sent", every=0.01)
    took = time.monotonic() - started

    assert approved.returncode == 0, approved.stderr
    assert "a worker resumes it now" in approved.stdout
    wait_until(lambda: deployment.view(RUN).status == "done", 10, "the run to finish")
    assert len(deployment.outbox()) == 1
    print(f"approve to email, worker and no beat: {took:.2f}s (the approve command included)")
