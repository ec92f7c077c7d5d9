"""Transient failures with real processes: the system retries the run, or says it gave up.

The model API down past its attempts and the SMTP relay down at send time fail the run for
now only: it stays in the due index, beat's due sweep hands it to a worker again after the
back-off (2 s here), and it resumes from the failed step. Past ``DIGEST_GIVE_UP_AFTER`` it is
failed for good, logged at ERROR with its id, and shown as such; nothing retries it again.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from journal._clock import millis
from tasks.keys import DigestKeys
from tests.failure.conftest import (
    CALLS,
    ITEMS,
    ROOT,
    RUN,
    enqueue,
    log_problems,
    task_finished,
    wait_for_status,
)
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.smtp import Inbox, LoopbackController
from tests.support import Deployment, HeldPort, wait_until

pytestmark = pytest.mark.slow

BACKOFF = 2.0  # DIGEST_RUN_RETRY_DELAY and its cap, here
SLACK = 6.0  # a sweep (1 s), a queued delivery and a worker's start on a busy two-core machine

# What the weekly dispatcher does for a week: mark it, then enqueue it under a fixed task id.
_DISPATCH = """
import sys
from tasks import digest
digest.apply_async(args=[sys.argv[1]], task_id=f"digest-{sys.argv[1]}")
"""


@pytest.fixture
def retrying(live: Deployment) -> Deployment:
    """A deployment that retries a transiently failed run after 2 s, at most 2 s apart."""
    live.env.update(
        DIGEST_RUN_RETRY_DELAY=str(BACKOFF),
        DIGEST_RUN_RETRY_MAX_DELAY=str(BACKOFF),
        DIGEST_CONCURRENCY="1",  # one call in flight: every count below is exact
    )
    return live


def due(deployment: Deployment) -> float | None:
    """The run's time in the due index, in seconds, if it is there."""
    score = deployment.client().zscore(
        f"{deployment.env['DIGEST_KEY_PREFIX']}:due", f"digest:{RUN}"
    )
    return None if score is None else score / 1000


