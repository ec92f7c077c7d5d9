"""A poison run: every start kills its worker, so the run is parked instead of looping forever.

``CRASH=before-save:send`` on the worker makes each start die inside ``send``, after the email
left and before its record: nothing is ever recorded again, so every start counts as a start
without progress. After ``max_stalled_starts`` (5) of them the next start parks the run as
failed and acks its message; no delivery follows. ``digest run RUN --retry`` then resets it on
purpose and finishes it, and the outbox's idempotency key keeps the repeated sends to one email.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import JOURNAL, RUN, Deployment, item_ordered, only_index, wait_until

pytestmark = pytest.mark.slow


def test_poison_run_is_parked_then_retried_deliberately(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    deployment.env.update(fake_anthropic.env(), DIGEST_CONCURRENCY="1", DIGEST_LEASE_TTL="1")
    worker = deployment.worker("poisoned", concurrency=1, env={"CRASH": "before-save:send"})
    client = deployment.client()
    keys = deployment.runtime().journal.keys("digest", RUN)

    assert deployment.cli("enqueue", RUN).returncode == 0
    wait_until(
        lambda: client.hget(keys.meta, "parked") or "raised unexpected" in worker.text(),
        60,
        "the run to be parked",
    )
    assert "raised unexpected" not in worker.text()  # e.g. busy retries running out
    parked = deployment.view(RUN).meta

    # One start recorded select..compose and died in send; five more died there without
    # recording anything; the seventh found five stalled starts behind it and parked the run.
    assert parked["status"] == "failed"
    assert parked["starts"] == "7"
    assert parked["starts_without_progress"] == "5"
    assert parked["last_error"] == (
        f"run digest:{RUN} was parked after 5 starts without progress; "
        "fix the cause, then reset it deliberately (digest run RUN --retry)"
    )
    # The park is written before the worker logs it: wait for the line, do not race it.
    parked_line = f"run digest:{RUN} was parked after 5 starts"
    wait_until(lambda: parked_line in worker.text(), 10, "the worker's parked line")
    assert worker.text().count("simulated crash at before-save:send") == 6
    assert len(deployment.outbox()) == 1
    assert fake_anthropic.calls == 9
    assert item_ordered(deployment.view(RUN).steps) == JOURNAL[:10]
    assert client.zscore(only_index(deployment.runtime().journal).due, f"digest:{RUN}") is None
    assert client.get(keys.lease) is None

    # The parking delivery was acked: nothing redelivers the run, not even after the lease
    # time and a sweep interval have passed several times over.
    time.sleep(3)
    assert deployment.view(RUN).meta == parked  # starts and deliveries included
    assert (client.llen("celery"), client.hlen("unacked")) == (0, 0)  # kombu's queue, unacked

    shown = deployment.cli("show", RUN)
    assert shown.returncode == 0, shown.stderr
    assert "status   failed" in shown.stdout
    assert "parked   yes: starts kept dying; `digest run RUN --retry` resets it" in shown.stdout
    assert "starts   7 (deliveries " in shown.stdout
    assert "was parked after 5 starts without progress" in shown.stdout

    refused = deployment.cli("run", RUN)
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [f"failed: {parked['last_error']}"]
    assert fake_anthropic.calls == 9

    retried = deployment.cli("run", RUN, "--retry")

    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert re.findall(r"^  (ran|replayed) +(\S+)$", retried.stdout, re.MULTILINE) == [
        ("replayed" if index < 10 else "ran", key) for index, key in enumerate(JOURNAL)
    ]
    assert retried.stdout.splitlines()[-1] == (
        "sent: 8 items, 0 model calls in this attempt, "
        f"email already sent earlier, not resent (digest-{RUN})"
    )
    assert f"  reset digest:{RUN}: its next start is a deliberate retry" in retried.stderr
    assert len(deployment.outbox()) == 1
    assert fake_anthropic.calls == 9
    view = deployment.view(RUN)
    assert view.status == "done"
    assert item_ordered(view.steps) == JOURNAL
    assert "parked" not in view.meta
    assert view.meta["starts"] == "8"
