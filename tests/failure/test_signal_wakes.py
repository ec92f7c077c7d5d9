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

BOUND = 2.0


def test_approve_to_email_with_a_worker_and_no_beat(deployment: Deployment) -> None:
    deployment.env.update(DIGEST_OFFLINE="1", DIGEST_SWEEP_INTERVAL="3600")
    waiting = deployment.cli("run", RUN, "--approval")
    assert "waiting: signal approval" in waiting.stdout, waiting.stdout + waiting.stderr
    deployment.worker("a", concurrency=1)

    started = time.monotonic()
    approved = deployment.cli("approve", RUN)
    wait_until(deployment.outbox, 10, "the approved digest to be sent", every=0.01)
    took = time.monotonic() - started

    assert approved.returncode == 0, approved.stderr
    assert "a worker resumes it now" in approved.stdout
    assert took < BOUND, took
    wait_until(lambda: deployment.view(RUN).status == "done", 10, "the run to finish")
    assert len(deployment.outbox()) == 1
    print(f"approve to email, worker and no beat: {took:.2f}s (the approve command included)")