def test_the_model_api_down_fails_the_command_and_the_sweep_retries_it(
    retrying: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.fail_next(529, times=5, contains="<updates>")  # compose, five attempts

    failed = retrying.cli("run", RUN)

    assert failed.returncode == 1
    [line] = failed.stderr.splitlines()
    assert line.startswith(
        f"failed: run digest:{RUN} failed (ModelUnavailable: compose: the model API kept "
        "failing after 5 attempts (OverloadedError: "
    ), line
    assert "; the due sweep retries it at " in line
    assert fake_anthropic.calls == ITEMS + 5
    view = retrying.view(RUN)
    assert view.status == "retrying"
    retry_at = int(view.meta["retry_at"]) / 1000
    assert due(retrying) == retry_at
    shown = retrying.cli("show", RUN).stdout
    assert "status   retrying (next retry " in shown
    assert "transient failures so far: 1)" in shown
    listed = retrying.cli("runs").stdout
    assert f"digest:{RUN}" in listed and "retrying" in listed and "next retry" in listed

    # No person acts: a worker and beat are started, and the run is retried by itself.
    worker = retrying.worker("w1", concurrency=1)
    retrying.beat()
    wait_for_status(retrying, "done", BACKOFF + 30)

    view = retrying.view(RUN)
    compose = view.step("compose")
    assert compose is not None and compose.started_at >= millis(retry_at)  # not before its time
    assert compose.fence == 2  # the retry is the run's second start
    summary = view.step("summarize:i1")
    assert summary is not None and summary.fence == 1  # recorded by the command, replayed
    assert fake_anthropic.calls == CALLS + 5  # no summary asked twice
    assert len(retrying.outbox()) == 1
    assert not {"retry_at", "failing_since", "failures"} & set(view.meta)
    assert due(retrying) is None
    assert log_problems(worker) == []


def test_the_smtp_relay_down_at_send_time_is_retried_until_it_is_back(
    retrying: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    held = HeldPort()  # refused until the relay comes back on this very socket
    port = held.port
    retrying.env["DIGEST_SMTP_URL"] = f"smtp://127.0.0.1:{port}"  # nothing listens there yet
    keys = DigestKeys(retrying.env["DIGEST_KEY_PREFIX"])
    worker = retrying.worker("w1", concurrency=1)
    retrying.beat()

    # As the weekly dispatcher would: its marker set, the week enqueued under its task id.
    assert retrying.client().set(keys.dispatched(RUN), "2026-10-12T08:00:00+00:00", nx=True)
    subprocess.run([sys.executable, "-c", _DISPATCH, RUN], cwd=ROOT, env=retrying.env, check=True)
    wait_for_status(retrying, "retrying", 30)

    meta = retrying.view(RUN).meta
    assert meta["last_error"].startswith(
        f"MailUnavailable: cannot reach SMTP server 127.0.0.1:{port} (Connection refused)"
    )
    result = task_finished(retrying, f"digest-{RUN}")["result"]
    assert isinstance(result, dict) and result["status"] == "retrying"  # not a traceback

    # The relay comes back; the run is retried without anyone enqueueing it again.
    inbox = Inbox()
    relay = LoopbackController(inbox, hostname="127.0.0.1", port=port, sock=held.socket)
    relay.start()
    try:
        back = time.time()
        wait_for_status(retrying, "done", 2 * BACKOFF + SLACK)
        assert time.time() - back <= 2 * BACKOFF + SLACK
    finally:
        relay.stop()

    assert len(inbox.messages) == 1
    assert inbox.messages[0]["Message-ID"] == f"<digest-{RUN}@durable-digest>"
    assert fake_anthropic.calls == CALLS  # the retries resumed at send: no model call again
    assert retrying.client().exists(keys.dispatched(RUN))  # the marker stood; it blocked nothing
    assert int(retrying.view(RUN).meta["starts"]) >= 2
    assert log_problems(worker) == []


def test_past_give_up_after_the_run_fails_for_good_loudly(
    retrying: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    give_up_after = 4.0
    retrying.env.update(DIGEST_GIVE_UP_AFTER=str(give_up_after), DIGEST_RUN_RETRY_DELAY="1")
    fake_anthropic.fail_always(529)
    worker = retrying.worker("w1", concurrency=1)
    retrying.beat()
    started = time.time()

    enqueue(retrying)
    wait_until(
        lambda: "gave_up_at" in retrying.view(RUN).meta,
        give_up_after + 4 * SLACK,
        "the run to give up",
    )

    view = retrying.view(RUN)
    assert view.status == "failed"
    since, gave_up = int(view.meta["failing_since"]) / 1000, int(view.meta["gave_up_at"]) / 1000
    assert gave_up - since >= give_up_after  # not before the deadline
    assert gave_up - started <= give_up_after + 3 * SLACK
    failures = int(view.meta["failures"])
    assert failures >= 3  # the first failure, retries 1 s apart, the last on the deadline
    assert fake_anthropic.calls == 5 * failures  # five attempts of summarize:i1 each time
    # The run gives up in Redis before the worker logs it: wait for the line, do not race it.
    gave_up_line = f"run digest:{RUN} failed for good after {failures} transient failures"
    wait_until(lambda: gave_up_line in worker.text(), 10, "the worker's give-up line")
    errors = [line for line in worker.text().splitlines() if "ERROR/" in line]
    assert any(gave_up_line in line for line in errors), worker.text()
    shown = retrying.cli("show", RUN).stdout
    assert "status   failed for good (gave up " in shown
    assert f"transient failures: {failures}; not retried again)" in shown
    listed = retrying.cli("runs").stdout
    assert "failed" in listed and "for good" in listed
    assert due(retrying) is None
    assert retrying.outbox() == []

    time.sleep(3.0)  # three more sweeps: nothing retries it now
    assert fake_anthropic.calls == 5 * failures
    assert retrying.view(RUN).status == "failed"
