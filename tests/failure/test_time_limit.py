"""A delivery stopped by Celery's soft time limit is retried, not failed for good.

The limit stops the delivery, not the run: what it recorded stays, it is `retrying` (shown,
in the due index), and the due sweep hands it to a worker again after the back-off, which
resumes from the first step not recorded. A week is never lost to a slow model API.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.failure.conftest import CALLS, ROOT, RUN, log_problems, task_returned, wait_for_status
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import Deployment, wait_until

pytestmark = pytest.mark.slow

SOFT_LIMIT = 3  # seconds, for this one message (DIGEST_TASK_TIME_LIMIT is 30 s at least)

# One delivery with its own time limits, as Celery lets a message carry them.
_LIMITED = """
import sys
from tasks import digest
print(digest.apply_async(args=[sys.argv[1]], soft_time_limit=int(sys.argv[2]),
                         time_limit=int(sys.argv[2]) + 2).id)
"""
CALL_TIME = 0.5  # nine calls one at a time: 4.5 s, past the soft limit


def test_a_delivery_past_the_soft_time_limit_is_retried_from_where_it_stopped(
    live: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    live.env.update(
        DIGEST_MODEL_TIMEOUT="2",
        # Long enough that `digest runs` still finds the run retrying on a loaded machine (its
        # process starts in about a second); the sweep restarts it after that.
        DIGEST_RUN_RETRY_DELAY="4",
        DIGEST_RUN_RETRY_MAX_DELAY="4",
        DIGEST_CONCURRENCY="1",
    )
    fake_anthropic.delay = CALL_TIME
    worker = live.worker("a", concurrency=1)
    live.beat()
    sent = subprocess.run(
        [sys.executable, "-c", _LIMITED, RUN, str(SOFT_LIMIT)],
        cwd=ROOT,
        env=live.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    task = sent.stdout.strip()

    wait_until(
        lambda: live.view(RUN).status in ("retrying", "failed"), 20, "the soft time limit to hit"
    )
    stopped = live.view(RUN)
    assert stopped.status == "retrying", stopped.meta.get("last_error")
    assert "SoftTimeLimitExceeded" in stopped.meta["last_error"]
    assert "next retry" in live.cli("runs").stdout
    assert task_returned(live, task)["status"] == "retrying"
    recorded_first = len(stopped.steps)
    assert 1 < recorded_first <= CALLS  # select and some of the calls, not all of them

    fake_anthropic.delay = 0
    took = wait_for_status(live, "done", 30)
    assert len(live.outbox()) == 1
    assert json.loads(live.view(RUN).meta["outcome"])["status"] == "sent"
    # Each step recorded once; only the call the limit cut short was asked twice, at most.
    assert CALLS <= fake_anthropic.calls <= CALLS + 1
    assert log_problems(worker) == []
    print(
        f"soft limit {SOFT_LIMIT}s: {recorded_first} steps recorded, retrying; done {took:.1f}s "
        f"later, {fake_anthropic.calls} calls, 1 email"
    )
