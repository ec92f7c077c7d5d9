"""A durable wait with real processes: it outlives its worker and wakes on time by itself.

The approval gate is the wait: a signal wait with a timeout. While it waits no worker holds
it; beat's due sweep (every second here) is what wakes it, whether the timeout passes or a
decision arrives, and a worker killed meanwhile changes nothing.
"""

from __future__ import annotations

import json
import time

import pytest

from journal._clock import millis
from tasks.keys import DigestKeys
from tests.failure.conftest import RUN, enqueue, log_problems, task_returned, wait_for_status
from tests.support import Deployment, wait_until

pytestmark = pytest.mark.slow

TIMEOUT = 3.0
SWEEP = 1.0  # DIGEST_SWEEP_INTERVAL of every test deployment
SLACK = 4.0  # a delivery's queueing and start on a busy two-core machine


@pytest.fixture
def gated(deployment: Deployment) -> Deployment:
    """A deployment whose digests wait for approval, summarized offline by the workers."""
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        deployment.env.pop(name, None)
    deployment.env.update(DIGEST_APPROVAL="1", DIGEST_OFFLINE="1")
    assert deployment.config.sweep_interval == SWEEP
    return deployment


def outcome(deployment: Deployment) -> dict[str, object]:
    result: dict[str, object] = json.loads(deployment.view(RUN).meta["outcome"])
    return result


def seen(deployment: Deployment) -> int:
    return int(deployment.client().scard(DigestKeys(deployment.env["DIGEST_KEY_PREFIX"]).seen))


def sweeps_sent(deployment: Deployment) -> int:
    """Sweeps beat has sent so far."""
    beat_log = deployment.state_dir / "beat.log"
    return beat_log.read_text().count("Sending due task journal-sweep") if beat_log.exists() else 0


def test_a_wait_survives_a_killed_worker_and_expires_on_time_by_itself(gated: Deployment) -> None:
    gated.env["DIGEST_APPROVAL_TIMEOUT"] = str(int(TIMEOUT))
    first = gated.worker("w1", concurrency=1)
    gated.beat()
    [task_id] = enqueue(gated)

    wait_for_status(gated, "waiting", 30)
    view = gated.view(RUN)
    assert view.wait is not None and view.wait.until is not None
    assert (view.wait.kind, view.wait.signal, view.lease_holder) == ("signal", "approval", None)
    until = view.wait.until
    # The delivery returned: the worker's slot is free while the run waits.
    wait_until(lambda: f"Task tasks.digest[{task_id}] succeeded" in first.text(), 10, "the task")
    assert task_returned(gated, task_id)["status"] == "waiting"
    assert time.time() < until - 1, "the kill must come well before the timeout"

    first.kill()
    first.process.wait(timeout=10)
    second = gated.worker("w2", concurrency=1)
    ready_at = time.time()
    wait_for_status(gated, "done", until - time.time() + SWEEP + SLACK + 5)
    done_at = time.time()

    gate = gated.view(RUN).step("signal:approval")
    assert gate is not None and gate.result == {"received": False, "payload": None}
    assert gate.finished_at >= millis(until)  # never before its time
    assert done_at - max(until, ready_at) <= SWEEP + SLACK
    assert gate.fence == 2  # woken by the new worker's delivery, the run's second start
    assert gated.view(RUN).meta["starts"] == "2"
    assert outcome(gated) == {"status": "expired", "items": 0, "model_calls": 0}
    assert gated.outbox() == []
    assert seen(gated) == 0
    assert log_problems(second) == []


def test_an_approval_while_waiting_is_sent_by_the_worker_once(gated: Deployment) -> None:
    worker = gated.worker("w1", concurrency=1)
    gated.beat()
    enqueue(gated)
    wait_for_status(gated, "waiting", 30)
    view = gated.view(RUN)
    assert view.wait is not None and view.wait.until is not None
    assert view.wait.until > time.time() + 3600  # no countdown: only the sweep can wake it
    assert gated.outbox() == []

    approved = gated.cli("approve", RUN)
    assert approved.returncode == 0, approved.stderr
    decided_at = time.monotonic()
    wait_until(lambda: gated.outbox(), SWEEP + SLACK, "the approved digest to be sent")
    assert time.monotonic() - decided_at <= SWEEP + SLACK
    wait_for_status(gated, "done", 5)

    assert outcome(gated)["status"] == "sent"
    assert seen(gated) == 8
    sweeps = sweeps_sent(gated)
    wait_until(lambda: sweeps_sent(gated) >= sweeps + 2, 10, "two more sweeps")
    assert [path.name for path in gated.outbox()] == [f"digest-{RUN}.json"]
    assert log_problems(worker) == []
