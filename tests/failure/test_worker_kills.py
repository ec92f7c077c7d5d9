"""Workers killed with real signals while a model call is in flight.

Each run is held mid-way through its summaries (three recorded, the fourth call open at the
fake API), then the worker is hit. What must hold afterwards, counted exactly: the run is
done, the one email went out once, every summary recorded before the kill is replayed (never
asked of the model again), and only the call that was in flight is paid twice.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.failure.conftest import (
    CALLS,
    JOURNAL,
    RUN,
    enqueue,
    fences,
    intro_calls,
    log_problems,
    recorded,
    summary_calls,
    task_finished,
    task_result,
    task_returned,
    wait_for_status,
)
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import Deployment, Worker, wait_until

pytestmark = pytest.mark.slow

BEFORE_KILL = 3  # summaries recorded before the worker is hit; the next call is in flight
# Seconds each fake call takes, so a call that has arrived is still open when hold() follows.
CALL_TIME = 0.5


def hold_mid_summaries(deployment: Deployment, fake: FakeAnthropic) -> None:
    """Let ``BEFORE_KILL`` summaries through, then keep the next call open.

    One summary at a time (``DIGEST_CONCURRENCY=1``, set by the caller), so exactly one call
    is in flight: the one after the recorded ones.
    """
    fake.wait_for_calls(BEFORE_KILL + 1, timeout=30)
    fake.hold()
    wait_until(
        lambda: recorded(deployment) == BEFORE_KILL,
        10,
        f"{BEFORE_KILL} summaries recorded",
    )
    assert fake.calls == BEFORE_KILL + 1, "the call in flight was answered before hold()"


def assert_resumed_once(deployment: Deployment, fake: FakeAnthropic, final_fence: int) -> None:
    """One email, each summary asked once except the one in flight, the journal complete."""
    assert fake.calls == CALLS + 1
    assert summary_calls(fake) == [1, 1, 1, 2, 1, 1, 1, 1]  # the fourth was in flight
    assert intro_calls(fake) == 1
    assert len(deployment.outbox()) == 1
    view = deployment.view(RUN)
    assert sorted(step.key for step in view.steps) == sorted(JOURNAL)
    before = JOURNAL[: BEFORE_KILL + 1]  # select and the summaries recorded before the kill
    assert {k: f for k, f in fences(deployment).items() if k in before} == dict.fromkeys(before, 1)
    after = [key for key in JOURNAL if key not in before]
    assert {k: f for k, f in fences(deployment).items() if k in after} == dict.fromkeys(
        after, final_fence
    )
    assert view.meta["starts"] == str(final_fence)
    assert view.lease_holder is None
    assert json.loads(view.meta["outcome"]) == {
        "status": "sent",
        "items": 8,
        "model_calls": 6,  # the five summaries left and the opening paragraph
        "receipt": {"id": f"digest-{RUN}", "sent": True},
    }


def child_killed_mid_call(deployment: Deployment, fake: FakeAnthropic) -> float:
    """Scenario: SIGKILL the pool child running the task; the seconds until the run is done.

    Late acks with reject-on-worker-lost hand the message back to the broker as soon as the
    worker notices the death (it polls its pool, up to about 2 s); the redelivery finds the
    dead child's lease and, the child being provably gone from this host, takes it over at
    once: the default 30 s lease, like an OOM kill in production, costs nothing.
    """
    deployment.env["DIGEST_CONCURRENCY"] = "1"
    deployment.env["DIGEST_LEASE_TTL"] = "30"
    fake.delay = CALL_TIME
    worker = deployment.worker("a", concurrency=1)
    [task] = enqueue(deployment)
    hold_mid_summaries(deployment, fake)
    [child] = worker.children()
    os.kill(child, signal.SIGKILL)
    killed = time.monotonic()
    fake.release()
    fake.delay = 0
    wait_for_status(deployment, "done", 20)
    recovery = time.monotonic() - killed

    assert_resumed_once(deployment, fake, final_fence=2)
    result = task_finished(deployment, task)
    assert result["status"] == "SUCCESS"
    assert result["result"] == {
        "run": f"digest:{RUN}",
        "status": "done",
        "result": {
            "status": "sent",
            "items": 8,
            "model_calls": 6,
            "receipt": {"id": f"digest-{RUN}", "sent": True},
        },
        "ran": len(JOURNAL) - (BEFORE_KILL + 1),
        "replayed": BEFORE_KILL + 1,
    }
    # No beat runs here: the same message came back from the broker.
    assert "WorkerLostError" in worker.text()
    return recovery


def test_pool_child_killed_mid_call_is_redelivered_at_once(
    live: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    recovery = child_killed_mid_call(live, fake_anthropic)
    # The worker noticing the death, and the rest of the run: never the 30 s lease.
    assert recovery < 8, recovery
    print(f"child SIGKILL: done {recovery:.1f}s after the kill, {fake_anthropic.calls} calls")


def whole_worker_killed_mid_run(
    live: Deployment, fake_anthropic: FakeAnthropic
) -> tuple[str, Worker, float]:
    """Worker ``a`` and beat; ``a`` SIGKILLed mid-summaries, worker ``b`` started after.

    Returns:
        The delivery's task id, worker ``b``, and the seconds from the kill to the run done.
    """
    fake_anthropic.delay = CALL_TIME
    first = live.worker("a", concurrency=1)
    live.beat()
    [task] = enqueue(live)
    hold_mid_summaries(live, fake_anthropic)
    first.kill()
    killed = time.monotonic()
    first.process.wait(timeout=10)
    fake_anthropic.release()
    fake_anthropic.delay = 0
    second = live.worker("b", concurrency=1)
    wait_for_status(live, "done", 30)
    return task, second, time.monotonic() - killed


def test_whole_worker_killed_is_recovered_by_the_sweep_not_the_visibility_timeout(
    live: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    live.env["DIGEST_CONCURRENCY"] = "1"
    config = live.config
    assert config.visibility_timeout == 3600  # the broker alone would wait an hour
    task, second, recovery = whole_worker_killed_mid_run(live, fake_anthropic)

    # The due entry is pushed to lease expiry + recovery grace at every renewal; the sweep
    # finds it within one interval. The slack covers the new worker's start and the run.
    bound = config.lease_ttl + 5.0 + config.sweep_interval
    assert recovery < bound + 4, f"recovered in {recovery:.1f}s, bound {bound:g}s"
    assert_resumed_once(live, fake_anthropic, final_fence=2)
    assert "due sweep enqueued 1 run(s)" in second.text()
    # The message the dead worker held is still unacknowledged: the sweep's delivery did it.
    assert task_result(live, task)["status"] == "STARTED"
    assert log_problems(second) == []
    print(f"worker SIGKILL: done {recovery:.1f}s after the kill (bound {bound:g}s)")


def test_sigterm_finishes_the_running_task_with_nothing_repeated(
    live: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    live.env["DIGEST_CONCURRENCY"] = "1"
    fake_anthropic.delay = CALL_TIME
    worker = live.worker("a", concurrency=1)
    [task] = enqueue(live)
    hold_mid_summaries(live, fake_anthropic)
    worker.process.send_signal(signal.SIGTERM)
    wait_until(lambda: "Warm shutdown" in worker.text(), 10, "the warm shutdown to start")
    assert worker.process.poll() is None  # it waits for the running task
    fake_anthropic.release()
    fake_anthropic.delay = 0
    assert worker.process.wait(timeout=30) == 0

    assert live.view(RUN).status == "done"
    assert fake_anthropic.calls == CALLS
    assert summary_calls(fake_anthropic) == [1] * 8
    assert intro_calls(fake_anthropic) == 1
    assert len(live.outbox()) == 1
    assert fences(live) == dict.fromkeys(JOURNAL, 1)
    assert task_returned(live, task)["ran"] == len(JOURNAL)
    assert log_problems(worker) == []


def test_sigterm_as_a_soft_shutdown_hands_the_run_back_before_a_kill(
    live: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    """The orchestrator's recipe: SIGTERM starts a bounded warm shutdown, then requeues.

    With ``REMAP_SIGTERM=SIGQUIT`` and a soft shutdown timeout, a task still running when the
    timeout ends is stopped and its message handed back to the broker before the worker exits,
    so the next worker takes it at once, with no visibility timeout and no sweep involved.
    """
    live.env.update(
        DIGEST_CONCURRENCY="1", DIGEST_SOFT_SHUTDOWN_TIMEOUT="1", REMAP_SIGTERM="SIGQUIT"
    )
    fake_anthropic.delay = CALL_TIME
    first = live.worker("a", concurrency=1)
    [task] = enqueue(live)
    hold_mid_summaries(live, fake_anthropic)  # still held when the soft timeout ends
    stopping = time.monotonic()
    first.process.send_signal(signal.SIGTERM)
    assert first.process.wait(timeout=15) == 0
    shutdown = time.monotonic() - stopping
    assert "Restoring 1 unacknowledged message(s)" in first.text()
    fake_anthropic.release()
    fake_anthropic.delay = 0
    second = live.worker("b", concurrency=1)  # no beat: the broker hands the message over
    wait_for_status(live, "done", 20)

    # The soft timeout, then stopping the child and the pool: leave the orchestrator a few
    # seconds more than the soft timeout before its SIGKILL.
    assert shutdown < 1 + 5, shutdown
    assert_resumed_once(live, fake_anthropic, final_fence=2)
    assert task_returned(live, task)["replayed"] == BEFORE_KILL + 1
    assert log_problems(second) == []
    print(f"soft shutdown: worker gone {shutdown:.1f}s after SIGTERM")
